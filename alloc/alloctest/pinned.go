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
	tests := map[string]func(*pinnedEnv){
		"NoOverlap":   pinnedNoOverlap,
		"OutOfMemory": pinnedOutOfMemory,
		"Streams":     pinnedStreams,
		"Close":       pinnedClose,
		"AfterReset":  pinnedAfterReset,
	}
	for name, test := range tests {
		t.Run(name, func(t *testing.T) { test(newPinnedEnv(t, newPool)) })
	}
}

// pinnedLimit is the pinned memory of RunPinned's simulators.
const pinnedLimit = 16 * units.MiB

// pinnedEnv is one RunPinned subtest's simulator, pool and three streams,
// and the buffers it holds live.
type pinnedEnv struct {
	t    *testing.T
	d    *sim.Device
	p    PinnedAllocator
	ss   []device.Stream
	live map[*byte]device.HostBuffer
}

// newPinnedEnv makes the pool on a fresh simulator; both are closed when
// the test ends.
func newPinnedEnv(t *testing.T, newPool PinnedFactory) *pinnedEnv {
	d, err := sim.New(sim.Config{TotalBytes: 64 * units.MiB, PinnedLimit: pinnedLimit})
	if err != nil {
		t.Fatalf("sim.New: %v", err)
	}
	t.Cleanup(func() { _ = d.Close() })
	p := newPool(t, d)
	t.Cleanup(func() { _ = p.Close() })
	ss := []device.Stream{d.DefaultStream(), newStream(t, d), newStream(t, d)}
	return &pinnedEnv{t: t, d: d, p: p, ss: ss, live: map[*byte]device.HostBuffer{}}
}

// use allocates n bytes on s, checks the buffer against the live ones and
// fills it with tag.
func (e *pinnedEnv) use(n uint64, tag byte, s device.Stream) device.HostBuffer {
	e.t.Helper()
	b, err := e.p.Alloc(n, s)
	if err != nil {
		e.t.Fatalf("Alloc(%s): %v", units.Format(n), err)
	}
	if uint64(len(b.Data)) != n {
		e.t.Fatalf("Alloc(%s) returned %d bytes", units.Format(n), len(b.Data))
	}
	for _, o := range e.live {
		if overlap(b, o) {
			e.t.Fatalf("a new %s buffer overlaps a live one", units.Format(n))
		}
	}
	for i := range b.Data {
		b.Data[i] = tag
	}
	e.live[&b.Data[0]] = b
	return b
}

// check checks that the live buffers kept their bytes and that the
// counters add up, Reserved within what the device pins, and returns them.
func (e *pinnedEnv) check() alloc.Stats {
	e.t.Helper()
	var bytes uint64
	for _, b := range e.live {
		bytes += uint64(len(b.Data))
		if tag := b.Data[0]; b.Data[len(b.Data)-1] != tag {
			e.t.Fatalf("a live buffer's bytes changed under it")
		}
	}
	st := e.p.Stats()
	if st.Allocs-st.Frees != uint64(len(e.live)) || st.InUse < bytes || st.Reserved < st.InUse || st.Reserved > e.d.Leaks().HostBytes {
		e.t.Fatalf("stats %+v with %d buffers (%d bytes) live and %d pinned bytes on the device", st, len(e.live), bytes, e.d.Leaks().HostBytes)
	}
	return st
}

// free frees live buffer b on s.
func (e *pinnedEnv) free(b device.HostBuffer, s device.Stream) {
	e.t.Helper()
	delete(e.live, &b.Data[0])
	if err := e.p.Free(b, s); err != nil {
		e.t.Fatalf("Free: %v", err)
	}
}

// sync waits for the device's work.
func (e *pinnedEnv) sync() {
	e.t.Helper()
	if err := e.d.Synchronize(); err != nil {
		e.t.Fatal(err)
	}
}

// pinnedNoOverlap: buffers of many sizes on three streams have their
// length, never overlap a live one and keep their bytes.
func pinnedNoOverlap(e *pinnedEnv) {
	for i := range 600 {
		if len(e.live) < 12 && i%3 != 2 {
			e.use(1+uint64(i*7919)%(256*units.KiB), byte(i), e.ss[i%3])
		} else {
			for _, b := range e.live {
				e.free(b, e.ss[(i+1)%3])
				break
			}
		}
		e.check()
	}
}

// pinnedOutOfMemory: past the limit Alloc fails with ErrOutOfMemory,
// counted, and the pool recovers, twice.
func pinnedOutOfMemory(e *pinnedEnv) {
	t := e.t
	for range 2 {
		before := e.p.Stats()
		for {
			b, err := e.p.Alloc(3*units.MiB, e.ss[0])
			if err != nil {
				if !errors.Is(err, device.ErrOutOfMemory) {
					t.Fatalf("Alloc past the limit: %v, want device.ErrOutOfMemory", err)
				}
				break
			}
			e.live[&b.Data[0]] = b
		}
		if st := e.check(); st.OOMs != before.OOMs+1 || len(e.live) != 5 {
			t.Fatalf("filling a 16 MiB limit with 3 MiB buffers: %d fit, stats %+v", len(e.live), st)
		}
		for _, b := range e.live {
			e.free(b, e.ss[0])
		}
	}
}

