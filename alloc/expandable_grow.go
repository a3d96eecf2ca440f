package alloc

// Expandable's growth, unmapping and reset hooks (the strategy interface of
// core.go). Rules:
//
//   - A growth is planned under the lock (planLocked) and committed there
//     (commitLocked): the hole pages to map and the free neighbours they
//     join leave the books as one pending block, so no other goroutine
//     plans or takes them; the pages are mapped without the lock (grow),
//     and the core books the growth (addSegmentLocked), or gives it back
//     (release), or grow reverts it when mapping failed.
//   - An unmapping takes whole pages of shared free blocks off the books
//     as a pending block (unmapLocked, counted as a device free at once),
//     unmaps them without the lock (release), and turns them into a hole.
//   - Growths and unmappings travel through the core as segments of their
//     own (vmWork); ranges are the segments on the core's list, given back
//     whole at Close.

import (
	"errors"
	"fmt"
	"slices"

	"github.com/vramkit/vram/device"
	"github.com/vramkit/vram/internal/units"
)

// growthPlan is where a growth maps its pages.
type growthPlan struct {
	rg          *vrange // nil: no range has room; reserve a new one
	hole        *block
	lo, hi      device.Ptr // pages to map, within hole
	left, right *block     // free neighbours the growth joins (nil: none)
	bytes       uint64     // bytes to map
}

func (e *Expandable) rangeOf(b *block) *vrange { return e.bySeg[b.seg] }

// addHoleLocked turns b (in rg's chain, in no set) into a hole, merged with
// holes on either side, and lists it.
func (e *Expandable) addHoleLocked(rg *vrange, b *block) {
	b.class = holeClass
	if pv := b.prev; pv != nil && pv.class == holeClass {
		rg.unlistHole(pv)
		e.idx.absorbPrev(b)
	}
	if nx := b.next; nx != nil && nx.class == holeClass {
		rg.unlistHole(nx)
		e.idx.absorbNext(b)
	}
	b.fprev, b.fnext = nil, rg.holes
	if rg.holes != nil {
		rg.holes.fprev = b
	}
	rg.holes = b
}

// unlistHole takes hole h off rg's list.
func (rg *vrange) unlistHole(h *block) {
	if h.fprev != nil {
		h.fprev.fnext = h.fnext
	} else {
		rg.holes = h.fnext
	}
	if h.fnext != nil {
		h.fnext.fprev = h.fprev
	}
	h.fprev, h.fnext = nil, nil
}

// splitFront cuts the first n bytes (0 < n < b.size) off b, in no set, as a
// new block before it in the chain, of b's class.
func (e *Expandable) splitFront(b *block, n uint64) *block {
	a := e.idx.newBlock()
	a.addr, a.size, a.seg, a.class = b.addr, n, b.seg, b.class
	linkBefore(a, b)
	b.addr += device.Ptr(n)
	b.size -= n
	return a
}

// pagesFor is the pages that hold need bytes, at least one.
func (e *Expandable) pagesFor(need int64) uint64 {
	if need <= 0 {
		return 1
	}
	return (uint64(need) + e.page - 1) / e.page
}

// planLocked finds the growth that serves r with the fewest pages mapped:
// in a hole of r's ranges, joining the free blocks on either side that r's
// stream may use (among equals, the lowest address wins); for a large
// request, in a hole of its stream's small ranges instead where that maps
// fewer pages and crossWantedLocked allows.
func (e *Expandable) planLocked(r request) growthPlan {
	own := e.ownPlanLocked(r)
	if r.class != classLarge {
		return own
	}
	cross := growthPlan{}
	pages := own.bytes / e.page // to beat, strictly
	if e.planInLocked(r, classSmall, &cross, &pages); cross.rg != nil && e.crossWantedLocked(r, own) {
		return cross
	}
	return own
}

// ownPlanLocked is the growth that serves r in its class's ranges with
// the fewest pages mapped; rg nil: in a new range.
func (e *Expandable) ownPlanLocked(r request) growthPlan {
	best := growthPlan{bytes: roundUp(r.size, e.page)}
	pages := ^uint64(0)
	e.planInLocked(r, r.class, &best, &pages)
	return best
}

