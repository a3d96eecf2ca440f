package alloc

// Pool is vram's caching allocator. How it works:
//
// Requests are rounded up to 512 bytes. Memory comes from the device in
// segments; each segment is a chain of blocks ordered by address, each block
// live or free. An allocation takes the best-fitting free block (the
// smallest that is large enough, lowest address among equals), hands out
// its front and leaves the rest as a free block; a free merges the block
// with its free neighbours. Free blocks live in a freeIndex
// (streamorder.go): per-stream and shared treaps keyed by (size, address),
// so best fit is one O(log n) descent, which also decides which freed
// blocks each stream may reuse. Block structs are recycled and the table
// of live blocks is a map that stops growing, so the hit path — a lock, a
// descent, a split or a merge, a map insert or delete — allocates nothing.
//
// # Size classes
//
// Requests of at most SmallSize (1 MiB) are small and are served only from
// small segments; larger ones only from large segments, so that a
// long-lived small block never pins a large segment, as in PyTorch's
// allocator.
//
// # Growth policy
//
// The device rounds every Malloc up to its granularity (2 MiB pages on
// current drivers and the simulator), and two costs matter: peak reserved
// memory (what other programs on the GPU cannot have) and the number of
// device allocations (each one is slow and may synchronize). A miss asks
// the device for:
//
//   - a small request: a segment the size of the small class so far (so
//     the class doubles), at least SmallSegment (2 MiB, one page) and at
//     most 1/32 of the pool: a burst of thousands of small blocks takes a
//     handful of device calls, and the unused tail stays small against
//     what the pool holds;
//   - a large request (at least LargeSize, 10 MiB) whose rounding to the
//     device granularity wastes at most 1/16 of it: a segment of exactly
//     that rounded size. Nothing is wasted but the rounding, and freeing
//     the block frees the whole segment, so it can go back to the device;
//   - any other request (medium, or large but badly aligned, say 10.5 MiB
//     which a 12 MiB segment would waste 14% on): a shared segment of
//     1/GrowthDivisor (1/4) of what the large class holds, at least
//     MediumSegment (20 MiB) and at most MaxMediumSegment (256 MiB). A
//     program that keeps thousands of medium blocks live needs
//     logarithmically many segments (PyTorch's fixed 20 MiB segments need
//     one per two 9 MiB blocks), and a segment's free tail is used by the
//     next medium or large requests.
//
// # Giving memory back
//
// Before a growth that would take the pool's reserved memory above its
// high-water mark (the most it has ever held), the pool gives the device
// its wholly free segments, largest first, until the growth fits under the
// mark or none is left. Cached memory that could not serve the request is
// traded for the new segment instead of piling on top of it, so the pool
// sets a new peak only for memory that is live or fragmented, not for
// memory it merely caches, and it calls the device only on misses. A
// segment freed on a stream goes back only once an event shows that
// stream's work done (the device's Free would otherwise wait for it).
// KeepCache turns this off.
//
// On the traces of ../shared/traces (PyTorch training runs) this keeps peak
// reserved within 1.02 of peak live where PyTorch's own allocator needed
// 1.02 to 1.11, with 27% to 67% of its device allocations; the
// measurements and method are in BENCHMARKS.md.
//
// Trim gives back every segment whose blocks are all free (a segment with
// one live block stays, however much of it is free). When the device is
// out of memory, the pool retries with an exactly-sized segment; then it
// waits for the work of every other stream that owns free blocks (and of
// the calling stream too when another does, so that their blocks may
// coalesce), so that those blocks become usable on any stream and
// coalesce; merges the calling stream's own free blocks with their free
// neighbours that any stream may use; and tries its cache again; then it
// gives back every wholly free segment and retries the device once more.
// If that fails too, the error says what was asked, what is allocated,
// reserved, cached and free, the largest free block, and how much of the
// cache still waits on other streams' work, and tells fragmentation (free
// blocks of the request's size class that live blocks keep apart), cache
// that only the other size class may use, and memory that is live.
//
// What that wait blocks on: for each such stream S, an event recorded on
// S and synchronized. When the event S recorded at a free covers all of
// S's frees, it is that one, which covers S's work up to the free; else
// it is an event recorded lazily, at an earlier miss or at the wait
// itself, which covers everything queued on S up to then, work queued
// after the frees included (streamorder.go, "When events are recorded");
// a stream on which no event can be recorded is synchronized. So an Alloc
// that finds the device out of memory may return only after S's later
// work is done too. It holds no pool lock while it waits: other
// goroutines allocate and free meanwhile, and may wait alongside. But
// work on S that itself waits for the allocating goroutine (for an event
// it records, or a host function it releases, only after Alloc returns)
// deadlocks with it, as it would with any blocking allocation: a
// goroutine that such work waits for must not allocate from a pool whose
// device may be out of memory, or must order that work after the
// allocation.
//
// # Device resets
//
// A device Reset frees every segment (see the reset contract at
// Allocator). The pool reads the device's generation (device.Generational)
// under its lock in every Alloc, Free, Stats, Trim and Close, which costs
// the hit pair two atomic loads behind an interface call (about 4 ns on
// the simulator); when it has moved on, every segment is from before the
// reset.
// Their free blocks leave the free index at once, so nothing of them is
// handed out again, and a segment with no live block leaves the books
// (counted as a device free, without a device call: its memory is gone).
// A segment with live blocks becomes stale, kept aside with a count of
// them, its free bytes out of Reserved at once: freeing a live block
// takes it back, its bytes leaving InUse and Reserved, and returns an
// error wrapping device.ErrInvalidated; the last takes the segment off
// the books, counted as a device free.
// The pool's events from before the reset leave at their next use
// (streamorder.go). A device free that fails with device.ErrInvalidated
// (a device without a generation, or a reset racing the call) counts as
// done. A growth that a Reset overtakes cannot tell which side of it the
// new segment came from: the pool gives it back and the Alloc fails with
// an error wrapping device.ErrInvalidated.
//
// # Locking
//
// One mutex protects everything. The pool never calls the device while
// holding it: a miss computes what to ask for, unlocks, calls the device
// (events, Free of released segments, Malloc), and locks again to insert
// the new segment; memory freed meanwhile by others stays cached for the
// next request.

