package sim

// Sub-allocation marks: device.SubAllocationChecker.
//
// An allocator that carves its own blocks out of Mallocs (alloc.Pool with
// CheckBlocks) marks each block it hands out with MarkAllocated and each
// block it takes back with MarkFreed. A Malloc with marks keeps them in a
// treap of live ranges keyed by start address (span = the marked length)
// and a bounded treap of recently freed ranges, both under d.mu. Once a
// Malloc has been marked, an access to it must lie wholly inside one live
// mark: an access that runs past a mark's end or falls between marks is
// ErrOutOfBounds, one in a freed mark is ErrUseAfterFree. As for
// FreeAsync, a kernel launched before the MarkFreed (the free is
// stream-ordered after it) may still use the freed range: MarkFreed takes
// an issue stamp, and such a kernel may use the freed range even after it
// has been marked again, smaller (a pool re-handing the block on the same
// stream). Freed marks are keyed by start and id, since a range can be
// freed more than once and freed ranges can overlap. A Malloc never marked
// has a nil marks pointer and is checked exactly as before; freeing the
// Malloc drops its marks with it.

import (
	"fmt"
	"math"

	"github.com/vramkit/vram/device"
	"github.com/vramkit/vram/internal/units"
)

// markGhostCap bounds how many freed marks each Malloc remembers.
const markGhostCap = 4096

// mark is a marked range: live, or freed (then stamp is the free's).
type mark struct {
	size  uint64
	id    uint64 // counted from 1 per Malloc
	stamp uint64
}

// marks are the sub-allocations of one Malloc.
type marks struct {
	live   tree[mark]  // keyed by (start, 0); live marks never overlap
	freed  tree[mark]  // keyed by (start, id); may overlap each other and live marks
	order  forgetQueue // which freed marks to forget first
	nextID uint64
}

// markedLocked finds the live Malloc holding [a, a+n), or explains why
// there is none.
func (d *Device) markedLocked(op string, p device.Ptr, n uint64) (*tnode[rec], error) {
	if d.closed.Load() {
		return nil, d.errClosed(op)
	}
	a := uint64(p)
	nd := d.live.floor(a, 0)
	if nd == nil || a >= nd.k1+nd.span {
		if g := d.ghostHoldingLocked(a); g != nil {
			return nil, fmt.Errorf("%v: %s at %v: %s allocation #%d at 0x%x has been freed: %w",
				d, op, p, g.v.kind, g.v.id, g.v.start, device.ErrUseAfterFree)
		}
		return nil, d.foreignLocked(op, p, false)
	}
	if nd.v.kind != kMalloc {
		return nil, fmt.Errorf("%v: %s at %v: it lies in %s, not in a Malloc; only Malloc allocations take marks: %w",
			d, op, p, nd.v.kind, device.ErrInvalidPointer)
	}
	if end := a + n; end < a || end > nd.k1+nd.v.size {
		return nil, fmt.Errorf("%v: %s of %s at %v: Malloc allocation #%d at 0x%x holds %s, the range runs past its end: %w",
			d, op, units.Format(n), p, nd.v.id, nd.k1, units.Format(nd.v.size), device.ErrOutOfBounds)
	}
	return nd, nil
}

