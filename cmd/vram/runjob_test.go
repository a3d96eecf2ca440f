package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"math/cmplx"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/vramkit/vram"
	"github.com/vramkit/vram/device"
	"github.com/vramkit/vram/device/sim"
	"github.com/vramkit/vram/internal/oscillator"
	"github.com/vramkit/vram/internal/units"
)

// A small batch for tests: 20,000 runs of 40 steps with 21 samples
// (196 device bytes a run, 3.7 MiB in all) on a simulator of 1 MiB with
// 64 KiB pages, so the plan takes several chunks and the job a fraction
// of a second even under -race.
var smallRun = []string{"--device", "sim:granularity=64KiB,context=0", "--vram", "1MiB",
	"--runs", "20000", "--steps", "40", "--samples", "21"}

func TestRunChunkedVerified(t *testing.T) {
	tests := map[string]struct {
		allocator string
		double    bool
	}{
		"pool":                 {"pool", false},
		"pool, double buffer":  {"pool", true},
		"direct":               {"direct", false},
		"direct, double":       {"direct", true},
		"async":                {"async", false},
		"async, double buffer": {"async", true},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			args := append([]string{"run", "--json", "--allocator", tc.allocator, fmt.Sprintf("--double-buffer=%v", tc.double)}, smallRun...)
			stdout, stderr, code := cli(t, "", args...)
			if code != exitOK {
				t.Fatalf("exit %d; stderr:\n%s", code, stderr)
			}
			var r runReport
			if err := json.Unmarshal([]byte(stdout), &r); err != nil {
				t.Fatalf("stdout is not one JSON object: %v\n%s", err, stdout)
			}
			// The fields the issue names, by their JSON names.
			var raw map[string]any
			if err := json.Unmarshal([]byte(stdout), &raw); err != nil {
				t.Fatal(err)
			}
			for _, k := range []string{"runs", "chunks", "chunk_length", "verified", "wall_seconds", "runs_per_second",
				"peak_device_bytes", "allocator", "device", "bytes_to_device", "bytes_from_device", "allocator_stats"} {
				if _, ok := raw[k]; !ok {
					t.Errorf("run --json lacks %q", k)
				}
			}
			const runs, samples = 20000, 21
			switch {
			case !r.Verified || r.VerifyError != "" || r.FailedRuns != 0:
				t.Errorf("not verified: %+v", r)
			case r.Chunks < 3:
				t.Errorf("%d chunks: the test batch should not fit 1 MiB in fewer than 3", r.Chunks)
			case r.Chunks*r.ChunkLength < runs || (r.Chunks-1)*r.ChunkLength >= runs:
				t.Errorf("%d chunks × %d runs do not cover %d runs exactly", r.Chunks, r.ChunkLength, runs)
			case r.VerifiedRuns < defaultVerify || r.VerifiedRuns > defaultVerify+2*max(r.Chunks, r.ChunksRun):
				t.Errorf("verified %d runs; want %d spread out plus each chunk's first and last", r.VerifiedRuns, defaultVerify)
			case r.Allocator != tc.allocator || r.DoubleBuffer != tc.double || r.Buffers != map[bool]int{false: 1, true: 2}[tc.double]:
				t.Errorf("allocator %q, double %v, buffers %d: want %q, %v", r.Allocator, r.DoubleBuffer, r.Buffers, tc.allocator, tc.double)
			case r.BytesToDevice != runs*6*4 || r.BytesFromDevice != runs*(samples*2*4+4):
				t.Errorf("copied %d bytes in and %d out; want %d and %d", r.BytesToDevice, r.BytesFromDevice, runs*6*4, runs*(samples*2*4+4))
			case r.PeakDeviceBytes == 0 || r.PeakDeviceBytes > r.DeviceBytes || r.BytesPerChunk > r.BudgetBytes:
				t.Errorf("peak %d bytes, %d per chunk, budget %d, device %d: want a peak within the device and a plan within the budget",
					r.PeakDeviceBytes, r.BytesPerChunk, r.BudgetBytes, r.DeviceBytes)
			case r.RunsPerSecond <= 0 || r.WallSeconds < r.BatchSeconds:
				t.Errorf("%v runs/s, wall %v s, batch %v s", r.RunsPerSecond, r.WallSeconds, r.BatchSeconds)
			case r.Backend != "sim" || r.Kernel != "go" || r.Steps != 40 || r.Samples != samples || r.Dt != 0.01:
				t.Errorf("report %+v does not echo the job", r)
			}
		})
	}
}

