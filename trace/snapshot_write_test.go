package trace_test

import (
	"bytes"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/vramkit/vram/trace"
)

// snapshotLog is a small log with frees out of order, a block left live
// at the end, sizes above and below a MiB, and two streams.
func snapshotLog() []trace.Event {
	var ev []trace.Event
	for i := range 40 {
		size := uint64(512 << (i % 14)) // 512 B to 4 MiB
		ev = append(ev, trace.Event{Time: float64(len(ev)) * 1e-3, Action: trace.Allocate,
			Pointer: uint64(0x1000 + i), Size: size, Stream: uint64(i % 2)})
		if i%3 == 2 {
			for _, j := range []int{i - 1, i - 2} {
				ev = append(ev, trace.Event{Time: float64(len(ev)) * 1e-3, Action: trace.Free,
					Pointer: uint64(0x1000 + j), Size: uint64(512 << (j % 14)), Stream: uint64(j % 2)})
			}
		}
	}
	return ev
}

// TestRecordReplaySnapshot records a replay against each allocator,
// checks the history in Go (read back, it gives the log's allocations,
// frees and peak), and has Python's pickle load it and check the
// structure PyTorch's memory visualizer reads.
func TestRecordReplaySnapshot(t *testing.T) {
	python, pyErr := exec.LookPath("python3")
	events := snapshotLog()
	sum := trace.Summarize(events)
	for name, newAlloc := range allocators {
		t.Run(name, func(t *testing.T) {
			res, h, err := trace.RecordReplay(events, trace.SimConfig(events), newAlloc, trace.Options{})
			if err != nil {
				t.Fatal(err)
			}
			if res.Allocs != sum.Allocs || res.Frees != sum.Frees {
				t.Fatalf("replayed %d allocs and %d frees, want %d and %d", res.Allocs, res.Frees, sum.Allocs, sum.Frees)
			}
			if len(h.Segments) == 0 {
				t.Fatalf("no segments held at the end, though %d blocks are live", sum.BlocksAtEnd)
			}
			var buf bytes.Buffer
			if err := trace.WriteSnapshot(&buf, h); err != nil {
				t.Fatal(err)
			}
			back, err := trace.ReadSnapshot(bytes.NewReader(buf.Bytes()))
			if err != nil {
				t.Fatal(err)
			}
			got := trace.Summarize(back.Events)
			if got.Allocs != sum.Allocs || got.Frees != sum.Frees || got.PeakLive != sum.PeakLive || back.LiveAtStart != 0 {
				t.Errorf("read back: %d allocs, %d frees, peak live %d, %d live at start; want %d, %d, %d, 0",
					got.Allocs, got.Frees, got.PeakLive, back.LiveAtStart, sum.Allocs, sum.Frees, sum.PeakLive)
			}
			// The driver's pool behind AsyncPool reserves more than the
			// allocations the history sees.
			if r := back.PyTorch.PeakReserved; r != res.PeakReserved && (name != "AsyncPool" || r > res.PeakReserved) {
				t.Errorf("read back: peak reserved %d, the replay's %d", r, res.PeakReserved)
			}
			if pyErr != nil {
				t.Skipf("python3 not found (%v): the pickle was not checked by Python", pyErr)
			}
			path := filepath.Join(t.TempDir(), "snapshot.pickle")
			if err := trace.WriteSnapshotFile(path, h); err != nil {
				t.Fatal(err)
			}
			out, err := exec.Command(python, filepath.Join("testdata", "check_snapshot.py"), path,
				strconv.Itoa(sum.Allocs), strconv.Itoa(sum.Frees)).CombinedOutput()
			if err != nil {
				t.Fatalf("python3 check_snapshot.py: %v\n%s", err, out)
			}
		})
	}
}
