package vram

// The staging pool (cubie's ChunkBufferPool): chunk-sized pinned host
// buffers that the chunk pipeline stages pageable and file-backed arrays
// (and fill and drain functions) through, kept and reused across chunks
// and batches. It grows only while the host ladder's limits and the RAM
// the host has available allow, and a request it cannot serve now waits,
// as long as its context allows, for buffers in use to come back.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/vramkit/vram/device"
	"github.com/vramkit/vram/internal/meminfo"
	"github.com/vramkit/vram/internal/units"
)

// StagingPool hands out pinned staging buffers. Get it from
// Manager.Host().Staging(). Safe for concurrent use.
type StagingPool struct {
	h *hostPool

	mu      sync.Mutex
	idle    []*StagingBuffer // free, kept for reuse
	bytes   uint64           // every buffer's bytes, idle or in use
	inUse   int
	changed chan struct{} // closed and replaced when a buffer comes back
	closed  bool
	st      StagingStats
}

// StagingStats counts what a staging pool did. A plain value.
type StagingStats struct {
	Buffers, InUse int    // buffers held now, and of them in use
	Bytes          uint64 // bytes held now (pinned)
	Grows, Reuses  uint64 // buffers made; buffers handed out again
	Made           uint64 // bytes of the buffers made (pinned), in all
	// MakeTime is the time making them took (pinning: on a GPU about a
	// millisecond a MiB); Idle the bytes of the idle buffers now.
	MakeTime time.Duration
	Idle     uint64
	Waits    uint64 // acquisitions that had to wait
	Trims    uint64 // idle buffers given back to make room
}

// StagingBuffer is one pinned buffer of a staging pool. Not safe for
// concurrent use; Release it once the device work that uses it has
// finished.
type StagingBuffer struct {
	p      *StagingPool
	data   []byte
	hb     device.HostBuffer // zero when the memory is Go memory
	pinned bool
}

// Bytes is the buffer's memory (nil once released).
func (b *StagingBuffer) Bytes() []byte { return b.data }

// Pinned reports whether the buffer is page-locked (it is not on a device
// that cannot pin host memory).
func (b *StagingBuffer) Pinned() bool { return b.pinned }

// Release gives the buffer back to its pool for reuse. A second Release
// does nothing.
func (b *StagingBuffer) Release() {
	if b.p == nil {
		return
	}
	p := b.p
	b.p = nil
	p.mu.Lock()
	p.inUse--
	p.st.InUse = p.inUse
	if p.closed {
		p.bytes -= uint64(len(b.data))
		p.mu.Unlock()
		_ = p.free(b)
		return
	}
	p.idle = append(p.idle, b)
	p.signalLocked()
	p.mu.Unlock()
}

func newStagingPool(h *hostPool) *StagingPool {
	return &StagingPool{h: h, changed: make(chan struct{})}
}

// Stats returns the pool's counters.
func (p *StagingPool) Stats() StagingStats {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := p.st
	s.Buffers, s.InUse, s.Bytes = len(p.idle)+p.inUse, p.inUse, p.bytes
	for _, b := range p.idle {
		s.Idle += uint64(len(b.data))
	}
	return s
}

func (p *StagingPool) held() uint64 {
	if p == nil {
		return 0
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.bytes
}

func (p *StagingPool) signalLocked() {
	close(p.changed)
	p.changed = make(chan struct{})
}

// Acquire returns a buffer of at least n bytes, reusing an idle one or
// making one while the limits allow, and otherwise waiting for one to
// come back until ctx is done. It fails at once, wrapping ErrOutOfMemory,
// when no buffer is in use to come back and the limits leave no room.
func (p *StagingPool) Acquire(ctx context.Context, n uint64) (*StagingBuffer, error) {
	bs, err := p.AcquireSet(ctx, []uint64{n})
	if err != nil {
		return nil, err
	}
	return bs[0], nil
}

// AcquireSet returns one buffer for each size, all or none, as Acquire
// does: a caller that needs several buffers at once takes them together,
// so that two such callers never each hold part of what they need.
func (p *StagingPool) AcquireSet(ctx context.Context, sizes []uint64) ([]*StagingBuffer, error) {
	waited := false
	for {
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			return nil, fmt.Errorf("staging pool: %w", ErrClosed)
		}
		bs, err := p.tryLocked(sizes)
		if bs != nil || err != nil {
			p.mu.Unlock()
			return bs, err
		}
		if p.inUse == 0 {
			p.mu.Unlock()
			return nil, p.noRoom(sizes)
		}
		if !waited {
			p.st.Waits++
			waited = true
		}
		ch := p.changed
		p.mu.Unlock()
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("staging pool: waiting for %d buffers: %w", len(sizes), ctx.Err())
		case <-ch:
		}
	}
}