// TestRunOneRun checks the smallest batch: one run, whose run axis of
// length 1 makes nothing chunkable.
func TestRunOneRun(t *testing.T) {
	stdout, stderr, code := cli(t, "", "run", "--json", "--device", "sim:vram=64MiB", "--runs", "1", "--steps", "4")
	if code != exitOK {
		t.Fatalf("exit %d; stderr:\n%s", code, stderr)
	}
	var r runReport
	if err := json.Unmarshal([]byte(stdout), &r); err != nil {
		t.Fatal(err)
	}
	if !r.Verified || r.Chunks != 1 || r.ChunkLength != 1 || r.VerifiedRuns != 1 {
		t.Errorf("one run: verified %v, %d chunks of %d, %d runs checked; want verified, 1 chunk of 1, 1 checked",
			r.Verified, r.Chunks, r.ChunkLength, r.VerifiedRuns)
	}
}

func TestRunText(t *testing.T) {
	stdout, stderr, code := cli(t, "", append([]string{"run"}, smallRun...)...)
	if code != exitOK {
		t.Fatalf("exit %d; stderr:\n%s", code, stderr)
	}
	for _, w := range []string{"device", "sim:0", "allocator    expandable: ", "20000 runs × 40 steps, 21 samples", "chunks ×",
		"copied", "runs/s", "peak memory", "cache hit", "spread over all", "match the float64 reference"} {
		if !strings.Contains(stdout, w) {
			t.Errorf("report does not contain %q:\n%s", w, stdout)
		}
	}
}

// TestRunAllocatorNames checks that --allocator names the allocator that
// serves the batch, as replay's names do: pool is the segment Pool even
// where the manager's own choice (no flag) is Expandable.
func TestRunAllocatorNames(t *testing.T) {
	for flag, want := range map[string]string{"": "expandable", "pool": "pool", "expandable": "expandable", "direct": "direct", "async": "async",
		"cupy": "pool", "default": "direct", "cupy_async": "async", "Async-Pool": "async"} {
		t.Run(flag, func(t *testing.T) {
			args := []string{"run", "--json"}
			if flag != "" {
				args = append(args, "--allocator", flag)
			}
			stdout, stderr, code := cli(t, "", append(args, smallRun...)...)
			if code != exitOK {
				t.Fatalf("exit %d; stderr:\n%s", code, stderr)
			}
			var r runReport
			if err := json.Unmarshal([]byte(stdout), &r); err != nil {
				t.Fatal(err)
			}
			if r.Allocator != want || !r.Verified {
				t.Errorf("--allocator %s: served by %q (verified %v), want %q", flag, r.Allocator, r.Verified, want)
			}
		})
	}
	if _, stderr, code := cli(t, "", append([]string{"run", "--allocator", "slab"}, smallRun...)...); code != exitUsage || !strings.Contains(stderr, "want direct (or default), pool (or cupy), async (or asyncpool, async_pool, cupy_async), expandable") {
		t.Errorf("--allocator slab: exit %d, stderr %q; want a usage error listing the names", code, stderr)
	}
}