// planInLocked sets *best to the growth for r in the ranges of r's stream
// and class cls that maps the fewest pages, if fewer than *bestPages (or
// as many at a lower address), and *bestPages to its pages.
func (e *Expandable) planInLocked(r request, cls uint8, best *growthPlan, bestPages *uint64) {
	st := e.idx.streams[r.stream] // nil: only shared neighbours join
	consider := func(rg *vrange, h *block, pages uint64, lo device.Ptr, left, right *block) {
		if pages*e.page > h.size {
			return
		}
		if pages < *bestPages || (pages == *bestPages && lo < best.lo) {
			*bestPages = pages
			*best = growthPlan{rg: rg, hole: h, lo: lo, hi: lo + device.Ptr(pages*e.page), left: left, right: right, bytes: pages * e.page}
		}
	}
	s := int64(r.size)
	for _, rg := range e.ranges[rangeKey{r.stream, cls}] {
		for h := rg.holes; h != nil; h = h.fnext {
			l, rt := h.prev, h.next
			if !canJoin(l, st) {
				l = nil
			}
			if !canJoin(rt, st) {
				rt = nil
			}
			var ls, rs int64
			if l != nil {
				ls = int64(l.size)
			}
			if rt != nil {
				rs = int64(rt.size)
			}
			hp := h.size / e.page
			end := h.addr + device.Ptr(h.size)
			if p := e.pagesFor(s - ls); p < hp || rt == nil {
				consider(rg, h, p, h.addr, l, nil)
			}
			if p := e.pagesFor(s - rs); p < hp || l == nil {
				consider(rg, h, p, end-device.Ptr(p*e.page), nil, rt)
			}
			if ls+int64(h.size)+rs >= s {
				consider(rg, h, hp, h.addr, l, rt)
			}
		}
	}
}

// crossWantedLocked reports whether large request r may use its stream's
// small ranges, its own class's growth being own: only when own would take
// the pages mapped past their high-water mark, even after the unmapping
// before it, and the pages live blocks would then touch (those mapped
// less the whole free pages) past the waste target for the bytes live
// with r (wasteTarget). What it measures is the waste in partly used
// pages, the one thing a placement across classes can lower.
func (e *Expandable) crossWantedLocked(r request, own growthPlan) bool {
	if e.mappedAfterLocked(own) <= e.highWater {
		return false
	}
	touched := e.st.Reserved + own.bytes - e.wholeFreePagesLocked(^uint64(0), true, own.left, own.right)*e.page
	return touched > e.wasteTarget(e.st.InUse+r.size)
}

// wasteTarget is the most bytes mapped that the policy aims at for live
// bytes: 3 % more, or the pages they need and one more, whichever is
// larger (the bound TestExpandableReplays holds every replay to).
func (e *Expandable) wasteTarget(live uint64) uint64 {
	return max(live+live/100*3, roundUp(live, e.page)+e.page)
}

// mappedAfterLocked is the bytes mapped once growth pl is made, after the
// whole free pages releaseForGrowthLocked would unmap before it (within
// the churn budget, sparing the blocks pl joins). Those pages being
// unmapped first does not change it.
func (e *Expandable) mappedAfterLocked(pl growthPlan) uint64 {
	over := e.st.Reserved + pl.bytes
	if !e.releaseWantedLocked(pl.bytes) {
		return over
	}
	budget := e.pages.PeakMapped / churnDiv
	need := min(e.pagesFor(int64(over-e.highWater)), budget-min(budget, e.pages.GrowthUnmaps))
	return over - e.wholeFreePagesLocked(need, false, pl.left, pl.right)*e.page
}

// wholeFreePagesLocked counts the whole pages of shared free blocks (of
// every free block, with owned) but skip, up to need.
func (e *Expandable) wholeFreePagesLocked(need uint64, owned bool, skip ...*block) uint64 {
	var n uint64
	for c := range e.idx.shared {
		n = e.countWholeFrom(e.idx.shared[c].root, n, need, skip)
	}
	if !owned {
		return n
	}
	for _, st := range e.idx.streams {
		for c := range st.free {
			n = e.countWholeFrom(st.free[c].root, n, need, skip)
		}
	}
	return n
}

// countWholeFrom adds to n the whole pages of the blocks of the treap
// under b, largest first, until it reaches need.
func (e *Expandable) countWholeFrom(b *block, n, need uint64, skip []*block) uint64 {
	for ; b != nil && n < need; b = b.left {
		if n = e.countWholeFrom(b.right, n, need, skip); n >= need || b.size < e.page {
			return n // so is everything to its left
		}
		if !slices.Contains(skip, b) {
			lo, hi := e.wholePages(b)
			n += uint64(hi-lo) / e.page
		}
	}
	return n
}