// TryAcquire returns a buffer of at least n bytes if one is idle or can be
// made now, else nil.
func (p *StagingPool) TryAcquire(n uint64) (*StagingBuffer, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, fmt.Errorf("staging pool: %w", ErrClosed)
	}
	bs, err := p.tryLocked([]uint64{n})
	if len(bs) == 0 {
		return nil, err
	}
	return bs[0], err
}

// TryAcquireSet returns one buffer for each size if they can all be had
// now (idle or made), else nil: AcquireSet without the wait.
func (p *StagingPool) TryAcquireSet(sizes []uint64) ([]*StagingBuffer, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, fmt.Errorf("staging pool: %w", ErrClosed)
	}
	return p.tryLocked(sizes)
}

// tryLocked takes idle buffers and makes the rest, all or none; nil
// with no error when the limits leave no room now. An idle buffer
// serves the smallest size it holds; when what is to be made then does
// not fit, the buffers that serve the most bytes beyond their sizes are
// given up one by one for new ones of the sizes, until it fits: a
// re-cut to shorter chunks and more of them reuses its old buffers
// where they leave room, and replaces them where they do not.
func (p *StagingPool) tryLocked(sizes []uint64) ([]*StagingBuffer, error) {
	taken := make([]*StagingBuffer, len(sizes))
	from := make([]int, len(sizes)) // the idle index each taken buffer came from
	idle := slices.Clone(p.idle)
	var grow uint64
	for i, n := range sizes {
		best := -1
		for j, b := range idle {
			if b != nil && uint64(len(b.data)) >= n && (best < 0 || len(b.data) < len(idle[best].data)) {
				best = j
			}
		}
		if best >= 0 {
			taken[i], idle[best], from[i] = idle[best], nil, best
		} else {
			grow += n
		}
	}
	var spare uint64 // idle bytes nobody here takes
	for _, b := range idle {
		if b != nil {
			spare += uint64(len(b.data))
		}
	}
	for grow > 0 && !p.roomLocked(grow, spare) {
		i := mostWaste(taken, sizes)
		if i < 0 {
			return nil, nil // not even with every idle buffer gone
		}
		idle[from[i]], taken[i] = taken[i], nil
		grow += sizes[i]
		spare += uint64(len(idle[from[i]].data))
	}
	for grow > 0 && !p.roomLocked(grow, 0) {
		// Idle buffers nobody here takes give way, smallest first.
		j := -1
		for k, b := range idle {
			if b != nil && (j < 0 || len(b.data) < len(idle[j].data)) {
				j = k
			}
		}
		if j < 0 {
			return nil, nil
		}
		if err := p.dropLocked(idle[j]); err != nil {
			return nil, err
		}
		idle[j] = nil
	}
	made, err := p.makeLocked(sizes, taken)
	if err != nil {
		return nil, err
	}
	p.idle = slices.DeleteFunc(p.idle, func(b *StagingBuffer) bool { return slices.Contains(taken, b) || !slices.Contains(idle, b) })
	for _, b := range taken {
		if !slices.Contains(made, b) {
			p.st.Reuses++
			clear(b.data)
		}
		b.p = p
	}
	p.inUse += len(taken)
	p.st.InUse = p.inUse
	return taken, nil
}

