package alloc

// Block chains: the operations on a segment's chain of blocks that the
// splitting strategies (Pool, Expandable) share. A segment's blocks tile it
// in address order through prev and next, seg.first being the lowest; two
// free neighbours of one set are merged, so a chain never holds two such
// blocks side by side, and a free merges its block with every free
// neighbour its stream may use (canJoin). Every function here needs the
// core's lock.

import "github.com/vramkit/vram/device"

// linkBefore puts a in b's chain just before it.
func linkBefore(a, b *block) {
	a.prev, a.next = b.prev, b
	if b.prev != nil {
		b.prev.next = a
	} else {
		b.seg.first = a
	}
	b.prev = a
}

// carveFront takes size bytes from the front of free block b and returns
// them as a block out of the index (b itself when the rest would be under
// PoolGranularity); the rest stays free where b was.
func (x *freeIndex) carveFront(b *block, size uint64) *block {
	if b.size-size < PoolGranularity {
		x.remove(b)
		return b
	}
	a := x.newBlock()
	a.addr, a.size, a.seg, a.class = b.addr, size, b.seg, b.class
	linkBefore(a, b)
	x.resize(b, b.addr+device.Ptr(size), b.size-size)
	return a
}

// carveBack takes size bytes (less than b.size) from the back of free block
// b and returns them as a block out of the index; the front stays free
// where b was.
func (x *freeIndex) carveBack(b *block, size uint64) *block {
	a := x.newBlock()
	a.addr, a.size, a.seg, a.class = b.addr+device.Ptr(b.size-size), size, b.seg, b.class
	a.prev, a.next = b, b.next
	if b.next != nil {
		b.next.prev = a
	}
	b.next = a
	x.resize(b, b.addr, b.size-size)
	return a
}

// absorbPrev merges b's predecessor, a block out of the free index or in
// it, into b (in no set): the predecessor leaves its set if free and its
// struct is recycled.
func (x *freeIndex) absorbPrev(b *block) {
	pv := b.prev
	if pv.free {
		x.remove(pv)
	}
	b.addr = pv.addr
	b.size += pv.size
	b.prev = pv.prev
	if b.prev != nil {
		b.prev.next = b
	} else {
		b.seg.first = b
	}
	x.putBlock(pv)
}

// absorbNext merges b's successor into b, as absorbPrev.
func (x *freeIndex) absorbNext(b *block) {
	nx := b.next
	if nx.free {
		x.remove(nx)
	}
	b.size += nx.size
	b.next = nx.next
	if b.next != nil {
		b.next.prev = b
	}
	x.putBlock(nx)
}

// mergeFreed merges live block b, freed on st, with the free neighbours st
// may join, and puts it in st's free set, pending on st only where b was
// and where st's neighbours were pending. Free neighbours alternate between
// sets (two of one set would have merged), so absorbing a shared neighbour
// can bring one of st's next to b: it keeps going.
func (x *freeIndex) mergeFreed(b *block, st *streamState) {
	pend := span{b.addr, b.end()}
	for pv := b.prev; canJoin(pv, st); pv = b.prev {
		pend = pend.hull(pv.pend) // a shared block's is empty
		x.absorbPrev(b)
	}
	for nx := b.next; canJoin(nx, st); nx = b.next {
		pend = pend.hull(nx.pend)
		x.absorbNext(b)
	}
	x.insertOwned(b, st, pend)
}

// shedLocked gives the shared set back the bytes of other streams' free
// blocks that wait for nothing: those outside each block's pending span,
// which the block took from the shared set (or kept after handing out its
// pending bytes) when it merged. A miss on st calls it before it grows
// (core.missLocked); it reports whether it moved any. The pending span
// stays its stream's, with its free number; the bytes around it become
// shared blocks, which the index's join coalesces with shared neighbours.
func (x *freeIndex) shedLocked(st *streamState) bool {
	if x.hostVisible || x.owning == 0 || (x.owning == 1 && st.owned > 0) {
		return false // buffers are whole; or only st owns blocks
	}
	moved := false
	for _, o := range x.streams {
		if o == st {
			continue
		}
		for b := o.head; b != nil; {
			next := b.fnext // b stays in o's list, or leaves it whole
			if b.pend.lo > b.addr || b.pend.hi < b.end() {
				x.shed(b)
				moved = true
			}
			b = next
		}
	}
	return moved
}

