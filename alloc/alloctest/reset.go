package alloctest

// The device reset rule of the suite: see alloc.Allocator's reset contract.

import (
	"bytes"
	"errors"
	"testing"

	"github.com/vramkit/vram/alloc"
	"github.com/vramkit/vram/device"
	"github.com/vramkit/vram/device/sim"
	"github.com/vramkit/vram/internal/units"
)

// resetSizes span the pool's size classes: small, medium, a large one
// that gets a segment of its own.
var resetSizes = []uint64{4096, 100000, units.MiB + 512, 3 * units.MiB, 12 * units.MiB}

// span is an address range [lo, hi).
type span struct{ lo, hi uint64 }

// testAfterReset holds the allocator to the device reset contract (see
// alloc.Allocator), resetting the device three times:
//
//  1. With blocks live and cached across a reset, each Free of a pointer
//     from before it, on a stream from before or after it, returns an
//     error wrapping device.ErrInvalidated and takes the pointer back
//     (Frees counts it, InUse drops, a second Free is
//     alloc.ErrUnknownPointer); once all are freed InUse and Reserved are
//     zero. Blocks allocated then are memory the reset device accepts
//     (copies to them succeed; on the simulator, whose generations have
//     address ranges of their own, none overlaps memory from before the
//     reset); freed, Trim gives everything back.
//  2. With blocks cached across a second reset, the first call after it,
//     an Alloc, returns memory the reset device accepts: the allocator
//     noticed the reset without being told, and did not hand out its
//     cache.
//  3. With a block live and one cached across a third reset, Close
//     returns nil and leaves nothing in InUse or Reserved (nor, on the
//     simulator, allocated on the device).
//
// Pointers from before a reset are freed before anything is allocated
// after it: a device may hand their addresses out again (CUDA may), and
// then a pointer's Free cannot tell the old allocation from the new.
func testAfterReset(t *testing.T, tg target, newAlloc Factory) {
	e := setup(t, tg, newAlloc, sim.Config{TotalBytes: 256 * units.MiB})
	olds := []device.Stream{e.dev.DefaultStream(), e.newStream(t)}
	var before []device.Ptr // live across the reset
	var gone []span         // every block from before the reset, live or cached
	for i, n := range resetSizes {
		s := olds[i%2]
		p := e.alloc(t, n, s)
		q := e.alloc(t, n, s)
		e.free(t, q, s) // cached, where the allocator caches
		before = append(before, p)
		gone = append(gone, span{uint64(p), uint64(p) + n}, span{uint64(q), uint64(q) + n})
	}
	e.reset(t, tg)
	news := []device.Stream{e.dev.DefaultStream(), e.newStream(t)}
	// 1. Pointers from before the reset: taken back, with ErrInvalidated;
	// then memory the reset device accepts, all given back on Trim.
	e.freeFromBeforeReset(t, before, olds[0], news)
	e.warm(t, tg)
	e.allocAfterReset(t, gone, news)
	// 2. A cache across a reset, and an Alloc as the first call after it.
	for i, n := range resetSizes {
		e.free(t, e.alloc(t, n, news[i%2]), news[i%2])
	}
	e.reset(t, tg)
	news = []device.Stream{e.dev.DefaultStream(), e.newStream(t)}
	for i, n := range resetSizes {
		checkUsable(t, e.dev, e.alloc(t, n, news[i%2]), n, byte(0x20+i), news[i%2])
	}
	e.checkStats(t)
	// 3. Close after a reset, with a block live and some cached.
	e.closeAfterReset(t, news)
}

// freeFromBeforeReset frees the pointers before, from before the reset,
// on the streams news made since (the first on old, a stream from before
// it): each Free returns ErrInvalidated and takes the pointer back, a
// second one is ErrUnknownPointer and changes nothing, and then InUse and
// Reserved are zero.
func (e *env) freeFromBeforeReset(t *testing.T, before []device.Ptr, old device.Stream, news []device.Stream) {
	for i, p := range before {
		if _, ok := e.live.remove(p); !ok {
			t.Fatalf("test bug: %v untracked", p)
		}
		s := news[i%2]
		if i == 0 {
			s = old // a stream from before the reset will do too
		}
		st0 := e.a.Stats()
		if err := e.a.Free(p, s); !errors.Is(err, device.ErrInvalidated) {
			t.Errorf("Free(%v) of a pointer from before the reset: err = %v; want one wrapping device.ErrInvalidated", p, err)
		}
		if st := e.a.Stats(); st.Frees != st0.Frees+1 || st.InUse >= st0.InUse {
			t.Errorf("Free(%v) from before the reset did not take it back: %+v → %+v", p, st0, st)
		}
		st0 = e.a.Stats()
		if err := e.a.Free(p, s); !errors.Is(err, alloc.ErrUnknownPointer) {
			t.Errorf("second Free(%v) of a pointer from before the reset: err = %v; want alloc.ErrUnknownPointer", p, err)
		}
		if st := e.a.Stats(); st != st0 {
			t.Errorf("a refused second Free changed Stats: %+v → %+v", st0, st)
		}
	}
	if st := e.checkStats(t); st.InUse != 0 || st.Reserved != 0 {
		t.Errorf("with every pointer from before the reset freed: InUse %d, Reserved %d; want 0, 0", st.InUse, st.Reserved)
	}
}

