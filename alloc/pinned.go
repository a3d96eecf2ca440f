package alloc

// PinnedPool caches page-locked host buffers (cuMemHostAlloc), which are
// slow to make and to free (each pins pages and maps them for the device),
// as CuPy's PinnedMemoryPool and PyTorch's CachingHostAllocator do.
//
// Buffers are never split or merged: each is one HostAlloc of the request
// rounded up to 512 bytes, and a request reuses the smallest cached buffer
// at least as large, if that is at most a quarter larger; else it makes a
// new one. Freed buffers are kept in the same freeIndex as Pool's blocks
// (streamorder.go), in host-visible mode: the next user of a buffer writes
// or reads it from the host, which no stream orders, so a buffer freed on
// stream S — say after an asynchronous copy from it on S — is handed out
// again, on any stream, only once an event recorded on S after the free
// has completed. The event is recorded at the free (when the stream has
// none in flight; see streamorder.go). The pool does not block on that
// event: until it completes, the buffer is not offered and a request
// makes a new buffer.
//
// The pool never calls the device while holding its lock. On the device's
// out-of-memory it waits, without holding its lock, for the events of the
// streams that freed cached buffers and tries the cache again, then frees
// every cached buffer and retries once. As for Pool, such an event may
// have been recorded lazily (at an earlier miss or at the wait itself),
// so the wait may also cover work queued on a stream after its frees;
// work there that itself waits for the allocating goroutine deadlocks
// with it, as with any blocking allocation (streamorder.go, "When events
// are recorded").
//
// A device Reset unpins every buffer (see the reset contract at
// Allocator). As Pool does, the pool reads the device's generation
// (device.Generational) at each call; when it has moved on, its cached
// buffers leave the books (counted as device frees) and are handed to
// HostFree, which releases their host memory and whose
// device.ErrInvalidated is expected, at the first call that may call the
// device; a buffer handed out before the reset is marked stale and
// released the same way when it is freed, which returns an error wrapping
// device.ErrInvalidated.

import (
	"errors"
	"fmt"
	"sync"
	"unsafe"

	"github.com/vramkit/vram/device"
	"github.com/vramkit/vram/internal/units"
)

// PinnedConfig tunes a PinnedPool. The zero value is the default. A plain
// value, safe to share.
type PinnedConfig struct {
	// Mapped makes every buffer also mapped into the device's address
	// space (HostBuffer.DevicePtr), so kernels can read it over the bus.
	Mapped bool
}

// PinnedPool is a pool of pinned host buffers with stream-safe reuse. Its
// Stats count buffers as Pool counts blocks: InUse is the bytes of buffers
// handed out (after rounding), Reserved the bytes of buffers held, device
// allocations and frees are HostAlloc and HostFree calls.
//
// After a device reset (see Allocator) the pool notices, at its next
// call, that the device's generation has moved on (device.Generational):
// its cached buffers leave Reserved and are never handed out again; a
// buffer handed out before the reset stays in InUse and Reserved until it
// is freed, which returns an error wrapping device.ErrInvalidated. Trim and
// Close return nil for buffers the reset unpinned. On a device without a
// generation the pool cannot notice: make a new one after a reset.
//
// A PinnedPool is safe for concurrent use.
type PinnedPool struct {
	dev    device.Device
	host   device.HostAllocator
	mapped bool
	gen    device.Generational // the device's reset count; nil when it has none

	mu     sync.Mutex // protects the fields below
	closed bool
	idx    freeIndex
	live   map[device.Ptr]*block // keyed by the host address of the buffer's first byte
	segs   *segment              // every buffer held
	nsegs  int
	st     Stats
	devGen uint64     // the device's generation of the buffers in segs, but those marked stale
	dead   []*segment // cached buffers a device reset unpinned, off the books, for HostFree
}

// NewPinnedPool returns a PinnedPool on dev with the default configuration.
// It fails with an error wrapping device.ErrNotSupported if dev cannot
// allocate pinned host memory.
func NewPinnedPool(dev device.Device) (*PinnedPool, error) {
	return NewPinnedPoolConfig(dev, PinnedConfig{})
}

