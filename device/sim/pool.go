package sim

// The stream-ordered memory pool behind MallocAsync and FreeAsync: an
// emulation of the CUDA driver's default memory pool (cuMemAllocAsync,
// cuMemFreeAsync) with these exact rules.
//
// Reservation. The pool holds segments reserved from device memory, each
// a whole number of granules (Config.Granularity) at a granularity-aligned
// address. A request of n bytes is rounded up to PoolAlignment (512 B) and
// served from a free block; when no free block may serve it, the pool
// grows by one segment of the request rounded up to the granularity. If
// the device has too little free memory for that, the pool first releases
// its own wholly free segments, then fails with ErrOutOfMemory. Memory the
// pool holds counts against MemInfo's free memory whether in use or not.
//
// Blocks. Segments are cut into blocks (split on allocation, coalesced
// with free neighbours of the same class on free). A free block is either
// pending on the stream S that freed it — S's work enqueued before the
// FreeAsync has not been seen to finish — or ready.
//
// Reuse (cudaMemPoolReuseAllowOpportunistic, without internal dependency
// insertion). An allocation on stream s takes the smallest block that
// fits among the blocks pending on s itself (stream order makes them safe
// at once) and the ready blocks. A block pending on S becomes ready — and
// so usable by every stream — once S's work up to the free has finished,
// as observed at any pool call or synchronization point. Blocks pending on
// other streams are never used, even if an event would order them.
//
// Release. At every synchronization point (Stream, Event or Device
// Synchronize) the pool releases wholly free, ready segments, oldest
// first, while it holds more than the release threshold (0 by default, as
// in the driver). TrimPool(keep) does the same down to keep bytes. Only
// whole segments are released, so a partly used segment stays reserved.
//
// Free of a MallocAsync pointer with the synchronous Free is allowed (it
// waits for all work, then the block is ready at once), as cuMemFree
// allows.
//
// Everything here is protected by the device's mutex.

import (
	"fmt"

	"github.com/vramkit/vram/device"
	"github.com/vramkit/vram/internal/units"
)

type blockState uint8

const (
	bUsed blockState = iota + 1
	bPending
	bReady
)

type segment struct {
	start, size uint64
	mem         *backing // backing bytes, nil when address-only
	prevE, nxtE *segment // links in pool.empty while wholly free and ready
	inEmpty     bool
}

type block struct {
	seg         *segment
	start, size uint64
	prev, next  *block // address neighbours within the segment
	state       blockState
	req         uint64  // bUsed: requested bytes
	id          uint64  // bUsed: allocation number
	s           *stream // bPending: the stream that freed it
	seq         uint64  // bPending: that stream's enqueued count at the free
	tag         uint64  // bPending: matches the live fifo entry
}

type pool struct {
	threshold      uint64
	reserved       uint64 // bytes of all segments
	used           uint64 // bytes of blocks in use (rounded to PoolAlignment)
	usedReq        uint64 // bytes requested by blocks in use
	nUsed          int
	nSeg           int
	blocks         tree[*block] // every block by start
	ready          tree[*block] // ready blocks by (size, start)
	pendingStreams []*stream
	emptyHead      *segment // wholly free segments, oldest first
	emptyTail      *segment
	tags           uint64
	spare          []*block
}

func (p *pool) newBlock() *block {
	if n := len(p.spare); n > 0 {
		b := p.spare[n-1]
		p.spare = p.spare[:n-1]
		return b
	}
	return new(block)
}

func (p *pool) dropBlock(b *block) {
	*b = block{}
	if len(p.spare) < 1024 {
		p.spare = append(p.spare, b)
	}
}

// index puts a free block in the index of its class.
func (p *pool) index(b *block) {
	switch b.state {
	case bReady:
		p.ready.insert(b.size, b.start, 0, b)
		if b.size == b.seg.size {
			p.pushEmpty(b.seg)
		}
	case bPending:
		p.tags++
		b.tag = p.tags
		s := b.s
		s.pend.insert(b.size, b.start, 0, b)
		s.fifo = append(s.fifo, fifoEntry{b, b.tag})
		if !s.inPending {
			s.inPending = true
			p.pendingStreams = append(p.pendingStreams, s)
		}
	}
}