func TestRunErrors(t *testing.T) {
	tests := map[string]struct {
		args []string
		code int
		want string
	}{
		"samples do not divide": {[]string{"--steps", "40", "--samples", "7"}, exitUsage, "--samples 7 with --steps 40"},
		"one sample":            {[]string{"--steps", "40", "--samples", "1"}, exitUsage, "want 2 to 41 samples"},
		"no runs":               {[]string{"--runs", "0"}, exitUsage, "--runs 0"},
		"cosine out of range":   {[]string{"--steps", "100000", "--dt", "0.01"}, exitUsage, "|Ωt| < 100π"},
		"negative dt":           {[]string{"--dt", "-1"}, exitUsage, "--dt -1"},
		"bad allocator":         {[]string{"--allocator", "slab"}, exitUsage, `--allocator "slab"`},
		"bad vram":              {[]string{"--vram", "big"}, exitUsage, `--vram "big"`},
		"vram below a page":     {[]string{"--vram", "1MiB"}, exitUsage, `--vram 1MiB: want at least 2 MiB, one page of the simulated device`},
		"out not a .npy":        {[]string{"--out", "r.txt"}, exitUsage, `--out "r.txt": want a file name ending in .npy`},
		"vram with no unit":     {[]string{"--vram", "64"}, exitUsage, `--vram 64 (read as 64 bytes: a size without a unit is bytes; write 64MiB or 64GiB for more): want at least 2 MiB`},
		"vram below its page":   {[]string{"--device", "sim:granularity=64KiB", "--vram", "32KiB"}, exitUsage, `--vram 32KiB: want at least 64 KiB`},
		"unstable dt":           {[]string{"--runs", "2000", "--dt", "1", "--steps", "50"}, exitUsage, "RK4 is unstable at this step"},
		"sized twice":           {[]string{"--device", "sim:vram=1GiB", "--vram", "1GiB"}, exitUsage, "give one of them"},
		"verify none":           {[]string{"--verify", "0"}, exitUsage, "--verify 0"},
		"arguments":             {[]string{"extra"}, exitUsage, "vram run takes no arguments"},
		// 80,001 samples are 625 KiB a run: more than the whole device.
		"one run too large": {[]string{"--device", "sim:granularity=64KiB,context=0", "--vram", "512KiB", "--runs", "100",
			"--steps", "80000", "--dt", "0.0005"}, exitFailure, "one run does not fit"},
		"one run too large, hint": {[]string{"--device", "sim:granularity=64KiB,context=0", "--vram", "512KiB", "--runs", "100",
			"--steps", "80000", "--dt", "0.0005", "--double-buffer"}, exitFailure,
			"to make the batch fit: give the simulator more than its 512 KiB (--vram), save fewer samples per run (--samples) or use fewer buffers in flight (--buffers)"},
		"host arrays too large": {[]string{"--device", "sim:pinned=64MiB", "--runs", "1000000", "--steps", "40"}, exitFailure,
			"the host arrays take 339.5 MiB in all; lower --runs or --samples"},
		"address-only device": {[]string{"--device", "sim:backed=false", "--runs", "10", "--steps", "2"}, exitFailure, "not supported"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			stdout, stderr, code := cli(t, "", append([]string{"run", "--json"}, tc.args...)...)
			if code != tc.code {
				t.Errorf("exit %d, want %d; stderr:\n%s", code, tc.code, stderr)
			}
			if stdout != "" {
				t.Errorf("stdout not empty:\n%s", stdout)
			}
			if !strings.Contains(stderr, tc.want) {
				t.Errorf("stderr does not contain %q:\n%s", tc.want, stderr)
			}
		})
	}
}

// vramFlag is --vram as the command line gives it: text set, else the
// default.
func vramFlag(t *testing.T, text string, set bool) sizeFlag {
	t.Helper()
	f := newSizeFlag(defaultRunVRAM, "256MiB")
	if set {
		must(t, f.Set(text))
	}
	return *f
}

