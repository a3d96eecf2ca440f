package alloc

// Test-only exports that reach Pool's and PinnedPool's internals, as the
// runtime's export_test.go does.

import (
	"errors"
	"fmt"
	"sort"

	"github.com/vramkit/vram/device"
)

// SegmentInfo describes one segment of a Pool, for tests.
type SegmentInfo struct {
	Base, Size uint64
	Small      bool
	Blocks     int
	Free       int // free blocks
}

// Segments lists the pool's segments, lowest address first.
func (p *Pool) Segments() []SegmentInfo {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []SegmentInfo
	for seg := p.segs; seg != nil; seg = seg.snext {
		si := SegmentInfo{Base: uint64(seg.base), Size: seg.size, Small: seg.class == classSmall}
		for b := seg.first; b != nil; b = b.next {
			si.Blocks++
			if b.free {
				si.Free++
			}
		}
		out = append(out, si)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Base < out[j].Base })
	return out
}

// CheckInvariants checks the pool's books against each other and returns
// every inconsistency found.
func (p *Pool) CheckInvariants() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if p.closed {
		return nil
	}
	var reserved, inUse uint64
	var classRes [numClasses]uint64
	var nsegs, nlive, nfree, nwholly int
	var freeBytes uint64
	for seg := p.segs; seg != nil; seg = seg.snext {
		nsegs++
		reserved += seg.size
		classRes[seg.class] += seg.size
		if seg.snext != nil && seg.snext.sprev != seg {
			bad("segment %v: broken list link", seg.base)
		}
		if seg.stale {
			bad("segment %v: stale but on the segment list", seg.base)
		}
		if seg.first == nil || seg.first.prev != nil {
			bad("segment %v: bad first block", seg.base)
			continue
		}
		at := seg.base
		var prev *block
		for b := seg.first; b != nil; b = b.next {
			if b.prev != prev {
				bad("block %v: prev link broken", b.addr)
			}
			if b.seg != seg || b.class != seg.class {
				bad("block %v: wrong segment or class", b.addr)
			}
			if b.addr != at {
				bad("block %v: expected at %v (gap or overlap)", b.addr, at)
			}
			if b.size == 0 || b.size%PoolGranularity != 0 {
				bad("block %v: size %d not a positive multiple of %d", b.addr, b.size, PoolGranularity)
			}
			at = b.addr + ptrOf(b.size)
			if b.free {
				nfree++
				freeBytes += b.size
				if prev != nil && prev.free && prev.owner == b.owner {
					bad("blocks %v and %v: adjacent free blocks of one set not coalesced", prev.addr, b.addr)
				}
				if p.live[b.addr] == b {
					bad("block %v: free but in the live table", b.addr)
				}
			} else {
				nlive++
				inUse += b.size
				if p.live[b.addr] != b {
					bad("block %v: live but not in the live table", b.addr)
				}
			}
			prev = b
		}
		if at != seg.base+ptrOf(seg.size) {
			bad("segment %v: blocks end at %v, segment at %v", seg.base, at, seg.base+ptrOf(seg.size))
		}
		wholly := seg.first.free && seg.first.next == nil
		if wholly {
			nwholly++
		}
		if wholly != (seg.wi > 0) {
			bad("segment %v: wholly free %v but listed %v", seg.base, wholly, seg.wi > 0)
		}
		if seg.wi > 0 && (seg.wi > len(p.wholly) || p.wholly[seg.wi-1] != seg) {
			bad("segment %v: wrong index in the wholly free list", seg.base)
		}
	}
	// Segments from before a device reset with live blocks: off the
	// segment list, each counting its live blocks.
	staleLive := map[*segment]int{}
	for ptr, b := range p.live {
		if b.seg.stale {
			staleLive[b.seg]++
			reserved += b.size // the rest of a stale segment left Reserved at the reset
			nlive++
			inUse += b.size
			if b.free || b.prev != nil || b.next != nil || b.addr != ptr {
				bad("block %v of a stale segment: free %v, linked %v", b.addr, b.free, b.prev != nil || b.next != nil)
			}
		}
	}
	nstale := 0
	for seg := p.stale; seg != nil; seg = seg.snext {
		nstale++
		if !seg.stale || seg.nlive <= 0 || staleLive[seg] != seg.nlive || seg.first != nil || seg.wi != 0 {
			bad("stale segment %v: stale %v, %d live blocks counted, %d found", seg.base, seg.stale, seg.nlive, staleLive[seg])
		}
		if seg.snext != nil && seg.snext.sprev != seg {
			bad("stale segment %v: broken list link", seg.base)
		}
	}
	if nstale != len(staleLive) {
		bad("%d stale segments listed, %d hold live blocks", nstale, len(staleLive))
	}
	if nsegs != p.nsegs || nwholly != len(p.wholly) {
		bad("segments %d (books %d), wholly free %d (list %d)", nsegs, p.nsegs, nwholly, len(p.wholly))
	}
	if nlive != len(p.live) {
		bad("live blocks %d, live table %d", nlive, len(p.live))
	}
	if reserved != p.st.Reserved || classRes != p.classRes {
		bad("segments hold %d bytes (%v), Stats.Reserved %d (%v)", reserved, classRes, p.st.Reserved, p.classRes)
	}
	if inUse != p.st.InUse {
		bad("live blocks hold %d bytes, Stats.InUse %d", inUse, p.st.InUse)
	}
	if p.st.PeakInUse < p.st.InUse || p.st.PeakReserved < p.st.Reserved || p.highWater < p.st.Reserved {
		bad("peaks below current values: %+v (high water %d)", p.st, p.highWater)
	}
	if err := p.idx.check(nfree, freeBytes); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

