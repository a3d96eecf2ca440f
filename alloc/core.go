package alloc

// The stream-ordered core of the caching allocators. Pool (device
// segments, split and merged), Expandable (device pages mapped into one
// growing address range per stream and size class, split and merged;
// expandable.go, expandable_grow.go) and PinnedPool (whole pinned host
// buffers) are strategies on one core, which owns what they share: the
// lock, the closed flag, the free index and its events (streamorder.go,
// fence.go), the live table, the books, the device's generation, and the
// skeletons of Alloc, Free, Trim, Close and the out-of-memory path. A
// strategy supplies only what differs (the strategy interface): how to
// carve a free block and merge a freed one, how much to grow and how to
// get and give back memory, and what a device reset leaves of its
// segments.
//
// Rules and invariants:
//
//   - mu protects every field from it on, in the core and in the
//     strategy; methods ending in Locked need it held. The device is
//     never called with mu held: a step that calls it releases mu, and
//     after taking mu again checks closed and the device's generation.
//   - Every live block is in live, keyed by the address it was handed out
//     at; every free block is in idx; every segment of the current
//     generation is on segs (a strategy may keep others aside, as Pool
//     does with segments a reset left live blocks in).
//   - A miss climbs one ladder, in order (missLocked): the cache after a
//     fence round over other streams' frees; the cache after the bytes
//     other streams' free blocks hold but do not wait for are shared again
//     (shedLocked); the cache after a round over
//     every stream, when the strategy would give back cached memory that
//     still waits on a stream; a growth; after the device's out of memory
//     a wait for every stream's frees, the strategy's merge, the cache,
//     giving back everything wholly free, and one more growth. Then it
//     fails with the strategy's account of why.
//   - A device reset is noticed under mu at every entry point
//     (syncGenLocked); the strategy drops what the reset took. Memory it
//     must still release (a pinned buffer's host memory) waits in dead
//     for the next call that may call the device.
//   - A growth that a reset overtakes cannot tell which side of it the new
//     segment came from: it is given back and the Alloc fails with an
//     error wrapping device.ErrInvalidated.

import (
	"errors"
	"fmt"
	"sync"

	"github.com/vramkit/vram/device"
	"github.com/vramkit/vram/internal/units"
)

// request is one Alloc, as the core and strategies see it.
type request struct {
	n     uint64 // bytes asked for
	size  uint64 // n rounded to PoolGranularity
	class uint8  // size class (0 for a strategy with one)
	exact bool   // a miss grows by the request only (ExactGrower)
	// stream is the handle of the stream asked on, for a strategy that
	// grows per stream (Expandable); others leave it 0.
	stream uintptr
}

// strategy is what a caching allocator supplies to the core. Methods
// ending in Locked are called with the core's lock held; the others
// without it.
type strategy interface {
	// takeLocked takes a cached free block for r that st may use out of
	// the free index and returns the block to hand out (split from it
	// where the strategy splits), or nil.
	takeLocked(r request, st *streamState) *block
	// freeLocked puts live block b, freed on st and already out of the
	// live table, into the free index (merging it with free neighbours
	// where the strategy merges).
	freeLocked(b *block, st *streamState)
	// fenceBeforeGrowthLocked reports whether a growth for r would give
	// back cached memory that still waits on a stream's event, so that a
	// fence round over every stream should come first.
	fenceBeforeGrowthLocked(r request) bool
	// growthLocked is how many bytes a miss for r asks the device for.
	growthLocked(r request) uint64
	// releaseForGrowthLocked takes off the books the cached memory to
	// give back before a growth of g bytes.
	releaseForGrowthLocked(g uint64) []*segment
	// grow gets a new segment of g bytes for r from the device (or less,
	// down to what r needs, when g fails) and returns it off the books,
	// with the bytes it asked for last.
	grow(r request, g uint64) (seg *segment, tried uint64, err error)
	// addSegmentLocked books new segment seg, whose one block is
	// seg.first, and returns the block to hand out for r.
	addSegmentLocked(seg *segment, r request) *block
	// beforeRetryLocked prepares the cache for a retry on st after the
	// out-of-memory wait (Pool merges st's blocks with shared ones).
	beforeRetryLocked(st *streamState)
	// trimLocked takes every wholly free segment off the books.
	trimLocked() []*segment
	// release returns one segment taken off the books to the device.
	release(seg *segment) error
	// dropGenerationLocked handles a device reset: every segment on segs
	// is from before it.
	dropGenerationLocked()
	// freeStaleLocked takes back live block b of a segment from before a
	// reset, already out of the live table and InUse, and returns what to
	// give back.
	freeStaleLocked(b *block) []*segment
	// closeLocked clears the strategy's own books at Close and returns
	// how many segments it held aside, to count as device frees.
	closeLocked() int
	// allocFailed is the error of a miss that could not be served.
	allocFailed(m miss, err error) error
	// grewAcrossReset is the error of a growth a reset overtook.
	grewAcrossReset(m miss, seg *segment) error
}

