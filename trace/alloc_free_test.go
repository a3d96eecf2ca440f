package trace_test

import (
	"testing"

	"github.com/vramkit/vram/alloc"
	"github.com/vramkit/vram/device"
	"github.com/vramkit/vram/device/sim"
	"github.com/vramkit/vram/internal/units"
	"github.com/vramkit/vram/trace"
)

// bump is an allocator that never allocates on the heap: addresses come
// from a counter and frees are only counted. It measures Replay's own
// cost, apart from any real allocator's.
type bump struct {
	next device.Ptr
	st   alloc.Stats
}

func (b *bump) Alloc(n uint64, _ device.Stream) (device.Ptr, error) {
	b.next += 1 << 20
	b.st.Allocs++
	return b.next, nil
}
func (b *bump) Free(device.Ptr, device.Stream) error { b.st.Frees++; return nil }
func (b *bump) Stats() alloc.Stats                   { return b.st }
func (b *bump) Trim() error                          { return nil }
func (b *bump) Close() error                         { return nil }

// TestReplayLoopDoesNotAllocate: Replay's heap allocations do not grow
// with the number of events (they are the compiled program's slices and
// map, made once).
func TestReplayLoopDoesNotAllocate(t *testing.T) {
	dev, err := sim.New(sim.Config{TotalBytes: units.GiB, AddressOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Close()
	log := func(n int) []trace.Event {
		var events []trace.Event
		for i := range n {
			events = append(events,
				trace.Event{Action: trace.Allocate, Pointer: uint64(i%64 + 1), Size: 512},
				trace.Event{Action: trace.Free, Pointer: uint64(i%64 + 1), Size: 512})
		}
		return events
	}
	small, large := log(20000), log(80000) // both past the map's initial size
	allocs := func(events []trace.Event) float64 {
		return testing.AllocsPerRun(5, func() {
			if _, err := trace.Replay(events, &bump{}, trace.Options{Device: dev, Samples: 100}); err != nil {
				t.Fatal(err)
			}
		})
	}
	a, b := allocs(small), allocs(large)
	t.Logf("heap allocations per replay: %.0f for %d events, %.0f for %d events", a, len(small), b, len(large))
	if b > a+2 {
		t.Errorf("Replay allocates per event: %.0f allocations for %d events, %.0f for %d", a, len(small), b, len(large))
	}
}

// BenchmarkReplayLoop is Replay's own cost per event, on an allocator
// that costs nothing.
func BenchmarkReplayLoop(b *testing.B) {
	dev, err := sim.New(sim.Config{TotalBytes: units.GiB, AddressOnly: true})
	if err != nil {
		b.Fatal(err)
	}
	defer dev.Close()
	var events []trace.Event
	for i := range 50000 {
		events = append(events,
			trace.Event{Action: trace.Allocate, Pointer: uint64(i%1000 + 1), Size: 4096},
			trace.Event{Action: trace.Free, Pointer: uint64(i%1000 + 1), Size: 4096})
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := trace.Replay(events, &bump{}, trace.Options{Device: dev}); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(len(events))*float64(b.N)/b.Elapsed().Seconds(), "events/s")
}