// commitLocked takes the plan's pages and free neighbours off the books as
// one pending block and returns the work of mapping them.
func (e *Expandable) commitLocked(pl growthPlan) *vmWork {
	rg, h := pl.rg, pl.hole
	rg.unlistHole(h)
	h.class = pendingClass // before the splits, so the holes cut off do not merge back
	if pl.lo > h.addr {
		e.addHoleLocked(rg, e.splitFront(h, uint64(pl.lo-h.addr)))
	}
	if end := h.addr + device.Ptr(h.size); end > pl.hi {
		rest := e.splitFront(h, uint64(pl.hi-h.addr))
		rest, h = h, rest // h is the front, [lo, hi); rest the back
		e.addHoleLocked(rg, rest)
	}
	w := &vmWork{rg: rg, blk: h, lo: pl.lo, hi: pl.hi}
	if l := pl.left; l != nil {
		w.left = absorbed{size: l.size, owner: l.owner, seq: l.seq, pend: l.pend}
		e.idx.holdLocked(l)
		e.idx.absorbPrev(h)
	}
	if r := pl.right; r != nil {
		w.right = absorbed{size: r.size, owner: r.owner, seq: r.seq, pend: r.pend}
		e.idx.holdLocked(r)
		e.idx.absorbNext(h)
	}
	return w
}

// growthLocked is the bytes a miss for r maps, by the plan it would follow.
func (e *Expandable) growthLocked(r request) uint64 {
	e.plan = e.planLocked(r)
	return e.plan.bytes
}

// releaseWantedLocked reports whether mapping g more bytes would take the
// mapped bytes past their high-water mark.
func (e *Expandable) releaseWantedLocked(g uint64) bool {
	return !e.cfg.KeepMapped && e.st.Reserved+g > e.highWater
}

// fenceBeforeGrowthLocked reports whether a growth for r would unmap free
// pages while some free blocks still wait for a stream's event (a fence
// round may make them shared, and so unmappable).
func (e *Expandable) fenceBeforeGrowthLocked(r request) bool {
	return e.idx.owning > 0 && e.releaseWantedLocked(e.planLocked(r).bytes)
}

// releaseForGrowthLocked unmaps whole free pages of shared blocks, those
// with the most whole pages first, until a growth of g bytes stays under
// the high-water mark; the blocks the plan joins are spared.
func (e *Expandable) releaseForGrowthLocked(g uint64) []*segment {
	if !e.releaseWantedLocked(g) {
		return nil
	}
	need := e.pagesFor(int64(e.st.Reserved + g - e.highWater))
	// The churn budget: at most one page unmapped this way per two pages
	// of the peak, so that maps and unmaps stay within 3× the pages at the
	// peak whatever the workload (BENCHMARKS.md).
	if budget := e.pages.PeakMapped / churnDiv; e.pages.GrowthUnmaps >= budget {
		return nil
	} else {
		need = min(need, budget-e.pages.GrowthUnmaps)
	}
	cand := e.unmappableLocked(e.plan.left, e.plan.right)
	var out []*segment
	for _, b := range cand {
		if need == 0 {
			break
		}
		lo, hi := e.wholePages(b)
		n := min(uint64(hi-lo)/e.page, need)
		need -= n
		e.pages.GrowthUnmaps += n
		out = append(out, e.unmapLocked(b, hi-device.Ptr(n*e.page), hi))
	}
	return out
}

// wholePages is the whole pages free block b covers.
func (e *Expandable) wholePages(b *block) (lo, hi device.Ptr) {
	return e.wholePagesIn(b.addr, b.addr+device.Ptr(b.size))
}

// wholePagesIn is the whole pages within [from, to): [lo, hi), empty when
// lo == hi.
func (e *Expandable) wholePagesIn(from, to device.Ptr) (lo, hi device.Ptr) {
	lo = device.Ptr(roundUp(uint64(from), e.page))
	hi = device.Ptr(uint64(to) / e.page * e.page)
	return lo, max(lo, hi)
}