// core is the part of a caching allocator that every strategy shares.
type core struct {
	dev   device.Device
	gen   device.Generational // the device's reset count; nil when it has none
	strat strategy
	name  string // the registry's name (registry.go), or "pinned": in reports and error messages

	mu     sync.Mutex // protects the fields below and the strategy's
	closed bool
	idx    freeIndex
	live   map[device.Ptr]*block
	segs   *segment // every segment of the device's current generation
	nsegs  int
	st     Stats
	devGen uint64     // the device's generation that segs belong to
	dead   []*segment // off the books after a reset, still to give back

	// For the memory report (report.go): the out-of-memory observer
	// (safe without mu) and the most segments at once since the last
	// ResetPeaks (under mu).
	oomHook
	peakSegs int
}

// initCore sets c up on dev for strategy s; hostVisible and join are the
// free index's (see newFreeIndex).
func (c *core) initCore(dev device.Device, s strategy, name string, hostVisible bool, join func(*block)) {
	c.dev, c.strat, c.name = dev, s, name
	c.idx = newFreeIndex(dev, hostVisible, join)
	c.live = make(map[device.Ptr]*block)
	if g, ok := dev.(device.Generational); ok {
		c.gen, c.devGen = g, g.Generation()
	}
}

// miss is what a miss carries down the ladder.
type miss struct {
	r       request
	s       device.Stream
	g       uint64 // bytes the last growth asked for
	gen     uint64 // the device's generation the growth started from
	relErr  error  // giving memory back failed (reported if the miss fails)
	waitErr error  // waiting for other streams' frees failed
}

// alloc serves r on s: a cached block, else the miss ladder. The block it
// returns is live and the caller's.
func (c *core) alloc(r request, s device.Stream) (*block, error) {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil, c.closedAllocErr(r)
	}
	if c.genMovedLocked() {
		c.newGenerationLocked()
	}
	var relErr error
	if c.dead != nil {
		// Memory a reset took is released before anything else.
		if relErr = c.releaseDeadLocked(); c.closed {
			c.mu.Unlock()
			return nil, c.closedAllocErr(r, relErr)
		}
	}
	st := c.idx.streamLocked(s)
	if b := c.strat.takeLocked(r, st); b != nil {
		c.liveLocked(b, true)
		c.mu.Unlock()
		return b, nil
	}
	return c.missLocked(r, s, st, relErr)
}

// missLocked is the ladder of a miss (see the file overview) for r on s,
// whose state is st; relErr is what releasing memory a reset took
// raised. Entered with mu held; returns with it released.
func (c *core) missLocked(r request, s device.Stream, st *streamState, relErr error) (*block, error) {
	m := &miss{r: r, s: s, relErr: relErr}
	if c.idx.needFences(st) {
		// Memory freed on other streams may have become safe here.
		if b, done, err := c.fenceTakeLocked(m, st, false); done {
			return b, err
		}
	}
	if c.syncGenLocked(); c.idx.shedLocked(st) {
		// Shared memory that another stream's free merged with its
		// pending block (streamorder.go).
		if b := c.strat.takeLocked(m.r, st); b != nil {
			c.liveLocked(b, true)
			c.mu.Unlock()
			return b, nil
		}
	}
	if c.strat.fenceBeforeGrowthLocked(m.r) && !c.idx.fencing {
		if b, done, err := c.fenceTakeLocked(m, st, true); done {
			return b, err
		}
	}
	seg, err := c.growLocked(m)
	if errors.Is(err, device.ErrOutOfMemory) {
		var b *block
		var done bool
		if b, done, err = c.waitTake(m); done {
			return b, err
		}
		seg, m.g, err = c.strat.grow(m.r, m.g)
	}
	if err != nil {
		if errors.Is(err, device.ErrOutOfMemory) {
			return nil, c.outOfMemory(m.r.n, m.s, c.strat.allocFailed(*m, err))
		}
		return nil, c.strat.allocFailed(*m, err)
	}
	return c.addSegment(m, seg)
}

