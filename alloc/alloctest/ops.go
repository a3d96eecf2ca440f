package alloctest

import (
	"errors"
	"testing"

	"github.com/vramkit/vram/alloc"
	"github.com/vramkit/vram/device"
	"github.com/vramkit/vram/device/sim"
	"github.com/vramkit/vram/internal/units"
)

// OpsDeviceBytes is the size of the device Ops runs on: small enough that
// random sequences run out of memory now and then.
const OpsDeviceBytes = 256 * units.MiB

// Ops reads data as a sequence of allocator calls and runs it against the
// allocator newAlloc makes on a fresh simulated device of OpsDeviceBytes
// (a StreamRules device), on three streams, checking after every call
// that: pointers are aligned and no two live blocks overlap; Stats add up
// (Allocs − Frees = blocks live, InUse at least the bytes live, Reserved at
// least InUse and at most what the device gave); a failed Alloc wraps
// device.ErrOutOfMemory, adds one to OOMs and changes
// nothing else; a Free of a pointer not handed out fails with
// alloc.ErrUnknownPointer and changes nothing; and no allocation hands
// out a range freed on another stream whose work up to the free has not
// run (a call can hold a stream busy, or release it, so that freed
// memory's last use is still pending when other streams allocate; see
// StreamRules). At the end it frees everything, trims (after a device
// synchronization) and closes, and checks that the device has every byte
// back. It is meant for fuzz targets:
//
//	f.Fuzz(func(t *testing.T, data []byte) { alloctest.Ops(t, newAlloc, data) })
//
// Each call takes one byte: its kind is the byte mod 8 (0–3 Alloc, 4–5
// Free of a live block, 6 synchronize the device and Trim — or, with bit
// 3 set, hold the stream busy or release it, and with bit 3 clear and
// the two top bits set, reset the device — 7 a Free that must be
// refused), its stream the high four bits mod 3. An Alloc takes two more
// bytes for its size (64 B … 4 MiB, or up to 512 MiB, past the device,
// for one kind in eight).
//
// A reset (see alloc.Allocator's reset contract) releases every hold and
// resets the device with blocks live and cached; then every block live
// from before it is freed, each Free returning an error wrapping
// device.ErrInvalidated and taking the block back, after which InUse and
// Reserved are zero; the streams are made anew.
func Ops(t *testing.T, newAlloc Factory, data []byte) {
	t.Helper()
	o := newOpsRun(t, newAlloc)
	for i := 0; i < len(data); i++ {
		var check bool
		i, check = o.call(t, data, i)
		if check {
			o.e.checkQuiet(t)
		}
	}
	o.finish(t)
}

// opsRun is one run of Ops: the allocator's env on a StreamRules device,
// and its three streams.
type opsRun struct {
	e       *env
	r       *StreamRules
	tg      target
	streams []device.Stream
	// gran is the rounding of blocks as the allocator spends them: its
	// granularity, and at least 512 bytes, the least any of vram's
	// allocators (and the simulator's stream-ordered pool under
	// AsyncPool) rounds to. An adaptor over an allocator that is not
	// Granular reports 1, but its blocks are still rounded below it.
	gran uint64
}

func newOpsRun(t *testing.T, newAlloc Factory) *opsRun {
	r := NewStreamRules(t, sim.Config{TotalBytes: OpsDeviceBytes})
	tg := target{sim: true, open: func(*testing.T, sim.Config) device.Device { return r.Device() }}
	e := setup(t, tg, newAlloc, sim.Config{})
	o := &opsRun{e: e, r: r, tg: tg, gran: uint64(alloc.PoolGranularity),
		streams: []device.Stream{e.dev.DefaultStream(), e.newStream(t), e.newStream(t)}}
	t.Cleanup(r.ReleaseAll) // before the streams close, should the test stop while one is held
	if g, ok := e.a.(alloc.Granular); ok {
		o.gran = max(g.Granularity(), o.gran)
	}
	return o
}

// call runs the call that data[i] starts and returns the index of its
// last byte, and whether the allocator is to be checked after it.
func (o *opsRun) call(t *testing.T, data []byte, i int) (int, bool) {
	op := data[i]
	s := o.streams[int(op>>4)%len(o.streams)]
	switch op % 8 {
	case 0, 1, 2, 3:
		var v uint64
		if i+2 < len(data) {
			v = uint64(data[i+1])<<8 | uint64(data[i+2])
			i += 2
		}
		n := (v + 1) * 64
		if op%8 == 3 {
			n = (v + 1) * 8 * units.KiB
		}
		if p, ok := o.e.tryAlloc(t, n, s); ok {
			o.r.Allocated(t, p, roundUp(n, o.gran), s)
		}
	case 4, 5:
		if o.e.live.len() == 0 {
			return i, false
		}
		p, n, from := o.e.live.at(int(op>>3) % o.e.live.len())
		o.r.BeforeFree(t, p, roundUp(n, o.gran), from, s)
		o.e.free(t, p, s)
	case 6:
		return i, o.syncCall(t, op, s)
	case 7:
		o.refusedFree(t, op, s)
	}
	return i, true
}

