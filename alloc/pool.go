package alloc

// Pool: the device-memory strategy on the stream-ordered core (core.go).
// Rules and invariants:
//
//   - Requests are rounded up to PoolGranularity (512 bytes). Memory
//     comes from the device in segments; each segment is a chain of
//     blocks ordered by address, each live or free, that tiles it with no
//     gap or overlap. An allocation takes the best-fitting free block the
//     stream may use (smallest large enough, lowest address among equals),
//     hands out its front and leaves the rest free; a free merges the
//     block with free neighbours the stream may join (streamorder.go).
//   - Requests of at most SmallSize are served only from small segments,
//     larger ones only from large segments, so a long-lived small block
//     never pins a large segment.
//   - Growth (segmentSizeLocked): a small request gets a segment the size
//     of the small class so far (the class doubles), at least SmallSegment
//     and at most 1/smallShareDiv of the pool; a large request (at least
//     LargeSize) whose rounding to the device granularity wastes at most
//     1/ownWasteDiv of it gets a segment of exactly that size; any other
//     request a shared segment of 1/GrowthDivisor of the large class, at
//     least MediumSegment and at most MaxMediumSegment.
//   - Before a growth past the high-water mark (the most ever reserved),
//     wholly free segments go back to the device, largest first, until
//     the growth fits under the mark (unless KeepCache); one still waiting
//     on a stream's event goes only after a fence round shows that
//     stream's work done, so the device's Free never waits.
//   - wholly lists the segments that are one free block; stale the
//     segments from before a device reset that still have live blocks;
//     classRes the bytes reserved per class. All are protected by the
//     core's lock.
//
// Why these choices, and what they measure on the shared traces, is in
// BENCHMARKS.md. The rest of the strategy (growth, giving back, resets,
// the out-of-memory account) is in pool_grow.go.

import (
	"fmt"
	"math"

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

// Growth policy constants (see the file overview and segmentSizeLocked).
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
// itself, at the free where it can, and queries them at later misses;
// until one completes the block is not offered elsewhere and the pool
// grows instead). So memory is never reused on a stream while work on the
// stream that freed it may still touch it; using a pointer after Free, or
// on a stream other than the one named at Free without ordering the two
// streams, is undefined, as Allocator's contract says.
//
// When the device is out of memory, the pool retries with an exactly
// sized segment; then waits, without holding its lock, for the work of
// every stream that owns free blocks (possibly for work queued on such a
// stream after its frees too; fence.go, "When events are recorded", says
// what that wait may deadlock with), merges the calling stream's free
// blocks with shared neighbours and tries its cache again; then gives back
// every wholly free segment and retries the device once. If that fails
// too, the error says what was asked, what is allocated, reserved, cached
// and free, the largest free block, how much still waits on other
// streams' work, and whether fragmentation, the other size class or live
// memory is to blame.
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
	core
	gran   uint64 // device allocation unit, bytes
	maxReq uint64 // largest request whose rounding to gran does not overflow
	cfg    PoolConfig
	chk    device.SubAllocationChecker // non-nil when cfg.CheckBlocks and dev has one

	// Protected by the core's lock.
	stale     *segment           // segments from before a device reset that have live blocks
	wholly    []*segment         // segments that are one free block, unordered
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
		gran:   gran,
		maxReq: math.MaxUint64 &^ (gran - 1),
		cfg:    c,
	}
	p.initCore(dev, p, NamePool, false, p.joinSharedLocked)
	if c.CheckBlocks {
		p.chk, _ = dev.(device.SubAllocationChecker)
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
	if p.chk != nil || n == 0 || n > p.maxReq || s == nil {
		return p.allocChecked(n, s, false)
	}
	size := (n + PoolGranularity - 1) &^ (PoolGranularity - 1)
	b, err := p.core.alloc(request{n: n, size: size, class: p.classOf(size)}, s)
	if err != nil {
		return 0, err
	}
	return b.addr, nil
}

// AllocExact is Alloc for a long-lived allocation (alloc.ExactGrower): a
// miss takes a segment of the request's size rounded up to the device's
// granularity (at most SmallSegment for a small request), never a larger
// shared one. What the segment holds beyond the request is cached as
// usual.
func (p *Pool) AllocExact(n uint64, s device.Stream) (device.Ptr, error) {
	return p.allocChecked(n, s, true)
}

