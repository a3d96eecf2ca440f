package alloc

// Expandable: the expandable-segments strategy on the stream-ordered core
// (core.go), for devices with virtual memory (device.VirtualMemory).
// Rules and invariants:
//
//   - Requests are rounded up to PoolGranularity and split into two size
//     classes: at most SmallSize (by default, under a page: blocks that
//     must share their pages), and larger. Each (stream, class) pair grows
//     one range: a reservation of address space as large as the device,
//     into which physical pages (the device's VM granularity, 2 MiB on
//     current GPUs) are mapped as it grows, one handle and one mapping per
//     page, so that any whole page can be unmapped on its own. Should a
//     range fill up, the pair gets another.
//   - A range's blocks tile the whole reservation, in address order: live
//     blocks, free blocks (in the free index, always mapped), holes
//     (unmapped pages, class holeClass, linked on the range's hole list
//     through fprev/fnext) and pending blocks (class pendingClass: pages
//     being mapped or unmapped by a goroutine outside the lock, with the
//     free blocks a growth joins). Only free blocks merge; a free block
//     never touches a hole it could be joined with across a page it
//     partly covers: holes are whole pages.
//   - Best fit with splitting and coalescing, as Pool: an allocation takes
//     the smallest free block the stream may use and hands out the end of
//     it that leaves more whole pages free (the front on a tie), so that
//     the free rest can go back to the device; a rest too small for a
//     whole page stays beside the hole the block borders, if any, else
//     beside the block before it (carveLocked).
//   - A miss grows by the fewest pages that make a request fit: pages
//     mapped into a hole next to a free block the stream may use (at the
//     range's end, that is the free tail), or into a hole between two such
//     blocks, or fresh pages at a hole's edge (growthPlan).
//   - A small request no free block of its class fits may take a dead gap
//     of its stream's large range: a free block too small for any large
//     request, between two live blocks (deadGapLocked). The gap's pages
//     are pinned by its neighbours whatever happens; taking it pins no
//     page more, and spares the small range a growth.
//   - A large request may take the free space of its stream's small range
//     (a cached block there, or a growth that maps fewer pages than its
//     own class's), but only when its own class's growth would take the
//     pages mapped past their high-water mark and past the waste target
//     for the bytes live (wasteTarget: 3 % more than they need, or a page
//     more than their pages, whichever is larger), that is, when the
//     pages a second range leaves partly used decide the peak. A large
//     block among small ones pins no page that those do not already pin
//     (its whole pages go back when it is freed); the other way round, a
//     small block among large ones would. Below the target, the classes
//     stay apart, as PyTorch keeps them (crossWantedLocked).
//   - Whole free pages are unmapped (releasing their memory) only in three
//     cases: before a growth would take the mapped bytes past their
//     high-water mark, as many as keep it under the mark; on Trim, every
//     one; on the device's out of memory, every one. The first case has a
//     budget: over the allocator's life it unmaps at most one page per two
//     of the most ever mapped, so a workload that would unmap and map the
//     same pages again and again cannot make more than about three map or
//     unmap calls per page of its peak. Only pages of blocks
//     that every stream may use (the shared set) are unmapped: their
//     freeing streams' work is known done, as unmapping, which does not
//     wait, requires. Why this policy, and its measured cost, is in
//     BENCHMARKS.md.
//   - Mapped bytes are the Stats' Reserved: each growth counts as a device
//     allocation, each unmapping batch as a device free.

import (
	"errors"
	"fmt"

	"github.com/vramkit/vram/device"
	"github.com/vramkit/vram/internal/units"
)

// churnDiv sets the churn budget: pages unmapped before growths, over the
// allocator's life, stay at most PeakMapped/churnDiv.
const churnDiv = 2

// Block classes beyond Pool's two: blocks that are not in the free index.
const (
	holeClass    uint8 = 0xfe // unmapped pages
	pendingClass uint8 = 0xff // pages being mapped or unmapped, outside the lock
)

