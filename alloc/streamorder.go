package alloc

// The free index: which freed memory may be handed out again on which
// stream. The core (core.go) keeps every free block of its strategy here;
// its events are made and checked in fence.go. RMM's
// stream_ordered_memory_resource plays the same part for its pools.
//
// # The rule
//
// A block freed on stream S was last used by work ordered on S before the
// Free call. It may be handed out again:
//
//   - on S at once, because work on S runs in order — unless the index is
//     hostVisible (pinned host memory), where the next user writes from the
//     host, which no stream orders, so every reuse waits as below;
//   - on any other stream only once an event recorded on S after the free
//     has completed.
//
// Fresh memory from the device (a new segment) has never been used by any
// stream and is safe everywhere. Using a block on another stream without
// ordering the streams first is undefined, as Allocator's contract says.
//
// Only the bytes freed on S wait for S's event. A free on S merges the block
// with the free neighbours S may use, shared ones included, so that S can
// use the run as one block; the merged block is S's, but it keeps as
// pending (pend) only the bytes freed on S, and the bytes it took from the
// shared set stay safe on every stream: a stream that misses takes them
// back (shedLocked, chain.go) before it grows. RMM's pool keeps a free list
// per stream and fences only the blocks freed there; PyTorch's caching
// allocator never merges a block with events pending. Merging and shedding
// give the freeing stream the first's contiguity and every other stream the
// second's reach.
//
// # Invariants
//
//   - Every free block is in exactly one free set: its stream's set (owner
//     = the streamState of the stream it was freed on) or the shared set
//     (owner = nil), whose blocks are safe on every stream. Each set is
//     split by size class and kept as a treap keyed by (size, address).
//   - Every free on S takes the next number in S's sequence (seq); S's owned
//     blocks are linked in a list ordered by it; fenced ≤ recorded ≤ seq.
//   - When an event covering S's free number k is seen complete, every
//     block of S numbered at or before k moves to the shared set
//     (promoteLocked), where it coalesces with shared neighbours.
//   - Coalescing a block freed on S with a free neighbour is allowed when
//     the neighbour is S's or shared; the merged block is S's. Blocks of
//     other streams wait for their promotion.
//   - A block of S's set has a pending span (pend, within it, possibly
//     empty) that holds every byte of it freed on S and not yet covered by
//     a completed event: the hull of the pending spans it was merged from.
//     Its bytes outside pend are safe on every stream; a hull may hold safe
//     bytes too, which then wait with it (never the other way round).
//     Shared blocks have no pending span.
//   - At most one event per stream is in flight; a stream that owns no
//     free block, and holds none out of the index (held), is forgotten at
//     the next round: only free blocks name their stream, and its state,
//     numbers and fence start afresh on next use. A block out of the
//     index that still waits for its stream (joined by a growth in
//     flight) keeps the stream's state alive, else it would come back to
//     a stream that no longer knows it and be taken for fenced.
//   - A stream's busy flag says one goroutine is doing device work for its
//     event outside the lock; nobody else touches that event meanwhile.
//
// When events are recorded (at a free, lazily at a miss, and while waiting
// on out of memory), and what a device reset does to them, is in fence.go.
// Every method must be called with the owning core's lock held, except
// where fence.go says otherwise.

import "github.com/vramkit/vram/device"

// numClasses is the number of size classes a free set is split into
// (small and large for Pool; PinnedPool uses one).
const numClasses = 2

// block is a run of memory: a live allocation, or a free block in exactly
// one free set. Block structs are recycled through the freeIndex's spare
// list, so the hit path allocates nothing.
type block struct {
	addr device.Ptr // first byte
	size uint64     // bytes, a multiple of the pool's rounding
	seg  *segment   // segment the block lies in

	// prev and next are the neighbours by address within seg (nil at the
	// ends).
	prev, next *block

	free  bool  // in a free set (else live)
	class uint8 // size class of seg

	// Free-set membership (meaningful while free).
	left, right  *block       // treap children
	prio         uint32       // treap priority
	owner        *streamState // stream that must fence this block; nil = shared
	seq          uint64       // owner's free number when freed
	fprev, fnext *block       // owner's list, ordered by seq
	// pend is the bytes of an owned block that wait for its owner's event;
	// the rest of it is safe on every stream (see the invariants above).
	pend span
}

// end is the address just past b.
func (b *block) end() device.Ptr { return b.addr + device.Ptr(b.size) }

// span is the addresses [lo, hi); empty when lo >= hi.
type span struct{ lo, hi device.Ptr }

func (p span) empty() bool { return p.lo >= p.hi }

// hull is the smallest span holding p and q (an empty one adds nothing).
func (p span) hull(q span) span {
	switch {
	case q.empty():
		return p
	case p.empty():
		return q
	}
	return span{min(p.lo, q.lo), max(p.hi, q.hi)}
}

// clip is p within [lo, hi) (empty when they do not meet).
func (p span) clip(lo, hi device.Ptr) span {
	c := span{max(p.lo, lo), min(p.hi, hi)}
	if c.empty() {
		return span{}
	}
	return c
}