// fenceTakeLocked runs a fence round (over every stream owning free
// blocks but st, or every one when all is set) and tries the cache again.
// done says the call is over: a block handed out, or the pool closed
// meanwhile; then mu is released.
func (c *core) fenceTakeLocked(m *miss, st *streamState, all bool) (b *block, done bool, err error) {
	if open, ferr := c.fenceLocked(st, all); !open {
		return nil, true, c.closedAllocErr(m.r, ferr)
	}
	if b = c.strat.takeLocked(m.r, st); b != nil {
		c.liveLocked(b, true)
		c.mu.Unlock()
		return b, true, nil
	}
	return nil, false, nil
}

// growLocked gives back what the strategy releases before growing, and
// asks the device for a new segment. Entered with mu held; returns with
// it released.
func (c *core) growLocked(m *miss) (*segment, error) {
	c.syncGenLocked() // a fence round may have released the lock
	m.g = c.strat.growthLocked(m.r)
	rel := c.strat.releaseForGrowthLocked(m.g)
	m.gen = c.devGen // a Reset from here on leaves the new segment's side of it unknown
	c.mu.Unlock()
	// A segment the device fails to free is gone from the books either
	// way; that only happens to a lost device, which fails every later
	// call too. The error is reported if the allocation fails.
	m.relErr = joinErr(m.relErr, c.giveBack(rel))
	seg, g, err := c.strat.grow(m.r, m.g)
	m.g = g
	return seg, err
}

// waitTake is the out-of-memory step, entered and left without mu: wait
// (lock released) for the work of every stream that owns free blocks,
// let the strategy merge, try the cache, then give back everything wholly
// free. done says the call is over (a block handed out or the pool
// closed); else the caller grows once more.
func (c *core) waitTake(m *miss) (b *block, done bool, err error) {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil, true, c.closedAllocErr(m.r, m.relErr)
	}
	c.st.Retries++
	c.syncGenLocked()
	open, werr := c.waitLocked(c.idx.streamLocked(m.s))
	if !open {
		return nil, true, c.closedAllocErr(m.r, m.relErr, werr)
	}
	m.waitErr = werr
	c.syncGenLocked()
	m.gen = c.devGen // the retry grows from here
	st := c.idx.streamLocked(m.s)
	c.strat.beforeRetryLocked(st)
	if b = c.strat.takeLocked(m.r, st); b != nil {
		c.liveLocked(b, true)
		c.mu.Unlock()
		return b, true, nil
	}
	rel := append(c.strat.trimLocked(), c.takeDeadLocked()...)
	c.mu.Unlock()
	m.relErr = joinErr(m.relErr, c.giveBack(rel))
	return nil, false, nil
}

// addSegment books a segment just grown and hands out its block for m;
// called without mu. A pool closed, or a device reset, meanwhile gives
// the segment back.
func (c *core) addSegment(m *miss, seg *segment) (*block, error) {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil, c.closedAllocErr(m.r, c.giveBack([]*segment{seg}))
	}
	if c.syncGenLocked(); c.devGen != m.gen {
		rel := append(c.takeDeadLocked(), seg)
		c.mu.Unlock()
		return nil, joinErr(c.strat.grewAcrossReset(*m, seg), c.giveBack(rel))
	}
	b := c.idx.newBlock()
	b.addr, b.size, b.seg, b.class = seg.base, seg.size, seg, seg.class
	seg.first = b
	c.linkLocked(seg)
	b = c.strat.addSegmentLocked(seg, m.r)
	c.liveLocked(b, false)
	c.mu.Unlock()
	return b, nil
}