// makeLocked makes a buffer of sizes[i] for each taken[i] that is nil,
// into taken, and returns those it made; on an error it frees them.
func (p *StagingPool) makeLocked(sizes []uint64, taken []*StagingBuffer) ([]*StagingBuffer, error) {
	var made []*StagingBuffer
	for i, n := range sizes {
		if taken[i] != nil {
			continue
		}
		start := time.Now()
		b, err := p.make(n)
		p.st.MakeTime += time.Since(start)
		if err != nil {
			for _, m := range made {
				p.bytes -= uint64(len(m.data))
				err = errors.Join(err, p.free(m))
			}
			return nil, err
		}
		p.bytes += n
		p.st.Grows++
		p.st.Made += n
		made = append(made, b)
		taken[i] = b
	}
	return made, nil
}

// mostWaste is the index of the taken buffer that holds the most bytes
// beyond its size, -1 when none holds more than its size.
func mostWaste(taken []*StagingBuffer, sizes []uint64) int {
	best, most := -1, uint64(0)
	for i, b := range taken {
		if b != nil && uint64(len(b.data))-sizes[i] > most {
			best, most = i, uint64(len(b.data))-sizes[i]
		}
	}
	return best
}

// roomLocked reports whether n more bytes fit the pinned limit, the host
// limit and the RAM available, once freed bytes of idle buffers are gone.
func (p *StagingPool) roomLocked(n, freed uint64) bool {
	h := p.h
	var cached uint64 // freed pinned arrays in the pinned pool's cache
	if h.pinned != nil {
		st := h.pinned.Stats()
		if cached = st.Reserved - min(st.InUse, st.Reserved); cached > 0 && !p.fitsLocked(n, freed, cached) {
			_ = h.pinned.Trim() // cached pinned buffers give way
			st = h.pinned.Stats()
			cached = st.Reserved - min(st.InUse, st.Reserved)
		}
	}
	return p.fitsLocked(n, freed, cached)
}

// fitsLocked reports whether n more bytes fit with freed bytes of idle
// buffers gone and cached bytes in the pinned pool's cache.
func (p *StagingPool) fitsLocked(n, freed, cached uint64) bool {
	h := p.h
	h.mu.Lock()
	pinned := h.n.pinned + h.n.mapped + p.bytes + cached - freed
	ram := h.n.pinned + h.n.mapped + h.n.pageable + p.bytes + cached - freed
	h.mu.Unlock()
	if pinned+n > h.lim.pinned || (h.lim.limit > 0 && ram+n > h.lim.limit) {
		return false
	}
	if avail, ok := h.avail(); ok && n+meminfo.RAM()/16 > avail {
		return false
	}
	return true
}

// noRoom is the error for sizes that cannot fit with nothing to wait for.
func (p *StagingPool) noRoom(sizes []uint64) error {
	var sum uint64
	for _, n := range sizes {
		sum += n
	}
	s := p.h.stats()
	limit := "no limit"
	if s.Limit > 0 {
		limit = "the limit " + units.Format(s.Limit)
	}
	buffers := fmt.Sprintf("%d pinned buffers of %s in all do", len(sizes), units.Format(sum))
	if len(sizes) == 1 {
		buffers = "a pinned buffer of " + units.Format(sum) + " does"
	}
	return fmt.Errorf("staging pool: %s not fit: %s pinned of the pinned limit %s, %s of host RAM in use of %s; raise the host memory limits (pinned, host RAM) or make chunks smaller: %w",
		buffers, units.Format(s.Pinned+s.Mapped+s.Staging), units.Format(s.PinnedLimit),
		units.Format(s.RAM()), limit, errHostOutOfMemory)
}

// make allocates a buffer of n bytes: pinned where the device can pin,
// else Go memory.
func (p *StagingPool) make(n uint64) (*StagingBuffer, error) {
	if ha := p.h.ha; ha != nil {
		hb, err := ha.HostAlloc(n, false)
		if err != nil {
			return nil, fmt.Errorf("staging pool: pin %s: %w", units.Format(n), err)
		}
		return &StagingBuffer{data: hb.Data[:n:n], hb: hb, pinned: true}, nil
	}
	b, err := pageable(n)
	if err != nil {
		return nil, fmt.Errorf("staging pool: %w", err)
	}
	return &StagingBuffer{data: b}, nil
}