// segment is one allocation from the device (or one pinned host buffer).
type segment struct {
	base  device.Ptr
	size  uint64
	class uint8
	first *block // lowest block; the segment is wholly free when first.free && first.next == nil
	wi    int    // 1 + index in the pool's list of wholly free segments; 0 when not listed
	// sprev, snext link every segment of the pool.
	sprev, snext *segment
	host         device.HostBuffer // PinnedPool only
	// stale: the segment is from before a device reset and still has
	// live blocks (nlive of them), out of the free index and the pool's
	// list of segments; it leaves the books when the last is freed.
	stale bool
	nlive int
}

// streamState is what the index knows about one stream.
type streamState struct {
	handle uintptr
	s      device.Stream // the latest Stream value seen with this handle

	free       [numClasses]treap // blocks freed here, not yet known safe elsewhere
	head, tail *block            // the same blocks, by seq
	owned      int               // blocks in free

	seq      uint64 // frees made on this stream so far
	recorded uint64 // highest seq covered by an event recorded (complete or not)
	fenced   uint64 // highest seq covered by an event seen complete

	ev    device.Event // event in flight (recorded, not yet seen complete), or nil
	evSeq uint64       // seq that ev covers

	// busy: a goroutine is recording or querying this stream's event
	// outside the lock (a fence round, or a free recording one); nobody
	// else may touch ev, and the state is not forgotten, until it is done.
	busy bool

	// held: blocks of this set that a strategy holds out of the index,
	// not yet fenced (an Expandable growth in flight that joins them,
	// with the lock released while it maps). The state is not forgotten
	// while it holds any: they come back to it under their free numbers
	// (holdLocked, unholdLocked).
	held int
}

// freeIndex holds a pool's free blocks by stream and size class and applies
// the reuse rule above. Not safe for concurrent use on its own: the owning
// core's lock protects it, except where runFences says otherwise.
type freeIndex struct {
	dev         device.Device
	hostVisible bool         // every reuse waits for an event (pinned host memory)
	join        func(*block) // called for every promoted block (nil: none); see promoteLocked

	shared  [numClasses]treap // blocks safe on every stream
	streams map[uintptr]*streamState
	lastH   uintptr // one-entry cache in front of streams
	last    *streamState
	owning  int // streams with owned > 0

	rng   uint32 // treap priorities (xorshift)
	spare *block // recycled block structs, linked through next

	fencing bool           // a goroutine is running fence work (see runFences)
	work    []fenceWork    // reused by prepareFences
	spareEv []device.Event // idle events
	// roundDone, when not nil, is closed when the running round finishes;
	// made by a goroutine that must wait for it (waitLocked).
	roundDone chan struct{}
}

// newFreeIndex returns an index for memory of dev; hostVisible says every
// reuse waits for an event, and join, when not nil, is called for every
// block promoted to the shared set, so the strategy can coalesce it.
func newFreeIndex(dev device.Device, hostVisible bool, join func(*block)) freeIndex {
	return freeIndex{
		dev:         dev,
		hostVisible: hostVisible,
		join:        join,
		streams:     make(map[uintptr]*streamState),
		rng:         0x9e3779b9,
	}
}

// streamLocked returns the state of s, creating it on first use.
func (x *freeIndex) streamLocked(s device.Stream) *streamState {
	h := s.Handle()
	st := x.last
	if st == nil || h != x.lastH {
		st = x.streams[h]
		if st == nil {
			st = &streamState{handle: h}
			x.streams[h] = st
		}
		x.lastH, x.last = h, st
	}
	// Keep the latest Stream value for the handle: on CUDA a closed
	// stream's handle can be reused, and the newest value is the one that
	// can still record events.
	st.s = s
	return st
}

// newBlock returns a zeroed block struct, recycled when possible, so
// that splitting a block on the hit path allocates nothing.
func (x *freeIndex) newBlock() *block {
	b := x.spare
	if b == nil {
		return new(block)
	}
	x.spare = b.next
	b.next = nil
	return b
}

// putBlock recycles b, which must be in no set and no segment.
func (x *freeIndex) putBlock(b *block) {
	*b = block{next: x.spare}
	x.spare = b
}

func (x *freeIndex) nextPrio() uint32 {
	r := x.rng
	r ^= r << 13
	r ^= r >> 17
	r ^= r << 5
	x.rng = r
	return r
}

// bestFit returns the smallest free block of class c with at least n bytes
// that may be handed out on st, or nil.
func (x *freeIndex) bestFit(n uint64, c uint8, st *streamState) *block {
	b := x.shared[c].lowerBound(n)
	if x.hostVisible || st.owned == 0 {
		return b
	}
	if o := st.free[c].lowerBound(n); o != nil && (b == nil || keyLess(o, b)) {
		return o
	}
	return b
}

// insertShared adds free block b to the shared set.
func (x *freeIndex) insertShared(b *block) {
	b.free = true
	b.owner = nil
	b.pend = span{}
	b.prio = x.nextPrio()
	x.shared[b.class].insert(b)
}

