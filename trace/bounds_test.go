package trace_test

import (
	"context"
	"errors"
	"testing"

	"github.com/vramkit/vram/alloc"
	"github.com/vramkit/vram/device"
	"github.com/vramkit/vram/device/sim"
	"github.com/vramkit/vram/trace"
)

// streamLog is a log of n allocations, each on a stream of its own, each
// freed at once.
func streamLog(n int) []trace.Event {
	events := make([]trace.Event, 0, 2*n)
	for i := range n {
		p := uint64(i+1) << 12
		events = append(events,
			trace.Event{Action: trace.Allocate, Pointer: p, Size: 4096, Stream: uint64(i + 1)},
			trace.Event{Action: trace.Free, Pointer: p, Size: 4096, Stream: uint64(i + 1)})
	}
	return events
}

// A log of more distinct streams than MaxStreams is refused, before any
// stream is made; one of MaxStreams streams replays (each stream once cost
// O(n) to make and close, so 60,000 took a minute).
func TestReplayStreamBound(t *testing.T) {
	for name, tc := range map[string]struct {
		streams int
		refused bool
	}{
		"200,000 streams": {200000, true},
		"MaxStreams + 1":  {trace.MaxStreams + 1, true},
		"MaxStreams":      {trace.MaxStreams, false},
	} {
		t.Run(name, func(t *testing.T) {
			if !tc.refused && testing.Short() {
				t.Skip("replays 65,536 streams")
			}
			events := streamLog(tc.streams)
			res, err := trace.ReplayOn(events, simFor(events), allocators["Direct"], trace.Options{})
			if tc.refused {
				if !errors.Is(err, trace.ErrTooLarge) {
					t.Fatalf("replay of %d streams: %v, want ErrTooLarge", tc.streams, err)
				}
				return
			}
			if err != nil || res.Allocs != tc.streams {
				t.Fatalf("replay of %d streams: %d allocations, %v", tc.streams, res.Allocs, err)
			}
		})
	}
}

// cancelling wraps an allocator and cancels a context at its nth Alloc,
// counting the calls made after.
type cancelling struct {
	alloc.Allocator
	n, calls, after int
	cancel          context.CancelFunc
}

func (c *cancelling) Alloc(n uint64, s device.Stream) (device.Ptr, error) {
	c.calls++
	if c.calls == c.n {
		c.cancel()
	} else if c.calls > c.n {
		c.after++
	}
	return c.Allocator.Alloc(n, s)
}

// A cancelled replay stops within a bounded number of allocator calls,
// not at the end of the log: counted, not timed, so load cannot fail it.
func TestReplayCancel(t *testing.T) {
	events := make([]trace.Event, 0, 200000)
	for i := range 100000 {
		p := uint64(i+1) << 12
		events = append(events,
			trace.Event{Action: trace.Allocate, Pointer: p, Size: 512},
			trace.Event{Action: trace.Free, Pointer: p, Size: 512})
	}
	dev, err := sim.New(simConfig(events))
	check(t, err)
	defer func() { check(t, dev.Close()) }()
	base, err := alloc.NewPool(dev, alloc.PoolConfig{})
	check(t, err)
	defer func() { check(t, base.Close()) }()
	for _, at := range []int{1, 1000, 90000} {
		ctx, cancel := context.WithCancel(context.Background())
		a := &cancelling{Allocator: base, n: at, cancel: cancel}
		res, err := trace.ReplayContext(ctx, events, a, trace.Options{Device: dev})
		cancel()
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("cancelled at allocation %d: %v, want context.Canceled", at, err)
		}
		if a.after > 256 {
			t.Errorf("cancelled at allocation %d, the replay made %d more", at, a.after)
		}
		if res.Allocs != res.Frees && res.Allocs != res.Frees+1 {
			t.Errorf("partial result: %d allocs, %d frees", res.Allocs, res.Frees)
		}
		check(t, base.Trim())
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err = trace.ReplayOnContext(ctx, events, simFor(events), allocators["Pool"], trace.Options{})
	if !errors.Is(err, context.Canceled) {
		t.Errorf("replay under a cancelled context: %v, want context.Canceled", err)
	}
}

func check(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
