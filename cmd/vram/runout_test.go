package main

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/vramkit/vram/internal/oscillator"
	"github.com/vramkit/vram/npy"
)

// hostCapRun is smallRun with 100,000 runs: 16.8 MB of trajectories,
// eight times the 2 MiB --host-mem of the tests.
func hostCapRun(extra ...string) []string {
	args := append([]string{"run", "--json"}, smallRun...)
	for i, a := range args {
		if a == "20000" {
			args[i] = "100000"
		}
	}
	return append(args, extra...)
}

// TestRunOutFile runs a batch whose trajectories are eight times the host
// limit with --out and --host-mem, and checks the report, the file's
// header, that it was verified, and that nothing was spilled or left.
func TestRunOutFile(t *testing.T) {
	dir := t.TempDir()
	spill := t.TempDir()
	t.Setenv("VRAM_SPILL_DIR", spill)
	out := filepath.Join(dir, "r.npy")
	stdout, stderr, code := cli(t, "", hostCapRun("--out", out, "--host-mem", "2MiB")...)
	if code != exitOK {
		t.Fatalf("exit %d; stderr:\n%s", code, stderr)
	}
	var r runReport
	if err := json.Unmarshal([]byte(stdout), &r); err != nil {
		t.Fatalf("%v\n%s", err, stdout)
	}
	const runs, samples = 100000, 21
	if !r.Verified || r.Out != out || r.HostLimitBytes != 2<<20 || r.Chunks < 4 || r.HostRungs["trajectories"] != "" {
		t.Fatalf("report: verified %v, out %q, host limit %d, %d chunks, rungs %v", r.Verified, r.Out, r.HostLimitBytes, r.Chunks, r.HostRungs)
	}
	if r.StagingBytes > r.HostLimitBytes {
		t.Errorf("%d bytes of staging over the %d byte limit", r.StagingBytes, r.HostLimitBytes)
	}
	// The file is put in place before the report, which counts the time:
	// the parts of the job account for its wall (each measured apart).
	parts := r.SetupSeconds + r.BatchSeconds + r.VerifySeconds + r.CommitSeconds
	if r.CommitSeconds <= 0 || parts > r.WallSeconds {
		t.Errorf("commit %v s; set-up, batch, verify and commit %v s of a %v s wall; want a commit time, and the parts within the wall",
			r.CommitSeconds, parts, r.WallSeconds)
	}
	f, err := npy.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if h := f.Header(); h.Descr != "<f4" || h.Fortran || len(h.Shape) != 3 || h.Shape[0] != samples || h.Shape[1] != 2 || h.Shape[2] != runs {
		t.Errorf("header %+v: want <f4, C order, (%d, 2, %d)", h, samples, runs)
	}
	if left, _ := os.ReadDir(spill); len(left) != 0 {
		t.Errorf("spill directory holds %d files after the job", len(left))
	}
	numpyRuns(t, out, 40, 0.01, samples, []int{0, 1, 4999, 50000, runs - 1})
}

// TestRunHostMemSpills runs the same batch with --host-mem and no --out:
// the trajectories spill to a file in $VRAM_SPILL_DIR, the batch is
// verified, and the file is gone afterwards.
func TestRunHostMemSpills(t *testing.T) {
	spill := t.TempDir()
	t.Setenv("VRAM_SPILL_DIR", spill)
	stdout, stderr, code := cli(t, "", hostCapRun("--host-mem", "2MiB")...)
	if code != exitOK {
		t.Fatalf("exit %d; stderr:\n%s", code, stderr)
	}
	var r runReport
	if err := json.Unmarshal([]byte(stdout), &r); err != nil {
		t.Fatalf("%v\n%s", err, stdout)
	}
	if !r.Verified || r.HostRungs["trajectories"] != "file" || r.HostRungs["status"] != "pinned" || r.StagingBytes > 2<<20 {
		t.Fatalf("report: verified %v, rungs %v, %d bytes of staging: want the trajectories on a file, the staging within --host-mem", r.Verified, r.HostRungs, r.StagingBytes)
	}
	if left, _ := os.ReadDir(spill); len(left) != 0 {
		t.Errorf("spill directory holds %d files after the job", len(left))
	}
}