// NewPinnedPoolConfig returns a PinnedPool on dev configured by cfg.
func NewPinnedPoolConfig(dev device.Device, cfg PinnedConfig) (*PinnedPool, error) {
	if dev == nil {
		return nil, fmt.Errorf("alloc: new pinned pool: nil device: %w", device.ErrInvalidValue)
	}
	h, ok := dev.(device.HostAllocator)
	if !ok {
		return nil, fmt.Errorf("alloc: new pinned pool: %s device %q cannot allocate pinned host memory: %w",
			dev.Info().Backend, dev.Info().Name, device.ErrNotSupported)
	}
	p := &PinnedPool{
		dev:    dev,
		host:   h,
		mapped: cfg.Mapped,
		idx:    newFreeIndex(dev, true, nil),
		live:   make(map[device.Ptr]*block),
	}
	if g, ok := dev.(device.Generational); ok {
		p.gen, p.devGen = g, g.Generation()
	}
	return p, nil
}

// syncGenLocked notices a device reset: when the device's generation has
// moved on, every buffer held is from before the reset. Cached ones leave
// the books (and the free index) for p.dead; those handed out are marked
// stale, for Free.
func (p *PinnedPool) syncGenLocked() {
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
		if b := seg.first; b.free {
			p.idx.remove(b)
			p.idx.putBlock(b)
			p.unlinkLocked(seg)
			p.dead = append(p.dead, seg)
		} else {
			seg.stale = true
		}
		seg = next
	}
}

// takeDeadLocked takes the buffers a device reset left for HostFree.
func (p *PinnedPool) takeDeadLocked() []*segment {
	dead := p.dead
	p.dead = nil
	return dead
}

// Granularity is the unit buffer sizes are rounded to: 512 bytes.
func (p *PinnedPool) Granularity() uint64 { return PoolGranularity }

// hostKey is the key of a buffer: the address of its first byte.
func hostKey(data []byte) device.Ptr {
	return device.Ptr(uintptr(unsafe.Pointer(unsafe.SliceData(data))))
}

// reusable reports whether a cached buffer of have bytes may serve a
// request of want bytes (both rounded).
func reusable(have, want uint64) bool { return have-want <= want/4 }