// pinnedStreams: a buffer freed on a held stream, its last use queued
// there, is handed out on no stream before that use has run.
func pinnedStreams(e *pinnedEnv) {
	t, d, ss := e.t, e.d, e.ss
	gate, ran := make(chan struct{}), new(atomic.Bool)
	release := sync.OnceFunc(func() { close(gate) })
	t.Cleanup(release)
	if err := d.LaunchFunc(ss[1], 1, func(device.View, int, int) error { <-gate; return nil }); err != nil {
		t.Fatal(err)
	}
	b := e.use(64*units.KiB, 1, ss[1])
	if err := d.LaunchFunc(ss[1], 1, func(device.View, int, int) error { ran.Store(true); return nil }); err != nil {
		t.Fatal(err)
	}
	e.free(b, ss[1])
	for _, s := range ss {
		if c := e.use(64*units.KiB, 2, s); overlap(b, c) && !ran.Load() {
			t.Fatalf("the buffer freed on held stream %d was handed out on stream %d before its last use ran", ss[1].Handle(), s.Handle())
		}
	}
	release()
	e.check()
}

// pinnedClose: Close gives every buffer back, and later calls fail with
// alloc.ErrClosed.
func pinnedClose(e *pinnedEnv) {
	t, p, ss := e.t, e.p, e.ss
	keep := e.use(4096, 1, ss[0])
	e.free(e.use(100000, 2, ss[1]), ss[1])
	if err := p.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if lr := e.d.Leaks(); lr.HostBuffers != 0 || lr.Events != 0 {
		t.Errorf("after Close the device still has %d pinned buffers and %d events", lr.HostBuffers, lr.Events)
	}
	if _, err := p.Alloc(4096, ss[0]); !errors.Is(err, alloc.ErrClosed) {
		t.Errorf("Alloc after Close: err = %v, want alloc.ErrClosed", err)
	}
	if err := p.Free(keep, ss[0]); !errors.Is(err, alloc.ErrClosed) {
		t.Errorf("Free after Close: err = %v, want alloc.ErrClosed", err)
	}
}

// pinnedResetSizes are the buffers pinnedAfterReset holds across a reset.
var pinnedResetSizes = []uint64{4096, 100000, units.MiB}

// pinnedAfterReset: across a device Reset, buffers allocated after it are
// pinned anew, a Free of one from before it returns ErrInvalidated and
// takes it back, Trim then gives everything back, and Close after another
// reset returns nil with nothing left pinned.
func pinnedAfterReset(e *pinnedEnv) {
	t, d, olds := e.t, e.d, e.ss
	var before []device.HostBuffer // live across the reset
	for i, n := range pinnedResetSizes {
		s := olds[i%3]
		before = append(before, e.use(n, byte(i+1), s))
		e.free(e.use(n, 0x77, s), s) // cached
	}
	e.sync()
	if err := d.Reset(); err != nil {
		t.Fatalf("Reset: %v", err)
	}
	news := []device.Stream{d.DefaultStream(), newStream(t, d)}
	for i, n := range pinnedResetSizes {
		pinned := d.Leaks().HostBytes
		e.use(n, byte(0x10+i), news[i%2])
		if now := d.Leaks().HostBytes; now < pinned+n {
			t.Fatalf("Alloc(%s) after the reset: the device pins %d bytes, %d before it: the buffer was not pinned anew (a cached one from before the reset?)",
				units.Format(n), now, pinned)
		}
	}
	e.freeFromBeforeReset(before, news)
	e.check() // Reserved within what the device pins now
	for _, b := range e.live {
		e.free(b, news[0])
	}
	e.sync()
	if err := e.p.Trim(); err != nil {
		t.Errorf("Trim after a reset: %v", err)
	}
	if st := e.check(); st.InUse != 0 || st.Reserved != 0 || d.Leaks().HostBuffers != 0 {
		t.Errorf("after freeing everything and Trim: stats %+v, %d buffers pinned", st, d.Leaks().HostBuffers)
	}
	e.closeAfterReset(news)
}

// freeFromBeforeReset frees the buffers before, allocated before the
// reset: each Free returns ErrInvalidated and takes the buffer back, and a
// second one is ErrUnknownPointer.
func (e *pinnedEnv) freeFromBeforeReset(before []device.HostBuffer, news []device.Stream) {
	t := e.t
	for i, b := range before {
		delete(e.live, &b.Data[0])
		s := news[i%2]
		if i == 0 {
			s = e.ss[1] // a stream from before the reset will do too
		}
		st0 := e.p.Stats()
		if err := e.p.Free(b, s); !errors.Is(err, device.ErrInvalidated) {
			t.Errorf("Free of a %s buffer from before the reset: err = %v; want one wrapping device.ErrInvalidated", units.Format(uint64(len(b.Data))), err)
		}
		if st := e.p.Stats(); st.Frees != st0.Frees+1 || st.InUse >= st0.InUse {
			t.Errorf("Free of a buffer from before the reset did not take it back: %+v → %+v", st0, st)
		}
		if err := e.p.Free(b, s); !errors.Is(err, alloc.ErrUnknownPointer) {
			t.Errorf("second Free of a buffer from before the reset: err = %v; want alloc.ErrUnknownPointer", err)
		}
	}
}

// closeAfterReset holds a buffer and caches another, resets the device
// again and closes the pool: Close returns nil and nothing stays pinned.
func (e *pinnedEnv) closeAfterReset(news []device.Stream) {
	t, d, p := e.t, e.d, e.p
	e.use(4096, 1, news[0])
	e.free(e.use(100000, 2, news[1]), news[1])
	e.sync()
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

// overlap reports whether two host buffers share a byte.
func overlap(a, b device.HostBuffer) bool {
	alo, blo := uintptr(unsafe.Pointer(&a.Data[0])), uintptr(unsafe.Pointer(&b.Data[0]))
	return alo < blo+uintptr(len(b.Data)) && blo < alo+uintptr(len(a.Data))
}