import (
	"errors"
	"fmt"
	"math"
	"sort"
	"sync"

	"github.com/vramkit/vram/device"
	"github.com/vramkit/vram/internal/units"
)

// PoolGranularity is the unit Pool rounds requests to, in bytes.
const PoolGranularity = 512

// PoolConfig tunes a Pool. Zero fields take the defaults given; the zero
// value is the recommended configuration. A plain value, safe to share.
type PoolConfig struct {
	// SmallSize is the largest request (bytes, after rounding) served from
	// small segments. Default 1 MiB.
	SmallSize uint64
	// SmallSegment is the smallest segment small requests share, in bytes
	// (later ones double with the class). Default 2 MiB.
	SmallSegment uint64
	// LargeSize is the smallest request (bytes) that may get a segment of
	// its own, sized to the request rounded up to the device's granularity
	// (when that rounding wastes at most 1/16 of it). Default 10 MiB.
	LargeSize uint64
	// MediumSegment is the smallest segment, in bytes, that other large
	// requests share. Default 20 MiB.
	MediumSegment uint64
	// MaxMediumSegment caps the size of a shared segment, in bytes.
	// Default 256 MiB.
	MaxMediumSegment uint64
	// GrowthDivisor sets how shared segments grow: a new one is at least
	// 1/GrowthDivisor of the bytes the large class has reserved. Default 4.
	GrowthDivisor uint64
	// KeepCache turns off giving wholly free segments back before a growth
	// past the high-water mark: the pool then returns memory only on Trim,
	// Close and out-of-memory, as CuPy's and PyTorch's pools do.
	KeepCache bool
	// CheckBlocks marks each block handed out with the device's
	// device.SubAllocationChecker, when it has one, so the simulator's
	// memory checker catches accesses outside a block; costs a device
	// call per Alloc and Free.
	CheckBlocks bool
}

// withDefaults fills zero fields and checks the rest.
func (c PoolConfig) withDefaults() (PoolConfig, error) {
	def := func(v *uint64, d uint64) {
		if *v == 0 {
			*v = d
		}
	}
	def(&c.SmallSize, units.MiB)
	def(&c.SmallSegment, 2*units.MiB)
	def(&c.LargeSize, 10*units.MiB)
	def(&c.MediumSegment, 20*units.MiB)
	def(&c.MaxMediumSegment, 256*units.MiB)
	def(&c.GrowthDivisor, 4)
	switch {
	case c.SmallSegment < c.SmallSize:
		return c, fmt.Errorf("alloc: pool config: SmallSegment %s is smaller than SmallSize %s: %w",
			units.Format(c.SmallSegment), units.Format(c.SmallSize), device.ErrInvalidValue)
	case c.LargeSize <= c.SmallSize:
		return c, fmt.Errorf("alloc: pool config: LargeSize %s must be above SmallSize %s: %w",
			units.Format(c.LargeSize), units.Format(c.SmallSize), device.ErrInvalidValue)
	case c.MaxMediumSegment < c.MediumSegment:
		return c, fmt.Errorf("alloc: pool config: MaxMediumSegment %s is below MediumSegment %s: %w",
			units.Format(c.MaxMediumSegment), units.Format(c.MediumSegment), device.ErrInvalidValue)
	}
	return c, nil
}

// Growth policy constants (see the file overview).
const (
	// smallShareDiv: a new small segment is at most 1/smallShareDiv of
	// what the pool holds (but at least SmallSegment).
	smallShareDiv = 32
	// ownWasteDiv: a large request gets its own segment only when rounding
	// it to the device granularity wastes at most 1/ownWasteDiv of it.
	ownWasteDiv = 16
)

const (
	classSmall uint8 = 0
	classLarge uint8 = 1
)

