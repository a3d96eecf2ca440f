package alloc_test

import (
	"fmt"
	"sync"
	"sync/atomic"
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
			pairsOnStreams(b, p, n, streams)
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

// eventCounter is a simulated device that counts the event calls made on
// it, so a benchmark can report what the stream-ordering rules cost in
// device calls.
type eventCounter struct {
	*sim.Device
	made, records, queries atomic.Int64
}

func (d *eventCounter) NewEvent() (device.Event, error) {
	ev, err := d.Device.NewEvent()
	if err != nil {
		return nil, err
	}
	d.made.Add(1)
	return &countedEvent{Event: ev, d: d}, nil
}

type countedEvent struct {
	device.Event
	d *eventCounter
}

func (e *countedEvent) Record(s device.Stream) error {
	e.d.records.Add(1)
	return e.Event.Record(s)
}

func (e *countedEvent) Query() (bool, error) {
	e.d.queries.Add(1)
	return e.Event.Query()
}

// BenchmarkPoolTwoStreams measures what a free costs once a pool is used
// from two streams (fence.go, "When events are recorded"), with the
// event calls per op as metrics. One op is one Alloc and Free pair.
//
//   - "own stream": each of two goroutines allocates and frees on its own
//     stream (BenchmarkPoolHitStreams's pattern): every free records an
//     event, since its stream's event in flight guards no block.
//   - "handoff": one goroutine alternates streams, so every Alloc takes
//     the block the other stream just freed: the free records an event,
//     and the Alloc misses its own set, queries that event, finds it
//     complete and takes the block.
func BenchmarkPoolTwoStreams(b *testing.B) {
	setup := func(b *testing.B) (*eventCounter, *alloc.Pool, [2]device.Stream) {
		dev := &eventCounter{Device: openSimT(b, sim.Config{TotalBytes: 16 * units.GiB, AddressOnly: true, NoContext: true})}
		p, err := alloc.NewPool(dev, alloc.PoolConfig{})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { p.Close() })
		var ss [2]device.Stream
		for i := range ss {
			s, err := dev.NewStream()
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { s.Close() })
			ss[i] = s
		}
		return dev, p, ss
	}
	// report gives the event calls per op as metrics; warm is the
	// device allocations made before the timed loop, which must make none.
	report := func(b *testing.B, dev *eventCounter, p *alloc.Pool, warm uint64) {
		n := float64(b.N)
		b.ReportMetric(float64(dev.records.Load())/n, "records/op")
		b.ReportMetric(float64(dev.queries.Load())/n, "queries/op")
		if st := p.Stats(); st.DeviceAllocs != warm {
			b.Fatalf("%d device allocations, want the %d made warming up", st.DeviceAllocs, warm)
		}
	}
	const n = 64 * units.KiB
	b.Run("own stream", func(b *testing.B) {
		dev, p, ss := setup(b)
		// Each stream gets a block of its own, both live at once.
		var warmed [2]device.Ptr
		for i, s := range ss {
			ptr, err := p.Alloc(n, s)
			if err != nil {
				b.Fatal(err)
			}
			warmed[i] = ptr
		}
		for i, s := range ss {
			if err := p.Free(warmed[i], s); err != nil {
				b.Fatal(err)
			}
		}
		warm := p.Stats().DeviceAllocs
		b.ReportAllocs()
		dev.records.Store(0)
		dev.queries.Store(0)
		b.ResetTimer()
		pairsOnStreams(b, p, n, ss[:])
		report(b, dev, p, warm)
	})
	b.Run("handoff", func(b *testing.B) {
		dev, p, ss := setup(b)
		ptr, err := p.Alloc(n, ss[0])
		if err != nil {
			b.Fatal(err)
		}
		if err := p.Free(ptr, ss[0]); err != nil {
			b.Fatal(err)
		}
		b.ReportAllocs()
		dev.records.Store(0)
		dev.queries.Store(0)
		i := 1
		for b.Loop() {
			s := ss[i&1]
			i++
			q, err := p.Alloc(n, s)
			if err != nil {
				b.Fatal(err)
			}
			if q != ptr {
				b.Fatalf("Alloc on stream %d got %v, want the block the other stream freed (%v)", s.Handle(), q, ptr)
			}
			if err := p.Free(q, s); err != nil {
				b.Fatal(err)
			}
		}
		report(b, dev, p, 1)
	})
}

// pairsOnStreams runs b.N Alloc+Free pairs of n bytes on p, split evenly
// over one goroutine per stream, each on its own stream, and stops the
// timer when they are done.
func pairsOnStreams(b *testing.B, p *alloc.Pool, n uint64, streams []device.Stream) {
	var wg sync.WaitGroup
	errs := make(chan error, len(streams))
	for i, s := range streams {
		iters := b.N / len(streams)
		if i < b.N%len(streams) {
			iters++
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range iters {
				ptr, err := p.Alloc(n, s)
				if err == nil {
					err = p.Free(ptr, s)
				}
				if err != nil {
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
}