func TestSizeRunSpec(t *testing.T) {
	tests := map[string]struct {
		spec      string
		vram      string // --vram given ("": not given, the default 256MiB)
		wantTotal uint64 // the memory the spec gives the device (0: its own)
		wantSrc   string
		wantErr   string
	}{
		"sim default":         {spec: "sim", wantTotal: 256 << 20, wantSrc: `--device "sim" with --vram 256MiB`},
		"auto default":        {spec: "auto", wantTotal: 256 << 20, wantSrc: `--device "auto" with --vram 256MiB`},
		"sim with options":    {spec: "sim:granularity=64KiB", vram: "1MiB", wantTotal: 1 << 20},
		"sim already sized":   {spec: "sim:vram=1GiB", wantTotal: 1 << 30, wantSrc: `--device "sim:vram=1GiB"`},
		"auto already sized":  {spec: "auto:vram=1GiB", wantTotal: 1 << 30},
		"sized twice":         {spec: "sim:vram=1GiB", vram: "2GiB", wantErr: `--device "sim:vram=1GiB" sizes the device and so does --vram 2GiB`},
		"cuda, default cap":   {spec: "cuda:1", wantSrc: `--device "cuda:1"`},
		"cuda, capped":        {spec: "cuda", vram: "4GiB"},
		"auto, capped if GPU": {spec: "auto", vram: "1GiB", wantTotal: 1 << 30},
		"below a page":        {spec: "auto", vram: "1MiB", wantErr: "--vram 1MiB: want at least 2 MiB"},
		"below a small page":  {spec: "sim:granularity=64KiB", vram: "32KiB", wantErr: "want at least 64 KiB"},
		"bytes, no unit":      {spec: "sim", vram: "4096", wantErr: "(read as 4096 bytes"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			spec, err := device.ParseSpec(tc.spec)
			must(t, err)
			src := fmt.Sprintf("--device %q", tc.spec)
			vf := vramFlag(t, tc.vram, tc.vram != "")
			rs, err := sizeRunSpec(spec, src, vf)
			if tc.wantErr != "" {
				var ue usageError
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) || !errors.As(err, &ue) {
					t.Fatalf("error %v, want a usage error containing %q", err, tc.wantErr)
				}
				return
			}
			must(t, err)
			// The spec keeps its text: --vram travels as bytes, and a
			// device of its own memory gets it as a cap.
			if rs.spec.String() != tc.spec || rs.spec.Info().TotalBytes != tc.wantTotal || rs.limit != vf.bytes {
				t.Errorf("sizeRunSpec(%q, --vram %q) = %q of %d bytes, cap %d; want %q of %d bytes, cap %d",
					tc.spec, tc.vram, rs.spec, rs.spec.Info().TotalBytes, rs.limit, tc.spec, tc.wantTotal, vf.bytes)
			}
			if tc.wantSrc != "" && rs.src != tc.wantSrc {
				t.Errorf("source %q, want %q", rs.src, tc.wantSrc)
			}
		})
	}
}

// TestOpenRunDevice checks that a device the spec or --vram sized has
// that memory and no cap.
func TestOpenRunDevice(t *testing.T) {
	tests := map[string]struct {
		spec, vram string
		want       uint64
	}{
		"sim, --vram default": {"sim", "", 256 << 20},
		"sim, --vram":         {"sim:backed=false", "64MiB", 64 << 20},
		"sim, spec sized":     {"sim:vram=32MiB,backed=false", "", 32 << 20},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			a := &app{log: slog.New(slog.DiscardHandler)}
			spec, err := device.ParseSpec(tc.spec)
			must(t, err)
			vf := vramFlag(t, tc.vram, tc.vram != "")
			rd, err := a.openRunDevice(spec, "--device", vf)
			must(t, err)
			defer func() { must(t, rd.dev.Close()) }()
			if rd.info.TotalBytes != tc.want || rd.limit != 0 || rd.fallback != nil {
				t.Errorf("%q with --vram %q: %d bytes, cap %d, fallback %v; want %d bytes, no cap",
					tc.spec, tc.vram, rd.info.TotalBytes, rd.limit, rd.fallback, tc.want)
			}
		})
	}
}

// newTestJob plans, allocates and runs the small batch in-process and
// returns the job, for tests that look inside it.
func newTestJob(t *testing.T) *job {
	t.Helper()
	dev, err := device.Open("sim:granularity=64KiB,context=0,vram=1MiB")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dev.Close() })
	return runTestJob(t, dev, 20000, false)
}

// runTestJob plans, allocates and runs a batch of runs (40 steps, 21
// samples each) on dev, single or double buffered, and frees its host
// arrays and manager when the test ends.
func runTestJob(t *testing.T, dev device.Device, runs int, double bool) *job {
	t.Helper()
	j := prepareTestJob(t, dev, runs, double)
	if _, err := j.pipeline(buffersOf(double)); err != nil {
		t.Fatal(err)
	}
	return j
}