// ExpandableConfig tunes an Expandable. The zero value is the recommended
// configuration. A plain value, safe to share.
type ExpandableConfig struct {
	// SmallSize is the largest request (bytes, after rounding) served from
	// a stream's small range. Default: a page less 512 bytes, the largest
	// request under a page. A block under a page always shares its pages
	// with its neighbours; one of a page or more holds whole pages that go
	// back to the device when it is freed, and kept apart from the
	// others, its range's free space is not cut up by blocks that pin
	// pages. (Pool's 1 MiB comes from its 2 MiB small segments.)
	SmallSize uint64
	// Reserve is the address space each range reserves, in bytes. Default:
	// the device's total memory, rounded up to the page size.
	Reserve uint64
	// KeepMapped turns off unmapping free pages before a growth past the
	// high-water mark: pages are then unmapped only on Trim, Close and out
	// of memory, as PyTorch's expandable segments do.
	KeepMapped bool
	// ReleaseThreshold is the cached bytes (mapped, not in use) Trim keeps
	// mapped; it unmaps whole free pages only above it. Default 0: Trim
	// unmaps every whole free page. Out of memory unmaps every one
	// whatever it says.
	ReleaseThreshold uint64
}

// rangeKey names the range a request grows: its stream and size class.
type rangeKey struct {
	stream uintptr
	class  uint8
}

// vrange is one reservation and what is mapped in it.
type vrange struct {
	seg    *segment // base, size (reserved bytes) and class; its blocks tile it
	key    rangeKey
	mapped []bool // per page: mapped
	holes  *block // hole blocks, linked through fnext/fprev
	dead   bool   // given up (a device reset, Close); its pages are not ours
}

// vmWork is pages a goroutine maps or unmaps outside the lock: a growth
// (pending block blk, pages [lo, hi) to map, and the free blocks it
// absorbed on either side) or an unmapping (pages [lo, hi), pending block
// blk). It travels through the core as a segment of its own.
type vmWork struct {
	rg     *vrange
	blk    *block
	lo, hi device.Ptr
	unmap  bool
	// The free neighbours a growth took out of the index, to put back if
	// it fails: their sizes, owners and free numbers.
	left, right absorbed
}

// absorbed is a free block a growth took out of the index.
type absorbed struct {
	size  uint64
	owner *streamState
	seq   uint64
}

// Expandable is a caching best-fit allocator over expandable segments:
// per stream and size class, one address range that grows by mapping
// physical pages, so that memory comes from the device page by page, a
// large block can always extend the free space at the range's end, and
// whole free pages anywhere can go back to the device. It is PyTorch's
// caching allocator with expandable_segments:True, on the stream-ordered
// core Pool uses, so it shares Pool's stream rules: a block freed on s is
// reused at once on s and on other streams once an event shows s's work up
// to the free done. See the file overview for the growth and unmapping
// policy.
//
// On the device's out of memory it waits for the work of streams that own
// free blocks, unmaps every whole free page and retries once, as Pool
// does. Trim waits for those streams too, then unmaps every whole free
// page. Close unmaps everything at once: work that still uses its memory
// must have finished (device.VirtualMemory's Unmap does not wait).
//
// A device reset takes every range; blocks live across it are handled as
// Pool handles them. An Expandable is safe for concurrent use.
type Expandable struct {
	core
	vm      device.VirtualMemory
	page    uint64 // bytes per page (the device's VM granularity)
	reserve uint64 // bytes each range reserves
	cfg     ExpandableConfig

	// Protected by the core's lock.
	ranges     map[rangeKey][]*vrange
	bySeg      map[*segment]*vrange // range segments
	work       map[*segment]*vmWork // growths and unmappings in flight
	stale      *segment             // range segments from before a reset with live blocks
	highWater  uint64               // most bytes ever mapped
	plan       growthPlan           // the last plan of growthLocked, for releaseForGrowthLocked
	pages      PageStats
	peakRanges int // most ranges held at once
}

// PageStats counts an Expandable's pages: mapped now and at most, and the
// map and unmap calls made (one per page each).
type PageStats struct {
	Page       uint64 // bytes per page
	Mapped     uint64 // pages mapped now
	PeakMapped uint64 // most pages mapped at once
	Maps       uint64 // pages mapped (device Map calls)
	Unmaps     uint64 // pages unmapped (device Unmap calls)
	// GrowthUnmaps counts the pages unmapped before growths past the
	// high-water mark (not on Trim, Close or out of memory): at most
	// PeakMapped/2 (the churn budget).
	GrowthUnmaps uint64
	Reservation  uint64 // address ranges reserved
}