// shed splits owned free block b into its pending span, which stays where
// b was, and shared blocks before and after it; a block with nothing
// pending moves to the shared set whole.
func (x *freeIndex) shed(b *block) {
	if b.pend.empty() {
		x.remove(b)
		x.toShared(b)
		return
	}
	if end := b.end(); b.pend.hi < end {
		back := x.newBlock()
		back.addr, back.size, back.seg, back.class = b.pend.hi, uint64(end-b.pend.hi), b.seg, b.class
		back.prev, back.next = b, b.next
		if b.next != nil {
			b.next.prev = back
		}
		b.next = back
		x.resize(b, b.addr, uint64(b.pend.hi-b.addr))
		x.toShared(back)
	}
	if b.pend.lo > b.addr {
		front := x.newBlock()
		front.addr, front.size, front.seg, front.class = b.addr, uint64(b.pend.lo-b.addr), b.seg, b.class
		linkBefore(front, b)
		x.resize(b, b.pend.lo, uint64(b.end()-b.pend.lo))
		x.toShared(front)
	}
}

// toShared puts free block b, in no set, in the shared set and lets the
// index's join coalesce it.
func (x *freeIndex) toShared(b *block) {
	x.insertShared(b)
	if x.join != nil {
		x.join(b)
	}
}

// isSharedFree reports whether nb is a free block of the shared set.
func isSharedFree(nb *block) bool { return nb != nil && nb.free && nb.owner == nil }

// joinShared merges b, just moved to the shared set, with its shared free
// neighbours; it reports whether it merged any.
func (x *freeIndex) joinShared(b *block) bool {
	if !isSharedFree(b.prev) && !isSharedFree(b.next) {
		return false
	}
	x.remove(b)
	for isSharedFree(b.prev) {
		x.absorbPrev(b)
	}
	for isSharedFree(b.next) {
		x.absorbNext(b)
	}
	x.insertShared(b)
	return true
}

// mergeOwnedWithShared merges each free block that st owns with its free
// neighbours in the shared set (and, through them, with st's other
// blocks), the merged block staying st's with the latest free number among
// its parts and the hull of their pending spans: the shared bytes stay
// safe on every stream (streamorder.go). A free on st merges so at once, but a neighbour
// promoted to the shared set later joins only shared neighbours; the
// out-of-memory path calls this so that st can use such a run as one
// block. merged, if not nil, is told of each block that merging made.
func (x *freeIndex) mergeOwnedWithShared(st *streamState, merged func(*block)) {
	if st.owned == 0 {
		return
	}
	own := make([]*block, 0, st.owned)
	for b := st.head; b != nil; b = b.fnext {
		own = append(own, b)
	}
	for _, b := range own {
		// A block absorbed by one merged before it is recycled: skip it.
		if !b.free || b.owner != st || (!isSharedFree(b.prev) && !isSharedFree(b.next)) {
			continue
		}
		seq, pend := b.seq, b.pend
		x.remove(b)
		for pv := b.prev; canJoin(pv, st); pv = b.prev {
			if pv.owner == st {
				seq, pend = max(seq, pv.seq), pend.hull(pv.pend)
			}
			x.absorbPrev(b)
		}
		for nx := b.next; canJoin(nx, st); nx = b.next {
			if nx.owner == st {
				seq, pend = max(seq, nx.seq), pend.hull(nx.pend)
			}
			x.absorbNext(b)
		}
		x.insertOwnedAt(b, st, seq, pend)
		if merged != nil {
			merged(b)
		}
	}
}
