package alloc

// PinnedPool: the pinned-host-buffer strategy on the stream-ordered core
// (core.go), caching page-locked host buffers (cuMemHostAlloc), which are
// slow to make and to free, as CuPy's PinnedMemoryPool and PyTorch's
// CachingHostAllocator do. Rules and invariants:
//
//   - Buffers are never split or merged: each segment is one HostAlloc of
//     the request rounded up to 512 bytes, with one block. A request
//     reuses the smallest cached buffer at least as large, if that is at
//     most a quarter larger (reusable); else it makes a new one.
//   - The free index is host-visible: the next user of a buffer reads or
//     writes it from the host, which no stream orders, so a buffer freed
//     on stream S is handed out again, on any stream, only once an event
//     recorded on S after the free has completed (fence.go). Until then
//     it is not offered and a request makes a new buffer.
//   - Live buffers are keyed by the host address of their first byte; a
//     free must also name the buffer's device pointer.
//   - A device reset unpins every buffer: cached ones leave the books at
//     once (counted as device frees) and wait in the core's dead list for
//     HostFree, which releases their host memory and whose
//     device.ErrInvalidated is expected; one handed out is marked stale
//     and released the same way when it is freed.

import (
	"errors"
	"fmt"
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
// A buffer freed on stream s is handed out again, on any stream, once an
// event recorded on s after the free has completed; until then a request
// makes a new buffer. On the device's out of memory the pool waits,
// without holding its lock, for the streams that freed cached buffers
// (possibly for work queued on them after the frees too; fence.go, "When
// events are recorded", says what that wait may deadlock with) and tries
// the cache again, then frees every cached buffer and retries once.
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
	core
	host   device.HostAllocator
	mapped bool
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
	p := &PinnedPool{host: h, mapped: cfg.Mapped}
	p.initCore(dev, p, "pinned", true, nil)
	return p, nil
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
	b, err := p.alloc(request{n: n, size: size}, s)
	if err != nil {
		return device.HostBuffer{}, err
	}
	h := b.seg.host // the buffer is the caller's now; its segment does not change
	return device.HostBuffer{Data: h.Data[:n:n], DevicePtr: h.DevicePtr}, nil
}

// takeLocked takes the smallest cached buffer for r that st may use, if
// it is reusable for r.
func (p *PinnedPool) takeLocked(r request, st *streamState) *block {
	b := p.idx.bestFit(r.size, 0, st)
	if b == nil || !reusable(b.size, r.size) {
		return nil
	}
	p.idx.remove(b)
	return b
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
	switch res, err := p.free(key, b.DevicePtr, s); res {
	case freeClosed:
		return fmt.Errorf("alloc: pinned free: %w", ErrClosed)
	case freeUnknown:
		return fmt.Errorf("alloc: pinned free of a %s buffer at %#x: %w", units.Format(uint64(len(b.Data))), uint64(key), ErrUnknownPointer)
	case freeStale:
		return joinErr(fmt.Errorf("alloc: pinned free of a %s buffer at %#x: the buffer was allocated before a device reset, which unpinned it: %w",
			units.Format(uint64(len(b.Data))), uint64(key), device.ErrInvalidated), err)
	case freeEventErr:
		return fmt.Errorf("alloc: pinned free: the buffer is back in the pool, but the pool was closed meanwhile and closing its event failed: %w", err)
	}
	return nil
}

// freeLocked puts buffer b, freed on st, in st's free set.
func (p *PinnedPool) freeLocked(b *block, st *streamState) {
	p.idx.insertOwned(b, st, span{b.addr, b.end()})
}

// fenceBeforeGrowthLocked is false: a growth gives nothing back.
func (p *PinnedPool) fenceBeforeGrowthLocked(request) bool { return false }

// growthLocked is r's size: one buffer a request.
func (p *PinnedPool) growthLocked(r request) uint64 { return r.size }

// releaseForGrowthLocked is nil: a growth gives nothing back.
func (p *PinnedPool) releaseForGrowthLocked(uint64) []*segment { return nil }

// beforeRetryLocked does nothing: buffers do not merge.
func (p *PinnedPool) beforeRetryLocked(*streamState) {}