// Alloc returns a pinned buffer of n bytes (Data has length and capacity
// n) for use with work on s.
func (p *PinnedPool) Alloc(n uint64, s device.Stream) (device.HostBuffer, error) {
	if n == 0 || s == nil || n > 1<<62 {
		return device.HostBuffer{}, fmt.Errorf("alloc: pinned alloc of %d bytes on stream %v: want 0 < n ≤ 2^62 and a stream: %w",
			n, s, device.ErrInvalidValue)
	}
	size := (n + PoolGranularity - 1) &^ (PoolGranularity - 1)
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return device.HostBuffer{}, fmt.Errorf("alloc: pinned alloc of %s: %w", units.Format(n), ErrClosed)
	}
	p.syncGenLocked()
	// Buffers a device reset unpinned are released before anything else;
	// an error doing so is reported only if the allocation fails.
	var relErr error
	if dead := p.takeDeadLocked(); dead != nil {
		p.mu.Unlock()
		relErr = p.freeBuffers(dead)
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			return device.HostBuffer{}, errors.Join(fmt.Errorf("alloc: pinned alloc of %s: %w", units.Format(n), ErrClosed), relErr)
		}
	}
	st := p.idx.streamLocked(s)
	if b := p.idx.bestFit(size, 0, st); b != nil && reusable(b.size, size) {
		return p.hitLocked(b, n), nil
	}
	// Buffers freed on any stream become reusable once that stream's
	// work up to the free is done.
	if p.idx.needFences(st) {
		if open, err := p.idx.fenceLocked(&p.mu, &p.closed, st, true, nil); !open {
			return device.HostBuffer{}, errors.Join(fmt.Errorf("alloc: pinned alloc of %s: %w", units.Format(n), ErrClosed), err)
		}
		if b := p.idx.bestFit(size, 0, st); b != nil && reusable(b.size, size) {
			return p.hitLocked(b, n), nil
		}
	}
	p.syncGenLocked() // a fence round above may have released the lock
	gen := p.devGen   // a Reset from here on leaves the new buffer's side of it unknown
	p.mu.Unlock()

	buf, err := p.host.HostAlloc(size, p.mapped)
	if err != nil && errors.Is(err, device.ErrOutOfMemory) {
		// Wait for the streams that freed cached buffers and try the
		// cache again; then give back every cached buffer and retry once.
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			return device.HostBuffer{}, fmt.Errorf("alloc: pinned alloc of %s: %w", units.Format(n), ErrClosed)
		}
		p.st.Retries++
		p.syncGenLocked()
		st = p.idx.streamLocked(s)
		open, werr := p.idx.waitLocked(&p.mu, &p.closed, st, nil)
		if !open {
			return device.HostBuffer{}, errors.Join(fmt.Errorf("alloc: pinned alloc of %s: %w", units.Format(n), ErrClosed), werr)
		}
		p.syncGenLocked()
		gen = p.devGen // the retry below allocates from here
		if b := p.idx.bestFit(size, 0, p.idx.streamLocked(s)); b != nil && reusable(b.size, size) {
			return p.hitLocked(b, n), nil
		}
		rel := append(p.trimLocked(), p.takeDeadLocked()...)
		p.mu.Unlock()
		relErr = errors.Join(relErr, werr, p.freeBuffers(rel))
		buf, err = p.host.HostAlloc(size, p.mapped)
	}
	if err != nil {
		if !errors.Is(err, device.ErrOutOfMemory) {
			return device.HostBuffer{}, errors.Join(fmt.Errorf("alloc: pinned alloc of %s on stream %d: %w", units.Format(n), s.Handle(), err), relErr)
		}
		p.mu.Lock()
		p.st.OOMs++
		st := p.st
		p.mu.Unlock()
		return device.HostBuffer{}, errors.Join(fmt.Errorf("alloc: pinned alloc of %s on stream %d failed after giving back the cache: "+
			"the pool holds %s in buffers, %s of them handed out; free buffers or stage through smaller ones: %w",
			units.Format(n), s.Handle(), units.Format(st.Reserved), units.Format(st.InUse), err), relErr)
	}
	if uint64(len(buf.Data)) < size {
		return device.HostBuffer{}, errors.Join(fmt.Errorf("alloc: pinned alloc of %s: the device returned %d bytes: %w",
			units.Format(n), len(buf.Data), device.ErrInvalidValue), p.host.HostFree(buf))
	}

	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return device.HostBuffer{}, errors.Join(fmt.Errorf("alloc: pinned alloc of %s: %w", units.Format(n), ErrClosed), p.host.HostFree(buf))
	}
	if p.syncGenLocked(); p.devGen != gen {
		dead := p.takeDeadLocked()
		p.mu.Unlock()
		ferr := p.freeBuffers(append(dead, &segment{size: size, host: buf}))
		return device.HostBuffer{}, errors.Join(fmt.Errorf("alloc: pinned alloc of %s on stream %d: the device was reset during the allocation, so the new buffer may be from before the reset and was given back; retry on a stream made since: %w",
			units.Format(n), s.Handle(), device.ErrInvalidated), ferr)
	}
	seg := &segment{base: hostKey(buf.Data), size: size, host: buf}
	b := p.idx.newBlock()
	b.addr, b.size, b.seg = seg.base, size, seg
	seg.first = b
	seg.snext = p.segs
	if p.segs != nil {
		p.segs.sprev = seg
	}
	p.segs = seg
	p.nsegs++
	p.st.deviceAllocLocked(size)
	p.liveLocked(b, false)
	p.mu.Unlock()
	return device.HostBuffer{Data: buf.Data[:n:n], DevicePtr: buf.DevicePtr}, nil
}

// hitLocked hands out cached buffer b for n bytes and releases the lock.
func (p *PinnedPool) hitLocked(b *block, n uint64) device.HostBuffer {
	p.idx.remove(b)
	p.liveLocked(b, true)
	h := b.seg.host
	p.mu.Unlock()
	return device.HostBuffer{Data: h.Data[:n:n], DevicePtr: h.DevicePtr}
}

// liveLocked hands out buffer b; hit says it was cached.
func (p *PinnedPool) liveLocked(b *block, hit bool) {
	p.live[b.addr] = b
	p.st.allocLocked(b.size, hit)
}

