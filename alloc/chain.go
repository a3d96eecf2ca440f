package alloc

// Block chains: the operations on a segment's chain of blocks that the
// splitting strategies (Pool, Expandable) share. A segment's blocks tile it
// in address order through prev and next, seg.first being the lowest; two
// free neighbours that one stream may both use are merged (canJoin), so a
// chain never holds two such blocks side by side. Every function here
// needs the core's lock.

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
// may join, and puts it in st's free set. Free neighbours alternate between
// sets (two of one set would have merged), so absorbing a shared neighbour
// can bring one of st's next to b: it keeps going.
func (x *freeIndex) mergeFreed(b *block, st *streamState) {
	for pv := b.prev; canJoin(pv, st); pv = b.prev {
		x.absorbPrev(b)
	}
	for nx := b.next; canJoin(nx, st); nx = b.next {
		x.absorbNext(b)
	}
	x.insertOwned(b, st)
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
// its parts: demoting shared memory to one stream is always safe
// (streamorder.go). A free on st merges so at once, but a neighbour
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
		seq := b.seq
		x.remove(b)
		for pv := b.prev; canJoin(pv, st); pv = b.prev {
			if pv.owner == st {
				seq = max(seq, pv.seq)
			}
			x.absorbPrev(b)
		}
		for nx := b.next; canJoin(nx, st); nx = b.next {
			if nx.owner == st {
				seq = max(seq, nx.seq)
			}
			x.absorbNext(b)
		}
		x.insertOwnedAt(b, st, seq)
		if merged != nil {
			merged(b)
		}
	}
}