// grow makes a buffer of g bytes.
func (p *PinnedPool) grow(r request, g uint64) (*segment, uint64, error) {
	buf, err := p.host.HostAlloc(g, p.mapped)
	if err != nil {
		return nil, g, err
	}
	if uint64(len(buf.Data)) < g {
		return nil, g, errors.Join(fmt.Errorf("the device returned %d bytes: %w", len(buf.Data), device.ErrInvalidValue), p.host.HostFree(buf))
	}
	return &segment{base: hostKey(buf.Data), size: g, host: buf}, g, nil
}

// addSegmentLocked hands out new buffer seg whole.
func (p *PinnedPool) addSegmentLocked(seg *segment, _ request) *block { return seg.first }

// dropGenerationLocked handles a device reset: cached buffers leave the
// books (and the free index) for the core's dead list; those handed out
// are marked stale, for Free.
func (p *PinnedPool) dropGenerationLocked() {
	for seg := p.segs; seg != nil; {
		next := seg.snext
		if p.uncacheLocked(seg) {
			p.dead = append(p.dead, seg)
		} else {
			seg.stale = true
		}
		seg = next
	}
}

// freeStaleLocked takes buffer b, from before a reset, off the books and
// returns it to be released.
func (p *PinnedPool) freeStaleLocked(b *block) []*segment {
	seg := b.seg
	p.unlinkLocked(seg)
	p.idx.putBlock(b)
	return []*segment{seg}
}

// closeLocked holds nothing aside: every buffer is on the core's books.
func (p *PinnedPool) closeLocked() int { return 0 }

// allocFailed is the error of a request the ladder could not serve.
func (p *PinnedPool) allocFailed(m miss, err error) error {
	n, s := m.r.n, m.s
	if !errors.Is(err, device.ErrOutOfMemory) {
		return errors.Join(fmt.Errorf("alloc: pinned alloc of %s on stream %d: %w", units.Format(n), s.Handle(), err), m.relErr, m.waitErr)
	}
	p.mu.Lock()
	p.st.OOMs++
	st := p.st
	p.mu.Unlock()
	return errors.Join(fmt.Errorf("alloc: pinned alloc of %s on stream %d failed after giving back the cache: "+
		"the pool holds %s in buffers, %s of them handed out; free buffers or stage through smaller ones: %w",
		units.Format(n), s.Handle(), units.Format(st.Reserved), units.Format(st.InUse), err), m.relErr, m.waitErr)
}

// grewAcrossReset is the error of an allocation a reset overtook.
func (p *PinnedPool) grewAcrossReset(m miss, _ *segment) error {
	return fmt.Errorf("alloc: pinned alloc of %s on stream %d: the device was reset during the allocation, so the new buffer may be from before the reset and was given back; retry on a stream made since: %w",
		units.Format(m.r.n), m.s.Handle(), device.ErrInvalidated)
}

// trimLocked takes every cached buffer off the books and returns them.
func (p *PinnedPool) trimLocked() []*segment {
	var out []*segment
	for seg := p.segs; seg != nil; {
		next := seg.snext
		if p.uncacheLocked(seg) {
			out = append(out, seg)
		}
		seg = next
	}
	return out
}

// uncacheLocked takes buffer seg off the books if it is cached, and
// reports whether it was.
func (p *PinnedPool) uncacheLocked(seg *segment) bool {
	b := seg.first
	if !b.free {
		return false
	}
	p.idx.remove(b)
	p.idx.putBlock(b)
	p.unlinkLocked(seg)
	return true
}

// release gives buffer seg back to the device. Called without the lock.
// For a buffer a device reset unpinned, HostFree releases its host memory
// and says so with device.ErrInvalidated.
func (p *PinnedPool) release(seg *segment) error {
	if err := p.host.HostFree(seg.host); err != nil {
		return fmt.Errorf("alloc: pinned pool: free %s buffer: %w", units.Format(seg.size), err)
	}
	return nil
}

var (
	_ PeakResetter = (*PinnedPool)(nil)
	_ Granular     = (*PinnedPool)(nil)
	_ strategy     = (*PinnedPool)(nil)
)