// Pool is a caching best-fit allocator with block splitting and coalescing,
// 512-byte rounding, per-stream free lists and event-guarded cross-stream
// reuse, in the manner of PyTorch's caching allocator and RMM's pool.
//
// Streams: a block freed with Free(p, s) may be handed out again at once to
// an Alloc on s, and to an Alloc on another stream only after an event
// recorded on s after the free has completed (the pool records such events
// itself, at the free where it can, and queries them at later misses; it
// waits on one only when the device is out of memory, without holding
// its lock, and then possibly for work queued on s after the free too;
// the file overview of pool.go, "Giving memory back", says what that
// wait may deadlock with: otherwise, until the event completes, the block is not offered
// elsewhere and the pool grows instead). So memory is never
// reused on a stream while work on the
// stream that freed it may still touch it; using a pointer after Free, or
// on a stream other than the one named at Free without ordering the two
// streams, is undefined, as Allocator's contract says.
//
// After a device reset (see Allocator) the pool notices, at its next
// call, that the device's generation has moved on (device.Generational):
// its cached memory leaves Reserved and is never handed out again; a
// block still live from before the reset stays in InUse and Reserved
// until it is freed, which returns an error wrapping
// device.ErrInvalidated. Trim and Close return nil for memory the reset
// took. On a device without a generation the pool cannot notice: make a
// new one after a reset.
//
// A Pool is safe for concurrent use.
type Pool struct {
	dev    device.Device
	gran   uint64 // device allocation unit, bytes
	maxReq uint64 // largest request whose rounding to gran does not overflow
	cfg    PoolConfig
	chk    device.SubAllocationChecker // non-nil when cfg.CheckBlocks and dev has one
	gen    device.Generational         // the device's reset count; nil when it has none

	mu        sync.Mutex // protects the fields below
	closed    bool
	idx       freeIndex
	live      map[device.Ptr]*block
	segs      *segment // every segment of the device's current generation
	nsegs     int
	stale     *segment   // segments from before a device reset that have live blocks
	devGen    uint64     // the device's generation that segs belong to
	wholly    []*segment // segments that are one free block, unordered
	st        Stats
	highWater uint64             // most bytes ever reserved (not reset by ResetPeaks)
	classRes  [numClasses]uint64 // bytes reserved per class
}

// NewPool returns a Pool on dev.
func NewPool(dev device.Device, cfg PoolConfig) (*Pool, error) {
	if dev == nil {
		return nil, fmt.Errorf("alloc: new pool: nil device: %w", device.ErrInvalidValue)
	}
	c, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	gran := max(dev.Info().Granularity, PoolGranularity)
	p := &Pool{
		dev:    dev,
		gran:   gran,
		maxReq: math.MaxUint64 &^ (gran - 1),
		cfg:    c,
		idx:    newFreeIndex(dev, false),
		live:   make(map[device.Ptr]*block),
	}
	if c.CheckBlocks {
		p.chk, _ = dev.(device.SubAllocationChecker)
	}
	if g, ok := dev.(device.Generational); ok {
		p.gen, p.devGen = g, g.Generation()
	}
	return p, nil
}

// Granularity is the unit requests are rounded to: 512 bytes.
func (p *Pool) Granularity() uint64 { return PoolGranularity }

// Config returns the configuration in effect, defaults filled in.
func (p *Pool) Config() PoolConfig { return p.cfg }

// Alloc returns n bytes usable on s: a cached block when one fits and
// may be used on s, else a block of a new segment.
func (p *Pool) Alloc(n uint64, s device.Stream) (device.Ptr, error) {
	ptr, err := p.alloc(n, s, false)
	if p.chk != nil && err == nil {
		return p.markAllocated(ptr, n, s)
	}
	return ptr, err
}

// AllocExact is Alloc for a long-lived allocation (alloc.ExactGrower): a
// miss takes a segment of the request's size rounded up to the device's
// granularity (at most SmallSegment for a small request), never a larger
// shared one. What the segment holds beyond the request is cached as
// usual.
func (p *Pool) AllocExact(n uint64, s device.Stream) (device.Ptr, error) {
	ptr, err := p.alloc(n, s, true)
	if p.chk != nil && err == nil {
		return p.markAllocated(ptr, n, s)
	}
	return ptr, err
}

// markAllocated marks the block just handed out (CheckBlocks); if the
// device refuses, the block goes back to the pool.
func (p *Pool) markAllocated(ptr device.Ptr, n uint64, s device.Stream) (device.Ptr, error) {
	if err := p.chk.MarkAllocated(ptr, n); err != nil {
		_ = p.free(ptr, s)
		return 0, fmt.Errorf("alloc: pool alloc of %s: marking the block for the memory checker: %w", units.Format(n), err)
	}
	return ptr, nil
}

func (p *Pool) alloc(n uint64, s device.Stream, exact bool) (device.Ptr, error) {
	if n == 0 || n > p.maxReq || s == nil {
		return 0, p.badRequest(n, s)
	}
	size := (n + PoolGranularity - 1) &^ (PoolGranularity - 1)
	c := p.classOf(size)
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return 0, fmt.Errorf("alloc: pool alloc of %s: %w", units.Format(n), ErrClosed)
	}
	p.syncGenLocked()
	st := p.idx.streamLocked(s)
	if b := p.idx.bestFit(size, c, st); b != nil {
		ptr := p.takeLocked(b, size, true)
		p.mu.Unlock()
		return ptr, nil
	}
	return p.allocSlow(n, size, c, st, s, exact)
}

