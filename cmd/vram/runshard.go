// `vram run --shard i/N`: one task's share of a batch split among the
// tasks of a Slurm job array or a Kubernetes Indexed Job.
//
// Shard i of N runs the batch's runs [⌊i·R/N⌋, ⌊(i+1)·R/N⌋) of R = --runs
// (package internal/shard owns the rule). Run r gets the same parameters
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
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/vramkit/vram/internal/shard"
	"github.com/vramkit/vram/internal/userfile"
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

// partManifest is what a finished part says about itself: the
// OUT.shard-i-of-N.json beside its .npy.
type partManifest struct {
	Part      string  `json:"part"`  // the part's .npy file name, in the manifest's directory
	Shard     uint64  `json:"shard"` // i of --shard i/N
	Shards    uint64  `json:"shards"`
	From      string  `json:"from"`      // where the shard came from: --shard, slurm, kubernetes
	FirstRun  int     `json:"first_run"` // the batch's index of the part's run 0
	Runs      int     `json:"runs"`      // runs in the part
	TotalRuns int     `json:"total_runs"`
	Seed      uint64  `json:"seed"`
	Steps     int     `json:"steps"`
	Samples   int     `json:"samples"`
	Dt        float64 `json:"dt"`
	// DataBytes and DataCRC32C are the part's data (after its .npy
	// header): its size and CRC-32C (Castagnoli) in hex, so that merge
	// takes only the file this manifest was written for.
	DataBytes  int64  `json:"data_bytes"`
	DataCRC32C string `json:"data_crc32c"`
}

// partPaths are the part's .npy and manifest for the --out file out.
func partPaths(out string, s shard.Shard) (npyPath, manifest string) {
	stem := strings.TrimSuffix(out, ".npy")
	name := fmt.Sprintf("%s.shard-%d-of-%d", stem, s.Index, s.Count)
	return name + ".npy", name + ".json"
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

// openOut makes the --out file, or with a shard its part, beside where
// it goes; closeOut puts it in place (or, when failed, removes it) and
// then writes a part's manifest. A part and manifest left by an earlier
// try of the shard stay as they were until this one has succeeded.
func (j *job) openOut(out string) error {
	path := out
	if j.shape.parted() {
		path, _ = partPaths(out, j.shape.shard)
	}
	var err error
	if j.traj, err = createTrajFile(path, j.shape.runs, j.shape.samples); err != nil {
		return err
	}
	j.traj.keepRuns(spreadRuns(j.shape.runs, j.verifyRuns))
	return nil
}

func (j *job) closeOut(out string, failed bool) error {
	if j.traj == nil { // no --out, or the job failed before making it
		return nil
	}
	sh, s := j.shape, j.shape.shard
	npyPath, manifest := partPaths(out, s)
	if !failed && sh.parted() {
		// The old manifest would vouch for the new part: it goes first.
		if err := os.Remove(manifest); err != nil && !errors.Is(err, os.ErrNotExist) {
			return errors.Join(fmt.Errorf("--out: remove the old manifest: %w", err), j.traj.close(true))
		}
	}
	var sum string
	if !failed && sh.parted() {
		var err error
		if sum, err = j.traj.checksum(); err != nil {
			return errors.Join(err, j.traj.close(true))
		}
	}
	if err := j.traj.close(failed); err != nil || failed || !sh.parted() {
		return err
	}
	m := partManifest{Part: filepath.Base(npyPath), Shard: s.Index, Shards: s.Count, From: s.From,
		FirstRun: sh.first, Runs: sh.runs, TotalRuns: sh.total, Seed: j.seed,
		Steps: int(sh.steps), Samples: sh.samples, Dt: sh.dtFlag,
		DataBytes: j.traj.f.DataBytes(), DataCRC32C: sum}
	return writeManifest(manifest, m)
}

// writeManifest writes m to path whole or not at all.
func writeManifest(path string, m partManifest) error {
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return err
	}
	err = userfile.Write(path, userfile.Options{}, func(w io.Writer) error {
		_, err := w.Write(append(b, '\n'))
		return err
	})
	if err != nil {
		return fmt.Errorf("write the part's manifest: %w", err)
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

// shardOf is shard i of n as a value.
func shardOf(i, n uint64) shard.Shard { return shard.Shard{Index: i, Count: n} }

// partGlob is the pattern of out's parts' files with extension ext.
func partGlob(out, ext string) string {
	return strings.TrimSuffix(out, ".npy") + ".shard-*-of-*." + ext
}

// globEscape escapes the characters filepath.Match treats as special.
func globEscape(s string) string {
	r := strings.NewReplacer(`\`, `\\`, "*", `\*`, "?", `\?`, "[", `\[`)
	return r.Replace(s)
}

// unfinishedNote names the parts of out that have no manifest, if any.
func unfinishedNote(out string) string {
	found, _ := filepath.Glob(globEscape(strings.TrimSuffix(out, ".npy")) + ".shard-*-of-*.npy")
	if len(found) == 0 {
		return ""
	}
	return fmt.Sprintf("; %s exist without a manifest: their shards did not finish", strings.Join(found, ", "))
}