func ptrOf(n uint64) device.Ptr { return device.Ptr(n) }

// checkPend checks free block b's pending span: none for a shared block,
// within the block (or empty) for an owned one.
func checkPend(b *block) error {
	switch {
	case b.owner == nil && b.pend != span{}:
		return fmt.Errorf("shared block %v has pending span [%v, %v)", b.addr, b.pend.lo, b.pend.hi)
	case b.owner != nil && !b.pend.empty() && (b.pend.lo < b.addr || b.pend.hi > b.end()):
		return fmt.Errorf("block %v (%d bytes) has pending span [%v, %v) outside it", b.addr, b.size, b.pend.lo, b.pend.hi)
	case b.owner != nil && b.pend.empty() && b.pend != span{}:
		return fmt.Errorf("block %v has an empty pending span [%v, %v) not zero", b.addr, b.pend.lo, b.pend.hi)
	}
	return nil
}

// check verifies the free index: every set's treap is ordered and counted
// right, every stream's list matches its treaps, and the sets together
// hold nfree blocks of freeBytes bytes.
func (x *freeIndex) check(nfree int, freeBytes uint64) error {
	var errs []error
	var n int
	var bytes uint64
	checkTreap := func(name string, t *treap, owner *streamState) {
		var cnt int
		var sum uint64
		var last *block
		var walk func(b *block) bool
		walk = func(b *block) bool {
			if b == nil {
				return true
			}
			if b.left != nil && b.left.prio > b.prio || b.right != nil && b.right.prio > b.prio {
				errs = append(errs, fmt.Errorf("%s: heap order broken at %v", name, b.addr))
			}
			if !walk(b.left) {
				return false
			}
			if last != nil && !keyLess(last, b) {
				errs = append(errs, fmt.Errorf("%s: key order broken at %v", name, b.addr))
			}
			if !b.free || b.owner != owner {
				errs = append(errs, fmt.Errorf("%s: block %v not free or wrong owner", name, b.addr))
			}
			if err := checkPend(b); err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", name, err))
			}
			last = b
			cnt++
			sum += b.size
			return walk(b.right)
		}
		walk(t.root)
		if cnt != t.n || sum != t.bytes {
			errs = append(errs, fmt.Errorf("%s: %d blocks of %d bytes, counted %d of %d", name, cnt, sum, t.n, t.bytes))
		}
		n += cnt
		bytes += sum
	}
	for c := range x.shared {
		checkTreap(fmt.Sprintf("shared[%d]", c), &x.shared[c], nil)
	}
	owning := 0
	for h, st := range x.streams {
		inSets := 0
		for c := range st.free {
			checkTreap(fmt.Sprintf("stream %d [%d]", h, c), &st.free[c], st)
			inSets += st.free[c].n
		}
		listed := 0
		var seq uint64
		for b := st.head; b != nil; b = b.fnext {
			listed++
			if b.seq <= seq && listed > 1 {
				errs = append(errs, fmt.Errorf("stream %d: list out of order", h))
			}
			seq = b.seq
			if b.fnext == nil && st.tail != b {
				errs = append(errs, fmt.Errorf("stream %d: bad tail", h))
			}
		}
		if listed != inSets || listed != st.owned {
			errs = append(errs, fmt.Errorf("stream %d: %d listed, %d in sets, owned %d", h, listed, inSets, st.owned))
		}
		if st.owned > 0 {
			owning++
		}
	}
	if owning != x.owning {
		errs = append(errs, fmt.Errorf("owning streams %d, counted %d", owning, x.owning))
	}
	if n != nfree || bytes != freeBytes {
		errs = append(errs, fmt.Errorf("free sets hold %d blocks of %d bytes; segments have %d free blocks of %d bytes", n, bytes, nfree, freeBytes))
	}
	return errors.Join(errs...)
}

// StreamStates is how many streams the pool keeps state for.
func (p *Pool) StreamStates() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.idx.streams)
}

// Locked reports whether the allocator's lock is held (Pool, PinnedPool,
// Expandable). In a test where one goroutine calls the allocator, true
// means that goroutine holds it.
func (c *core) Locked() bool {
	if c.mu.TryLock() {
		c.mu.Unlock()
		return false
	}
	return true
}
