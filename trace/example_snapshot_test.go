package trace_test

import (
	"bytes"
	"fmt"
	"strings"

	"github.com/vramkit/vram/alloc"
	"github.com/vramkit/vram/device"
	"github.com/vramkit/vram/internal/units"
	"github.com/vramkit/vram/trace"
)

// A replay recorded as a PyTorch memory snapshot, and the snapshot read
// back as a log (a file written by torch.cuda.memory._dump_snapshot reads
// the same way, with ReadSnapshotFile).
func ExampleRecordReplay() {
	events, err := trace.Read(strings.NewReader(exampleLog))
	if err != nil {
		panic(err)
	}
	_, h, err := trace.RecordReplay(events, simFor(events), func(dev device.Device) (alloc.Allocator, error) {
		return alloc.NewPool(dev, alloc.PoolConfig{})
	}, trace.Options{})
	if err != nil {
		panic(err)
	}
	var pickle bytes.Buffer // what --snapshot-out writes, for pytorch.org/memory_viz
	if err := trace.WriteSnapshot(&pickle, h); err != nil {
		panic(err)
	}
	snap, err := trace.ReadSnapshot(&pickle)
	if err != nil {
		panic(err)
	}
	s := trace.Summarize(snap.Events)
	fmt.Println(len(h.Segments), "segments held at the end;", s.Allocs, "allocs,", s.Frees, "frees")
	fmt.Println("peak live:", units.Format(s.PeakLive), "peak reserved:", units.Format(snap.PyTorch.PeakReserved))
	// Output:
	// 2 segments held at the end; 3 allocs, 2 frees
	// peak live: 4 MiB peak reserved: 22 MiB
}