// allocAfterReset allocates blocks after the reset, which the device
// accepts (and, on the simulator, none overlapping gone, the blocks from
// before it), frees them and trims: the device has every byte back.
func (e *env) allocAfterReset(t *testing.T, gone []span, news []device.Stream) {
	_, isSim := e.dev.(*sim.Device)
	for i, n := range resetSizes {
		s := news[i%2]
		p := e.alloc(t, n, s)
		for _, g := range gone {
			if isSim && uint64(p) < g.hi && g.lo < uint64(p)+n {
				t.Fatalf("Alloc(%s) after the reset returned [%v, +%d), which overlaps [%#x, %#x) from before it",
					units.Format(n), p, n, g.lo, g.hi)
			}
		}
		checkUsable(t, e.dev, p, n, byte(i+1), s)
	}
	e.freeAll(t)
	if err := e.dev.Synchronize(); err != nil {
		t.Fatalf("Synchronize: %v", err)
	}
	if err := e.a.Trim(); err != nil {
		t.Errorf("Trim after a reset: %v", err)
	}
	if st := e.checkStats(t); st.InUse != 0 || st.Reserved != 0 {
		t.Errorf("after freeing everything and Trim: InUse %d, Reserved %d; want 0, 0", st.InUse, st.Reserved)
	}
	if used := e.used(t); used != 0 {
		t.Errorf("after Trim the device still gives %d bytes to the allocator", used)
	}
}

// closeAfterReset caches a block besides those live, resets the device
// and closes the allocator: Close returns nil and leaves nothing in InUse
// or Reserved (nor, on the simulator, allocated on the device).
func (e *env) closeAfterReset(t *testing.T, news []device.Stream) {
	e.free(t, e.alloc(t, units.MiB, news[1]), news[1])
	if err := e.dev.Synchronize(); err != nil {
		t.Fatalf("Synchronize: %v", err)
	}
	if err := e.dev.Reset(); err != nil {
		t.Fatalf("Reset: %v", err)
	}
	if err := e.a.Close(); err != nil {
		t.Errorf("Close after a reset: %v; want nil", err)
	}
	if st := e.a.Stats(); st.InUse != 0 || st.Reserved != 0 {
		t.Errorf("after a reset and Close: InUse %d, Reserved %d; want 0, 0", st.InUse, st.Reserved)
	}
	if sd, ok := e.dev.(*sim.Device); ok {
		if lr := sd.Leaks(); lr.Allocs+lr.AsyncAllocs != 0 || lr.Events != 0 {
			t.Errorf("after a reset and Close the device still has: %v", lr)
		}
	}
}

// reset synchronizes and resets the device, and counts the device's free
// memory afresh: the reset gave it back. On a real device it takes a
// stream's lazy memory first, but allocates nothing: a driver may place a
// new allocation at an address from before the reset, and pointers from
// before it are freed first (the rule above). warm takes the rest of the
// lazy memory once they are.
func (e *env) reset(t *testing.T, tg target) {
	t.Helper()
	if err := e.dev.Synchronize(); err != nil {
		t.Fatalf("Synchronize: %v", err)
	}
	if err := e.dev.Reset(); err != nil {
		t.Fatalf("Reset: %v", err)
	}
	if !tg.sim {
		warmStream(t, e.dev)
	}
	e.countFree(t)
}

// warm makes a real device take the memory it takes lazily on a first
// allocation (warmUp) and counts its free memory afresh: for exact
// figures after a reset, once the pointers from before it are freed.
func (e *env) warm(t *testing.T, tg target) {
	t.Helper()
	if !tg.sim {
		warmUp(t, e.dev)
		e.countFree(t)
	}
}

// countFree takes the device's free memory as what the allocator's use is
// measured from.
func (e *env) countFree(t *testing.T) {
	t.Helper()
	free, _, err := e.dev.MemInfo()
	if err != nil {
		t.Fatalf("MemInfo: %v", err)
	}
	e.startFree = free
}

// checkUsable writes a pattern to the first and last bytes of [p, p+n) on
// s and reads it back, on a device that keeps contents; memory from
// before a reset fails with device.ErrInvalidated.
func checkUsable(t *testing.T, dev device.Device, p device.Ptr, n uint64, tag byte, s device.Stream) {
	t.Helper()
	if !dev.Info().Backed {
		return
	}
	k := min(n, 4096)
	want := bytes.Repeat([]byte{tag}, int(k))
	for _, at := range []device.Ptr{p, p + device.Ptr(n-k)} {
		if err := dev.CopyHtoD(at, want, s); err != nil {
			t.Fatalf("CopyHtoD to %v (block %v, %s) after the reset: %v", at, p, units.Format(n), err)
		}
		got := make([]byte, k)
		if err := dev.CopyDtoH(got, at, s); err != nil {
			t.Fatalf("CopyDtoH from %v (block %v, %s) after the reset: %v", at, p, units.Format(n), err)
		}
		if err := s.Synchronize(); err != nil {
			t.Fatalf("Synchronize: %v", err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("block %v (%s): read back differs from what was written", p, units.Format(n))
		}
	}
}
