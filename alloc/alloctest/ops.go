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
	r := NewStreamRules(t, sim.Config{TotalBytes: OpsDeviceBytes})
	rulesTarget := target{sim: true, open: func(*testing.T, sim.Config) device.Device { return r.Device() }}
	e := setup(t, rulesTarget, newAlloc, sim.Config{})
	streams := []device.Stream{e.dev.DefaultStream(), newStream(t, e.dev), newStream(t, e.dev)}
	t.Cleanup(r.ReleaseAll) // before the streams close, should the test stop while one is held
	// Blocks as the allocator spends them: rounded to its granularity, and
	// at least to 512 bytes, the least any of vram's allocators (and the
	// simulator's stream-ordered pool under AsyncPool) rounds to. An
	// adaptor over an allocator that is not Granular reports 1, but its
	// blocks are still rounded below it.
	gran := uint64(alloc.PoolGranularity)
	if g, ok := e.a.(alloc.Granular); ok {
		gran = max(g.Granularity(), gran)
	}
	for i := 0; i < len(data); i++ {
		op := data[i]
		s := streams[int(op>>4)%len(streams)]
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
			if p, ok := e.tryAlloc(t, n, s); ok {
				r.Allocated(t, p, roundUp(n, gran), s)
			}
		case 4, 5:
			if e.live.len() == 0 {
				continue
			}
			p, n, from := e.live.at(int(op>>3) % e.live.len())
			r.BeforeFree(t, p, roundUp(n, gran), from, s)
			e.free(t, p, s)
		case 6:
			if op&8 != 0 {
				r.Toggle(t, s)
				continue
			}
			if op >= 0xc0 {
				streams = e.resetInOps(t, rulesTarget)
				continue
			}
			if err := e.dev.Synchronize(); err != nil {
				t.Fatalf("Synchronize: %v", err)
			}
			if err := e.a.Trim(); err != nil {
				t.Fatalf("Trim: %v", err)
			}
		case 7:
			var q device.Ptr
			if e.live.len() > 0 {
				p, _, _ := e.live.at(int(op>>3) % e.live.len())
				q = p + Alignment
			}
			before := e.a.Stats()
			if err := e.a.Free(q, s); !errors.Is(err, alloc.ErrUnknownPointer) {
				t.Fatalf("Free(%v), inside a live block or zero: err = %v, want alloc.ErrUnknownPointer", q, err)
			}
			if after := e.a.Stats(); after != before {
				t.Fatalf("a refused Free changed Stats: %+v → %+v", before, after)
			}
		}
		e.checkQuiet(t)
	}
	r.ReleaseAll()
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
	streams := []device.Stream{e.dev.DefaultStream(), newStream(t, e.dev), newStream(t, e.dev)}
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
