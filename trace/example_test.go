package trace_test

import (
	"fmt"
	"os"
	"strings"

	"github.com/vramkit/vram/alloc"
	"github.com/vramkit/vram/device"
	"github.com/vramkit/vram/device/sim"
	"github.com/vramkit/vram/internal/units"
	"github.com/vramkit/vram/trace"
)

const exampleLog = `Thread,Time,Action,Pointer,Size,Stream
0,0.0,allocate,0x7f0000000000,3145728,0
0,0.1,allocate,0x7f0000400000,1048576,0
0,0.2,free,0x7f0000000000,3145728,0
0,0.3,free,0x7f00deadbeef,512,0
0,0.4,allocate,0x7f0000000000,2097152,0
0,0.5,free,0x7f0000400000,1048576,0
`

func ExampleRead() {
	events, err := trace.Read(strings.NewReader(exampleLog))
	if err != nil {
		panic(err)
	}
	fmt.Println(len(events), "events; first:", events[0])
	s := trace.Summarize(events)
	fmt.Println("peak live:", units.Format(s.PeakLive), "unmatched frees:", s.UnmatchedFrees)
	// Output:
	// 6 events; first: 0,0,allocate,0x7f0000000000,3145728,0
	// peak live: 4 MiB unmatched frees: 1
}

func ExampleReplayOn() {
	events, err := trace.Read(strings.NewReader(exampleLog))
	if err != nil {
		panic(err)
	}
	newPool := func(dev device.Device) (alloc.Allocator, error) {
		return alloc.NewAsyncPool(dev, alloc.AsyncConfig{})
	}
	// A fresh simulator for the replay, sized for the log: address-only,
	// so even a log that peaked at tens of GB costs the host nothing.
	cfg := sim.Config{TotalBytes: trace.DeviceBytes(events, sim.DefaultGranularity), AddressOnly: true, NoContext: true}
	// The device pool grows by whole 2 MiB granules: 3 MiB takes 4 MiB,
	// and the next 1 MiB fits in what is left.
	res, err := trace.ReplayOn(events, sim.Factory(cfg), newPool, trace.Options{})
	if err != nil {
		panic(err)
	}
	fmt.Println("peak live:", units.Format(res.PeakLive))
	fmt.Println("peak reserved:", units.Format(res.PeakReserved))
	fmt.Println("device allocations:", res.DeviceAllocs, "cache hits:", res.CacheHits)
	fmt.Println("unmatched frees skipped:", res.UnmatchedFrees)
	// Output:
	// peak live: 4 MiB
	// peak reserved: 4 MiB
	// device allocations: 1 cache hits: 2
	// unmatched frees skipped: 1
}

func ExampleWrite() {
	events := []trace.Event{
		{Thread: 1, Time: 0.5, Action: trace.Allocate, Pointer: 0x1000, Size: 256},
		{Thread: 1, Time: 0.75, Action: trace.Free, Pointer: 0x1000, Size: 256},
	}
	if err := trace.Write(os.Stdout, events); err != nil {
		panic(err)
	}
	// Output:
	// Thread,Time,Action,Pointer,Size,Stream
	// 1,0.5,allocate,0x1000,256,0
	// 1,0.75,free,0x1000,256,0
}