// unindex takes a free block out of the index of its class.
func (p *pool) unindex(b *block) {
	switch b.state {
	case bReady:
		p.ready.remove(b.size, b.start)
		if b.seg.inEmpty {
			p.removeEmpty(b.seg)
		}
	case bPending:
		b.s.pend.remove(b.size, b.start)
		b.tag = 0 // its fifo entry is stale now
	}
}

func (p *pool) pushEmpty(s *segment) {
	s.inEmpty = true
	s.prevE, s.nxtE = p.emptyTail, nil
	if p.emptyTail != nil {
		p.emptyTail.nxtE = s
	} else {
		p.emptyHead = s
	}
	p.emptyTail = s
}

func (p *pool) removeEmpty(s *segment) {
	if s.prevE != nil {
		s.prevE.nxtE = s.nxtE
	} else {
		p.emptyHead = s.nxtE
	}
	if s.nxtE != nil {
		s.nxtE.prevE = s.prevE
	} else {
		p.emptyTail = s.prevE
	}
	s.prevE, s.nxtE, s.inEmpty = nil, nil, false
}

// absorb merges right (the address neighbour after left) into left. Both
// must be out of their indexes.
func (p *pool) absorb(left, right *block) {
	left.size += right.size
	if right.seq > left.seq {
		left.seq = right.seq
	}
	left.next = right.next
	if right.next != nil {
		right.next.prev = left
	}
	p.blocks.remove(right.start, 0)
	p.dropBlock(right)
}

// allocLocked serves n bytes on stream s.
func (p *pool) allocLocked(d *Device, s *stream, n uint64) (*block, error) {
	size, ok := units.RoundUp(n, PoolAlignment)
	if !ok || size > d.cfg.TotalBytes {
		return nil, d.oomLocked("malloc async", n, size)
	}
	p.promoteLocked()
	var b *block
	if nd := s.pend.ceil(size, 0); nd != nil {
		b = nd.v
	}
	if nd := p.ready.ceil(size, 0); nd != nil && (b == nil || nd.v.size < b.size) {
		b = nd.v
	}
	if b == nil {
		var err error
		if b, err = p.growLocked(d, size, n); err != nil {
			return nil, err
		}
	}
	p.unindex(b)
	if b.size > size {
		r := p.newBlock()
		*r = block{seg: b.seg, start: b.start + size, size: b.size - size, prev: b, next: b.next,
			state: b.state, s: b.s, seq: b.seq}
		if b.next != nil {
			b.next.prev = r
		}
		b.next = r
		b.size = size
		p.blocks.insert(r.start, 0, 0, r)
		p.index(r)
	}
	d.nextID++
	b.state, b.req, b.id, b.s, b.seq = bUsed, n, d.nextID, nil, 0
	d.dropGhostsLocked(b.start, b.size)
	p.used += b.size
	p.usedReq += n
	p.nUsed++
	return b, nil
}

// growLocked reserves a new segment for a block of size bytes and returns
// its one (ready, indexed) block.
func (p *pool) growLocked(d *Device, size, n uint64) (*block, error) {
	segSize, ok := units.RoundUp(size, d.cfg.Granularity)
	if !ok {
		return nil, d.oomLocked("malloc async", n, size)
	}
	taken, err := d.takeLocked(segSize)
	if err == nil && !taken {
		p.releaseLocked(d, 0)
		taken, err = d.takeLocked(segSize)
	}
	if err != nil || !taken {
		return nil, d.notTakenLocked("malloc async", n, segSize, err)
	}
	a, ok := d.va.alloc(segSize)
	if !ok {
		d.giveLocked(segSize)
		return nil, fmt.Errorf("%v: malloc async %s: address space exhausted: %w", d, units.Format(n), device.ErrOutOfMemory)
	}
	seg := &segment{start: a, size: segSize}
	if !d.cfg.AddressOnly {
		seg.mem = &backing{n: segSize}
	}
	d.live.insert(a, 0, segSize, rec{kind: kSegment, size: segSize, seg: seg})
	p.reserved += segSize
	p.nSeg++
	b := p.newBlock()
	*b = block{seg: seg, start: a, size: segSize, state: bReady}
	p.blocks.insert(a, 0, 0, b)
	p.index(b)
	return b, nil
}