// MarkAllocated marks [p, p+n), n > 0, inside one Malloc allocation, as a
// live sub-allocation (device.SubAllocationChecker). From then on every
// access to that Malloc must lie inside one live mark. A range overlapping
// a live mark is device.ErrInvalidValue.
func (d *Device) MarkAllocated(p device.Ptr, n uint64) error {
	const op = "mark allocated"
	if n == 0 {
		return fmt.Errorf("%v: %s of 0 bytes at %v: the size must be > 0: %w", d, op, p, device.ErrInvalidValue)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	nd, err := d.markedLocked(op, p, n)
	if err != nil {
		return err
	}
	m := nd.v.marks
	if m == nil {
		m = &marks{}
		nd.v.marks = m
	}
	a := uint64(p)
	if o := m.live.floor(a+n-1, 0); o != nil && o.k1+o.span > a {
		return fmt.Errorf("%v: %s of %s at %v: it overlaps live marked block #%d (%s at 0x%x): %w",
			d, op, units.Format(n), p, o.v.id, units.Format(o.v.size), o.k1, device.ErrInvalidValue)
	}
	m.nextID++
	m.live.insert(a, 0, n, mark{size: n, id: m.nextID})
	return nil
}

// MarkFreed ends the live mark starting at p (device.SubAllocationChecker).
// Freeing a mark twice is device.ErrDoubleFree; p not the start of a live
// mark is device.ErrInvalidPointer.
func (d *Device) MarkFreed(p device.Ptr) error {
	const op = "mark freed"
	d.mu.Lock()
	defer d.mu.Unlock()
	nd, err := d.markedLocked(op, p, 1)
	if err != nil {
		return err
	}
	a := uint64(p)
	m := nd.v.marks
	if m == nil {
		return fmt.Errorf("%v: %s %v: Malloc allocation #%d has no marked blocks: %w", d, op, p, nd.v.id, device.ErrInvalidPointer)
	}
	mk, ok := m.live.remove(a, 0)
	if !ok {
		if g := m.freed.floor(a, math.MaxUint64); g != nil && g.k1 == a {
			return fmt.Errorf("%v: %s %v: marked block #%d (%s) is already freed: %w",
				d, op, p, g.v.id, units.Format(g.v.size), device.ErrDoubleFree)
		}
		return fmt.Errorf("%v: %s %v: no live marked block starts here: %w", d, op, p, device.ErrInvalidPointer)
	}
	mk.stamp = d.stamp.Add(1)
	m.freed.insert(a, mk.id, mk.size, mk)
	if old, forget := m.order.push(ghostRef{a, mk.id, 0}, markGhostCap); forget {
		m.freed.remove(old.start, old.id)
	}
	return nil
}

// freedCover finds a freed mark of m that holds [a, a+n) and was freed
// after stamp (so an access issued at stamp may still use it), or failing
// that any freed mark holding a, for the error. Freed marks holding a are
// tried nearest start first.
func (m *marks) freedCover(a, n, stamp uint64) (usable, holder *tnode[mark]) {
	m.freed.overlapping(a, a+1, func(g *tnode[mark]) bool {
		if holder == nil {
			holder = g
		}
		if stamp != 0 && stamp < g.v.stamp && a+n <= g.k1+g.v.size {
			usable = g
			return false
		}
		return true
	})
	return usable, holder
}

// resolveMarkedLocked checks an access of n bytes at p (end not
// overflowing) to the marked Malloc nd; see resolveLocked.
func (d *Device) resolveMarkedLocked(op string, p device.Ptr, n, stamp uint64, nd *tnode[rec]) ([]byte, uint64, error) {
	a, r := uint64(p), &nd.v
	m := r.marks
	in := func(k1 uint64, mk mark) ([]byte, uint64, error) {
		if a+n > k1+mk.size {
			return nil, 0, fmt.Errorf("%v: %s of %s at %v: marked block #%d at 0x%x (in Malloc allocation #%d) holds %s, "+
				"the access runs %s past its end: %w",
				d, op, units.Format(n), p, mk.id, k1, r.id, units.Format(mk.size), units.Format(a+n-k1-mk.size), device.ErrOutOfBounds)
		}
		data, err := r.mem.bytes(d, op)
		if data == nil {
			return nil, k1, err
		}
		off := k1 - nd.k1
		return data[off : off+mk.size : off+mk.size], k1, nil
	}
	live := m.live.floor(a, 0)
	if live != nil && a < live.k1+live.span && a+n <= live.k1+live.v.size {
		return in(live.k1, live.v)
	}
	// A kernel launched before a (stream-ordered) free may still use the
	// freed block, even where it has been marked again: the free takes
	// effect after the kernel.
	usable, g := m.freedCover(a, n, stamp)
	if usable != nil {
		return in(usable.k1, usable.v)
	}
	if live != nil && a < live.k1+live.span {
		return in(live.k1, live.v) // the overrun error
	}
	if g != nil {
		return nil, 0, fmt.Errorf("%v: %s of %s at %v: marked block #%d (%s at 0x%x, in Malloc allocation #%d) has been freed: %w",
			d, op, units.Format(n), p, g.v.id, units.Format(g.v.size), g.k1, r.id, device.ErrUseAfterFree)
	}
	return nil, 0, fmt.Errorf("%v: %s of %s at %v: it starts outside every live marked block of Malloc allocation #%d at 0x%x: %w",
		d, op, units.Format(n), p, r.id, nd.k1, device.ErrOutOfBounds)
}
