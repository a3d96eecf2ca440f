package alloc

import (
	"errors"

	"github.com/vramkit/vram/device"
)

// Allocator hands out device memory, ordered on streams.
//
// Stream contract, in full (it is RMM's, and CUDA's stream-ordered
// allocator's):
//
//   - Alloc(n, s) returns memory that work ordered on s may use at once.
//     The memory may have been used before, by work on s that is still
//     pending (which runs first, being on s) or by work on other streams
//     that has finished. Work on another stream t may use it only once t
//     is ordered after s (an event recorded on s after the Alloc that t
//     waits on, or a host synchronization).
//   - Free(p, s) promises that every use of p is work ordered on s before
//     the call: the caller must first order any other stream's use of p
//     into s (an event recorded on that stream that s waits on) or wait
//     for it on the host. s may differ from the Alloc's stream; it names
//     the stream of the last use. Free does not wait for that work.
//   - After Free(p, s) the allocator may hand the memory to an Alloc on s
//     at once, since stream order runs the new use after the old, and to
//     an Alloc on another stream only once the work enqueued on s up to
//     the Free has finished. The allocators enforce this themselves:
//     Pool (and PinnedPool) record an event on s after the free and offer
//     the block to other streams only once it has completed; until then
//     they serve the request from other memory, and they wait for the
//     event only when the device has none left; AsyncPool leaves it to
//     the device's stream-ordered pool,
//     which applies the same rule; Direct's device Free waits for all
//     work, so its memory is safe on any stream.
//   - Anything else is undefined: using p after Free, or on a stream not
//     ordered as above.
//
// Device reset contract, in full. device.Device.Reset destroys every
// allocation, stream and event made before it. That memory is already
// gone, so every allocator treats it as given back, never as something
// still to free:
//
//   - Free(p, s) of a pointer handed out before the reset, on any stream
//     (one from before the reset will do), takes p back as any Free does
//     (InUse drops, Frees counts it, and p is forgotten: a second Free
//     returns ErrUnknownPointer), and returns an error wrapping
//     device.ErrInvalidated, so that the caller learns that p's contents
//     were lost. It is the one error after which p is taken back.
//   - Device memory held from before the reset (Direct's allocations,
//     Pool's segments, PinnedPool's buffers) counts as released, with
//     Reserved dropping and DeviceFrees counting it, once no live pointer
//     lies in it: cached memory as soon as the allocator notices the
//     reset, the rest as its pointers are freed (AsyncPool's Reserved is
//     the device pool's, which the reset emptied). A device free that
//     fails with device.ErrInvalidated counts as done and is never
//     retried, so Trim and Close return nil for memory a reset took, and
//     once every pointer from before the reset has been freed, InUse and
//     Reserved count only memory allocated since.
//   - The allocator stays usable: an Alloc after the reset returns memory
//     of the reset device, never cached memory from before it. Pool and
//     PinnedPool, which hand out cached memory without a device call,
//     notice the reset at their next call by the device's generation
//     (device.Generational, which both backends implement); with a device
//     that has none they cannot, so make a new allocator after a reset.
//     Use streams made after the reset for new work.
//   - Free the pointers from before a reset before allocating after it,
//     as the manager's InvalidateAll does: a device may hand their
//     addresses out again (CUDA may; the simulator never does), and then
//     a Free of the old pointer cannot be told from one of the new.
//   - A Reset that overtakes a call is as if it came right after the
//     call, except that an Alloc that was growing when the device was
//     reset fails with an error wrapping device.ErrInvalidated (retry it).
//
// Every Allocator is safe for concurrent use.
type Allocator interface {
	// Alloc returns n > 0 bytes usable on s. Errors wrap
	// device.ErrOutOfMemory when memory ran out.
	Alloc(n uint64, s device.Stream) (device.Ptr, error)
	// Free returns p, last used on s. An error wrapping
	// device.ErrInvalidated says p was allocated before a device reset:
	// p is taken back all the same (see the reset contract above).
	Free(p device.Ptr, s device.Stream) error
	// Stats reports the allocator's counters.
	Stats() Stats
	// Trim returns cached free memory to the device (CuPy's
	// free_all_blocks, PyTorch's empty_cache).
	Trim() error
	// Close frees everything the allocator holds, live or cached.
	Close() error
}

// Stats are an allocator's counters. Bytes are as the allocator spends
// them (after its rounding). A Stats is a snapshot, a plain value: copy
// and read it freely.
type Stats struct {
	InUse        uint64 // bytes in live allocations
	PeakInUse    uint64 // most bytes live at once since the last ResetPeaks
	Reserved     uint64 // bytes held from the device (live plus cached)
	PeakReserved uint64 // most bytes held at once since the last ResetPeaks
	Allocs       uint64 // successful Alloc calls
	Frees        uint64 // Free calls that took a pointer back (those of pointers lost to a device reset included)
	CacheHits    uint64 // Allocs served without a device allocation
	DeviceAllocs uint64 // device allocations made
	DeviceFrees  uint64 // device frees made, and device allocations lost to a device reset and given up
	Retries      uint64 // allocations retried after the device ran out of memory (waiting for other streams' frees, trimming the cache)
	OOMs         uint64 // Allocs that failed for want of memory
}

// Cached is the memory held from the device but not in use.
func (s Stats) Cached() uint64 { return s.Reserved - s.InUse }

// PeakResetter is an allocator whose peaks can be reset to the current
// values. Every allocator in this package implements it, safely for
// concurrent use with the allocator's other methods.
type PeakResetter interface{ ResetPeaks() }

// Granular is an allocator that rounds requests up to a multiple of
// Granularity bytes. The planner counts bytes the same way. Granularity
// is fixed for the allocator's life and safe to call at any time.
type Granular interface{ Granularity() uint64 }

// ExactGrower is an allocator that can serve a long-lived allocation (a
// batch's arrays) without growing a shared segment for it. AllocExact is
// Alloc, except that on a cache miss it takes from the device no more
// than n rounded up to the device's granularity (a request small enough
// to share takes one SmallSegment at most), so the device memory a set of
// such allocations may take is bounded by their own rounded sizes. The
// manager uses it for the arrays of a planned batch, so that a plan that
// fits does fit. Pool implements it; the adaptors forward it.
type ExactGrower interface {
	AllocExact(n uint64, s device.Stream) (device.Ptr, error)
}

// AllocExact calls a.AllocExact when a is an ExactGrower, else a.Alloc
// (whose device use is already exact for Direct and AsyncPool).
func AllocExact(a Allocator, n uint64, s device.Stream) (device.Ptr, error) {
	if eg, ok := a.(ExactGrower); ok {
		return eg.AllocExact(n, s)
	}
	return a.Alloc(n, s)
}

// Adaptor is an allocator that wraps another.
type Adaptor interface {
	Allocator
	Upstream() Allocator
}

// Sentinel errors.
var (
	// ErrLimit: an allocation would take a Limit adaptor over its cap.
	// Errors wrapping it also wrap device.ErrOutOfMemory.
	ErrLimit = errors.New("allocation limit reached")
	// ErrUnknownPointer: Free of a pointer this allocator did not hand out
	// (or has already taken back).
	ErrUnknownPointer = errors.New("pointer not allocated by this allocator")
	// ErrClosed: the allocator has been closed.
	ErrClosed = errors.New("allocator closed")
)

// lostToReset reports whether err from a device free says the memory was
// allocated before a device reset, which has freed it already.
func lostToReset(err error) bool { return errors.Is(err, device.ErrInvalidated) }
