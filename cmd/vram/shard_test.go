package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vramkit/vram/shard"
)

// The tests of this package run `vram run` and expect the whole batch,
// so a scheduler's variables in the environment of the test process (a
// test run inside a Slurm array task or an indexed pod) are dropped.
func init() {
	for _, k := range []string{shard.EnvSlurmID, shard.EnvSlurmMin, shard.EnvSlurmStep, shard.EnvSlurmCount, shard.EnvK8sIndex, shard.EnvCount} {
		os.Unsetenv(k)
	}
}

// shardRun is smallRun's batch less its run count, which each test sets
// (several chunks a shard: 256 KiB of device holds about a thousand runs).
var shardRun = []string{"--device", "sim:granularity=64KiB,context=0", "--vram", "256KiB", "--steps", "40", "--samples", "21", "--seed", "7"}

// runShard runs `vram run` for runs runs with extra arguments and the
// environment env, and fails the test unless it succeeds.
func runShard(t *testing.T, runs int, env map[string]string, extra ...string) runReport {
	t.Helper()
	for k, v := range env {
		t.Setenv(k, v)
	}
	args := append(append([]string{"run", "--json", "--runs", fmt.Sprint(runs)}, shardRun...), extra...)
	stdout, stderr, code := cli(t, "", args...)
	for k := range env {
		os.Unsetenv(k)
	}
	if code != exitOK {
		t.Fatalf("vram %s (env %v): exit %d\n%s", strings.Join(args, " "), env, code, stderr)
	}
	var r runReport
	if err := json.Unmarshal([]byte(stdout), &r); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, stdout)
	}
	return r
}

// TestShardsMergeToTheWholeRun is the promise of sharding: the parts of a
// batch split N ways — by --shard, by Slurm's variables or by
// Kubernetes' — gathered by vram merge are byte for byte the file one
// process writes for the batch.
func TestShardsMergeToTheWholeRun(t *testing.T) {
	const runs = 12_003 // not a multiple of 4, 3 or 7
	dir := t.TempDir()
	whole := filepath.Join(dir, "whole.npy")
	runShard(t, runs, nil, "--out", whole)
	want, err := os.ReadFile(whole)
	if err != nil {
		t.Fatal(err)
	}
	tests := map[string]struct {
		n   int
		env func(i int) map[string]string // nil: --shard i/N
	}{
		"--shard, 4": {n: 4},
		"--shard, 7": {n: 7},
		"slurm 1-3": {n: 3, env: func(i int) map[string]string {
			return map[string]string{shard.EnvSlurmID: fmt.Sprint(i + 1), shard.EnvSlurmMin: "1", shard.EnvSlurmCount: "3"}
		}},
		"kubernetes 4": {n: 4, env: func(i int) map[string]string {
			return map[string]string{shard.EnvK8sIndex: fmt.Sprint(i), shard.EnvCount: "4"}
		}},
		// A scheduler's job of one task still writes a part, which its
		// merge job (deploy/slurm, deploy/kubernetes) gathers.
		"slurm 0-0": {n: 1, env: func(i int) map[string]string {
			return map[string]string{shard.EnvSlurmID: "0", shard.EnvSlurmCount: "1"}
		}},
		"kubernetes 1": {n: 1, env: func(i int) map[string]string {
			return map[string]string{shard.EnvK8sIndex: "0", shard.EnvCount: "1"}
		}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "r.npy")
			covered := 0
			for i := range tc.n {
				var r runReport
				if tc.env == nil {
					r = runShard(t, runs, nil, "--out", out, "--shard", fmt.Sprintf("%d/%d", i, tc.n))
				} else {
					r = runShard(t, runs, tc.env(i), "--out", out)
				}
				wantFrom := map[bool]string{true: "--shard", false: strings.Fields(name)[0]}[tc.env == nil]
				if r.Shard != fmt.Sprintf("%d/%d", i, tc.n) || r.ShardFrom != wantFrom || r.FirstRun != covered || r.TotalRuns != runs || !r.Verified {
					t.Fatalf("shard %d: report says shard %q from %q, runs %d+%d of %d, verified %v; want %d/%d from %s starting at %d",
						i, r.Shard, r.ShardFrom, r.FirstRun, r.Runs, r.TotalRuns, r.Verified, i, tc.n, wantFrom, covered)
				}
				if i == 0 && r.Chunks < 2 {
					t.Errorf("shard 0 ran in %d chunk; the test wants several", r.Chunks)
				}
				covered += r.Runs
			}
			if covered != runs {
				t.Fatalf("the shards ran %d runs, want %d", covered, runs)
			}
			if _, stderr, code := cli(t, "", "merge", out); code != exitOK {
				t.Fatalf("merge: exit %d\n%s", code, stderr)
			}
			got, err := os.ReadFile(out)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("the merged file (%d bytes) differs from the one-process file (%d bytes)", len(got), len(want))
			}
		})
	}
}