// numpyRuns has numpy load path (memory-mapped) and checks runs idx of
// it against the float64 reference; it skips, saying why, without numpy.
func numpyRuns(t *testing.T, path string, steps int, dt float32, samples int, idx []int) {
	t.Helper()
	py := ""
	for _, p := range []string{"/usr/bin/python3", "python3"} {
		if exec.Command(p, "-c", "import numpy").Run() == nil {
			py = p
			break
		}
	}
	if py == "" {
		t.Skip("numpy check skipped: no python3 with numpy (apt-get install -y python3-numpy)")
	}
	var list []string
	for _, i := range idx {
		list = append(list, strconv.Itoa(i))
	}
	script := `
import sys, json, numpy as np
a = np.load(sys.argv[1], mmap_mode="r")
assert a.dtype == np.float32 and a.flags.c_contiguous
if a.nbytes <= int(sys.argv[2]) or sys.argv[3] == "1":
    b = np.load(sys.argv[1])  # read whole, not mapped
    assert a.shape == b.shape and (a[:, :, -1] == b[:, :, -1]).all()
print(json.dumps({"shape": list(a.shape), "runs": [a[:, :, i].astype(float).tolist() for i in [` + strings.Join(list, ",") + `]]}))
`
	// A plain load reads the whole file: done up to 1 GiB, or always with
	// VRAM_NPY_FULL_LOAD=1.
	full := os.Getenv("VRAM_NPY_FULL_LOAD")
	out, err := exec.Command(py, "-c", script, path, strconv.Itoa(1<<30), full).CombinedOutput()
	if err != nil {
		t.Fatalf("numpy: %v\n%s", err, out)
	}
	var got struct {
		Shape []int
		Runs  [][][2]float64
	}
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if len(got.Shape) != 3 || got.Shape[0] != samples || got.Shape[1] != 2 {
		t.Fatalf("numpy shape %v", got.Shape)
	}
	for k, i := range idx {
		s := make([]oscillator.Sample, samples)
		for j, xv := range got.Runs[k] {
			s[j] = oscillator.Sample{X: xv[0], V: xv[1]}
		}
		want := oscillator.ReferenceRun(runAt(1, i), dt, steps, steps/(samples-1))
		if err := oscillator.Verify(s, want); err != nil {
			t.Errorf("run %d as numpy reads it: %v", i, err)
		}
	}
}

// TestNumpyReadsOutFile checks a file written by `vram run --out` with
// the default --steps, --dt and --seed, named by $VRAM_OUT_NPY: numpy
// loads it with the documented shape, and runs spread over it match the
// float64 reference. It skips when the variable is not set (BENCHMARKS.md
// runs it on the 4,000,000-run file).
func TestNumpyReadsOutFile(t *testing.T) {
	path := os.Getenv("VRAM_OUT_NPY")
	if path == "" {
		t.Skip("set VRAM_OUT_NPY to a file written by vram run --out with the default --steps, --dt and --seed")
	}
	f, err := npy.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	h := f.Header()
	f.Close()
	if len(h.Shape) != 3 || h.Shape[0] != defaultSteps+1 || h.Shape[1] != 2 || h.Descr != "<f4" {
		t.Fatalf("header %+v: want <f4 (%d, 2, runs)", h, defaultSteps+1)
	}
	runs := h.Shape[2]
	var idx []int
	for k := range 33 {
		idx = append(idx, int(int64(k)*int64(runs-1)/32))
	}
	numpyRuns(t, path, defaultSteps, defaultDt, defaultSteps+1, idx)
	t.Logf("%d runs of %d checked through numpy", len(idx), runs)
}

// TestRunHostMemSmall gives --host-mem less than one chunk's staging
// buffers: the job finishes with shorter chunks, verified, within the
// limit. Under one run's staging it fails with what to change, and
// leaves no --out file.
func TestRunHostMemSmall(t *testing.T) {
	dir := t.TempDir()
	stdout, stderr, code := cli(t, "", hostCapRun("--out", filepath.Join(dir, "small.npy"), "--host-mem", "64KiB")...)
	if code != exitOK {
		t.Fatalf("--host-mem 64KiB: exit %d, stderr:\n%s", code, stderr)
	}
	var r runReport
	if err := json.Unmarshal([]byte(stdout), &r); err != nil {
		t.Fatal(err)
	}
	if !r.Verified || r.RunChunkLength >= r.ChunkLength || r.StagingBytes > 64<<10 || len(r.Recuts) == 0 || r.WriteSeconds <= 0 {
		t.Errorf("--host-mem 64KiB: verified %v, chunks of %d runs (plan %d), %d bytes of staging, re-cuts %+v, %v s writing; want verified, shorter chunks, staging within the limit, the change listed, the writes timed",
			r.Verified, r.RunChunkLength, r.ChunkLength, r.StagingBytes, r.Recuts, r.WriteSeconds)
	}
	out := filepath.Join(dir, "r.npy")
	_, stderr, code = cli(t, "", hostCapRun("--out", out, "--host-mem", "100B")...)
	if code != exitFailure || !strings.Contains(stderr, "raise --host-mem") || !strings.Contains(stderr, "one run of") || !strings.Contains(stderr, "host limit 100 B") {
		t.Fatalf("exit %d, stderr:\n%s\nwant exit %d saying one run does not fit and to raise --host-mem", code, stderr, exitFailure)
	}
	if _, err := os.Stat(out); !os.IsNotExist(err) {
		t.Errorf("--out file after a failed job: %v, want none", err)
	}
}

// TestRunHostMemUsage refuses a --host-mem that is not a size.
func TestRunHostMemUsage(t *testing.T) {
	for _, v := range []string{"lots", "0", "-5MiB"} {
		_, stderr, code := cli(t, "", hostCapRun("--host-mem", v)...)
		if code != exitUsage || !strings.Contains(stderr, "--host-mem") {
			t.Errorf("--host-mem %q: exit %d, stderr %q; want a usage error naming the flag", v, code, stderr)
		}
	}
}