func (p *Pool) badRequest(n uint64, s device.Stream) error {
	if s == nil {
		return fmt.Errorf("alloc: pool alloc of %d bytes: nil stream: %w", n, device.ErrInvalidValue)
	}
	if n == 0 {
		return fmt.Errorf("alloc: pool alloc of 0 bytes: want n > 0: %w", device.ErrInvalidValue)
	}
	p.mu.Lock()
	p.st.OOMs++
	p.mu.Unlock()
	return fmt.Errorf("alloc: pool alloc of %d bytes: no device can hold it (rounding it up to the device's %s granularity overflows 64 bits): %w",
		n, units.Format(p.gran), device.ErrOutOfMemory)
}

// takeLocked hands out size bytes from the front of free block b and
// returns the address; hit says b was cached, not a new segment.
func (p *Pool) takeLocked(b *block, size uint64, hit bool) device.Ptr {
	if b.prev == nil && b.next == nil {
		p.unmarkWhollyLocked(b.seg)
	}
	a := b
	if b.size-size >= PoolGranularity {
		a = p.idx.newBlock()
		a.addr, a.size, a.seg, a.class = b.addr, size, b.seg, b.class
		a.prev, a.next = b.prev, b
		if b.prev != nil {
			b.prev.next = a
		} else {
			b.seg.first = a
		}
		b.prev = a
		p.idx.resize(b, b.addr+device.Ptr(size), b.size-size)
	} else {
		p.idx.remove(b)
	}
	p.live[a.addr] = a
	p.st.allocLocked(a.size, hit)
	return a.addr
}

// markWhollyLocked notes that seg is one free block.
func (p *Pool) markWhollyLocked(seg *segment) {
	seg.wi = len(p.wholly) + 1
	p.wholly = append(p.wholly, seg)
}

// unmarkWhollyLocked notes that seg is no longer one free block.
func (p *Pool) unmarkWhollyLocked(seg *segment) {
	i := seg.wi - 1
	if i < 0 {
		return
	}
	last := len(p.wholly) - 1
	moved := p.wholly[last]
	p.wholly[i] = moved
	moved.wi = i + 1
	p.wholly[last] = nil
	p.wholly = p.wholly[:last]
	seg.wi = 0
}

// Free returns p's block to the pool; it may be reused on s at once and on
// other streams once s's work up to now has finished. It may record an
// event on s for that, after releasing the pool's lock (streamorder.go
// says when: in a pool used from one stream, only when s has no event in
// flight, so the hit path makes no device call).
func (p *Pool) Free(ptr device.Ptr, s device.Stream) error {
	if s == nil {
		return fmt.Errorf("alloc: pool free of %v: nil stream: %w", ptr, device.ErrInvalidValue)
	}
	if p.chk != nil {
		// Unmark before the block can be reused; the pool's own error
		// (an unknown pointer, a closed pool) takes precedence.
		markErr := p.chk.MarkFreed(ptr)
		if err := p.free(ptr, s); err != nil {
			return err
		}
		if markErr != nil {
			return fmt.Errorf("alloc: pool free of %v: the block is back in the pool, but unmarking it for the memory checker failed: %w", ptr, markErr)
		}
		return nil
	}
	return p.free(ptr, s)
}

// free is Free without the CheckBlocks unmarking; s is not nil.
func (p *Pool) free(ptr device.Ptr, s device.Stream) error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return fmt.Errorf("alloc: pool free of %v: %w", ptr, ErrClosed)
	}
	p.syncGenLocked()
	b := p.live[ptr]
	if b == nil {
		p.mu.Unlock()
		return fmt.Errorf("alloc: pool free of %v: %w", ptr, ErrUnknownPointer)
	}
	delete(p.live, ptr)
	p.st.freeLocked(b.size)
	if b.seg.stale {
		p.freeStaleLocked(b)
		p.mu.Unlock()
		return fmt.Errorf("alloc: pool free of %v: the block was allocated before a device reset, which freed it: %w",
			ptr, device.ErrInvalidated)
	}
	st := p.idx.streamLocked(s)
	// Free neighbours alternate between sets (two of one set would have
	// merged), so absorbing a shared neighbour can bring one of st's
	// next to b: keep going.
	for pv := b.prev; canJoin(pv, st); pv = b.prev {
		p.absorbPrevLocked(b)
	}
	for nx := b.next; canJoin(nx, st); nx = b.next {
		p.absorbNextLocked(b)
	}
	p.idx.insertOwned(b, st)
	if b.prev == nil && b.next == nil {
		p.markWhollyLocked(b.seg)
	}
	if p.idx.recordWanted(st) {
		// An event at the free lets other streams reuse the block once
		// s's work up to here is done, not later (streamorder.go).
		if err := p.idx.recordAtFreeLocked(&p.mu, &p.closed, st, p.joinSharedLocked); err != nil {
			return fmt.Errorf("alloc: pool free of %v: the block is back in the pool, but the pool was closed meanwhile and closing its event failed: %w", ptr, err)
		}
		return nil
	}
	p.mu.Unlock()
	return nil
}

