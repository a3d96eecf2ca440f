package sim

// The memory checker: what every copy, memset, kernel access and free is
// checked against, and the errors that say what went wrong (out of bounds,
// use after free, double free, a pointer from before a Reset or from
// another device).
//
// Ghosts. Freed allocations leave a ghost in d.ghosts, keyed by start
// address and allocation number (a range can be freed, handed out again
// and freed again), so a later access or free is reported as use after
// free or double free rather than as an unknown pointer. When addresses
// are handed out again, the ghosts there whose frees have completed are
// cut back to what lies outside the new allocation (dropped if nothing
// does); ghosts whose frees have not completed are kept whole, overlapping
// it. The ghosts of the oldest frees beyond the last ghostCap are
// forgotten.
//
// Checking. Copies and memsets resolve their pointers when they are
// enqueued (the host's view: freeing happens-before a later call) and
// capture the backing slices; kernels resolve through their View when
// they run. A kernel may still touch a MallocAsync block that was freed
// after the kernel was launched (the free is stream-ordered after it),
// even once the block has been handed out again, smaller, on the freeing
// stream: every launch and every FreeAsync take a stamp from one device
// counter, and a kernel with an earlier stamp than the free may use the
// freed block's range while the freeing stream has not reached the free.
// The check against the live allocation comes first and is unchanged;
// the freed blocks are searched only when it fails. Malloc needs none of
// this: Free waits for all work first, so no kernel launched before it
// runs after it.

import (
	"fmt"
	"math"

	"github.com/vramkit/vram/device"
	"github.com/vramkit/vram/internal/units"
)

// ghostCap bounds how many freed allocations are remembered for use after
// free and double free reports (oldest forgotten first).
const ghostCap = 1 << 16

// ghost is a freed allocation, remembered for error messages and for
// kernels launched before a stream-ordered free. Its node in d.ghosts is
// keyed by (where it starts now, id) and spans what is left of it: the
// part of a ghost that is handed out again is cut off once its free has
// completed, so that what remains still names the allocation.
type ghost struct {
	start uint64 // where the allocation started
	size  uint64 // its requested bytes
	id    uint64
	kind  recKind
	stamp uint64  // issue stamp of the free (FreeAsync)
	s     *stream // FreeAsync: the freeing stream; nil when the free is complete at once
	seq   uint64  // FreeAsync: s's enqueued count at the free
}

// done reports whether the free has completed: its stream has finished
// the work enqueued before it, so no kernel may use the range any more.
func (g *ghost) done() bool { return g.s == nil || g.s.done.Load() >= g.seq }

// ghostRef names a freed allocation (or mark) in a forgetQueue; size is
// its requested bytes (device ghosts only).
type ghostRef struct{ start, id, size uint64 }

// ghostNode is a copy of a node of d.ghosts.
type ghostNode struct {
	k1, k2, span uint64
	v            ghost
}

// forgetQueue keeps the order in which freed records were remembered, so
// that only the most recent ones are kept: push returns the record to
// forget once more than limit are remembered.
type forgetQueue struct {
	refs []ghostRef // oldest first from head
	head int
}

func (q *forgetQueue) push(r ghostRef, limit int) (old ghostRef, forget bool) {
	q.refs = append(q.refs, r)
	if len(q.refs)-q.head <= limit {
		return ghostRef{}, false
	}
	old = q.refs[q.head]
	q.head++
	if q.head > limit { // compact, amortized
		q.refs = append(q.refs[:0], q.refs[q.head:]...)
		q.head = 0
	}
	return old, true
}

// addGhostLocked remembers a freed allocation.
func (d *Device) addGhostLocked(a uint64, g ghost) {
	g.start = a
	d.ghosts.insert(a, g.id, g.size, g)
	old, forget := d.ghostOrder.push(ghostRef{a, g.id, g.size}, ghostCap)
	if !forget {
		return
	}
	if nd := d.ghosts.get(old.start, old.id); nd != nil && nd.span == old.size {
		d.ghosts.remove(old.start, old.id) // still whole: the usual case
		return
	}
	// Forget what is left of it, in pieces or not at all.
	d.cutGhostsLocked(old.start, old.start+old.size, func(g *tnode[ghost]) bool { return g.k2 == old.id }, false)
}