func atoi(s string) int {
	n, _ := strconv.Atoi(s)
	return n
}

// buffersOf is the buffers in flight of a test job: 2 double, else 1.
func buffersOf(double bool) int {
	if double {
		return 2
	}
	return 1
}

// prepareTestJob is runTestJob up to the pipeline: planned and allocated.
func prepareTestJob(t *testing.T, dev device.Device, runs int, double bool) *job {
	t.Helper()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	m, err := vram.New(dev, vram.WithLogger(log))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	k := oscillator.NewPortable()
	t.Cleanup(func() { k.Close() })
	a := &app{ctx: context.Background(), stdout: io.Discard, stderr: io.Discard, log: log}
	js, err := runFlags{runs: runs, steps: 40, samples: 21, dt: 0.01, verify: 64, allocator: "pool"}.check()
	if err != nil {
		t.Fatal(err)
	}
	j := &job{a: a, shape: js, seed: 7, m: m, dev: dev, kernel: k}
	if err := j.allocate(buffersOf(double)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { j.freeHost() })
	return j
}

// TestVerifyCatchesBadResults corrupts results and checks that the job's
// verification reports them: a wrong sample, a bad status.
func TestVerifyCatchesBadResults(t *testing.T) {
	j := newTestJob(t)
	if n, err := j.verify(64); err != nil || n < 64 {
		t.Fatalf("the intact results: verify checked %d runs, error %v", n, err)
	}
	if j.failedRuns() != 0 {
		t.Fatalf("%d failed runs in the intact results", j.failedRuns())
	}
	// The last run of chunk 2 is always checked.
	start, n, err := j.plan.Chunk(1)
	if err != nil {
		t.Fatal(err)
	}
	victim := start + n - 1
	out := j.hOut.Float32s()
	i := (10*2+0)*j.shape.runs + victim // sample 10, x
	saved := out[i]
	out[i] += 0.5
	_, err = j.verify(64)
	if !errors.Is(err, errVerify) || !strings.Contains(err.Error(), fmt.Sprintf("run %d", victim)) || !strings.Contains(err.Error(), "sample 10") {
		t.Errorf("a wrong sample of run %d: verify error %v, want one naming the run and sample", victim, err)
	}
	out[i] = saved

	status := j.hStatus.Int32s()
	status[victim] = 1
	if _, err := j.verify(64); !errors.Is(err, errVerify) || !strings.Contains(err.Error(), "the integration became non-finite (NaN or ±Inf; status 1)") ||
		!strings.Contains(err.Error(), fmt.Sprintf("run %d (", victim)) || !strings.Contains(err.Error(), "chunk 2 of ") {
		t.Errorf("a bad status: verify error %v, want one saying the run became NaN or Inf, with its run and chunk", err)
	}
	if got := j.failedRuns(); got != 1 {
		t.Errorf("failedRuns = %d, want 1", got)
	}
}

// TestVerifyIndicesCoverEveryChunk checks the runs chosen for checking:
// in range, distinct, and the first and last run of every chunk among
// them.
func TestVerifyIndicesCoverEveryChunk(t *testing.T) {
	tests := map[string]struct {
		runs, chunkLength, want int
	}{
		"several chunks":     {20000, 3000, 64},
		"more wanted than n": {10, 4, 64},
		"one wanted":         {1000, 1000, 1},
		"one run":            {1, 1, 64},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			chunks := (tc.runs + tc.chunkLength - 1) / tc.chunkLength
			j := &job{shape: jobShape{runs: tc.runs}, plan: vram.ChunkPlan{Chunks: chunks, ChunkLength: tc.chunkLength, TotalRuns: tc.runs}}
			idx := j.verifyIndices(tc.want)
			seen := map[int]bool{}
			for k, i := range idx {
				if i < 0 || i >= tc.runs || seen[i] || (k > 0 && i < idx[k-1]) {
					t.Fatalf("indices %v: want sorted, distinct, in [0, %d)", idx, tc.runs)
				}
				seen[i] = true
			}
			for c := range chunks {
				start, n, err := j.plan.Chunk(c)
				if err != nil {
					t.Fatal(err)
				}
				if !seen[start] || !seen[start+n-1] {
					t.Errorf("chunk %d [%d, %d) lacks its first or last run in %v", c, start, start+n, idx)
				}
			}
			if len(idx) < min(tc.want, tc.runs) {
				t.Errorf("%d indices, want at least %d", len(idx), min(tc.want, tc.runs))
			}
		})
	}
}