// freeLocked frees a used block, stream-ordered on s (nil: every stream's
// work is known finished, so the block is ready at once).
func (p *pool) freeLocked(s *stream, b *block) {
	p.used -= b.size
	p.usedReq -= b.req
	p.nUsed--
	b.req, b.id = 0, 0
	if s == nil {
		p.makeReady(b)
		return
	}
	b.state, b.s, b.seq = bPending, s, s.enq.Load()
	if nb := b.next; nb != nil && nb.state == bPending && nb.s == s {
		p.unindex(nb)
		p.absorb(b, nb)
	}
	if pb := b.prev; pb != nil && pb.state == bPending && pb.s == s {
		p.unindex(pb)
		p.absorb(pb, b)
		b = pb
	}
	p.index(b)
}

// makeReady turns an unindexed free block ready, coalescing it with ready
// neighbours.
func (p *pool) makeReady(b *block) {
	b.state, b.s, b.seq = bReady, nil, 0
	if nb := b.next; nb != nil && nb.state == bReady {
		p.unindex(nb)
		p.absorb(b, nb)
	}
	if pb := b.prev; pb != nil && pb.state == bReady {
		p.unindex(pb)
		p.absorb(pb, b)
		b = pb
	}
	b.seq = 0
	p.index(b)
}

// promoteLocked makes ready every pending block whose freeing stream has
// finished the work enqueued before the free.
func (p *pool) promoteLocked() {
	for i := 0; i < len(p.pendingStreams); {
		s := p.pendingStreams[i]
		done := s.done.Load()
		for s.fifoHead < len(s.fifo) {
			e := s.fifo[s.fifoHead]
			if e.b.state == bPending && e.b.tag == e.tag {
				if e.b.seq > done {
					break
				}
				p.unindex(e.b)
				p.makeReady(e.b)
			}
			s.fifo[s.fifoHead] = fifoEntry{}
			s.fifoHead++
		}
		if s.fifoHead == len(s.fifo) {
			s.fifo, s.fifoHead = s.fifo[:0], 0
			s.inPending = false
			last := len(p.pendingStreams) - 1
			p.pendingStreams[i] = p.pendingStreams[last]
			p.pendingStreams[last] = nil
			p.pendingStreams = p.pendingStreams[:last]
			continue
		}
		if s.fifoHead > 64 && s.fifoHead*2 > len(s.fifo) {
			n := copy(s.fifo, s.fifo[s.fifoHead:])
			clear(s.fifo[n:])
			s.fifo, s.fifoHead = s.fifo[:n], 0
		}
		i++
	}
}

// releaseLocked gives wholly free segments back to the device, oldest
// first, while the pool holds more than keep bytes.
func (p *pool) releaseLocked(d *Device, keep uint64) {
	for p.reserved > keep && p.emptyHead != nil {
		seg := p.emptyHead
		p.removeEmpty(seg)
		b := p.blocks.get(seg.start, 0).v
		p.ready.remove(b.size, b.start)
		p.blocks.remove(b.start, 0)
		p.dropBlock(b)
		d.live.remove(seg.start, 0)
		seg.mem.releaseLocked(d)
		d.va.release(seg.start, seg.size)
		p.reserved -= seg.size
		p.nSeg--
		d.giveLocked(seg.size)
	}
}

// usedBlockAt returns the block in use that starts at a, if any.
func (p *pool) usedBlockAt(d *Device, a uint64) *block {
	nd := d.live.floor(a, 0)
	if nd == nil || a >= nd.k1+nd.span || nd.v.kind != kSegment {
		return nil
	}
	if b := p.blocks.get(a, 0); b != nil && b.v.state == bUsed {
		return b.v
	}
	return nil
}

// resolveLocked checks an access of n bytes at p inside segment seg.
func (p *pool) resolveLocked(d *Device, op string, ptr device.Ptr, n, stamp uint64, seg *segment) ([]byte, uint64, error) {
	a := uint64(ptr)
	b := p.blocks.floor(a, 0).v
	if b.state == bUsed && a+n <= b.start+b.req {
		data, err := sub(d, op, seg, b.start, b.req)
		return data, b.start, err
	}
	// A kernel launched before a (stream-ordered) free may still use the
	// freed block, even where it has been handed out again: the free takes
	// effect after the kernel.
	if stamp != 0 {
		g, over := d.usableGhostLocked(a, n, stamp)
		if g != nil && g.k1 >= seg.start && g.k1+g.span <= seg.start+seg.size {
			data, err := sub(d, op, seg, g.k1, g.span)
			return data, g.k1, err
		}
		if over != nil { // the kernel's own block, overrun
			return nil, 0, d.oobErr(op, ptr, n, over.v.start, over.v.size, kPoolBlock, over.v.id)
		}
	}
	if b.state == bUsed {
		return nil, 0, d.oobErr(op, ptr, n, b.start, b.req, kPoolBlock, b.id)
	}
	g := d.ghostHoldingLocked(a)
	if g == nil {
		return nil, 0, fmt.Errorf("%v: %s of %s at %v: it points into the async pool's free memory, never allocated: %w",
			d, op, units.Format(n), ptr, device.ErrInvalidPointer)
	}
	return nil, 0, d.uafErr(op, ptr, n, g)
}