// unmappableLocked lists the shared free blocks that cover a whole page,
// but skip, those with the most whole pages first.
func (e *Expandable) unmappableLocked(skip ...*block) []*block {
	var out []*block
	var walk func(b *block)
	walk = func(b *block) {
		if b == nil {
			return
		}
		walk(b.right)
		if b.size < e.page {
			return // so is everything to its left
		}
		if lo, hi := e.wholePages(b); hi > lo && !slices.Contains(skip, b) {
			out = append(out, b)
		}
		walk(b.left)
	}
	for c := range e.idx.shared {
		walk(e.idx.shared[c].root)
	}
	slices.SortStableFunc(out, func(a, b *block) int {
		la, ha := e.wholePages(a)
		lb, hb := e.wholePages(b)
		return int(int64(hb-lb) - int64(ha-la))
	})
	return out
}

// unmapLocked takes pages [lo, hi) of shared free block b off the books
// and returns the work of unmapping them; the rest of b stays free.
func (e *Expandable) unmapLocked(b *block, lo, hi device.Ptr) *segment {
	e.idx.remove(b)
	rg := e.rangeOf(b)
	if lo > b.addr {
		e.idx.insertShared(e.splitFront(b, uint64(lo-b.addr)))
	}
	if end := b.addr + device.Ptr(b.size); end > hi {
		front := e.splitFront(b, uint64(hi-b.addr))
		e.idx.insertShared(b)
		b = front
	}
	b.class = pendingClass
	seg := &segment{base: lo, size: uint64(hi - lo), class: rg.seg.class}
	e.work[seg] = &vmWork{rg: rg, blk: b, lo: lo, hi: hi, unmap: true}
	e.st.deviceFreeLocked(seg.size)
	return seg
}

// trimLocked unmaps every whole page of every shared free block.
func (e *Expandable) trimLocked() []*segment { return e.releaseCachedLocked(0) }

// releaseCachedLocked unmaps whole pages of shared free blocks, those with
// the most whole pages first, while more than keep bytes are cached
// (mapped and not in use).
func (e *Expandable) releaseCachedLocked(keep uint64) []*segment {
	var out []*segment
	for _, b := range e.unmappableLocked() {
		cached := e.st.Reserved - min(e.st.Reserved, e.st.InUse)
		if cached <= keep {
			break
		}
		lo, hi := e.wholePages(b)
		n := min(uint64(hi-lo)/e.page, e.pagesFor(int64(cached-keep)))
		out = append(out, e.unmapLocked(b, hi-device.Ptr(n*e.page), hi))
	}
	return out
}

// grow maps the pages of the best plan for r, reserving a new range when
// no range has room. Called without the lock. On the device's out of
// memory, while streams still own free blocks, it waits for their work,
// unmaps every whole free page and tries once more: the core's own wait
// leaves the asking stream's blocks with it (a Pool's device Free waits for
// their work, but Unmap does not), and those pages must go too.
func (e *Expandable) grow(r request, g uint64) (*segment, uint64, error) {
	seg, n, err := e.growOnce(r, g)
	if err == nil || !errors.Is(err, device.ErrOutOfMemory) {
		return seg, n, err
	}
	e.mu.Lock()
	if e.closed || e.idx.owning == 0 {
		e.mu.Unlock()
		return seg, n, err
	}
	werr := e.fenceAllLocked()
	if e.closed {
		e.mu.Unlock()
		return seg, n, joinErr(err, werr)
	}
	rel := e.trimLocked()
	e.mu.Unlock()
	if len(rel) == 0 {
		return seg, n, joinErr(err, werr)
	}
	if rerr := e.giveBack(rel); rerr != nil {
		return seg, n, errors.Join(err, werr, rerr)
	}
	return e.growOnce(r, g)
}