func TestRunAtIsDeterministicAndInRange(t *testing.T) {
	for i := range 1000 {
		r := runAt(3, i)
		if r != runAt(3, i) {
			t.Fatalf("runAt(3, %d) differs between calls", i)
		}
		if r.X0 < -1 || r.X0 >= 1 || r.V0 < -1 || r.V0 >= 1 || r.Omega < 0.5 || r.Omega >= 4 ||
			r.Zeta < 0.02 || r.Zeta >= 0.5 || r.A < 0 || r.A >= 2 || r.Drive < 0.2 || r.Drive >= maxDrive {
			t.Fatalf("runAt(3, %d) = %+v: out of range", i, r)
		}
	}
	if runAt(3, 0) == runAt(4, 0) || runAt(3, 0) == runAt(3, 1) {
		t.Error("different seeds or runs give the same parameters")
	}
}

// TestRunInterrupted checks that a cancelled context (an interrupt)
// stops the job before its next chunk, with exit 1.
func TestRunInterrupted(t *testing.T) {
	for _, double := range []bool{false, true} {
		t.Run(fmt.Sprintf("double=%v", double), func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			var out, errb strings.Builder
			args := append([]string{"run", fmt.Sprintf("--double-buffer=%v", double)}, smallRun...)
			code := runContext(ctx, args, strings.NewReader(""), &out, &errb)
			// Cancelled before it starts, the job stops in its set-up:
			// the allocation takes the context too.
			if code != exitFailure || !strings.Contains(errb.String(), "interrupted while allocating the device arrays, before chunk 1") ||
				!strings.Contains(errb.String(), "no chunk run") || out.Len() != 0 {
				t.Errorf("exit %d, stdout %q, stderr %q; want exit 1, nothing on stdout, and the interrupt named", code, out.String(), errb.String())
			}
		})
	}
}

// TestRunInterruptedDuringChunk cancels the job's context as a chunk
// finishes, the way Ctrl-C lands while the device works: after the first
// chunk the job stops before another (those already enqueued are waited
// for) and not after the last; after the last it stops before verifying.
// Either way it exits 1 and says how many chunks finished.
func TestRunInterruptedDuringChunk(t *testing.T) {
	tests := map[string]struct {
		double bool
		at     int // cancel when this many chunks are done; 0: the last
		want   string
	}{
		"after the first":         {false, 1, `interrupted before chunk (\d+) of (\d+): (\d+) of (\d+) chunks finished, results not verified`},
		"after the first, double": {true, 1, `interrupted before chunk (\d+) of (\d+): (\d+) of (\d+) chunks finished, results not verified`},
		"during the last":         {false, 0, "interrupted after the last chunk: %[1]d of %[1]d chunks finished, results not verified"},
		"during the last, double": {true, 0, "interrupted after the last chunk: %[1]d of %[1]d chunks finished, results not verified"},
		"during the only":         {false, -1, "interrupted after the last chunk: %[1]d of %[1]d chunks finished"},
		"during the only, double": {true, -1, "interrupted after the last chunk: %[1]d of %[1]d chunks finished"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			var out, errb strings.Builder
			chunks := 0
			a := &app{ctx: ctx, stdin: strings.NewReader(""), stdout: &out, stderr: &errb,
				onChunkDone: func(done, of int) {
					chunks = of
					if done == tc.at || (tc.at <= 0 && done == of) {
						cancel()
					}
				}}
			args := append([]string{"run", "--json", fmt.Sprintf("--double-buffer=%v", tc.double)}, smallRun...)
			if tc.at < 0 { // one chunk: the same batch on a device it fits
				args = []string{"run", "--json", fmt.Sprintf("--double-buffer=%v", tc.double), "--device", "sim:vram=64MiB",
					"--runs", "2000", "--steps", "40", "--samples", "21"}
			}
			code := a.execute(args)
			if tc.at < 0 && chunks != 1 {
				t.Fatalf("%d chunks; the test wants a batch of one", chunks)
			}
			if tc.at > 0 && chunks < 4 {
				t.Fatalf("%d chunks; the test wants at least 4", chunks)
			}
			if code != exitFailure || out.Len() != 0 || !strings.Contains(errb.String(), "context canceled") {
				t.Fatalf("exit %d, stdout %q, stderr %q; want exit 1, nothing on stdout, and a cancelled context", code, out.String(), errb.String())
			}
			if tc.at > 0 {
				// Stopped before chunk n+1 with n done: at least the
				// first, not every one of the chunks the batch had.
				m := regexp.MustCompile(tc.want).FindStringSubmatch(errb.String())
				if m == nil || m[2] != m[4] || atoi(m[1]) != atoi(m[3])+1 || atoi(m[3]) < tc.at || atoi(m[3]) >= atoi(m[2]) {
					t.Errorf("stderr %q; want %q with at least %d and not all chunks finished", errb.String(), tc.want, tc.at)
				}
				return
			}
			if want := fmt.Sprintf(tc.want, chunks); !strings.Contains(errb.String(), want) {
				t.Errorf("stderr %q; want %q", errb.String(), want)
			}
		})
	}
}