// Free returns buffer b, last used by work on s (or by the host). It is
// handed out again once s's work up to now has finished. For a buffer from
// before a device reset it returns an error wrapping
// device.ErrInvalidated, having taken b back and released it.
func (p *PinnedPool) Free(b device.HostBuffer, s device.Stream) error {
	if s == nil {
		return fmt.Errorf("alloc: pinned free: nil stream: %w", device.ErrInvalidValue)
	}
	if len(b.Data) == 0 {
		return fmt.Errorf("alloc: pinned free of an empty buffer: %w", ErrUnknownPointer)
	}
	key := hostKey(b.Data)
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return fmt.Errorf("alloc: pinned free: %w", ErrClosed)
	}
	p.syncGenLocked()
	blk := p.live[key]
	if blk == nil || blk.seg.host.DevicePtr != b.DevicePtr {
		p.mu.Unlock()
		return fmt.Errorf("alloc: pinned free of a %s buffer at %#x: %w", units.Format(uint64(len(b.Data))), uint64(key), ErrUnknownPointer)
	}
	delete(p.live, key)
	p.st.freeLocked(blk.size)
	if seg := blk.seg; seg.stale {
		p.unlinkLocked(seg)
		p.idx.putBlock(blk)
		rel := append(p.takeDeadLocked(), seg)
		p.mu.Unlock()
		return errors.Join(fmt.Errorf("alloc: pinned free of a %s buffer at %#x: the buffer was allocated before a device reset, which unpinned it: %w",
			units.Format(uint64(len(b.Data))), uint64(key), device.ErrInvalidated), p.freeBuffers(rel))
	}
	st := p.idx.streamLocked(s)
	p.idx.insertOwned(blk, st)
	if p.idx.recordWanted(st) {
		// An event at the free covers s's work up to here and no later
		// work, so the buffer comes back as soon as it may.
		if err := p.idx.recordAtFreeLocked(&p.mu, &p.closed, st, nil); err != nil {
			return fmt.Errorf("alloc: pinned free: the buffer is back in the pool, but the pool was closed meanwhile and closing its event failed: %w", err)
		}
		return nil
	}
	p.mu.Unlock()
	return nil
}

// trimLocked takes every cached buffer out of the books and returns them.
func (p *PinnedPool) trimLocked() []*segment {
	var out []*segment
	for seg := p.segs; seg != nil; {
		next := seg.snext
		if b := seg.first; b.free {
			p.idx.remove(b)
			p.idx.putBlock(b)
			p.unlinkLocked(seg)
			out = append(out, seg)
		}
		seg = next
	}
	return out
}

func (p *PinnedPool) unlinkLocked(seg *segment) {
	if seg.sprev != nil {
		seg.sprev.snext = seg.snext
	} else {
		p.segs = seg.snext
	}
	if seg.snext != nil {
		seg.snext.sprev = seg.sprev
	}
	seg.sprev, seg.snext, seg.first = nil, nil, nil
	p.nsegs--
	p.st.deviceFreeLocked(seg.size)
}

// freeBuffers gives buffers back to the device. Called without the lock.
// A buffer a device reset unpinned counts as given back: HostFree releases
// its host memory and says so with device.ErrInvalidated.
func (p *PinnedPool) freeBuffers(segs []*segment) error {
	var errs []error
	for _, seg := range segs {
		if err := p.host.HostFree(seg.host); err != nil && !lostToReset(err) {
			errs = append(errs, fmt.Errorf("alloc: pinned pool: free %s buffer: %w", units.Format(seg.size), err))
		}
	}
	return errors.Join(errs...)
}

// Stats reports the pool's counters, exactly.
func (p *PinnedPool) Stats() Stats {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.closed {
		p.syncGenLocked()
	}
	return p.st
}

// ResetPeaks sets PeakInUse and PeakReserved to the current values.
func (p *PinnedPool) ResetPeaks() {
	p.mu.Lock()
	p.st.resetPeaksLocked()
	p.mu.Unlock()
}

// Trim frees every cached buffer. The device's HostFree waits for work
// that may still use one. Buffers a device reset unpinned count as freed,
// without an error.
func (p *PinnedPool) Trim() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return fmt.Errorf("alloc: pinned trim: %w", ErrClosed)
	}
	p.syncGenLocked()
	rel := append(p.trimLocked(), p.takeDeadLocked()...)
	p.mu.Unlock()
	return p.freeBuffers(rel)
}

// Close frees every buffer, handed out or cached, and the pool's events.
// Buffers and events a device reset took count as freed, without an
// error. Later calls return ErrClosed; a second Close returns nil.
func (p *PinnedPool) Close() error {
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
	p.st.DeviceFrees += uint64(len(segs))
	segs = append(segs, p.takeDeadLocked()...) // already off the books
	p.segs, p.nsegs, p.live = nil, 0, nil
	p.st.InUse, p.st.Reserved = 0, 0
	var evs []device.Event
	if !p.idx.fencing {
		evs = p.idx.eventsLocked()
	}
	p.mu.Unlock()
	return errors.Join(p.freeBuffers(segs), closeEvents(evs))
}

var (
	_ PeakResetter = (*PinnedPool)(nil)
	_ Granular     = (*PinnedPool)(nil)
)