// liveLocked enters b, just taken, in the live table; hit says it was
// cached.
func (c *core) liveLocked(b *block, hit bool) {
	c.live[b.addr] = b
	c.st.allocLocked(b.size, hit)
}

// freeResult is how a free ended, for the strategy's message.
type freeResult uint8

const (
	freed        freeResult = iota // back in the pool
	freeClosed                     // the pool is closed
	freeUnknown                    // no such live block
	freeStale                      // from before a device reset; taken back
	freeEventErr                   // freed, but the pool closed meanwhile and closing its event failed
)

// free returns the live block at key, whose segment's host buffer has
// device pointer devPtr (0 for device memory), freed on s. The error
// comes with freeStale (giving memory back failed) and freeEventErr.
func (c *core) free(key, devPtr device.Ptr, s device.Stream) (freeResult, error) {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return freeClosed, nil
	}
	if c.genMovedLocked() { // syncGenLocked, inlined
		c.newGenerationLocked()
	}
	b := c.live[key]
	if b == nil || b.seg.host.DevicePtr != devPtr {
		c.mu.Unlock()
		return freeUnknown, nil
	}
	delete(c.live, key)
	c.st.freeLocked(b.size)
	if b.seg.stale {
		rel := append(c.takeDeadLocked(), c.strat.freeStaleLocked(b)...)
		c.mu.Unlock()
		return freeStale, c.giveBack(rel)
	}
	st := c.idx.streamLocked(s)
	c.strat.freeLocked(b, st)
	if c.idx.recordWanted(st) {
		// An event at the free lets other streams reuse the block once
		// s's work up to here is done, not later (streamorder.go).
		if err := c.recordAtFreeLocked(st); err != nil {
			return freeEventErr, err
		}
		return freed, nil
	}
	c.mu.Unlock()
	return freed, nil
}

// Trim gives every wholly free segment back to the device (for a
// PinnedPool, every cached buffer). For a Pool, blocks still waiting for
// another stream's event are freed too: the device's Free waits for work
// that may use the memory. Memory a device reset took counts as given
// back, without an error.
func (c *core) Trim() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return fmt.Errorf("alloc: %s trim: %w", c.name, ErrClosed)
	}
	c.syncGenLocked()
	rel := append(c.strat.trimLocked(), c.takeDeadLocked()...)
	c.mu.Unlock()
	return c.giveBack(rel)
}

// Close gives all memory back to the device, live blocks included, and
// releases the pool's events. Memory and events a device reset took
// count as given back, without an error. Later calls return ErrClosed; a
// second Close returns nil.
func (c *core) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	c.syncGenLocked()
	var segs []*segment
	for seg := c.segs; seg != nil; seg = seg.snext {
		segs = append(segs, seg)
	}
	c.st.DeviceFrees += uint64(len(segs) + c.strat.closeLocked())
	segs = append(segs, c.takeDeadLocked()...) // already off the books
	c.segs, c.nsegs, c.live = nil, 0, nil
	c.st.InUse, c.st.Reserved = 0, 0
	var evs []device.Event
	if !c.idx.fencing {
		evs = c.idx.eventsLocked()
	}
	c.mu.Unlock()
	return errors.Join(c.giveBack(segs), closeEvents(evs))
}

// Stats reports the pool's counters, exactly: the snapshot is taken under
// the lock. A PinnedPool counts buffers as a Pool counts blocks.
func (c *core) Stats() Stats {
	c.mu.Lock()
	if !c.closed {
		c.syncGenLocked()
	}
	s := c.st
	c.mu.Unlock()
	return s
}

// ResetPeaks sets PeakInUse and PeakReserved to the current values.
func (c *core) ResetPeaks() {
	c.mu.Lock()
	c.st.resetPeaksLocked()
	c.peakSegs = c.nsegs
	c.mu.Unlock()
}