// TestChunkErrorsCountFromOne makes the second chunk's kernel launch
// fail and checks that the error calls it chunk 2, as the logs and
// interrupts do.
func TestChunkErrorsCountFromOne(t *testing.T) {
	for _, double := range []bool{false, true} {
		t.Run(fmt.Sprintf("double=%v", double), func(t *testing.T) {
			dev, err := sim.New(sim.Config{TotalBytes: units.MiB, Granularity: 64 * units.KiB, NoContext: true})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { dev.Close() })
			j := prepareTestJob(t, dev, 20000, double)
			if j.plan.Chunks < 3 {
				t.Fatalf("%d chunks, want at least 3", j.plan.Chunks)
			}
			// The second launch resets the device and fails.
			dev.Faults().ResetAt(sim.OpLaunch, 2)
			_, err = j.pipeline(buffersOf(double))
			want := fmt.Sprintf("chunk 2 of %d: launch the kernel: ", j.plan.Chunks)
			if !errors.Is(err, sim.ErrInjected) || !strings.Contains(err.Error(), want) {
				t.Errorf("pipeline error %v, want one containing %q", err, want)
			}
		})
	}
}

// TestRK4Limit checks rk4Limit against RK4's stability polynomial: inside
// the region |R(z)| ≤ 1 for every damping ratio the job draws, and not
// far inside it (just past it, the most damped runs grow).
func TestRK4Limit(t *testing.T) {
	r := func(z complex128) float64 {
		return cmplx.Abs(1 + z + z*z/2 + z*z*z/6 + z*z*z*z/24)
	}
	ray := func(zeta, wdt float64) complex128 {
		return complex(-zeta*wdt, math.Sqrt(1-zeta*zeta)*wdt)
	}
	for k := 0; k <= 1000; k++ {
		zeta := minZeta + (maxZeta-minZeta)*float64(k)/1000
		for _, wdt := range []float64{rk4Limit / 4, rk4Limit / 2, rk4Limit} {
			if g := r(ray(zeta, wdt)); g > 1 {
				t.Fatalf("ζ %.4f, ω·dt %.4f: |R| = %.6f > 1: rk4Limit is outside RK4's stability region", zeta, wdt, g)
			}
		}
	}
	if g := r(ray(maxZeta, rk4Limit+0.01)); g <= 1 {
		t.Errorf("ζ %v, ω·dt %v: |R| = %.6f ≤ 1: rk4Limit could be larger", maxZeta, rk4Limit+0.01, g)
	}
}

