package alloc

// Test-only check of Expandable's internals.

import (
	"errors"
	"fmt"

	"github.com/vramkit/vram/device"
)

// CheckInvariants checks Expandable's books at a quiet moment (no call in
// flight): every range is tiled by its blocks; holes are whole unmapped
// pages, listed, never two side by side; free and live blocks lie in
// mapped pages, free ones in the index, live ones in the live table; the
// pages mapped are PageStats.Mapped, and their bytes Reserved less what
// live blocks from before a reset still hold; every owned free block's
// stream is known to the index, and none holds a block out of it
// (streamState.held).
func (e *Expandable) CheckInvariants() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return nil
	}
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	var mappedPages uint64
	for seg := e.segs; seg != nil; seg = seg.snext {
		rg := e.bySeg[seg]
		if rg == nil {
			bad("segment %v on the list is no range", seg.base)
			continue
		}
		listed := map[*block]bool{}
		for h := rg.holes; h != nil; h = h.fnext {
			listed[h] = true
		}
		at := seg.base
		var prev *block
		for b := seg.first; b != nil; b = b.next {
			if b.addr != at || b.prev != prev || b.seg != seg {
				bad("range %v: block at %v (prev %p) does not follow %v", seg.base, b.addr, b.prev, at)
				break
			}
			e.checkBlockLocked(rg, b, listed[b], bad)
			delete(listed, b)
			if prev != nil && prev.class == holeClass && b.class == holeClass {
				bad("range %v: two holes side by side at %v", seg.base, b.addr)
			}
			at += device.Ptr(b.size)
			prev = b
		}
		if at != seg.base+device.Ptr(seg.size) {
			bad("range %v: blocks end at %v, the range at %v", seg.base, at, seg.base+device.Ptr(seg.size))
		}
		if len(listed) > 0 {
			bad("range %v: %d listed holes are not in its chain", seg.base, len(listed))
		}
		for _, m := range rg.mapped {
			if m {
				mappedPages++
			}
		}
	}
	if mappedPages != e.pages.Mapped {
		bad("%d pages mapped, PageStats says %d", mappedPages, e.pages.Mapped)
	}
	var stale uint64
	for seg := e.stale; seg != nil; seg = seg.snext {
		for b := range e.live {
			if e.live[b].seg == seg {
				stale += e.live[b].size
			}
		}
	}
	for _, st := range e.idx.streams {
		if st.held != 0 {
			bad("stream %d holds %d free blocks out of the index, with no growth in flight", st.handle, st.held)
		}
	}
	if len(e.work) == 0 && mappedPages*e.page+stale != e.st.Reserved {
		bad("%d pages mapped and %d bytes of stale live blocks, but Reserved is %d", mappedPages, stale, e.st.Reserved)
	}
	return errors.Join(errs...)
}

// checkBlockLocked checks one block of range rg; listed says it is on the
// hole list.
func (e *Expandable) checkBlockLocked(rg *vrange, b *block, listed bool, bad func(string, ...any)) {
	first := uint64(b.addr-rg.seg.base) / e.page
	last := (uint64(b.addr-rg.seg.base) + b.size - 1) / e.page
	switch b.class {
	case holeClass:
		if !listed || uint64(b.addr)%e.page != 0 || b.size%e.page != 0 {
			bad("hole at %v (%d bytes): listed %v, want whole pages", b.addr, b.size, listed)
		}
		for p := first; p <= last; p++ {
			if rg.mapped[p] {
				bad("hole at %v: page %d is mapped", b.addr, p)
			}
		}
		return
	case pendingClass:
		bad("pending block at %v with no call in flight", b.addr)
		return
	}
	if b.class != rg.seg.class {
		bad("block at %v of class %d in a range of class %d", b.addr, b.class, rg.seg.class)
	}
	for p := first; p <= last; p++ {
		if !rg.mapped[p] {
			bad("block at %v (%d bytes, free %v): page %d is not mapped", b.addr, b.size, b.free, p)
		}
	}
	if !b.free && e.live[b.addr] != b {
		bad("block at %v is neither free nor live", b.addr)
	}
	if b.free {
		if err := checkPend(b); err != nil {
			bad("%v", err)
		}
		if o := b.owner; o != nil && e.idx.streams[o.handle] != o {
			bad("free block at %v is owned by stream %d, which the index has forgotten", b.addr, o.handle)
		}
	}
	if listed {
		bad("block at %v is on the hole list", b.addr)
	}
}
