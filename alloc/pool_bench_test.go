package alloc_test

import (
	"fmt"
	"sync"
	"testing"

	"github.com/vramkit/vram/alloc"
	"github.com/vramkit/vram/device"
	"github.com/vramkit/vram/device/sim"
	"github.com/vramkit/vram/internal/units"
)

// benchPool is a Pool on an address-only simulated device, closed with the
// benchmark.
func benchPool(b *testing.B) (*sim.Device, *alloc.Pool) {
	b.Helper()
	dev := openSimT(b, sim.Config{TotalBytes: 16 * units.GiB, AddressOnly: true, NoContext: true})
	p, err := alloc.NewPool(dev, alloc.PoolConfig{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { p.Close() })
	return dev, p
}

var hitSizes = []uint64{4 * units.KiB, units.MiB, 8 * units.MiB, 64 * units.MiB}

// BenchmarkPoolHit measures the cache-hit path: an Alloc and Free pair of
// a size the pool holds free, on one goroutine and stream. One op is one
// pair.
func BenchmarkPoolHit(b *testing.B) {
	for _, n := range hitSizes {
		b.Run(units.Format(n), func(b *testing.B) {
			dev, p := benchPool(b)
			s := dev.DefaultStream()
			warm, err := p.Alloc(n, s)
			if err != nil {
				b.Fatal(err)
			}
			if err := p.Free(warm, s); err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			for b.Loop() {
				ptr, err := p.Alloc(n, s)
				if err != nil {
					b.Fatal(err)
				}
				if err := p.Free(ptr, s); err != nil {
					b.Fatal(err)
				}
			}
			if st := p.Stats(); st.DeviceAllocs != 1 {
				b.Fatalf("hit path made %d device allocations", st.DeviceAllocs)
			}
		})
	}
}

// BenchmarkPoolHitStreams runs the same pairs from several goroutines,
// each on its own stream; one op is one pair, whichever goroutine made it.
func BenchmarkPoolHitStreams(b *testing.B) {
	for _, g := range []int{2, 4} {
		b.Run(fmt.Sprintf("%dgoroutines", g), func(b *testing.B) {
			dev, p := benchPool(b)
			n := 64 * units.KiB
			streams := make([]device.Stream, g)
			for i := range streams {
				s, err := dev.NewStream()
				if err != nil {
					b.Fatal(err)
				}
				b.Cleanup(func() { s.Close() })
				streams[i] = s
				warm, err := p.Alloc(n, s)
				if err != nil {
					b.Fatal(err)
				}
				if err := p.Free(warm, s); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportAllocs()
			b.ResetTimer()
			var wg sync.WaitGroup
			errs := make(chan error, g)
			for i, s := range streams {
				iters := b.N / g
				if i < b.N%g {
					iters++
				}
				wg.Add(1)
				go func() {
					defer wg.Done()
					for range iters {
						ptr, err := p.Alloc(n, s)
						if err != nil {
							errs <- err
							return
						}
						if err := p.Free(ptr, s); err != nil {
							errs <- err
							return
						}
					}
				}()
			}
			wg.Wait()
			b.StopTimer()
			close(errs)
			for err := range errs {
				b.Fatal(err)
			}
		})
	}
}

// BenchmarkPoolChurn allocates and frees blocks of mixed sizes in a
// sliding window, so that splitting, coalescing and best fit all work.
func BenchmarkPoolChurn(b *testing.B) {
	dev, p := benchPool(b)
	s := dev.DefaultStream()
	const window = 256
	var ring [window]device.Ptr
	sizes := [...]uint64{512, 3 * units.KiB, 40 * units.KiB, 700 * units.KiB, 2 * units.MiB, 9 * units.MiB, 24 * units.MiB}
	i := 0
	b.ReportAllocs()
	for b.Loop() {
		slot := i % window
		if ring[slot] != 0 {
			if err := p.Free(ring[slot], s); err != nil {
				b.Fatal(err)
			}
		}
		ptr, err := p.Alloc(sizes[(i*7+i/window)%len(sizes)], s)
		if err != nil {
			b.Fatal(err)
		}
		ring[slot] = ptr
		i++
	}
}

// pairSizes are the sizes of the Direct and AsyncPool pair benchmarks: a
// small block and one of several device pages.
var pairSizes = []uint64{64 * units.KiB, 8 * units.MiB}

// benchPair times Alloc and Free pairs of n bytes on s; one op is one pair.
func benchPair(b *testing.B, a alloc.Allocator, n uint64, s device.Stream) {
	b.Helper()
	b.ReportAllocs()
	for b.Loop() {
		ptr, err := a.Alloc(n, s)
		if err != nil {
			b.Fatal(err)
		}
		if err := a.Free(ptr, s); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkDirectPair is the baseline for BenchmarkPoolHit: every pair is
// a simulated device Malloc and Free.
func BenchmarkDirectPair(b *testing.B) {
	for _, n := range pairSizes {
		b.Run(units.Format(n), func(b *testing.B) {
			dev := openSimT(b, sim.Config{TotalBytes: 16 * units.GiB, AddressOnly: true, NoContext: true})
			d := alloc.NewDirect(dev)
			b.Cleanup(func() { d.Close() })
			benchPair(b, d, n, dev.DefaultStream())
		})
	}
}

// BenchmarkAsyncPoolPair: every pair is a MallocAsync and FreeAsync of the
// simulator's stream-ordered pool, which reuses the block on the same
// stream.
func BenchmarkAsyncPoolPair(b *testing.B) {
	for _, n := range pairSizes {
		b.Run(units.Format(n), func(b *testing.B) {
			dev := openSimT(b, sim.Config{TotalBytes: 16 * units.GiB, AddressOnly: true, NoContext: true})
			a, err := alloc.NewAsyncPool(dev, alloc.AsyncConfig{})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { a.Close() })
			benchPair(b, a, n, dev.DefaultStream())
		})
	}
}