// dropGhostsLocked cuts [a, a+n), whose addresses are being handed out
// again, out of the ghosts there whose frees have completed, keeping the
// parts of them outside it. Ghosts whose frees have not completed stay
// whole: a kernel launched before the free may still use them.
func (d *Device) dropGhostsLocked(a, n uint64) {
	hi := a + n
	// The usual case, in two floor queries: the ghost nearest below hi is
	// done (cut it), and then the nearest one misses a and none further
	// down is long enough to reach it.
	for {
		g := d.ghosts.floor(hi-1, math.MaxUint64)
		switch {
		case g == nil:
			return
		case g.k1+g.span <= a:
			if d.ghosts.root.maxSpan <= a-g.k1 {
				return
			}
		case g.v.done():
			if g.k1 >= a && g.k1+g.span <= hi {
				d.ghosts.remove(g.k1, g.k2) // wholly handed out again
			} else {
				d.cutGhostLocked(ghostNode{g.k1, g.k2, g.span, g.v}, a, hi)
			}
			continue
		}
		break
	}
	d.cutGhostsLocked(a, hi, func(g *tnode[ghost]) bool { return g.v.done() }, true)
}

// cutGhostLocked cuts [lo, hi) out of ghost node g, keeping the parts of
// it outside.
func (d *Device) cutGhostLocked(g ghostNode, lo, hi uint64) {
	d.ghosts.remove(g.k1, g.k2)
	if g.k1 < lo {
		d.ghosts.insert(g.k1, g.k2, lo-g.k1, g.v)
	}
	if end := g.k1 + g.span; end > hi {
		d.ghosts.insert(hi, g.k2, end-hi, g.v)
	}
}

// cutGhostsLocked cuts [lo, hi) out of the ghost nodes overlapping it that
// match; with keep, the parts of them outside it stay as nodes of their
// own, else they go too.
func (d *Device) cutGhostsLocked(lo, hi uint64, match func(g *tnode[ghost]) bool, keep bool) {
	if !d.ghosts.mayOverlap(lo, hi) {
		return
	}
	cut := d.ghostCut[:0]
	d.ghosts.overlapping(lo, hi, func(g *tnode[ghost]) bool {
		if match(g) {
			cut = append(cut, ghostNode{g.k1, g.k2, g.span, g.v})
		}
		return true
	})
	for _, g := range cut {
		if keep {
			d.cutGhostLocked(g, lo, hi)
		} else {
			d.ghosts.remove(g.k1, g.k2)
		}
	}
	clear(cut) // drop the stream pointers
	d.ghostCut = cut[:0]
}

// ghostHoldingLocked finds a freed allocation that held address a: the
// one starting nearest below a (the latest one, if several start there).
func (d *Device) ghostHoldingLocked(a uint64) *tnode[ghost] {
	if !d.ghosts.mayOverlap(a, a+1) {
		return nil
	}
	var found *tnode[ghost]
	d.ghosts.overlapping(a, a+1, func(g *tnode[ghost]) bool {
		found = g
		return false
	})
	return found
}

// usableGhostLocked finds a freed pool block that a kernel launched at
// stamp may still use for [a, a+n): freed (stream-ordered) after the
// launch, the free not yet complete, and holding the whole access. Failing
// that, overrun is such a block that holds a but not the whole access.
func (d *Device) usableGhostLocked(a, n, stamp uint64) (usable, overrun *tnode[ghost]) {
	if !d.ghosts.mayOverlap(a, a+1) {
		return nil, nil
	}
	d.ghosts.overlapping(a, a+1, func(g *tnode[ghost]) bool {
		if stamp < g.v.stamp && !g.v.done() {
			if a+n <= g.k1+g.span {
				usable = g
				return false
			}
			if overrun == nil {
				overrun = g
			}
		}
		return true
	})
	return usable, overrun
}

