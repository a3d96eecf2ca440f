package alloc

import (
	"errors"

	"github.com/vramkit/vram/device"
)

// Allocator hands out device memory, ordered on streams.
//
// Stream contract: a pointer returned by Alloc(n, s) may be used by work
// ordered on s at once. Free(p, s) says that the last use of p is work
// ordered on s before the call; the allocator may hand p's memory out again
// to an allocation on s at once, and to an allocation on another stream only
// after the work enqueued on s up to the free has finished — pools enforce
// this by recording an event on s at the free and reusing the block
// elsewhere only once that event has completed (or by making the new stream
// wait on it). Using memory on a stream other than the one it was freed on,
// without such ordering or a host synchronization, is undefined, as in
// RMM. Free with a different stream than Alloc is allowed and names the
// stream of the last use.
//
// Every Allocator is safe for concurrent use.
type Allocator interface {
	// Alloc returns n > 0 bytes usable on s. Errors wrap
	// device.ErrOutOfMemory when memory ran out.
	Alloc(n uint64, s device.Stream) (device.Ptr, error)
	// Free returns p, last used on s.
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
// them (after its rounding).
type Stats struct {
	InUse        uint64 // bytes in live allocations
	PeakInUse    uint64 // most bytes live at once since the last ResetPeaks
	Reserved     uint64 // bytes held from the device (live plus cached)
	PeakReserved uint64 // most bytes held at once since the last ResetPeaks
	Allocs       uint64 // successful Alloc calls
	Frees        uint64 // successful Free calls
	CacheHits    uint64 // Allocs served without a device allocation
	DeviceAllocs uint64 // device allocations made
	DeviceFrees  uint64 // device frees made
	Retries      uint64 // allocations retried after trimming the cache
	OOMs         uint64 // Allocs that failed for want of memory
}

// Cached is the memory held from the device but not in use.
func (s Stats) Cached() uint64 { return s.Reserved - s.InUse }

// PeakResetter is an allocator whose peaks can be reset to the current
// values. Every allocator in this package implements it.
type PeakResetter interface{ ResetPeaks() }

// Granular is an allocator that rounds requests up to a multiple of
// Granularity bytes. The planner counts bytes the same way.
type Granular interface{ Granularity() uint64 }

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
