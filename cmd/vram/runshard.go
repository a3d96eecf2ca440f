// `vram run --shard i/N`: one task's share of a batch split among the
// tasks of a Slurm job array or a Kubernetes Indexed Job.
//
// Shard i of N runs the batch's runs [⌊i·R/N⌋, ⌊(i+1)·R/N⌋) of R = --runs
// (package shard owns the rule, the part's files and merge). Run r gets the same parameters
// (runAt(seed, r)) whichever shard computes it, and each run's result
// depends on nothing else, so the shards' parts gathered by `vram merge`
// are byte-identical to the same batch's --out in one process.
//
// Without --shard the job looks for a scheduler's index in its
// environment (shard.FromEnv: SLURM_ARRAY_TASK_ID with
// SLURM_ARRAY_TASK_COUNT and SLURM_ARRAY_TASK_MIN, or JOB_COMPLETION_INDEX
// with VRAM_SHARD_COUNT), and says on stderr which it used. --shard 0/1
// runs the whole batch whatever the environment says; a scheduler's shard
// 0/1 (an array of one task) is still a part, for its merge job.
//
// With --out OUT.npy a shard writes its part, not OUT.npy: the part
// OUT.shard-i-of-N.npy (float32, C order, shape (samples, 2, its runs)),
// and once the part is complete and verified, its manifest
// OUT.shard-i-of-N.json saying which runs of which batch it holds, and the
// size and CRC-32C of the part's data (read back from the file), so that
// merge takes that file and no other. A part
// without a manifest is unfinished; `vram merge OUT.npy` gathers the parts
// that have one. Both are written beside their paths and renamed into
// place, so a try of a shard that fails leaves an earlier try's part and
// manifest as they were.

package main

import (
	"encoding/json"
	"fmt"
	"os"
	"time"

	"github.com/vramkit/vram/shard"
)

// shardHelp is the part of `vram run --help` about --shard.
const shardHelp = `--shard i/N runs shard i of N of the batch: runs [⌊i·R/N⌋, ⌊(i+1)·R/N⌋)
of R = --runs, each with the parameters it has in the whole batch. Without
--shard the job takes its shard from a Slurm job array
(SLURM_ARRAY_TASK_ID − SLURM_ARRAY_TASK_MIN of SLURM_ARRAY_TASK_COUNT) or
a Kubernetes Indexed Job (JOB_COMPLETION_INDEX of VRAM_SHARD_COUNT, which
the Job sets to its completions), and says on stderr which it used;
--shard 0/1 runs the whole batch. With --out OUT.npy a shard (any shard a
scheduler gave, even the one task of an array of one) writes its
part OUT.shard-i-of-N.npy and, once verified, its manifest
OUT.shard-i-of-N.json; vram merge OUT.npy gathers the parts into the file
one process would have written.

`

// runBatch is what tells vram run's batches apart, in a part's manifest
// (shard.Manifest.Batch): merge gathers only parts of one batch.
type runBatch struct {
	Seed    uint64  `json:"seed"`
	Steps   int     `json:"steps"`
	Samples int     `json:"samples"`
	Dt      float64 `json:"dt"`
}

// shardJob resolves the job's shard (--shard, else the scheduler's
// environment, else the whole batch) and narrows js to its runs.
func (a *app) shardJob(js jobShape, f runFlags) (jobShape, error) {
	s := shard.One
	if f.shard != "" {
		var err error
		if s, err = shard.Parse(f.shard); err != nil {
			return js, usagef("--shard: %w", err)
		}
	} else if es, ok, err := shard.FromEnv(os.Getenv); err != nil {
		return js, usagef("%w", err)
	} else if ok {
		s = es
	}
	js.shard, js.first, js.total = s, 0, js.runs
	if !js.parted() {
		return js, nil
	}
	lo, hi := s.Range(uint64(js.total))
	if lo == hi {
		return js, usagef("shard %s (%s) of %d runs has no runs: want at most %d shards, or more --runs", s, shardSource(s), js.total, js.total)
	}
	js.first, js.runs = int(lo), int(hi-lo)
	fmt.Fprintf(a.stderr, "vram: shard %s from %s: runs %d-%d of %d\n", s, shardSource(s), lo, hi-1, js.total)
	return js, nil
}