// syncGenLocked notices a device reset: when the device's generation has
// moved on, every segment is from before the reset and its memory is
// gone. Its free blocks leave the free index; a segment with no live
// block leaves the books, counted as a device free; one with live blocks
// keeps only their bytes in Reserved and goes to the stale list until
// they are freed (freeStaleLocked). The growth policy starts afresh, as
// on a new device.
func (p *Pool) syncGenLocked() {
	if p.gen == nil {
		return
	}
	g := p.gen.Generation()
	if g == p.devGen {
		return
	}
	p.devGen = g
	for seg := p.segs; seg != nil; {
		next := seg.snext
		p.unmarkWhollyLocked(seg)
		live, liveBytes := 0, uint64(0)
		for b := seg.first; b != nil; {
			nx := b.next
			if b.free {
				p.idx.remove(b)
				p.idx.putBlock(b)
			} else {
				b.prev, b.next = nil, nil
				live++
				liveBytes += b.size
			}
			b = nx
		}
		seg.first = nil
		if live == 0 {
			seg.sprev, seg.snext = nil, nil
			p.st.deviceFreeLocked(seg.size)
		} else {
			// Only its live blocks stay in Reserved (and InUse), each
			// until it is freed: the rest of it is gone with the reset.
			p.st.Reserved -= seg.size - liveBytes
			seg.stale, seg.nlive = true, live
			seg.sprev, seg.snext = nil, p.stale
			if p.stale != nil {
				p.stale.sprev = seg
			}
			p.stale = seg
		}
		seg = next
	}
	p.segs, p.nsegs = nil, 0
	p.classRes = [numClasses]uint64{}
}

// freeStaleLocked takes back live block b of a stale segment, already out
// of the live table and InUse: its bytes leave Reserved, and the segment
// leaves the books with its last live block, counted as a device free.
func (p *Pool) freeStaleLocked(b *block) {
	seg := b.seg
	p.st.Reserved -= b.size
	p.idx.putBlock(b)
	seg.nlive--
	if seg.nlive > 0 {
		return
	}
	if seg.sprev != nil {
		seg.sprev.snext = seg.snext
	} else {
		p.stale = seg.snext
	}
	if seg.snext != nil {
		seg.snext.sprev = seg.sprev
	}
	seg.sprev, seg.snext = nil, nil
	p.st.DeviceFrees++ // its bytes left Reserved at the reset and with each free
}

// joinSharedLocked merges b, just moved to the shared set, with its shared
// free neighbours.
func (p *Pool) joinSharedLocked(b *block) {
	pv, nx := b.prev, b.next
	joinPrev := pv != nil && pv.free && pv.owner == nil
	joinNext := nx != nil && nx.free && nx.owner == nil
	if !joinPrev && !joinNext {
		return
	}
	p.idx.remove(b)
	if joinPrev {
		p.absorbPrevLocked(b)
	}
	if joinNext {
		p.absorbNextLocked(b)
	}
	p.idx.insertShared(b)
	if b.prev == nil && b.next == nil {
		p.markWhollyLocked(b.seg)
	}
}

// joinOwnLocked merges each free block that st owns with its free
// neighbours in the shared set (and, through them, with st's other blocks),
// the merged block staying st's with the latest free number among its
// parts: demoting shared memory to one stream is always safe
// (streamorder.go). A free on st merges so at once, but a neighbour
// promoted to the shared set later joins only shared neighbours; the
// out-of-memory path calls this so that st can use such a run as one
// block.
func (p *Pool) joinOwnLocked(st *streamState) {
	if st.owned == 0 {
		return
	}
	own := make([]*block, 0, st.owned)
	for b := st.head; b != nil; b = b.fnext {
		own = append(own, b)
	}
	shared := func(nb *block) bool { return nb != nil && nb.free && nb.owner == nil }
	for _, b := range own {
		if !b.free || b.owner != st {
			continue // absorbed by a block merged before it (recycled)
		}
		if !shared(b.prev) && !shared(b.next) {
			continue
		}
		seq := b.seq
		p.idx.remove(b)
		for pv := b.prev; canJoin(pv, st); pv = b.prev {
			if pv.owner == st {
				seq = max(seq, pv.seq)
			}
			p.absorbPrevLocked(b)
		}
		for nx := b.next; canJoin(nx, st); nx = b.next {
			if nx.owner == st {
				seq = max(seq, nx.seq)
			}
			p.absorbNextLocked(b)
		}
		p.idx.insertOwnedAt(b, st, seq)
		if b.prev == nil && b.next == nil {
			p.markWhollyLocked(b.seg)
		}
	}
}

// absorbPrevLocked merges b's free predecessor into b, which is in no
// free set: the predecessor leaves its set and its struct is recycled.
func (p *Pool) absorbPrevLocked(b *block) {
	pv := b.prev
	p.idx.remove(pv)
	b.addr = pv.addr
	b.size += pv.size
	b.prev = pv.prev
	if b.prev != nil {
		b.prev.next = b
	} else {
		b.seg.first = b
	}
	p.idx.putBlock(pv)
}

