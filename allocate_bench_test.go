package vram

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/vramkit/vram/account"
	"github.com/vramkit/vram/device"
	"github.com/vramkit/vram/device/sim"
	"github.com/vramkit/vram/internal/units"
)

// BenchmarkAllocateBesideLongKernels measures one group's Allocate (queue
// 4 arrays of 1 MiB, allocate them, free them) on a 256 MiB simulator,
// alone and beside a second group that runs 20 ms kernels back to back on
// its own stream, allocating and freeing an 8 MiB array around each, so
// that the allocator always caches memory that group's stream has still
// to reach. An Allocate that waits for the other group's work (a trim at
// every budget read once did) takes about a kernel; one that does not
// stays at its cost alone. BENCHMARKS.md has the figures.
func BenchmarkAllocateBesideLongKernels(b *testing.B) {
	for _, beside := range []bool{false, true} {
		name := "alone"
		if beside {
			name = "beside 20ms kernels"
		}
		b.Run(name, func(b *testing.B) {
			dev, err := sim.New(sim.Config{TotalBytes: 256 * units.MiB, NoContext: true})
			if err != nil {
				b.Fatal(err)
			}
			defer dev.Close()
			m, err := New(dev, WithAllocatorChoice(account.Choice{Kind: Pool}))
			if err != nil {
				b.Fatal(err)
			}
			defer m.Close()
			if beside {
				stop := longKernelsLoop(b, m, dev)
				defer stop()
			}
			c, err := m.Register(ClientOptions{Name: "measured", Group: "measured"})
			if err != nil {
				b.Fatal(err)
			}
			reqs := map[string]ArrayRequest{}
			for _, l := range []string{"a", "b", "c", "d"} {
				reqs[l] = ArrayRequest{Shape: []int{1 << 20}, DType: Uint8, Unchunkable: true}
			}
			for b.Loop() {
				if err := c.Queue(reqs); err != nil {
					b.Fatal(err)
				}
				if _, err := c.Allocate(context.Background()); err != nil {
					b.Fatal(err)
				}
				for l := range reqs {
					if err := c.Free(l); err != nil {
						b.Fatal(err)
					}
				}
			}
		})
	}
}

// longKernelsLoop runs, until stop, a client of its own group that
// allocates an 8 MiB array, launches a 20 ms kernel on its stream and
// frees the array behind it, again and again.
func longKernelsLoop(b *testing.B, m *Manager, dev *sim.Device) (stop func()) {
	k, err := m.Register(ClientOptions{Name: "kernels", Group: "kernels"})
	if err != nil {
		b.Fatal(err)
	}
	s, err := k.Stream()
	if err != nil {
		b.Fatal(err)
	}
	quit := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		x := map[string]ArrayRequest{"x": {Shape: []int{8 << 20}, DType: Uint8, Unchunkable: true}}
		for {
			select {
			case <-quit:
				return
			default:
			}
			if err := k.Queue(x); err != nil {
				b.Error(err)
				return
			}
			if _, err := k.Allocate(context.Background()); err != nil {
				b.Error(err)
				return
			}
			if err := dev.LaunchFunc(s, 1, func(device.View, int, int) error { time.Sleep(20 * time.Millisecond); return nil }); err != nil {
				b.Error(err)
				return
			}
			if err := k.Free("x"); err != nil {
				b.Error(err)
				return
			}
			if err := k.Sync(context.Background()); err != nil {
				b.Error(err)
				return
			}
		}
	}()
	// The first kernel is running, its array freed behind it.
	time.Sleep(5 * time.Millisecond)
	return func() {
		close(quit)
		wg.Wait()
	}
}