// NewExpandable returns an Expandable on dev, which must implement
// device.VirtualMemory; one that does not, or whose driver lacks the
// ability, gives an error wrapping device.ErrNotSupported.
func NewExpandable(dev device.Device, cfg ExpandableConfig) (*Expandable, error) {
	if dev == nil {
		return nil, fmt.Errorf("alloc: new expandable: nil device: %w", device.ErrInvalidValue)
	}
	vm, ok := dev.(device.VirtualMemory)
	if !ok {
		return nil, fmt.Errorf("alloc: new expandable: %s devices have no virtual memory management: %w",
			dev.Info().Backend, device.ErrNotSupported)
	}
	page := vm.VMGranularity()
	if page == 0 || page%PoolGranularity != 0 {
		return nil, fmt.Errorf("alloc: new expandable: the device's VM granularity %d is not a multiple of %d: %w",
			page, PoolGranularity, device.ErrNotSupported)
	}
	// One page reserved and given back proves the ability is there.
	p, err := vm.ReserveAddress(page)
	if err != nil {
		return nil, fmt.Errorf("alloc: new expandable: %w", err)
	}
	if err := vm.FreeAddress(p, page); err != nil {
		return nil, fmt.Errorf("alloc: new expandable: %w", err)
	}
	if cfg.SmallSize == 0 {
		cfg.SmallSize = page - PoolGranularity
	}
	if cfg.Reserve == 0 {
		cfg.Reserve = dev.Info().TotalBytes
	}
	e := &Expandable{
		vm:      vm,
		page:    page,
		reserve: roundUp(max(cfg.Reserve, page), page),
		cfg:     cfg,
		ranges:  map[rangeKey][]*vrange{},
		bySeg:   map[*segment]*vrange{},
		work:    map[*segment]*vmWork{},
	}
	e.pages.Page = page
	e.initCore(dev, e, NameExpandable, false, e.joinSharedLocked)
	return e, nil
}

// Config returns the configuration in effect, defaults filled in.
func (e *Expandable) Config() ExpandableConfig { return e.cfg }

// Granularity is the unit requests are rounded to: 512 bytes.
func (e *Expandable) Granularity() uint64 { return PoolGranularity }

// PageStats reports the allocator's pages and its map and unmap calls.
func (e *Expandable) PageStats() PageStats {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.pages
}

// Alloc returns n bytes usable on s: a cached block when one fits and may
// be used on s, else a block of pages newly mapped.
func (e *Expandable) Alloc(n uint64, s device.Stream) (device.Ptr, error) {
	if n == 0 || n > math64 || s == nil {
		return 0, e.badRequest(n, s)
	}
	size := (n + PoolGranularity - 1) &^ (PoolGranularity - 1)
	cls := classSmall
	if size > e.cfg.SmallSize {
		cls = classLarge
	}
	b, err := e.core.alloc(request{n: n, size: size, class: cls, stream: s.Handle()}, s)
	if err != nil {
		return 0, err
	}
	return b.addr, nil
}

// math64 is the largest request whose rounding does not overflow.
const math64 = ^uint64(0) - 1<<32

func (e *Expandable) badRequest(n uint64, s device.Stream) error {
	switch {
	case s == nil:
		return fmt.Errorf("alloc: expandable alloc of %d bytes: nil stream: %w", n, device.ErrInvalidValue)
	case n == 0:
		return fmt.Errorf("alloc: expandable alloc of 0 bytes: want n > 0: %w", device.ErrInvalidValue)
	}
	e.mu.Lock()
	e.st.OOMs++
	e.mu.Unlock()
	return e.outOfMemory(n, s, fmt.Errorf("alloc: expandable alloc of %d bytes: no device can hold it: %w", n, device.ErrOutOfMemory))
}

// fillReportLocked adds the pages to the core's report (reportFiller):
// Segments are the ranges, PeakSegments the most ranges ever held.
func (e *Expandable) fillReportLocked(r *MemoryReport) {
	r.PageSize, r.Pages, r.PeakPages = e.page, e.pages.Mapped, e.pages.PeakMapped
	r.Segments, r.PeakSegments = e.nsegs, max(e.nsegs, e.peakRanges)
}