func sub(d *Device, op string, seg *segment, start, n uint64) ([]byte, error) {
	if seg.mem == nil {
		return nil, nil
	}
	b, err := seg.mem.bytes(d, op)
	if err != nil {
		return nil, err
	}
	off := start - seg.start
	return b[off : off+n : off+n], nil
}

// MallocAsync allocates n > 0 bytes from the device's stream-ordered pool
// for use by work ordered on s after the call. Addresses are aligned to
// PoolAlignment.
func (d *Device) MallocAsync(n uint64, s device.Stream) (device.Ptr, error) {
	st, err := d.streamOf(s, "malloc async")
	if err != nil {
		return 0, err
	}
	if n == 0 {
		return 0, fmt.Errorf("%v: malloc async of 0 bytes: the size must be > 0: %w", d, device.ErrInvalidValue)
	}
	if err := d.faults.check(OpAlloc, "malloc async", n); err != nil {
		return 0, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed.Load() {
		return 0, d.errClosed("malloc async")
	}
	if st.gen != d.gen.Load() {
		return 0, st.goneErr("malloc async")
	}
	b, err := d.pool.allocLocked(d, st, n)
	if err != nil {
		return 0, err
	}
	return device.Ptr(b.start), nil
}

// FreeAsync frees p, from MallocAsync, once the work enqueued on s so far
// has finished. The block is reusable on s at once and on other streams
// after that work has finished.
func (d *Device) FreeAsync(p device.Ptr, s device.Stream) error {
	st, err := d.streamOf(s, "free async")
	if err != nil {
		return err
	}
	if err := d.faults.check(OpFree, "free async", 0); err != nil {
		return err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed.Load() {
		return d.errClosed("free async")
	}
	if st.gen != d.gen.Load() {
		return st.goneErr("free async")
	}
	a := uint64(p)
	b := d.pool.usedBlockAt(d, a)
	if b == nil {
		return d.badFreeLocked(p, "free async")
	}
	d.addGhostLocked(a, ghost{size: b.req, id: b.id, kind: kPoolBlock, stamp: d.stamp.Add(1), s: st, seq: st.enq.Load()})
	d.pool.freeLocked(st, b)
	return nil
}

// SetReleaseThreshold sets how many bytes of unused memory the pool keeps
// reserved at synchronization points.
func (d *Device) SetReleaseThreshold(bytes uint64) error {
	if d.closed.Load() {
		return d.errClosed("set release threshold")
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.pool.threshold = bytes
	return nil
}

// TrimPool releases wholly free pool segments whose frees have completed
// until at most keep bytes stay reserved.
func (d *Device) TrimPool(keep uint64) error {
	if d.closed.Load() {
		return d.errClosed("trim pool")
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.pool.promoteLocked()
	d.pool.releaseLocked(d, keep)
	return nil
}

// PoolSegments lists the pool's reservations, by address
// (device.PoolSegmenter).
func (d *Device) PoolSegments() []device.PoolSegment {
	d.mu.RLock()
	defer d.mu.RUnlock()
	out := make([]device.PoolSegment, 0, d.pool.nSeg)
	var last *segment
	d.pool.blocks.each(func(n *tnode[*block]) bool {
		if seg := n.v.seg; seg != last {
			out = append(out, device.PoolSegment{Addr: device.Ptr(seg.start), Size: seg.size})
			last = seg
		}
		return true
	})
	return out
}

// PoolUsage reports the bytes the pool holds reserved from the device and
// the bytes of live MallocAsync blocks (each rounded up to PoolAlignment).
func (d *Device) PoolUsage() (reserved, used uint64, err error) {
	if d.closed.Load() {
		return 0, 0, d.errClosed("pool usage")
	}
	d.mu.RLock()
	defer d.mu.RUnlock()
	return d.pool.reserved, d.pool.used, nil
}