// syncGenLocked notices a device reset: when the device's generation has
// moved on, every segment on segs is from before it, and the strategy
// drops what the reset took.
func (c *core) syncGenLocked() {
	if c.genMovedLocked() {
		c.newGenerationLocked()
	}
}

// genMovedLocked reports whether the device has been reset since the
// core last looked. Small enough to inline: the hit path pays one
// interface call and a compare, not a function call more.
func (c *core) genMovedLocked() bool {
	return c.gen != nil && c.gen.Generation() != c.devGen
}

// newGenerationLocked moves to the device's new generation.
func (c *core) newGenerationLocked() {
	c.devGen = c.gen.Generation()
	c.strat.dropGenerationLocked()
}

// takeDeadLocked takes the segments a reset left to give back.
func (c *core) takeDeadLocked() []*segment {
	dead := c.dead
	c.dead = nil
	return dead
}

// releaseDeadLocked gives back the segments a reset left, with mu released
// meanwhile, and returns the error doing so.
func (c *core) releaseDeadLocked() error {
	dead := c.takeDeadLocked()
	c.mu.Unlock()
	err := c.giveBack(dead)
	c.mu.Lock()
	return err
}

// linkLocked puts new segment seg on the books.
func (c *core) linkLocked(seg *segment) {
	c.pushSegLocked(seg)
	c.peakSegs = max(c.peakSegs, c.nsegs)
	c.st.deviceAllocLocked(seg.size)
}

// pushSegLocked puts seg at the head of segs, counted in nsegs.
func (c *core) pushSegLocked(seg *segment) {
	seg.snext = c.segs
	if c.segs != nil {
		c.segs.sprev = seg
	}
	c.segs = seg
	c.nsegs++
}

// unlinkLocked takes segment seg, whose blocks are out of the free index,
// off the books, counted as a device free.
func (c *core) unlinkLocked(seg *segment) {
	unlinkSegment(&c.segs, seg)
	seg.first = nil
	c.nsegs--
	c.st.deviceFreeLocked(seg.size)
}

// unlinkSegment takes seg out of the list of segments that starts at
// *head (linked through sprev and snext).
func unlinkSegment(head **segment, seg *segment) {
	if seg.sprev != nil {
		seg.sprev.snext = seg.snext
	} else {
		*head = seg.snext
	}
	if seg.snext != nil {
		seg.snext.sprev = seg.sprev
	}
	seg.sprev, seg.snext = nil, nil
}

// closedAllocErr is the error of an Alloc the pool's closing ended,
// joined with errs that are not nil.
func (c *core) closedAllocErr(r request, errs ...error) error {
	err := fmt.Errorf("alloc: %s alloc of %s: %w", c.name, units.Format(r.n), ErrClosed)
	for _, e := range errs {
		if e != nil {
			return errors.Join(append([]error{err}, errs...)...)
		}
	}
	return err
}

// freeErr is the error of a Free of ptr that the core ended with res (not
// freed) and err.
func (c *core) freeErr(ptr device.Ptr, res freeResult, err error) error {
	switch res {
	case freeClosed:
		return fmt.Errorf("alloc: %s free of %v: %w", c.name, ptr, ErrClosed)
	case freeUnknown:
		return fmt.Errorf("alloc: %s free of %v: %w", c.name, ptr, ErrUnknownPointer)
	case freeStale:
		return joinErr(fmt.Errorf("alloc: %s free of %v: the block was allocated before a device reset, which freed it: %w",
			c.name, ptr, device.ErrInvalidated), err)
	}
	return fmt.Errorf("alloc: %s free of %v: the block is back, but the %s was closed meanwhile and closing its event failed: %w", c.name, ptr, c.name, err)
}

// joinErr is errors.Join of two errors, returning either alone when the
// other is nil.
func joinErr(a, b error) error {
	switch {
	case a == nil:
		return b
	case b == nil:
		return a
	}
	return errors.Join(a, b)
}

// giveBack returns segments taken off the books to the device, without
// the lock; one a device reset took counts as given back.
func (c *core) giveBack(segs []*segment) error {
	var errs []error
	for _, seg := range segs {
		if err := c.strat.release(seg); err != nil && !lostToReset(err) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
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