// free returns a buffer's memory.
func (p *StagingPool) free(b *StagingBuffer) error {
	b.data = nil
	if b.pinned {
		return p.h.ha.HostFree(b.hb)
	}
	return nil
}

// dropLocked frees the idle buffer b.
func (p *StagingPool) dropLocked(b *StagingBuffer) error {
	p.idle = slices.DeleteFunc(p.idle, func(x *StagingBuffer) bool { return x == b })
	p.bytes -= uint64(len(b.data))
	p.st.Trims++
	return p.free(b)
}

// Trim frees every idle buffer.
func (p *StagingPool) Trim() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	var errs []error
	for len(p.idle) > 0 {
		errs = append(errs, p.dropLocked(p.idle[0]))
	}
	return errors.Join(errs...)
}

func (p *StagingPool) trim() { _ = p.Trim() }

// close frees the idle buffers; buffers in use are freed as they come
// back.
func (p *StagingPool) close() error {
	err := p.Trim()
	p.mu.Lock()
	p.closed = true
	p.signalLocked()
	p.mu.Unlock()
	return err
}

// Array views the buffer's first bytes as a host array of shape and
// dtype, in the buffer's memory (Pinned, or Pageable on a device that
// cannot pin), on the ladder's pinned or pageable rung "a staging pool
// buffer": the form a chunk pipeline stages a chunk through. Freeing the
// array releases the buffer. The buffer must hold the array's bytes, and
// must not have been released.
func (b *StagingBuffer) Array(shape []int, dtype DType) (*HostArray, error) {
	n, ok := elements(shape)
	switch {
	case b.p == nil:
		return nil, fmt.Errorf("staging buffer: released; acquire another: %w", ErrFreed)
	case !dtype.Valid():
		return nil, fmt.Errorf("staging buffer: dtype %v is not one of %v: %w", dtype, DTypes(), ErrInvalidRequest)
	case !ok:
		return nil, fmt.Errorf("staging buffer: shape %v has a negative dimension or overflows: %w", shape, ErrInvalidRequest)
	case n > uint64(len(b.data))/dtype.Size():
		return nil, fmt.Errorf("staging buffer of %s: %v%v does not fit; acquire one of its size: %w",
			units.Format(uint64(len(b.data))), dtype, shape, ErrMismatch)
	}
	mem, rung := Pageable, RungPageable
	if b.pinned {
		mem, rung = Pinned, RungPinned
	}
	size := n * dtype.Size()
	return &HostArray{data: b.data[:size:size], shape: slices.Clone(shape), dtype: dtype, memory: mem,
		place:   &HostPlacement{Rung: rung, Reason: "a staging pool buffer"},
		release: func(device.Stream) error { b.Release(); return nil }}, nil
}

// Room is the bytes of new buffers the pool could make now, its idle
// buffers given up: the least of what the pinned limit, the host limit
// and the RAM the host has available leave. Buffers in use are not
// counted (they may come back). A batch whose chunk's staging does not
// fit shrinks its chunks to it.
func (p *StagingPool) Room() uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	var idle uint64
	for _, b := range p.idle {
		idle += uint64(len(b.data))
	}
	h := p.h
	h.mu.Lock()
	pinned := h.n.pinned + h.n.mapped + p.bytes - idle
	ram := pinned + h.n.pageable
	h.mu.Unlock()
	room := h.lim.pinned - min(h.lim.pinned, pinned)
	if h.lim.limit > 0 {
		room = min(room, h.lim.limit-min(h.lim.limit, ram))
	}
	if avail, ok := h.avail(); ok {
		avail += idle // given up, they are available again
		room = min(room, avail-min(avail, meminfo.RAM()/16))
	}
	return room
}