// TestShardTellsWhereFrom: the job says on stderr which shard it runs and
// where it found it.
func TestShardTellsWhereFrom(t *testing.T) {
	for name, tc := range map[string]struct {
		env  map[string]string
		args []string
		want string
	}{
		"flag":       {args: []string{"--shard", "1/2"}, want: "vram: shard 1/2 from --shard: runs 50-99 of 100"},
		"slurm":      {env: map[string]string{shard.EnvSlurmID: "0", shard.EnvSlurmCount: "2"}, want: "vram: shard 0/2 from Slurm (SLURM_ARRAY_TASK_ID=0, SLURM_ARRAY_TASK_MIN=, SLURM_ARRAY_TASK_COUNT=2): runs 0-49 of 100"},
		"kubernetes": {env: map[string]string{shard.EnvK8sIndex: "1", shard.EnvCount: "2"}, want: "vram: shard 1/2 from Kubernetes (JOB_COMPLETION_INDEX=1, VRAM_SHARD_COUNT=2): runs 50-99 of 100"},
		"slurm, step": {env: map[string]string{shard.EnvSlurmID: "4", shard.EnvSlurmStep: "2", shard.EnvSlurmCount: "3"},
			want: "vram: shard 2/3 from Slurm (SLURM_ARRAY_TASK_ID=4, SLURM_ARRAY_TASK_MIN=, SLURM_ARRAY_TASK_COUNT=3, SLURM_ARRAY_TASK_STEP=2): runs 66-99 of 100"},
		"slurm, one task": {env: map[string]string{shard.EnvSlurmID: "0", shard.EnvSlurmCount: "1"},
			want: "vram: shard 0/1 from Slurm (SLURM_ARRAY_TASK_ID=0, SLURM_ARRAY_TASK_MIN=, SLURM_ARRAY_TASK_COUNT=1): runs 0-99 of 100"},
		"flag wins": {env: map[string]string{shard.EnvK8sIndex: "1", shard.EnvCount: "2"}, args: []string{"--shard", "0/1"}, want: ""},
	} {
		t.Run(name, func(t *testing.T) {
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			args := append([]string{"run", "--device", "sim", "--runs", "100", "--steps", "10"}, tc.args...)
			stdout, stderr, code := cli(t, "", args...)
			if code != exitOK {
				t.Fatalf("exit %d\n%s", code, stderr)
			}
			if tc.want == "" {
				if strings.Contains(stderr, "vram: shard") || strings.Contains(stdout, "shard ") {
					t.Fatalf("--shard 0/1 ran a shard:\n%s%s", stderr, stdout)
				}
				return
			}
			if !strings.Contains(stderr, tc.want) {
				t.Fatalf("stderr does not say %q:\n%s", tc.want, stderr)
			}
		})
	}
}

func TestShardErrors(t *testing.T) {
	for name, tc := range map[string]struct {
		env  map[string]string
		args []string
		want string
	}{
		"bad flag":           {args: []string{"--shard", "4/4"}, want: "--shard: \"4/4\": shard: index 4 of 4 shards: want 0 to 3"},
		"not i/N":            {args: []string{"--shard", "2"}, want: "want i/N"},
		"empty shard":        {args: []string{"--runs", "3", "--shard", "0/4"}, want: "shard 0/4 (--shard) of 3 runs has no runs: want at most 3 shards"},
		"kubernetes, no N":   {env: map[string]string{shard.EnvK8sIndex: "1"}, want: "VRAM_SHARD_COUNT is not"},
		"slurm, no count":    {env: map[string]string{shard.EnvSlurmID: "1"}, want: "SLURM_ARRAY_TASK_COUNT is not"},
		"slurm, holed array": {env: map[string]string{shard.EnvSlurmID: "9", shard.EnvSlurmMin: "1", shard.EnvSlurmCount: "3"}, want: "holes"},
	} {
		t.Run(name, func(t *testing.T) {
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			out := filepath.Join(t.TempDir(), "r.npy")
			args := append([]string{"run", "--device", "sim", "--steps", "10", "--out", out}, tc.args...)
			_, stderr, code := cli(t, "", args...)
			if code != exitUsage || !strings.Contains(stderr, tc.want) {
				t.Fatalf("exit %d, stderr:\n%s\nwant exit %d saying %q", code, stderr, exitUsage, tc.want)
			}
			if m, _ := filepath.Glob(filepath.Join(filepath.Dir(out), "*")); len(m) > 0 {
				t.Fatalf("a refused job left files: %v", m)
			}
		})
	}
}