// growOnce is one try of grow.
func (e *Expandable) growOnce(r request, g uint64) (*segment, uint64, error) {
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return nil, g, fmt.Errorf("alloc: expandable alloc of %s: %w", units.Format(r.n), ErrClosed)
	}
	pl := e.planLocked(r)
	if pl.rg == nil {
		var err error
		if pl, err = e.newRangeLocked(r); err != nil {
			e.mu.Unlock()
			return nil, pl.bytes, err
		}
	}
	w := e.commitLocked(pl)
	gen := e.devGen
	e.mu.Unlock()
	maps, unmaps, err := e.mapPages(w.lo, w.hi)
	e.mu.Lock()
	e.pages.Maps += maps
	e.pages.Unmaps += unmaps
	if err != nil {
		// A reset meanwhile took the range: the device refuses its
		// addresses (as an invalid value), and the error says why.
		if e.syncGenLocked(); e.devGen != gen && !errors.Is(err, device.ErrInvalidated) {
			err = fmt.Errorf("%w (the device was reset while the pages were mapped: %w)", err, device.ErrInvalidated)
		}
		e.revertLocked(w)
		e.mu.Unlock()
		return nil, uint64(w.hi - w.lo), err
	}
	seg := &segment{base: w.lo, size: uint64(w.hi - w.lo), class: w.rg.seg.class}
	e.work[seg] = w
	e.mu.Unlock()
	return seg, seg.size, nil
}

// newRangeLocked reserves a range for r's stream and class (the lock is
// released meanwhile) and plans r's growth in it.
func (e *Expandable) newRangeLocked(r request) (growthPlan, error) {
	need := roundUp(r.size, e.page)
	size := max(e.reserve, need)
	gen := e.devGen
	e.mu.Unlock()
	base, err := e.vm.ReserveAddress(size)
	if err != nil && errors.Is(err, device.ErrOutOfMemory) {
		// Address space is short: give back the ranges nothing is mapped
		// in (streams gone), and reserve no more than r needs.
		e.mu.Lock()
		empty := e.emptyRangesLocked()
		e.mu.Unlock()
		_ = e.giveBack(empty)
		size = need
		base, err = e.vm.ReserveAddress(size)
	}
	e.mu.Lock()
	if err != nil {
		return growthPlan{bytes: need}, fmt.Errorf("alloc: expandable alloc of %s: reserving %s of address space: %w",
			units.Format(r.n), units.Format(size), err)
	}
	if e.syncGenLocked(); e.closed || e.devGen != gen {
		e.mu.Unlock()
		ferr := e.vm.FreeAddress(base, size)
		e.mu.Lock()
		if lostToReset(ferr) {
			ferr = nil
		}
		return growthPlan{bytes: need}, joinErr(fmt.Errorf("alloc: expandable alloc of %s: the device was reset or the allocator closed while it reserved address space: %w",
			units.Format(r.n), device.ErrInvalidated), ferr)
	}
	seg := &segment{base: base, size: size, class: r.class}
	h := e.idx.newBlock()
	h.addr, h.size, h.seg = base, size, seg
	seg.first = h
	rg := &vrange{seg: seg, key: rangeKey{r.stream, r.class}, mapped: make([]bool, size/e.page)}
	e.addHoleLocked(rg, h)
	// On the core's list (so Close gives it back), but not in Reserved:
	// only mapped pages count.
	e.pushSegLocked(seg)
	e.peakRanges = max(e.peakRanges, e.nsegs)
	e.ranges[rg.key] = append(e.ranges[rg.key], rg)
	e.bySeg[seg] = rg
	e.pages.Reservation++
	return e.planLocked(r), nil
}

// mapPages maps fresh pages over [lo, hi), one handle each, and grants
// access; on failure it unmaps what it mapped. It returns the map and
// unmap calls made. Called without the lock.
func (e *Expandable) mapPages(lo, hi device.Ptr) (maps, unmaps uint64, err error) {
	at := lo
	for ; at < hi && err == nil; at += device.Ptr(e.page) {
		var h device.PhysMem
		if h, err = e.vm.CreatePhysical(e.page); err != nil {
			break
		}
		err = e.vm.Map(at, e.page, h)
		rerr := e.vm.ReleasePhysical(h) // the mapping keeps the memory
		if err != nil {
			break
		}
		maps++
		err = rerr
	}
	if err == nil {
		err = e.vm.SetAccess(lo, uint64(hi-lo))
	}
	if err == nil {
		return maps, 0, nil
	}
	for p := lo; p < lo+device.Ptr(maps*e.page); p += device.Ptr(e.page) {
		_ = e.vm.Unmap(p, e.page)
		unmaps++
	}
	return maps, unmaps, fmt.Errorf("alloc: expandable: mapping %s at %v: %w", units.Format(uint64(hi-lo)), lo, err)
}