// badFreeLocked explains why p cannot be freed by op.
func (d *Device) badFreeLocked(p device.Ptr, op string) error {
	a := uint64(p)
	if a == 0 {
		return fmt.Errorf("%v: %s of a null pointer: %w", d, op, device.ErrInvalidPointer)
	}
	if nd := d.live.floor(a, 0); nd != nil && a < nd.k1+nd.span {
		switch nd.v.kind {
		case kMapped:
			if a == nd.k1 {
				return fmt.Errorf("%v: %s %v: it is mapped host memory; release it with HostFree: %w", d, op, p, device.ErrInvalidPointer)
			}
		case kMalloc:
			if a == nd.k1 {
				return fmt.Errorf("%v: %s %v: it was allocated with Malloc; release it with Free: %w", d, op, p, device.ErrInvalidPointer)
			}
		case kVMMap:
			return fmt.Errorf("%v: %s %v: it is mapped virtual memory; remove it with Unmap: %w", d, op, p, device.ErrInvalidPointer)
		case kSegment:
			if b := d.pool.blocks.floor(a, 0); b != nil && b.v.state == bUsed && a > b.v.start {
				return fmt.Errorf("%v: %s %v: it is %d bytes into the MallocAsync allocation at 0x%x; free takes the start: %w",
					d, op, p, a-b.v.start, b.v.start, device.ErrInvalidPointer)
			}
			if g := d.ghostHoldingLocked(a); g != nil {
				return d.freedErr(op, p, g)
			}
			return fmt.Errorf("%v: %s %v: it points into the async pool's free memory, never allocated: %w", d, op, p, device.ErrInvalidPointer)
		}
		return fmt.Errorf("%v: %s %v: it is %d bytes into the %s allocation at 0x%x; free takes the start: %w",
			d, op, p, a-nd.k1, nd.v.kind, nd.k1, device.ErrInvalidPointer)
	}
	if g := d.ghostHoldingLocked(a); g != nil {
		return d.freedErr(op, p, g)
	}
	return d.foreignLocked(op, p, false)
}

// freedErr reports a free of an address inside the freed allocation g.
func (d *Device) freedErr(op string, p device.Ptr, g *tnode[ghost]) error {
	if uint64(p) == g.v.start {
		return fmt.Errorf("%v: %s %v: already freed (%s allocation #%d of %s): %w",
			d, op, p, g.v.kind, g.v.id, units.Format(g.v.size), device.ErrDoubleFree)
	}
	return fmt.Errorf("%v: %s %v: it is %d bytes into the freed %s allocation #%d at 0x%x: %w",
		d, op, p, uint64(p)-g.v.start, g.v.kind, g.v.id, g.v.start, device.ErrInvalidPointer)
}

// foreignLocked explains an address that is not in this generation's
// allocations or ghosts; access is true for a copy, memset or kernel
// access, false for a free.
func (d *Device) foreignLocked(op string, p device.Ptr, access bool) error {
	a := uint64(p)
	if a == 0 {
		return fmt.Errorf("%v: %s: null pointer: %w", d, op, device.ErrInvalidPointer)
	}
	if r, open, ok := regionOf(a); ok {
		switch {
		case r.dev == d.id && r.gen != d.gen.Load():
			return fmt.Errorf("%v: %s %v: the pointer was allocated before a device reset (generation %d, now %d): %w",
				d, op, p, r.gen, d.gen.Load(), device.ErrInvalidated)
		case r.dev != d.id && open:
			return fmt.Errorf("%v: %s %v: the pointer belongs to another device (sim#%d): %w", d, op, p, r.dev, device.ErrInvalidPointer)
		case r.dev != d.id:
			return fmt.Errorf("%v: %s %v: the pointer belongs to another device (sim#%d, closed since): %w", d, op, p, r.dev, device.ErrInvalidPointer)
		}
	}
	if d.va.handedOut(a) {
		// Handed out before and freed since, but its ghost is forgotten.
		if access {
			return fmt.Errorf("%v: %s at %v: the address was allocated earlier and has been freed "+
				"(more than %d frees ago, so which allocation it was is forgotten): %w", d, op, p, ghostCap, device.ErrUseAfterFree)
		}
		return fmt.Errorf("%v: %s %v: no live allocation here; the address was allocated earlier and freed "+
			"more than %d frees ago, so this is a double free or a pointer into freed memory: %w", d, op, p, ghostCap, device.ErrInvalidPointer)
	}
	if a >= d.rg.lo && a < d.rg.hi {
		return fmt.Errorf("%v: %s %v: no allocation at this address: %w", d, op, p, device.ErrInvalidPointer)
	}
	return fmt.Errorf("%v: %s %v: not an address of this device: %w", d, op, p, device.ErrInvalidPointer)
}

