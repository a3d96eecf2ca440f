package batch_test

import (
	"context"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/vramkit/vram/batch"
	"github.com/vramkit/vram/internal/units"
)

// procStatus reads a kB field of /proc/self/status, in bytes.
func procStatus(t *testing.T, field string) uint64 {
	t.Helper()
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Skipf("no /proc/self/status: %v", err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, field+":"); ok {
			kb, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			if err != nil {
				t.Fatalf("%s: %q: %v", field, line, err)
			}
			return kb << 10
		}
	}
	t.Skipf("no %s in /proc/self/status", field)
	return 0
}

// A batch staged under a host limit, re-cut to chunks half as long and
// back while it runs, never asks for more pinned memory than the limit
// (the simulator's PinnedBytes peak: what the library asked for), and
// its process's RSS stays within the limit and the device memory it may
// use (its cap) of what it was before (VmHWM, reset first), give or take
// 16 MiB for the runtime's own (it takes about 1). The simulator's pinned buffers used to be Go heap:
// freed at a re-cut, they stayed resident until the collector ran, and
// the new slots came on top of them (the test collects just before each
// re-cut, so that the collector's next run is a heap's worth away, as in
// a job whose heap holds its pinned host arrays).
func TestRunHostMemWithinLimit(t *testing.T) {
	const (
		runs, chunkRuns = 64 << 20, 8 << 20
		devBytes        = 128 << 20
		limit           = 160 << 20 // chunks of 8M runs: 32 MiB a slot, 5 slots
		slack           = 16 << 20
	)
	if raceOn {
		// Every address instrumented code touches has shadow memory in
		// RSS, twice its size or more: .ci/run runs this test without it.
		t.Skip("RSS is not the library's under the race detector (its shadow memory counts); run without -race")
	}
	f := newStaged(t, runs, chunkRuns, devBytes, limit)
	if err := os.WriteFile("/proc/self/clear_refs", []byte("5"), 0); err != nil {
		t.Skipf("cannot reset the peak RSS: %v", err)
	}
	before := procStatus(t, "VmRSS")
	caps := map[int]uint64{2: f.cap / 2, 5: f.cap}
	rep, err := f.b.Run(context.Background(), batch.Options{Grow: true}, f.compute(func(ch *batch.Chunk) {
		if c, ok := caps[ch.Index]; ok {
			delete(caps, ch.Index)
			runtime.GC()
			must(t, f.m.Account().SetCap(c))
		}
	}))
	must(t, err)
	peak := procStatus(t, "VmHWM")
	_, pinned := f.dev.PinnedBytes()
	if f.bad != 0 || rep.Runs != runs || len(rep.Recuts) < 2 {
		t.Fatalf("%d wrong results, %d runs of %d, re-cuts %+v: want two at least", f.bad, rep.Runs, runs, rep.Recuts)
	}
	if pinned > limit {
		t.Errorf("the library pinned %s at most; want at most the %s limit", units.Format(pinned), units.Format(limit))
	}
	if grew := peak - min(peak, before); grew > limit+f.cap+slack {
		t.Errorf("RSS grew by %s in the batch (from %s to a peak of %s); want at most the host limit %s, the device memory's cap %s and %s",
			units.Format(grew), units.Format(before), units.Format(peak), units.Format(limit), units.Format(f.cap), units.Format(slack))
	}
	t.Logf("RSS %s before, peak %s; %s pinned at most; %d re-cuts", units.Format(before), units.Format(peak), units.Format(pinned), len(rep.Recuts))
}