// Free returns p's block to the allocator; it may be reused on s at once
// and on other streams once s's work up to now has finished.
func (e *Expandable) Free(ptr device.Ptr, s device.Stream) error {
	if s == nil {
		return fmt.Errorf("alloc: expandable free of %v: nil stream: %w", ptr, device.ErrInvalidValue)
	}
	if res, err := e.core.free(ptr, 0, s); res != freed {
		return e.freeErr(ptr, res, err)
	}
	return nil
}

// Trim waits for the work of every stream that owns free blocks up to its
// frees, then unmaps whole free pages until at most ReleaseThreshold bytes
// are cached (every one, by default), and frees the address ranges left
// with nothing mapped. Memory a device reset took counts as given back,
// without an error.
func (e *Expandable) Trim() error {
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return fmt.Errorf("alloc: expandable trim: %w", ErrClosed)
	}
	werr := e.fenceAllLocked()
	if e.closed { // fenceAllLocked released the lock
		e.mu.Unlock()
		return joinErr(werr, fmt.Errorf("alloc: expandable trim: %w", ErrClosed))
	}
	e.syncGenLocked()
	rel := append(e.releaseCachedLocked(e.cfg.ReleaseThreshold), e.takeDeadLocked()...)
	e.mu.Unlock()
	err := joinErr(werr, e.giveBack(rel))
	// Ranges left with nothing mapped (their streams' blocks all gone) give
	// their address space back too.
	e.mu.Lock()
	var empty []*segment
	if !e.closed {
		empty = e.emptyRangesLocked()
	}
	e.mu.Unlock()
	return joinErr(err, e.giveBack(empty))
}

// Close waits for the streams that own free blocks, then gives every page
// and range back to the device.
func (e *Expandable) Close() error {
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return nil
	}
	werr := e.fenceAllLocked()
	e.mu.Unlock()
	return joinErr(werr, e.core.Close())
}

// fenceAllLocked waits (lock released meanwhile) until the work of every
// stream owning free blocks is done up to its frees, promoting them all to
// the shared set. A closed allocator leaves the lock held all the same.
func (e *Expandable) fenceAllLocked() error {
	x := &e.idx
	if !e.awaitRoundLocked() || e.closed || !x.prepareFencesLocked(nil, true, true) {
		return nil
	}
	e.mu.Unlock()
	x.runFences()
	e.mu.Lock()
	return x.finishFencesLocked()
}

// takeLocked takes the best-fitting cached block for r that st may use and
// returns r.size bytes of it (carveLocked); when none fits, for a small
// request the best fit in its stream's large ranges if that is a dead gap
// (deadGapLocked), for a large one the best fit in its stream's small
// ranges where crossWantedLocked allows; nil when none fits.
func (e *Expandable) takeLocked(r request, st *streamState) *block {
	if b := e.idx.bestFit(r.size, r.class, st); b != nil {
		return e.carveLocked(b, r.size)
	}
	if r.class != classLarge {
		if b := e.idx.bestFit(r.size, classLarge, st); b != nil && e.deadGapLocked(b) {
			return e.carveLocked(b, r.size)
		}
		return nil
	}
	if b := e.idx.bestFit(r.size, classSmall, st); b != nil && e.crossWantedLocked(r, e.ownPlanLocked(r)) {
		return e.carveLocked(b, r.size)
	}
	return nil
}

// deadGapLocked reports whether free block b of a large range is a dead
// gap: too small for any large request (at most SmallSize), holding no
// whole page, between two live blocks. Such a gap stays mapped while its
// neighbours live (every page it touches, one of them touches too), yet
// its own class cannot use it; a small request placed in it pins no page
// that is not pinned already.
func (e *Expandable) deadGapLocked(b *block) bool {
	if b.size > e.cfg.SmallSize || !isLive(b.prev) || !isLive(b.next) {
		return false
	}
	lo, hi := e.wholePages(b)
	return lo == hi
}