// absorbNextLocked merges b's free successor into b, as absorbPrevLocked.
func (p *Pool) absorbNextLocked(b *block) {
	nx := b.next
	p.idx.remove(nx)
	b.size += nx.size
	b.next = nx.next
	if b.next != nil {
		b.next.prev = b
	}
	p.idx.putBlock(nx)
}

// classOf is the size class of a request of size bytes (rounded).
func (p *Pool) classOf(size uint64) uint8 {
	if size <= p.cfg.SmallSize {
		return classSmall
	}
	return classLarge
}

// ownSegment reports whether a request of size bytes gets a segment of its
// own: it is at least LargeSize and rounding it up to the device's
// granularity wastes at most 1/ownWasteDiv of it.
func (p *Pool) ownSegment(size uint64) bool {
	return size >= p.cfg.LargeSize && roundUp(size, p.gran)-size <= size/ownWasteDiv
}

// segmentSizeLocked is the growth policy (see the file overview): the
// bytes to ask the device for to serve a request of size bytes (rounded)
// in class c.
func (p *Pool) segmentSizeLocked(size uint64, c uint8) uint64 {
	exact := roundUp(size, p.gran)
	var g uint64
	switch {
	case c == classSmall:
		// Double the small class, up to 1/smallShareDiv of the pool.
		g = max(p.cfg.SmallSegment, min(p.classRes[classSmall], p.st.Reserved/smallShareDiv))
	case p.ownSegment(size):
		return exact
	default:
		g = max(p.cfg.MediumSegment, min(p.classRes[classLarge]/p.cfg.GrowthDivisor, p.cfg.MaxMediumSegment))
	}
	return max(roundUp(g, p.gran), exact)
}

func roundUp(n, g uint64) uint64 {
	r, ok := units.RoundUp(n, g)
	if !ok {
		return math.MaxUint64 &^ (g - 1)
	}
	return r
}

// detachLocked takes segment seg, all of whose blocks are free, out of the
// pool's books, ready to be freed on the device.
func (p *Pool) detachLocked(seg *segment) {
	p.unmarkWhollyLocked(seg)
	for b := seg.first; b != nil; {
		nx := b.next
		p.idx.remove(b)
		p.idx.putBlock(b)
		b = nx
	}
	seg.first = nil
	if seg.sprev != nil {
		seg.sprev.snext = seg.snext
	} else {
		p.segs = seg.snext
	}
	if seg.snext != nil {
		seg.snext.sprev = seg.sprev
	}
	seg.sprev, seg.snext = nil, nil
	p.nsegs--
	p.st.deviceFreeLocked(seg.size)
	p.classRes[seg.class] -= seg.size
}

// releaseWantedLocked reports whether a growth of g bytes would take the
// pool past its high-water mark while it holds wholly free segments.
func (p *Pool) releaseWantedLocked(g uint64) bool {
	return !p.cfg.KeepCache && len(p.wholly) > 0 && p.st.Reserved+g > p.highWater
}

// ownedWhollyLocked reports whether some wholly free segment still waits
// for a stream's event.
func (p *Pool) ownedWhollyLocked() bool {
	for _, seg := range p.wholly {
		if seg.first.owner != nil {
			return true
		}
	}
	return false
}

// releaseForGrowthLocked picks wholly free segments to give back before a
// growth of g bytes would raise the high-water mark, detaches them and
// returns them.
func (p *Pool) releaseForGrowthLocked(g uint64) []*segment {
	if !p.releaseWantedLocked(g) {
		return nil
	}
	cand := append([]*segment(nil), p.wholly...)
	sort.Slice(cand, func(i, j int) bool { return cand[i].size > cand[j].size })
	var out []*segment
	for _, seg := range cand {
		if p.st.Reserved+g <= p.highWater {
			break
		}
		if seg.first.owner != nil {
			// Still waiting for a stream's event: the device's Free
			// would wait for that stream's work, and a miss must not
			// block.
			continue
		}
		p.detachLocked(seg)
		out = append(out, seg)
	}
	return out
}

// trimLocked detaches every segment whose blocks are all free, and returns
// them. Blocks may still be waiting for different streams' events (so
// they have not coalesced): the device's Free waits for the work that may
// use them.
func (p *Pool) trimLocked() []*segment {
	var out []*segment
	for seg := p.segs; seg != nil; seg = seg.snext {
		all := true
		for b := seg.first; b != nil && all; b = b.next {
			all = b.free
		}
		if all {
			out = append(out, seg)
		}
	}
	for _, seg := range out {
		p.detachLocked(seg)
	}
	return out
}

// freeSegments gives detached segments back to the device. Called without
// the lock. A segment a device reset has freed counts as given back.
func (p *Pool) freeSegments(segs []*segment) error {
	var errs []error
	for _, seg := range segs {
		if err := p.dev.Free(seg.base); err != nil && !lostToReset(err) {
			errs = append(errs, fmt.Errorf("alloc: pool: free segment %v (%s): %w", seg.base, units.Format(seg.size), err))
		}
	}
	return errors.Join(errs...)
}

