package trace_test

import (
	"bytes"
	"maps"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/vramkit/vram/alloc"
	"github.com/vramkit/vram/device"
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
	all := maps.Clone(allocators)
	all["Expandable"] = func(dev device.Device) (alloc.Allocator, error) {
		return alloc.NewExpandable(dev, alloc.ExpandableConfig{})
	}
	all["AsyncPool/ReleaseAtSync"] = func(dev device.Device) (alloc.Allocator, error) {
		return alloc.NewAsyncPool(dev, alloc.AsyncConfig{ReleaseAtSync: true})
	}
	for name, newAlloc := range all {
		t.Run(name, func(t *testing.T) {
			res, h, err := trace.RecordReplay(events, simFor(events), newAlloc, trace.Options{})
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
			// The snapshot agrees with the replay's own row: its peak
			// reserved bytes, and (but for Expandable, whose growths are
			// page maps) its device allocations and frees. AsyncPool's are
			// the driver pool's reservations, as the allocator saw them.
			t.Logf("%d device allocs, %d device frees, peak reserved %d", res.DeviceAllocs, res.DeviceFrees, res.PeakReserved)
			if r := back.PyTorch.PeakReserved; r != res.PeakReserved {
				t.Errorf("read back: peak reserved %d, the replay's %d", r, res.PeakReserved)
			}
			if p := back.PyTorch; name != "Expandable" && (uint64(p.SegmentAllocs) != res.DeviceAllocs || uint64(p.SegmentFrees) != res.DeviceFrees) {
				t.Errorf("read back: %d segment allocs and %d frees, the replay's %d device allocs and %d frees",
					p.SegmentAllocs, p.SegmentFrees, res.DeviceAllocs, res.DeviceFrees)
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

// TestRecordReplayExpandableSegments: an allocator that maps pages
// (Expandable) is recorded as PyTorch records expandable segments: a
// "segment_map" per mapping and "segment_unmap" per unmapping, and, at the
// end, the pages that touch as one segment marked expandable, so that a
// block live across several pages lies in one segment.
func TestRecordReplayExpandableSegments(t *testing.T) {
	const mib = 1 << 20
	events := []trace.Event{
		{Action: trace.Allocate, Pointer: 1, Size: mib},
		{Action: trace.Allocate, Pointer: 2, Size: 7 * mib}, // across four 2 MiB pages
		{Action: trace.Allocate, Pointer: 3, Size: 9 * mib},
		{Action: trace.Free, Pointer: 3, Size: 9 * mib},
	}
	newAlloc := func(dev device.Device) (alloc.Allocator, error) {
		return alloc.NewExpandable(dev, alloc.ExpandableConfig{})
	}
	_, h, err := trace.RecordReplay(events, simFor(events), newAlloc, trace.Options{})
	if err != nil {
		t.Fatal(err)
	}
	maps := 0
	for _, e := range h.Entries {
		if e.Action == "segment_alloc" {
			t.Errorf("entry %+v: want segment_map for a page mapping", e)
		}
		if e.Action == "segment_map" {
			maps++
		}
	}
	if maps < 4 {
		t.Errorf("%d segment_map entries; want at least 4 for 8 MiB of 2 MiB pages", maps)
	}
	var live uint64
	for _, s := range h.Segments {
		if !s.Expandable {
			t.Errorf("segment %+v not marked expandable", s)
		}
		at := s.Addr
		for _, b := range s.Blocks {
			if b.Addr != at || b.Addr+b.Size > s.Addr+s.Size {
				t.Fatalf("segment at %#x of %d bytes: block %+v does not tile it", s.Addr, s.Size, b)
			}
			at += b.Size
			if b.Allocated {
				live += b.Size
			}
		}
	}
	if live != 8*mib {
		t.Errorf("segments hold %d live bytes; want %d", live, 8*mib)
	}
}