// revertLocked undoes a growth whose pages are unmapped: the free
// neighbours it joined go back to the index as they were, its pages
// become a hole. In a range a reset or Close gave up, only the holds on
// its neighbours' streams end.
func (e *Expandable) revertLocked(w *vmWork) {
	if w.rg.dead {
		e.idx.unholdLocked(w.left.owner)
		e.idx.unholdLocked(w.right.owner)
		return
	}
	b := w.blk
	if w.left.size > 0 {
		e.putBackLocked(e.splitFront(b, w.left.size), w.left)
	}
	if w.right.size > 0 {
		right := e.splitFront(b, uint64(w.hi-w.lo))
		right, b = b, right
		e.putBackLocked(right, w.right)
	}
	e.addHoleLocked(w.rg, b)
}

// putBackLocked returns free block b, absorbed by a growth, to its set:
// its stream's (kept while the growth held it) or the shared set.
func (e *Expandable) putBackLocked(b *block, a absorbed) {
	b.class = b.seg.class
	if a.owner == nil {
		e.idx.insertShared(b)
		return
	}
	e.idx.unholdLocked(a.owner)
	e.idx.insertOwnedAt(b, a.owner, a.seq, a.pend)
}

// addSegmentLocked books a growth the core has counted (seg, linked on the
// core's list with a block of its own): the pages join the range, with the
// free neighbours the growth absorbed, as one free block (r's stream's when
// it absorbed one of that stream's, pending only where those were: the
// only owned neighbours a growth for r joins, canJoin), and r's block is
// carved from its front.
func (e *Expandable) addSegmentLocked(seg *segment, r request) *block {
	w := e.work[seg]
	delete(e.work, seg)
	e.idx.putBlock(seg.first)
	seg.first = nil
	unlinkSegment(&e.segs, seg)
	e.nsegs--
	e.markLocked(w, true)
	e.highWater = max(e.highWater, e.st.Reserved)
	b := w.blk
	b.class = w.rg.seg.class
	var st *streamState
	var seq uint64
	var pend span // the new pages wait for nothing
	for _, a := range []absorbed{w.left, w.right} {
		if a.owner != nil {
			e.idx.unholdLocked(a.owner)
			st, seq, pend = a.owner, max(seq, a.seq), pend.hull(a.pend)
		}
	}
	if st != nil {
		e.idx.insertOwnedAt(b, st, seq, pend)
	} else {
		e.idx.insertShared(b)
	}
	return e.idx.carveFront(b, r.size)
}

// markLocked records w's pages as mapped or not.
func (e *Expandable) markLocked(w *vmWork, mapped bool) {
	base := w.rg.seg.base
	for p := w.lo; p < w.hi; p += device.Ptr(e.page) {
		w.rg.mapped[uint64(p-base)/e.page] = mapped
	}
	n := uint64(w.hi-w.lo) / e.page
	if mapped {
		e.pages.Mapped += n
		e.pages.PeakMapped = max(e.pages.PeakMapped, e.pages.Mapped)
	} else {
		e.pages.Mapped -= n
	}
}

// release gives back what seg stands for: a range (Close), an unmapping, or
// a growth the core did not book. Called without the lock.
func (e *Expandable) release(seg *segment) error {
	e.mu.Lock()
	if rg := e.bySeg[seg]; rg != nil {
		delete(e.bySeg, seg)
		return e.releaseRange(rg) // unlocks
	}
	// The work stays on the books until its pages are unmapped: a reset
	// meanwhile (dropGenerationLocked) must know that an unmapping's
	// pages, still marked mapped, are already out of Reserved.
	w := e.work[seg]
	e.mu.Unlock()
	if w == nil {
		return nil
	}
	var errs []error
	var unmaps uint64
	for p := w.lo; p < w.hi; p += device.Ptr(e.page) {
		if err := e.vm.Unmap(p, e.page); err != nil && !lostToReset(err) {
			errs = append(errs, err)
		}
		unmaps++
	}
	e.mu.Lock()
	delete(e.work, seg)
	e.pages.Unmaps += unmaps
	switch {
	case !w.unmap:
		e.revertLocked(w)
	case !w.rg.dead:
		e.markLocked(w, false)
		e.addHoleLocked(w.rg, w.blk)
	}
	e.mu.Unlock()
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("alloc: expandable: unmapping %s at %v: %w", units.Format(uint64(w.hi-w.lo)), w.lo, err)
	}
	return nil
}