// allocSlow serves a miss. Called with the lock held; returns with it
// released.
func (p *Pool) allocSlow(n, size uint64, c uint8, st *streamState, s device.Stream, exactGrowth bool) (device.Ptr, error) {
	growth := func() uint64 {
		if exactGrowth {
			if c == classSmall {
				return roundUp(max(size, p.cfg.SmallSegment), p.gran)
			}
			return roundUp(size, p.gran)
		}
		return p.segmentSizeLocked(size, c)
	}
	closedErr := func() error { return fmt.Errorf("alloc: pool alloc of %s: %w", units.Format(n), ErrClosed) }
	// Memory freed on other streams may have become safe here.
	if p.idx.needFences(st) {
		if open, err := p.idx.fenceLocked(&p.mu, &p.closed, st, false, p.joinSharedLocked); !open {
			return 0, errors.Join(closedErr(), err)
		}
		if b := p.idx.bestFit(size, c, st); b != nil {
			ptr := p.takeLocked(b, size, true)
			p.mu.Unlock()
			return ptr, nil
		}
	}
	// A growth past the high-water mark gives back wholly free segments;
	// those freed on a stream can go once that stream's work is done.
	if g := growth(); p.releaseWantedLocked(g) && p.ownedWhollyLocked() && !p.idx.fencing {
		if open, err := p.idx.fenceLocked(&p.mu, &p.closed, st, true, p.joinSharedLocked); !open {
			return 0, errors.Join(closedErr(), err)
		}
		if b := p.idx.bestFit(size, c, st); b != nil {
			ptr := p.takeLocked(b, size, true)
			p.mu.Unlock()
			return ptr, nil
		}
	}

	p.syncGenLocked() // the fence rounds above released the lock
	exact := roundUp(size, p.gran)
	g := growth()
	rel := p.releaseForGrowthLocked(g)
	gen := p.devGen // a Reset from here on leaves the new segment's side of it unknown
	p.mu.Unlock()
	// A segment the device fails to free is gone from the books either
	// way; that only happens to a lost device (a reset, a dead context),
	// which fails every later call too. The error is reported if this
	// allocation fails, and dropped if it succeeds.
	relErr := p.freeSegments(rel)

	base, err := p.dev.Malloc(g)
	if err != nil && g > exact && errors.Is(err, device.ErrOutOfMemory) {
		g = exact
		base, err = p.dev.Malloc(g)
	}
	var waitErr error
	if err != nil && errors.Is(err, device.ErrOutOfMemory) {
		// Before giving up, as PyTorch's allocator does: wait (with the
		// lock released) for the work of every stream that owns free
		// blocks, so that they become usable here and coalesce, and try
		// the cache again; then give back every wholly free segment and
		// retry the device once.
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			return 0, errors.Join(closedErr(), relErr)
		}
		p.st.Retries++
		p.syncGenLocked()
		st = p.idx.streamLocked(s)
		open, werr := p.idx.waitLocked(&p.mu, &p.closed, st, p.joinSharedLocked)
		if !open {
			return 0, errors.Join(closedErr(), relErr, werr)
		}
		waitErr = werr
		p.syncGenLocked()
		gen = p.devGen // the retry below grows from here
		st = p.idx.streamLocked(s)
		// s's own free blocks next to shared ones are usable here as
		// one block.
		p.joinOwnLocked(st)
		if b := p.idx.bestFit(size, c, st); b != nil {
			ptr := p.takeLocked(b, size, true)
			p.mu.Unlock()
			return ptr, nil
		}
		rel = p.trimLocked()
		p.mu.Unlock()
		relErr = errors.Join(relErr, p.freeSegments(rel))
		base, err = p.dev.Malloc(g)
	}
	if err != nil {
		return 0, p.allocFailed(n, size, c, s, err, relErr, waitErr)
	}

	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return 0, errors.Join(fmt.Errorf("alloc: pool alloc of %s: %w", units.Format(n), ErrClosed), p.dev.Free(base))
	}
	if p.syncGenLocked(); p.devGen != gen {
		p.mu.Unlock()
		ferr := p.dev.Free(base)
		if lostToReset(ferr) {
			ferr = nil
		}
		return 0, errors.Join(fmt.Errorf("alloc: pool alloc of %s on stream %d: the device was reset while the pool grew, so the new %s segment may be from before the reset and was given back; retry on a stream made since: %w",
			units.Format(n), s.Handle(), units.Format(g), device.ErrInvalidated), ferr)
	}
	seg := &segment{base: base, size: g, class: c}
	b := p.idx.newBlock()
	b.addr, b.size, b.seg, b.class = base, g, seg, c
	seg.first = b
	seg.snext = p.segs
	if p.segs != nil {
		p.segs.sprev = seg
	}
	p.segs = seg
	p.nsegs++
	p.st.deviceAllocLocked(g)
	p.classRes[c] += g
	p.highWater = max(p.highWater, p.st.Reserved)
	// The new block is fresh memory: safe on every stream.
	p.idx.insertShared(b)
	p.markWhollyLocked(seg)
	ptr := p.takeLocked(b, size, false)
	p.mu.Unlock()
	return ptr, nil
}