// syncCall holds or releases s (bit 3 set), resets the device (the top
// two bits set), or synchronizes the device and trims; it says whether
// the allocator is to be checked after it.
func (o *opsRun) syncCall(t *testing.T, op byte, s device.Stream) bool {
	switch {
	case op&8 != 0:
		o.r.Toggle(t, s)
		return false
	case op >= 0xc0:
		o.streams = o.e.resetInOps(t, o.tg)
		return false
	}
	if err := o.e.dev.Synchronize(); err != nil {
		t.Fatalf("Synchronize: %v", err)
	}
	if err := o.e.a.Trim(); err != nil {
		t.Fatalf("Trim: %v", err)
	}
	return true
}

// refusedFree frees a pointer inside a live block (or 0): it must be
// refused with alloc.ErrUnknownPointer and change nothing.
func (o *opsRun) refusedFree(t *testing.T, op byte, s device.Stream) {
	var q device.Ptr
	if o.e.live.len() > 0 {
		p, _, _ := o.e.live.at(int(op>>3) % o.e.live.len())
		q = p + Alignment
	}
	before := o.e.a.Stats()
	if err := o.e.a.Free(q, s); !errors.Is(err, alloc.ErrUnknownPointer) {
		t.Fatalf("Free(%v), inside a live block or zero: err = %v, want alloc.ErrUnknownPointer", q, err)
	}
	if after := o.e.a.Stats(); after != before {
		t.Fatalf("a refused Free changed Stats: %+v → %+v", before, after)
	}
}

// finish releases every hold, frees everything, trims and closes, and
// checks that the device has every byte back.
func (o *opsRun) finish(t *testing.T) {
	e := o.e
	o.r.ReleaseAll()
	e.freeAll(t)
	if err := e.dev.Synchronize(); err != nil {
		t.Fatalf("Synchronize: %v", err)
	}
	if err := e.a.Trim(); err != nil {
		t.Fatalf("Trim: %v", err)
	}
	if st := e.checkQuiet(t); st.InUse != 0 || st.Reserved != 0 {
		t.Fatalf("after freeing everything and Trim: %+v", st)
	}
	if err := e.a.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if used := e.used(t); used != 0 {
		t.Fatalf("after Close the device still gives %d bytes to the allocator", used)
	}
}

// resetInOps resets the device with blocks live and cached, frees every
// block from before the reset (each Free must fail with
// device.ErrInvalidated and take the block back), checks that nothing is
// left in InUse or Reserved, and returns three streams made since.
func (e *env) resetInOps(t *testing.T, tg target) []device.Stream {
	t.Helper()
	e.reset(t, tg)
	streams := []device.Stream{e.dev.DefaultStream(), e.newStream(t), e.newStream(t)}
	for i := 0; e.live.len() > 0; i++ {
		p, _, _ := e.live.at(0)
		e.live.remove(p)
		before := e.a.Stats()
		if err := e.a.Free(p, streams[i%len(streams)]); !errors.Is(err, device.ErrInvalidated) {
			t.Fatalf("Free(%v) of a block from before a reset: err = %v, want one wrapping device.ErrInvalidated", p, err)
		}
		if after := e.a.Stats(); after.Frees != before.Frees+1 || after.InUse >= before.InUse {
			t.Fatalf("Free(%v) from before a reset did not take it back: %+v → %+v", p, before, after)
		}
	}
	if st := e.checkQuiet(t); st.InUse != 0 || st.Reserved != 0 {
		t.Fatalf("with every block from before the reset freed: InUse %d, Reserved %d; want 0, 0", st.InUse, st.Reserved)
	}
	e.warm(t, tg)
	return streams
}

// tryAlloc allocates n bytes on s; running out of memory is allowed, but
// must change nothing but OOMs (and the cache a retry may have trimmed).
// It returns the new block, and whether there is one.
func (e *env) tryAlloc(t *testing.T, n uint64, s device.Stream) (device.Ptr, bool) {
	t.Helper()
	before := e.a.Stats()
	p, err := e.a.Alloc(n, s)
	if err != nil {
		if !errors.Is(err, device.ErrOutOfMemory) {
			t.Fatalf("Alloc(%s): %v, want success or an error wrapping device.ErrOutOfMemory", units.Format(n), err)
		}
		after := e.a.Stats()
		if after.OOMs != before.OOMs+1 || after.InUse != before.InUse || after.Allocs != before.Allocs {
			t.Fatalf("a failed Alloc(%s) changed Stats other than OOMs+1: %+v → %+v", units.Format(n), before, after)
		}
		return 0, false
	}
	if err := e.live.add(p, n, s); err != nil {
		t.Fatal(err)
	}
	return p, true
}

// checkQuiet is checkStats that stops the test at the first failure.
func (e *env) checkQuiet(t *testing.T) alloc.Stats {
	t.Helper()
	st := e.checkStats(t)
	if t.Failed() {
		t.FailNow()
	}
	return st
}

// roundUp is n rounded up to a multiple of g, or n when that overflows.
func roundUp(n, g uint64) uint64 {
	if r, ok := units.RoundUp(n, g); ok {
		return r
	}
	return n
}