// emptyRangesLocked takes off the books every range that is one hole (no
// block, nothing mapped, nothing in flight) and returns their segments, to
// give back with release.
func (e *Expandable) emptyRangesLocked() []*segment {
	var out []*segment
	for key, rgs := range e.ranges {
		kept := rgs[:0]
		for _, rg := range rgs {
			if f := rg.seg.first; f != nil && f.class == holeClass && f.next == nil {
				unlinkSegment(&e.segs, rg.seg)
				e.nsegs--
				out = append(out, rg.seg)
				continue
			}
			kept = append(kept, rg)
		}
		if len(kept) == 0 {
			delete(e.ranges, key)
		} else {
			e.ranges[key] = kept
		}
	}
	return out
}

// releaseRange unmaps every page of rg and frees its addresses; entered
// with the lock held, returns with it released.
func (e *Expandable) releaseRange(rg *vrange) error {
	rg.dead = true
	var pages []device.Ptr
	for i, m := range rg.mapped {
		if m {
			pages = append(pages, rg.seg.base+device.Ptr(uint64(i)*e.page))
		}
	}
	e.pages.Unmaps += uint64(len(pages))
	e.pages.Mapped -= uint64(len(pages))
	e.mu.Unlock()
	var errs []error
	for _, p := range pages {
		if err := e.vm.Unmap(p, e.page); err != nil && !lostToReset(err) {
			errs = append(errs, err)
		}
	}
	if err := e.vm.FreeAddress(rg.seg.base, rg.seg.size); err != nil && !lostToReset(err) {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("alloc: expandable: giving back the range at %v (%s): %w", rg.seg.base, units.Format(rg.seg.size), err)
	}
	return nil
}

// dropGenerationLocked handles a device reset: every range is from before
// it and gone with its pages. Free blocks leave the index; a range with no
// live block leaves the books, counted as a device free; one with live
// blocks keeps only their bytes in Reserved, on the stale list, until they
// are freed (freeStaleLocked). The high-water mark starts afresh.
func (e *Expandable) dropGenerationLocked() {
	for seg := e.segs; seg != nil; {
		next := seg.snext
		rg := e.bySeg[seg]
		rg.dead = true
		delete(e.bySeg, seg)
		var mapped uint64
		for _, m := range rg.mapped {
			if m {
				mapped += e.page
			}
		}
		for _, w := range e.work {
			if w.unmap && w.rg == rg {
				mapped -= uint64(w.hi - w.lo) // already out of Reserved
			}
		}
		live, liveBytes := 0, uint64(0)
		for b := seg.first; b != nil; {
			nx := b.next
			switch {
			case b.free:
				e.idx.remove(b)
				e.idx.putBlock(b)
			case b.class == holeClass:
				e.idx.putBlock(b)
			case b.class == pendingClass:
				// Its work, in flight, finds the range dead.
			default:
				b.prev, b.next = nil, nil
				live++
				liveBytes += b.size
			}
			b = nx
		}
		seg.first = nil
		seg.sprev, seg.snext = nil, nil
		e.st.Reserved -= mapped - min(mapped, liveBytes)
		if live == 0 {
			e.st.DeviceFrees++
		} else {
			seg.stale, seg.nlive = true, live
			seg.snext = e.stale
			if e.stale != nil {
				e.stale.sprev = seg
			}
			e.stale = seg
		}
		seg = next
	}
	for _, w := range e.work {
		w.rg.dead = true
	}
	e.segs, e.nsegs = nil, 0
	clear(e.ranges)
	e.highWater = 0
	e.pages.Mapped = 0
}

// freeStaleLocked takes back live block b of a range from before a reset:
// its bytes leave Reserved, and the range leaves the books with its last
// live block.
func (e *Expandable) freeStaleLocked(b *block) []*segment {
	seg := b.seg
	e.st.Reserved -= b.size
	e.idx.putBlock(b)
	seg.nlive--
	if seg.nlive == 0 {
		unlinkSegment(&e.stale, seg)
		e.st.DeviceFrees++
	}
	return nil
}

// closeLocked clears the strategy's books at Close and returns the number
// of stale ranges (gone with a reset: nothing to give back).
func (e *Expandable) closeLocked() int {
	n := 0
	for seg := e.stale; seg != nil; seg = seg.snext {
		n++
	}
	e.stale = nil
	clear(e.ranges)
	for _, w := range e.work {
		w.rg.dead = true
	}
	return n
}