// allocFailed builds the error for a failed miss. Called without the lock.
// waitErr is what waiting for other streams' frees raised.
func (p *Pool) allocFailed(n, size uint64, c uint8, s device.Stream, err, relErr, waitErr error) error {
	if !errors.Is(err, device.ErrOutOfMemory) {
		return errors.Join(fmt.Errorf("alloc: pool alloc of %s on stream %d: %w", units.Format(n), s.Handle(), err), relErr)
	}
	p.mu.Lock()
	p.st.OOMs++
	st := p.st
	largest := p.idx.largest()
	waiting := p.idx.waitingBytes(s.Handle())
	classFree := p.idx.classBytes(c)
	p.mu.Unlock()
	devFree := "unknown"
	if free, total, e := p.dev.MemInfo(); e == nil {
		devFree = units.Format(free) + " of " + units.Format(total)
	}
	asked := units.Format(n)
	if r := units.Format(size); r != asked {
		asked += " (" + r + " rounded)"
	}
	advice := "free live arrays, lower the batch size, or give this pool more of the device"
	switch {
	case waiting > 0 && waitErr != nil:
		advice = fmt.Sprintf("%s freed on other streams cannot be used on stream %d, as waiting for those streams failed (%v); "+
			"synchronize them, or %s", units.Format(waiting), s.Handle(), waitErr, advice)
	case waiting > 0:
		// Freed by other goroutines while this call waited.
		advice = fmt.Sprintf("%s was freed on other streams after this call waited for them; retry, or %s",
			units.Format(waiting), advice)
	case classFree >= size:
		// Nothing waits on another stream, and the out-of-memory path
		// merged every free block this stream may use with its free
		// neighbours: live blocks lie between what is left.
		advice = fmt.Sprintf("the cache has the bytes but not in one piece: its %s of free blocks for requests of this size lie between live blocks; %s",
			units.Format(classFree), advice)
	case st.Cached() >= size:
		// Trim gave back every wholly free segment: the rest of the
		// cache is in segments of the other size class that live
		// blocks hold.
		other := "small requests (at most " + units.Format(p.cfg.SmallSize) + ")"
		if c == classSmall {
			other = "larger requests"
		}
		advice = fmt.Sprintf("the cache has the bytes but only %s of them serve requests of this size: the rest lies in segments for %s, held by live blocks; %s",
			units.Format(classFree), other, advice)
	}
	return errors.Join(fmt.Errorf("alloc: pool alloc of %s on stream %d failed after waiting for other streams' frees, trimming the cache and retrying: "+
		"the pool has %s allocated and %s reserved (%s cached, largest free block %s, %s of it waiting on other streams' work), the device has %s free; %s: %w",
		asked, s.Handle(),
		units.Format(st.InUse), units.Format(st.Reserved), units.Format(st.Cached()), units.Format(largest), units.Format(waiting),
		devFree, advice, err), relErr)
}

// Stats reports the pool's counters, exactly: the snapshot is taken under
// the lock.
func (p *Pool) Stats() Stats {
	p.mu.Lock()
	if !p.closed {
		p.syncGenLocked()
	}
	s := p.st
	p.mu.Unlock()
	return s
}

// ResetPeaks sets PeakInUse and PeakReserved to the current values.
func (p *Pool) ResetPeaks() {
	p.mu.Lock()
	p.st.resetPeaksLocked()
	p.mu.Unlock()
}

// Trim gives every wholly free segment back to the device. Blocks still
// waiting for another stream's event are freed too: the device's Free waits
// for work that may use the memory. Segments a device reset took count as
// given back, without an error.
func (p *Pool) Trim() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return fmt.Errorf("alloc: pool trim: %w", ErrClosed)
	}
	p.syncGenLocked()
	rel := p.trimLocked()
	p.mu.Unlock()
	return p.freeSegments(rel)
}

// Close gives every segment back to the device, live blocks included, and
// releases the pool's events. Segments and events a device reset took
// count as given back, without an error. Later calls return ErrClosed; a
// second Close returns nil.
func (p *Pool) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	p.syncGenLocked()
	var segs []*segment
	for seg := p.segs; seg != nil; seg = seg.snext {
		segs = append(segs, seg)
	}
	nstale := 0
	for seg := p.stale; seg != nil; seg = seg.snext {
		nstale++ // gone with a device reset: nothing to free
	}
	p.segs, p.nsegs, p.wholly, p.stale = nil, 0, nil, nil
	p.st.DeviceFrees += uint64(len(segs) + nstale)
	p.st.Reserved, p.st.InUse = 0, 0
	p.classRes = [numClasses]uint64{}
	p.live = nil
	var evs []device.Event
	if !p.idx.fencing {
		evs = p.idx.eventsLocked()
	}
	p.mu.Unlock()
	return errors.Join(p.freeSegments(segs), closeEvents(evs))
}

// closeEvents closes events the pool no longer needs; one a device reset
// destroyed counts as closed.
func closeEvents(evs []device.Event) error {
	var errs []error
	for _, ev := range evs {
		if err := ev.Close(); err != nil && !lostToReset(err) {
			errs = append(errs, fmt.Errorf("alloc: close event: %w", err))
		}
	}
	return errors.Join(errs...)
}

var (
	_ Allocator    = (*Pool)(nil)
	_ PeakResetter = (*Pool)(nil)
	_ Granular     = (*Pool)(nil)
)