// TestRunDtAtTheLimit asks for a --dt RK4 cannot take, reads the largest
// allowed one from the message, and runs the batch at that step: it is
// stable, finite and matches the reference.
func TestRunDtAtTheLimit(t *testing.T) {
	base := []string{"run", "--json", "--device", "sim:vram=64MiB", "--runs", "2000", "--steps", "50"}
	_, stderr, code := cli(t, "", append(base, "--dt", "1")...)
	const marker = "want --dt of at most "
	i := strings.Index(stderr, marker)
	if code != exitUsage || i < 0 || !strings.Contains(stderr, "RK4 is unstable") || !strings.Contains(stderr, "largest ω is 3.99") {
		t.Fatalf("--dt 1: exit %d; want %d and the largest allowed dt; stderr:\n%s", code, exitUsage, stderr)
	}
	most := strings.Fields(stderr[i+len(marker):])[0]
	dt, err := strconv.ParseFloat(most, 64)
	if err != nil || dt < 0.6 || dt > rk4Limit/3.99 {
		t.Fatalf("largest dt %q: want about %.3g", most, rk4Limit/4)
	}
	stdout, stderr, code := cli(t, "", append(base, "--dt", most)...)
	if code != exitOK {
		t.Fatalf("--dt %s: exit %d; stderr:\n%s", most, code, stderr)
	}
	var rep runReport
	if err := json.Unmarshal([]byte(stdout), &rep); err != nil {
		t.Fatal(err)
	}
	if !rep.Verified || rep.FailedRuns != 0 {
		t.Errorf("--dt %s: verified %v, %d runs non-finite; want a verified batch", most, rep.Verified, rep.FailedRuns)
	}
	// A batch of one run checks its own ω: a step too large for the
	// batch of 2,000 suits a run of small ω.
	seed := uint64(1)
	for runAt(seed, 0).Omega > 2.5 {
		seed++
	}
	if err := checkStable(1, 1, seed); err != nil {
		t.Errorf("one run of ω %.3g: --dt 1 refused: %v", runAt(seed, 0).Omega, err)
	}
}

func TestPlural(t *testing.T) {
	tests := map[string]struct {
		n    uint64
		noun string
		want string
	}{
		"one":           {1, "cache hit", "1 cache hit"},
		"none":          {0, "free", "0 frees"},
		"y to ies":      {3, "retry", "3 retries"},
		"invariant":     {2, "out of memory", "2 out of memory"},
		"one invariant": {1, "out of memory", "1 out of memory"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if got := plural(tc.n, tc.noun); got != tc.want {
				t.Errorf("plural(%d, %q) = %q, want %q", tc.n, tc.noun, got, tc.want)
			}
		})
	}
}

// TestSocketFlag: vram run names the broker's socket --socket, as vram
// lease and vram broker do; --broker, its first name, still sets it,
// hidden from the help and saying so on stderr when given.
func TestSocketFlag(t *testing.T) {
	tests := map[string]struct {
		args       []string
		env        string
		want       string
		deprecated bool
	}{
		"socket":       {args: []string{"--socket", "/run/a.sock"}, want: "/run/a.sock"},
		"broker alias": {args: []string{"--broker", "/run/b.sock"}, want: "/run/b.sock", deprecated: true},
		"environment":  {env: "/run/env.sock", want: "/run/env.sock"},
		"none":         {want: ""},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Setenv(vram.BrokerEnv, tc.env)
			var stderr strings.Builder
			a := &app{ctx: context.Background(), stdout: io.Discard, stderr: &stderr}
			cmd := a.runCommand()
			cmd.SetErr(&stderr)
			if err := cmd.ParseFlags(tc.args); err != nil {
				t.Fatal(err)
			}
			if got := cmd.Flags().Lookup("socket").Value.String(); got != tc.want {
				t.Errorf("--socket = %q after %q; want %q", got, tc.args, tc.want)
			}
			if said := strings.Contains(stderr.String(), "--broker has been deprecated, use --socket"); said != tc.deprecated {
				t.Errorf("stderr %q; want the deprecation said: %v", stderr.String(), tc.deprecated)
			}
			if f := cmd.Flags().Lookup("broker"); !f.Hidden {
				t.Error("--broker is in the help; want it hidden")
			}
		})
	}
}