// resolveLocked checks an access of n bytes at p and returns the bytes of
// the allocation it falls in that the access may see (data, starting at
// address base), or an error wrapping ErrOutOfBounds, ErrUseAfterFree,
// ErrInvalidated or ErrInvalidPointer. A kernel passes its launch stamp;
// the host passes 0. data is nil on an address-only device.
func (d *Device) resolveLocked(op string, p device.Ptr, n uint64, stamp uint64) (data []byte, base uint64, err error) {
	a := uint64(p)
	end := a + n
	if end < a {
		return nil, 0, fmt.Errorf("%v: %s of %d bytes at %v overflows the address space: %w", d, op, n, p, device.ErrOutOfBounds)
	}
	if nd := d.live.floor(a, 0); nd != nil && a < nd.k1+nd.span {
		r := &nd.v
		if r.kind == kSegment {
			return d.pool.resolveLocked(d, op, p, n, stamp, r.seg)
		}
		if r.kind == kVMMap {
			return d.resolveVMLocked(op, p, n, nd)
		}
		if r.marks != nil {
			return d.resolveMarkedLocked(op, p, n, stamp, nd)
		}
		if end > nd.k1+r.size {
			return nil, 0, d.oobErr(op, p, n, nd.k1, r.size, r.kind, r.id)
		}
		data, err := r.mem.bytes(d, op)
		return data, nd.k1, err
	}
	if g := d.ghostHoldingLocked(a); g != nil {
		return nil, 0, d.uafErr(op, p, n, g)
	}
	if err := d.reservedUnmappedErr(op, p, n); err != nil {
		return nil, 0, err
	}
	return nil, 0, d.foreignLocked(op, p, true)
}

func (d *Device) oobErr(op string, p device.Ptr, n, start, size uint64, kind recKind, id uint64) error {
	off := uint64(p) - start
	return fmt.Errorf("%v: %s of %s at %v: %s allocation #%d at 0x%x holds %s, the access runs %s past its end: %w",
		d, op, units.Format(n), p, kind, id, start, units.Format(size), units.Format(off+n-size), device.ErrOutOfBounds)
}

func (d *Device) uafErr(op string, p device.Ptr, n uint64, g *tnode[ghost]) error {
	return fmt.Errorf("%v: %s of %s at %v: %s allocation #%d (%s at 0x%x) has been freed: %w",
		d, op, units.Format(n), p, g.v.kind, g.v.id, units.Format(g.v.size), g.v.start, device.ErrUseAfterFree)
}

// checkAccess resolves an access from the host and returns the n bytes
// (nil when address-only).
func (d *Device) checkAccess(op string, p device.Ptr, n uint64) ([]byte, error) {
	d.mu.RLock()
	defer d.mu.RUnlock()
	if d.closed.Load() {
		return nil, d.errClosed(op)
	}
	data, base, err := d.resolveLocked(op, p, n, 0)
	if err != nil || data == nil {
		return nil, err
	}
	off := uint64(p) - base
	return data[off : off+n : off+n], nil
}

// checkEmpty checks the device pointer of a 0-byte copy or memset: nil is
// allowed; any other must lie in a live allocation or point just past
// its end. The error is that of a 0-byte access at p.
func (d *Device) checkEmpty(op string, p device.Ptr) error {
	if p == 0 {
		return nil
	}
	d.mu.RLock()
	defer d.mu.RUnlock()
	if d.closed.Load() {
		return d.errClosed(op)
	}
	_, _, err := d.resolveLocked(op, p, 0, 0)
	if err != nil {
		// Just past the end: the last byte before p is in bounds.
		if _, _, e := d.resolveLocked(op, p-1, 1, 0); e == nil {
			return nil
		}
	}
	return err
}
