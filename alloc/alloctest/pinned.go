package alloctest

import (
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"unsafe"

	"github.com/vramkit/vram/alloc"
	"github.com/vramkit/vram/device"
	"github.com/vramkit/vram/device/sim"
	"github.com/vramkit/vram/internal/units"
)

// PinnedAllocator is a pool of pinned host buffers, as alloc.PinnedPool:
// Alloc returns a buffer of n bytes for use with work on s, and Free(b, s)
// returns it, last used by work on s (or the host). Buffers are used from
// the host, which no stream orders, so a buffer freed on s may be handed
// out again, on any stream, only once s's work up to the free is done.
type PinnedAllocator interface {
	Alloc(n uint64, s device.Stream) (device.HostBuffer, error)
	Free(b device.HostBuffer, s device.Stream) error
	Stats() alloc.Stats
	Trim() error
	Close() error
}

// PinnedFactory makes the pinned pool under test on dev, a fresh
// simulator that the suite closes after the pool.
type PinnedFactory func(t *testing.T, dev device.Device) PinnedAllocator

// RunPinned holds the pool made by newPool to PinnedAllocator's contract,
// each rule a subtest on a fresh simulator with a 16 MiB pinned limit:
// buffers have the length asked for, never overlap a live one, and keep
// what is written to them (NoOverlap); the counters add up and Reserved is
// never above the pinned bytes the device gave; a request past the limit
// fails with device.ErrOutOfMemory, counted and changing nothing else,
// and the pool recovers after filling the limit (OutOfMemory); a buffer
// freed on a stream held busy, with its last use queued there, is not
// handed out again on any stream before that use has run (Streams);
// Close gives every buffer back and later calls fail with alloc.ErrClosed
// (Close); and across a device Reset (the reset contract of
// alloc.Allocator), buffers allocated after it are newly pinned, never
// cached ones from before it, Free of a buffer from before it returns an
// error wrapping device.ErrInvalidated and takes it back, Trim then gives
// everything back, and Close after another reset returns nil with nothing
// left pinned (AfterReset). (PinnedPool's own tests cover refused frees
// and concurrency.)
func RunPinned(t *testing.T, newPool PinnedFactory) {
	t.Helper()
	const limit = 16 * units.MiB
	setup := func(t *testing.T) (*sim.Device, PinnedAllocator, []device.Stream) {
		d, err := sim.New(sim.Config{TotalBytes: 64 * units.MiB, PinnedLimit: limit})
		if err != nil {
			t.Fatalf("sim.New: %v", err)
		}
		t.Cleanup(func() { _ = d.Close() })
		p := newPool(t, d)
		t.Cleanup(func() { _ = p.Close() })
		ss := []device.Stream{d.DefaultStream(), newStream(t, d), newStream(t, d)}
		return d, p, ss
	}
	// use allocates n bytes on s, checks the buffer against the live ones
	// and fills it with tag.
	use := func(t *testing.T, p PinnedAllocator, live map[*byte]device.HostBuffer, n uint64, tag byte, s device.Stream) device.HostBuffer {
		t.Helper()
		b, err := p.Alloc(n, s)
		if err != nil {
			t.Fatalf("Alloc(%s): %v", units.Format(n), err)
		}
		if uint64(len(b.Data)) != n {
			t.Fatalf("Alloc(%s) returned %d bytes", units.Format(n), len(b.Data))
		}
		for _, o := range live {
			if overlap(b, o) {
				t.Fatalf("a new %s buffer overlaps a live one", units.Format(n))
			}
		}
		for i := range b.Data {
			b.Data[i] = tag
		}
		live[&b.Data[0]] = b
		return b
	}
	check := func(t *testing.T, d *sim.Device, p PinnedAllocator, live map[*byte]device.HostBuffer) alloc.Stats {
		t.Helper()
		var bytes uint64
		for _, b := range live {
			bytes += uint64(len(b.Data))
			if tag := b.Data[0]; b.Data[len(b.Data)-1] != tag {
				t.Fatalf("a live buffer's bytes changed under it")
			}
		}
		st := p.Stats()
		if st.Allocs-st.Frees != uint64(len(live)) || st.InUse < bytes || st.Reserved < st.InUse || st.Reserved > d.Leaks().HostBytes {
			t.Fatalf("stats %+v with %d buffers (%d bytes) live and %d pinned bytes on the device", st, len(live), bytes, d.Leaks().HostBytes)
		}
		return st
	}
	free := func(t *testing.T, p PinnedAllocator, live map[*byte]device.HostBuffer, b device.HostBuffer, s device.Stream) {
		t.Helper()
		delete(live, &b.Data[0])
		if err := p.Free(b, s); err != nil {
			t.Fatalf("Free: %v", err)
		}
	}
	tests := map[string]func(t *testing.T){
		"NoOverlap": func(t *testing.T) {
			d, p, ss := setup(t)
			live := map[*byte]device.HostBuffer{}
			for i := range 600 {
				if len(live) < 12 && i%3 != 2 {
					use(t, p, live, 1+uint64(i*7919)%(256*units.KiB), byte(i), ss[i%3])
				} else {
					for _, b := range live {
						free(t, p, live, b, ss[(i+1)%3])
						break
					}
				}
				check(t, d, p, live)
			}
		},
		"OutOfMemory": func(t *testing.T) {
			d, p, ss := setup(t)
			live := map[*byte]device.HostBuffer{}
			for range 2 {
				before := p.Stats()
				for {
					b, err := p.Alloc(3*units.MiB, ss[0])
					if err != nil {
						if !errors.Is(err, device.ErrOutOfMemory) {
							t.Fatalf("Alloc past the limit: %v, want device.ErrOutOfMemory", err)
						}
						break
					}
					live[&b.Data[0]] = b
				}
				if st := check(t, d, p, live); st.OOMs != before.OOMs+1 || len(live) != 5 {
					t.Fatalf("filling a 16 MiB limit with 3 MiB buffers: %d fit, stats %+v", len(live), st)
				}
				for _, b := range live {
					free(t, p, live, b, ss[0])
				}
			}
		},
		"Streams": func(t *testing.T) {
			d, p, ss := setup(t)
			gate, ran := make(chan struct{}), new(atomic.Bool)
			release := sync.OnceFunc(func() { close(gate) })
			t.Cleanup(release)
			if err := d.LaunchFunc(ss[1], 1, func(device.View, int, int) error { <-gate; return nil }); err != nil {
				t.Fatal(err)
			}
			live := map[*byte]device.HostBuffer{}
			b := use(t, p, live, 64*units.KiB, 1, ss[1])
			if err := d.LaunchFunc(ss[1], 1, func(device.View, int, int) error { ran.Store(true); return nil }); err != nil {
				t.Fatal(err)
			}
			free(t, p, live, b, ss[1])
			for _, s := range ss {
				if c := use(t, p, live, 64*units.KiB, 2, s); overlap(b, c) && !ran.Load() {
					t.Fatalf("the buffer freed on held stream %d was handed out on stream %d before its last use ran", ss[1].Handle(), s.Handle())
				}
			}
			release()
			check(t, d, p, live)
		},
		"Close": func(t *testing.T) {
			d, p, ss := setup(t)
			live := map[*byte]device.HostBuffer{}
			keep := use(t, p, live, 4096, 1, ss[0])
			free(t, p, live, use(t, p, live, 100000, 2, ss[1]), ss[1])
			if err := p.Close(); err != nil {
				t.Fatalf("Close: %v", err)
			}
			if lr := d.Leaks(); lr.HostBuffers != 0 || lr.Events != 0 {
				t.Errorf("after Close the device still has %d pinned buffers and %d events", lr.HostBuffers, lr.Events)
			}
			if _, err := p.Alloc(4096, ss[0]); !errors.Is(err, alloc.ErrClosed) {
				t.Errorf("Alloc after Close: err = %v, want alloc.ErrClosed", err)
			}
			if err := p.Free(keep, ss[0]); !errors.Is(err, alloc.ErrClosed) {
				t.Errorf("Free after Close: err = %v, want alloc.ErrClosed", err)
			}
		},
	}
	tests["AfterReset"] = func(t *testing.T) {
		d, p, olds := setup(t)
		live := map[*byte]device.HostBuffer{}
		sizes := []uint64{4096, 100000, units.MiB}
		var before []device.HostBuffer // live across the reset
		for i, n := range sizes {
			s := olds[i%3]
			before = append(before, use(t, p, live, n, byte(i+1), s))
			free(t, p, live, use(t, p, live, n, 0x77, s), s) // cached
		}
		if err := d.Synchronize(); err != nil {
			t.Fatal(err)
		}
		if err := d.Reset(); err != nil {
			t.Fatalf("Reset: %v", err)
		}
		news := []device.Stream{d.DefaultStream(), newStream(t, d)}
		for i, n := range sizes {
			pinned := d.Leaks().HostBytes
			use(t, p, live, n, byte(0x10+i), news[i%2])
			if now := d.Leaks().HostBytes; now < pinned+n {
				t.Fatalf("Alloc(%s) after the reset: the device pins %d bytes, %d before it: the buffer was not pinned anew (a cached one from before the reset?)",
					units.Format(n), now, pinned)
			}
		}
		for i, b := range before {
			delete(live, &b.Data[0])
			s := news[i%2]
			if i == 0 {
				s = olds[1] // a stream from before the reset will do too
			}
			st0 := p.Stats()
			if err := p.Free(b, s); !errors.Is(err, device.ErrInvalidated) {
				t.Errorf("Free of a %s buffer from before the reset: err = %v; want one wrapping device.ErrInvalidated", units.Format(uint64(len(b.Data))), err)
			}
			if st := p.Stats(); st.Frees != st0.Frees+1 || st.InUse >= st0.InUse {
				t.Errorf("Free of a buffer from before the reset did not take it back: %+v → %+v", st0, st)
			}
			if err := p.Free(b, s); !errors.Is(err, alloc.ErrUnknownPointer) {
				t.Errorf("second Free of a buffer from before the reset: err = %v; want alloc.ErrUnknownPointer", err)
			}
		}
		check(t, d, p, live) // Reserved within what the device pins now
		for _, b := range live {
			free(t, p, live, b, news[0])
		}
		if err := d.Synchronize(); err != nil {
			t.Fatal(err)
		}
		if err := p.Trim(); err != nil {
			t.Errorf("Trim after a reset: %v", err)
		}
		if st := check(t, d, p, live); st.InUse != 0 || st.Reserved != 0 || d.Leaks().HostBuffers != 0 {
			t.Errorf("after freeing everything and Trim: stats %+v, %d buffers pinned", st, d.Leaks().HostBuffers)
		}
		use(t, p, live, 4096, 1, news[0])
		free(t, p, live, use(t, p, live, 100000, 2, news[1]), news[1])
		if err := d.Synchronize(); err != nil {
			t.Fatal(err)
		}
		if err := d.Reset(); err != nil {
			t.Fatalf("second Reset: %v", err)
		}
		if err := p.Close(); err != nil {
			t.Errorf("Close after a reset: %v; want nil", err)
		}
		if st := p.Stats(); st.InUse != 0 || st.Reserved != 0 {
			t.Errorf("after a reset and Close: stats %+v; want nothing in use or reserved", st)
		}
		if lr := d.Leaks(); lr.HostBuffers != 0 || lr.Events != 0 {
			t.Errorf("after a reset and Close the device still has %d pinned buffers and %d events", lr.HostBuffers, lr.Events)
		}
	}
	for name, test := range tests {
		t.Run(name, test)
	}
}

// overlap reports whether two host buffers share a byte.
func overlap(a, b device.HostBuffer) bool {
	alo, blo := uintptr(unsafe.Pointer(&a.Data[0])), uintptr(unsafe.Pointer(&b.Data[0]))
	return alo < blo+uintptr(len(b.Data)) && blo < alo+uintptr(len(a.Data))
}