// parted reports whether the job writes a part of the batch for vram
// merge rather than the whole file: a shard of several, or any shard a
// scheduler gave, even the one task of an array of one (its merge job
// gathers one part). --shard 0/1 is the whole batch.
func (js jobShape) parted() bool {
	return !js.shard.Whole() || js.shard.From == "slurm" || js.shard.From == "kubernetes"
}

// shardSource says where s came from, with the variables read.
func shardSource(s shard.Shard) string {
	switch s.From {
	case "slurm":
		step := ""
		if v := os.Getenv(shard.EnvSlurmStep); v != "" {
			step = fmt.Sprintf(", %s=%s", shard.EnvSlurmStep, v)
		}
		return fmt.Sprintf("Slurm (%s=%s, %s=%s, %s=%s%s)", shard.EnvSlurmID, os.Getenv(shard.EnvSlurmID),
			shard.EnvSlurmMin, os.Getenv(shard.EnvSlurmMin), shard.EnvSlurmCount, os.Getenv(shard.EnvSlurmCount), step)
	case "kubernetes":
		return fmt.Sprintf("Kubernetes (%s=%s, %s=%s)", shard.EnvK8sIndex, os.Getenv(shard.EnvK8sIndex), shard.EnvCount, os.Getenv(shard.EnvCount))
	}
	return s.From
}

// openOut makes the --out file, or with a shard its part
// (shard.CreatePart), beside where it goes; closeOut puts it in place (a
// part, then its manifest) or, when failed, removes it. A part and
// manifest left by an earlier try of the shard stay as they were until
// this one has succeeded.
func (j *job) openOut(out string) error {
	if err := j.createOut(out); err != nil {
		return err
	}
	j.traj.keepRuns(spreadRuns(j.shape.runs, j.verifyRuns))
	return nil
}

// createOut makes the --out file, or with a shard its part, into j.traj.
func (j *job) createOut(out string) error {
	sh := j.shape
	if !sh.parted() {
		var err error
		j.traj, err = createTrajFile(out, sh.runs, sh.samples)
		return err
	}
	id, err := json.Marshal(runBatch{Seed: j.seed, Steps: int(sh.steps), Samples: sh.samples, Dt: sh.dtFlag})
	if err != nil {
		return err
	}
	p, err := shard.CreatePart(out, sh.shard, sh.total, trajHeader(sh.runs, sh.samples), shard.PartOptions{Axis: 2, Batch: id})
	if err != nil {
		return fmt.Errorf("--out: %w", err)
	}
	j.traj = &trajFile{f: p.File(), path: p.Path(), runs: sh.runs, samples: sh.samples, done: func(failed bool) error {
		if failed {
			return p.Abort()
		}
		return p.Commit()
	}}
	return nil
}

// commitOut puts the verified --out file in place before the report is
// written, so that the report counts the time (flushing gigabytes to the
// disk can be seconds) and a report that cannot be written leaves a
// verified file whole; it returns the seconds it took. The deferred
// closeOut then has nothing left to do.
func (j *job) commitOut(out string) (float64, error) {
	if j.traj == nil {
		return 0, nil
	}
	t0 := time.Now()
	err := j.closeOut(out, false)
	j.traj = nil
	return time.Since(t0).Seconds(), err
}

func (j *job) closeOut(out string, failed bool) error {
	if j.traj == nil { // no --out, or the job failed before making it
		return nil
	}
	if err := j.traj.done(failed); err != nil {
		return fmt.Errorf("--out %s: %w", j.traj.path, err)
	}
	return nil
}

// shardReport adds the shard to the report.
func (j *job) shardReport(rep *runReport) {
	s := j.shape.shard
	if !j.shape.parted() {
		return
	}
	rep.Shard, rep.ShardFrom, rep.FirstRun, rep.TotalRuns = s.String(), s.From, j.shape.first, j.shape.total
}