// allocChecked is Alloc (AllocExact when exact is set) with its request
// checked and, for CheckBlocks, the block marked for the memory checker;
// if the device refuses the mark, the block goes back to the pool.
func (p *Pool) allocChecked(n uint64, s device.Stream, exact bool) (device.Ptr, error) {
	if n == 0 || n > p.maxReq || s == nil {
		return 0, p.badRequest(n, s)
	}
	size := (n + PoolGranularity - 1) &^ (PoolGranularity - 1)
	b, err := p.core.alloc(request{n: n, size: size, class: p.classOf(size), exact: exact}, s)
	if err != nil {
		return 0, err
	}
	if p.chk != nil {
		if err := p.chk.MarkAllocated(b.addr, n); err != nil {
			_ = p.free(b.addr, s)
			return 0, fmt.Errorf("alloc: pool alloc of %s: marking the block for the memory checker: %w", units.Format(n), err)
		}
	}
	return b.addr, nil
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
	return p.outOfMemory(n, s, fmt.Errorf("alloc: pool alloc of %d bytes: no device can hold it (rounding it up to the device's %s granularity overflows 64 bits): %w",
		n, units.Format(p.gran), device.ErrOutOfMemory))
}

// takeLocked takes the best-fitting cached block for r that st may use
// and returns its front, of r.size bytes; nil when none fits.
func (p *Pool) takeLocked(r request, st *streamState) *block {
	b := p.idx.bestFit(r.size, r.class, st)
	if b == nil {
		return nil
	}
	return p.carveLocked(b, r.size)
}

// carveLocked takes size bytes from the front of free block b and returns
// them as a block (b itself when the rest would be under PoolGranularity);
// the rest stays free where b was.
func (p *Pool) carveLocked(b *block, size uint64) *block {
	if b.prev == nil && b.next == nil {
		p.unmarkWhollyLocked(b.seg)
	}
	return p.idx.carveFront(b, size)
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
	if s == nil || p.chk != nil {
		return p.freeChecked(ptr, s)
	}
	if res, err := p.core.free(ptr, 0, s); res != freed {
		return p.freeErr(ptr, res, err)
	}
	return nil
}

// freeChecked is Free for a nil stream or with CheckBlocks: the block is
// unmarked for the memory checker before it can be reused.
func (p *Pool) freeChecked(ptr device.Ptr, s device.Stream) error {
	if s == nil {
		return fmt.Errorf("alloc: pool free of %v: nil stream: %w", ptr, device.ErrInvalidValue)
	}
	// The pool's own error (an unknown pointer, a closed pool) takes
	// precedence.
	markErr := p.chk.MarkFreed(ptr)
	if err := p.free(ptr, s); err != nil {
		return err
	}
	if markErr != nil {
		return fmt.Errorf("alloc: pool free of %v: the block is back in the pool, but unmarking it for the memory checker failed: %w", ptr, markErr)
	}
	return nil
}

// free is Free without the CheckBlocks unmarking; s is not nil.
func (p *Pool) free(ptr device.Ptr, s device.Stream) error {
	if res, err := p.core.free(ptr, 0, s); res != freed {
		return p.freeErr(ptr, res, err)
	}
	return nil
}

// freeLocked merges live block b, freed on st, with the free neighbours
// st may join, and puts it in st's free set.
func (p *Pool) freeLocked(b *block, st *streamState) {
	p.idx.mergeFreed(b, st)
	p.markIfWhollyLocked(b)
}

// joinSharedLocked merges b, just moved to the shared set, with its shared
// free neighbours, and keeps the list of wholly free segments: b may be a
// block split off a segment's one block (freeIndex.shed).
func (p *Pool) joinSharedLocked(b *block) {
	merged := p.idx.joinShared(b)
	switch whole := b.prev == nil && b.next == nil; {
	case whole && merged:
		p.markWhollyLocked(b.seg)
	case !whole:
		p.unmarkWhollyLocked(b.seg)
	}
}

// beforeRetryLocked merges each free block that st owns with its free
// shared neighbours (freeIndex.mergeOwnedWithShared).
func (p *Pool) beforeRetryLocked(st *streamState) {
	p.idx.mergeOwnedWithShared(st, p.markIfWhollyLocked)
}

// markIfWhollyLocked marks b's segment wholly free when free block b is
// all of it.
func (p *Pool) markIfWhollyLocked(b *block) {
	if b.prev == nil && b.next == nil {
		p.markWhollyLocked(b.seg)
	}
}

// classOf is the size class of a request of size bytes (rounded).
func (p *Pool) classOf(size uint64) uint8 {
	if size <= p.cfg.SmallSize {
		return classSmall
	}
	return classLarge
}

var (
	_ Allocator    = (*Pool)(nil)
	_ PeakResetter = (*Pool)(nil)
	_ Granular     = (*Pool)(nil)
	_ strategy     = (*Pool)(nil)
)