// carveLocked takes size bytes from free block b: from its back when the
// front that stays free then holds more whole pages than the back would
// if the front were taken, else from its front. A page is the unit that
// goes back to the device; the bytes of a page a live block shares are
// mapped whatever the free rest does. When no rest can hold a whole page,
// the rest is left beside a hole where b borders one (a growth into the
// hole joins it: planLocked), so from the back only when the block after
// b is live; between two live blocks that leaves the rest beside the one
// before, which measured better (BENCHMARKS.md).
func (e *Expandable) carveLocked(b *block, size uint64) *block {
	if b.size-size < e.page { // no rest holds a whole page
		if b.size > size && isLive(b.next) {
			return e.idx.carveBack(b, size)
		}
		return e.idx.carveFront(b, size)
	}
	end := b.addr + device.Ptr(b.size)
	flo, fhi := e.wholePagesIn(b.addr, end-device.Ptr(size)) // the front, were the back taken
	blo, bhi := e.wholePagesIn(b.addr+device.Ptr(size), end)
	if fhi-flo > bhi-blo {
		return e.idx.carveBack(b, size)
	}
	return e.idx.carveFront(b, size)
}

// isLive reports whether b is a live block: not free, not a hole, not
// pending; nil is none.
func isLive(b *block) bool { return b != nil && !b.free && b.class < holeClass }

// freeLocked merges live block b, freed on st, with the free neighbours st
// may join, and puts it in st's free set.
func (e *Expandable) freeLocked(b *block, st *streamState) { e.idx.mergeFreed(b, st) }

// joinSharedLocked merges b, just moved to the shared set, with its shared
// free neighbours.
func (e *Expandable) joinSharedLocked(b *block) { e.idx.joinShared(b) }

// beforeRetryLocked merges each free block st owns with its shared free
// neighbours, as Pool's does, so that st can use such a run as one block.
func (e *Expandable) beforeRetryLocked(st *streamState) { e.idx.mergeOwnedWithShared(st, nil) }

// grewAcrossReset is the error of a growth a reset overtook.
func (e *Expandable) grewAcrossReset(m miss, seg *segment) error {
	return fmt.Errorf("alloc: expandable alloc of %s on stream %d: the device was reset while the allocator mapped %s, which was given back; retry on a stream made since: %w",
		units.Format(m.r.n), m.s.Handle(), units.Format(seg.size), device.ErrInvalidated)
}

// allocFailed builds the error of a miss the ladder could not serve.
// Called without the lock.
func (e *Expandable) allocFailed(m miss, err error) error {
	if !errors.Is(err, device.ErrOutOfMemory) {
		return errors.Join(fmt.Errorf("alloc: expandable alloc of %s on stream %d: %w", units.Format(m.r.n), m.s.Handle(), err), m.relErr)
	}
	e.mu.Lock()
	e.st.OOMs++
	st := e.st
	largest := e.idx.largest()
	waiting := e.idx.waitingBytes(m.s.Handle())
	e.mu.Unlock()
	devFree := "unknown"
	if free, total, merr := e.dev.MemInfo(); merr == nil {
		devFree = units.Format(free) + " of " + units.Format(total)
	}
	return errors.Join(fmt.Errorf("alloc: expandable alloc of %s on stream %d failed after waiting for other streams' frees, unmapping every free page and retrying: "+
		"%s allocated and %s mapped (%s cached, largest free block %s, %s of it waiting on other streams' work), the device has %s free; "+
		"free live arrays, lower the batch size, or give this allocator more of the device: %w",
		units.Format(m.r.n), m.s.Handle(), units.Format(st.InUse), units.Format(st.Reserved), units.Format(st.Cached()),
		units.Format(largest), units.Format(waiting), devFree, err), m.relErr)
}

var (
	_ Allocator    = (*Expandable)(nil)
	_ PeakResetter = (*Expandable)(nil)
	_ Granular     = (*Expandable)(nil)
	_ strategy     = (*Expandable)(nil)

	_ Reporter      = (*Expandable)(nil)
	_ OOMObservable = (*Expandable)(nil)
	_ reportFiller  = (*Expandable)(nil)
)

// Cost is PageCost with the allocator's granularity and its page: a
// request's growth maps at most its bytes rounded up to pages (less when
// it joins free space at a range's end), and small requests share pages.
// PageCost credits the sharing to requests of at most half a page (its
// packing argument needs that), so the small size it is given is SmallSize
// or half a page, whichever is smaller. ok is always true.
func (e *Expandable) Cost(sizes []uint64) (uint64, bool) {
	return PageCost(sizes, PoolGranularity, e.page, min(e.cfg.SmallSize, e.page/2)), true
}

// Room is math.MaxUint64: an Expandable has no cap of its own.
func (e *Expandable) Room() uint64 { return ^uint64(0) }

var _ Coster = (*Expandable)(nil)