// insertOwned adds free block b, just freed on st, to st's set with the
// next free number and pending span pend.
func (x *freeIndex) insertOwned(b *block, st *streamState, pend span) {
	b.free = true
	b.owner = st
	b.pend = pend
	b.prio = x.nextPrio()
	st.seq++
	b.seq = st.seq
	st.free[b.class].insert(b)
	b.fnext = nil
	b.fprev = st.tail
	if st.tail != nil {
		st.tail.fnext = b
	} else {
		st.head = b
	}
	st.tail = b
	if st.owned == 0 {
		x.owning++
	}
	st.owned++
}

// insertOwnedAt adds free block b to st's set with free number seq (one
// st has already used) and pending span pend, keeping st's list in order:
// for a block merged from blocks freed earlier, seq is the latest of their
// numbers and pend the hull of their pending spans.
func (x *freeIndex) insertOwnedAt(b *block, st *streamState, seq uint64, pend span) {
	b.free = true
	b.owner = st
	b.pend = pend
	b.prio = x.nextPrio()
	b.seq = seq
	st.free[b.class].insert(b)
	at := st.tail
	for at != nil && at.seq > seq {
		at = at.fprev
	}
	b.fprev = at
	if at != nil {
		b.fnext = at.fnext
		at.fnext = b
	} else {
		b.fnext = st.head
		st.head = b
	}
	if b.fnext != nil {
		b.fnext.fprev = b
	} else {
		st.tail = b
	}
	if st.owned == 0 {
		x.owning++
	}
	st.owned++
}

// holdLocked notes that free block b is leaving the index for a while
// (absorbed into a block out of it) and will come back, or be dropped with
// its memory, with unholdLocked: its stream, if it has one, is kept until
// then.
func (x *freeIndex) holdLocked(b *block) {
	if b.owner != nil {
		b.owner.held++
	}
}

// unholdLocked ends a hold (holdLocked) on a block of st's; the caller puts
// the block back in st's set, with its free number, or drops its memory. A
// nil st is the shared set: nothing to end.
func (x *freeIndex) unholdLocked(st *streamState) {
	if st != nil {
		st.held--
	}
}

// classBytes is the bytes of free blocks of class c in every set.
func (x *freeIndex) classBytes(c uint8) uint64 {
	n := x.shared[c].bytes
	for _, st := range x.streams {
		n += st.free[c].bytes
	}
	return n
}

// remove takes free block b out of its set. b keeps its owner and seq until
// it is inserted again.
func (x *freeIndex) remove(b *block) {
	st := b.owner
	if st == nil {
		x.shared[b.class].remove(b)
		b.free = false
		return
	}
	st.free[b.class].remove(b)
	if b.fprev != nil {
		b.fprev.fnext = b.fnext
	} else {
		st.head = b.fnext
	}
	if b.fnext != nil {
		b.fnext.fprev = b.fprev
	} else {
		st.tail = b.fprev
	}
	b.fprev, b.fnext = nil, nil
	st.owned--
	if st.owned == 0 {
		x.owning--
	}
	b.free = false
}

// resize moves free block b to a new address and size, keeping its set,
// owner and seq; its pending span keeps only what lies within it.
func (x *freeIndex) resize(b *block, addr device.Ptr, size uint64) {
	t := &x.shared[b.class]
	if b.owner != nil {
		t = &b.owner.free[b.class]
	}
	t.remove(b)
	b.addr, b.size = addr, size
	b.pend = b.pend.clip(addr, b.end())
	t.insert(b)
}

// canJoin reports whether free neighbour nb may coalesce with a block being
// freed on st.
func canJoin(nb *block, st *streamState) bool {
	return nb != nil && nb.free && (nb.owner == nil || nb.owner == st)
}

// largest returns the size of the largest free block in any set.
func (x *freeIndex) largest() uint64 {
	var m uint64
	for c := range x.shared {
		if b := x.shared[c].max(); b != nil && b.size > m {
			m = b.size
		}
	}
	for _, st := range x.streams {
		for c := range st.free {
			if b := st.free[c].max(); b != nil && b.size > m {
				m = b.size
			}
		}
	}
	return m
}

// waitingBytes is the bytes of the pending spans of free blocks that a
// stream other than the one with handle h owns: memory that h may not use
// until those streams' work up to the frees is known done. It walks every
// owned block: for error messages only.
func (x *freeIndex) waitingBytes(h uintptr) uint64 {
	var n uint64
	for _, st := range x.streams {
		if st.handle == h && !x.hostVisible {
			continue
		}
		for b := st.head; b != nil; b = b.fnext {
			if !b.pend.empty() {
				n += uint64(b.pend.hi - b.pend.lo)
			}
		}
	}
	return n
}

// recordWanted reports whether a free just made on st should record an
// event on st now (see "When events are recorded" above). Cheap: it is on
// the hit path.
func (x *freeIndex) recordWanted(st *streamState) bool {
	if st.busy || st.recorded >= st.seq {
		return false
	}
	// Only when S has no event in flight: moving one that is in flight
	// would put a device call on the hit path of every stream that frees
	// and reuses its own blocks (see "When events are recorded").
	return st.ev == nil
}
