package sim

import (
	"errors"
	"fmt"
	"strings"

	"github.com/vramkit/vram/internal/units"
)

// ErrLeak is matched (errors.Is) by the *LeakError Close returns when
// memory was still allocated.
var ErrLeak = errors.New("device memory leaked")

// maxLeakDetails bounds LeakReport.Details.
const maxLeakDetails = 16

// LeakReport says what a device still holds. Byte counts are as requested
// by the caller (before rounding).
type LeakReport struct {
	Allocs      int    // live Malloc allocations
	AllocBytes  uint64 // their bytes
	AsyncAllocs int    // live MallocAsync allocations
	AsyncBytes  uint64 // their bytes
	HostBuffers int    // live HostAlloc buffers
	HostBytes   uint64 // their bytes
	Physical    int    // physical memory handles alive (CreatePhysical)
	PhysBytes   uint64 // their bytes
	Reserved    int    // address reservations not freed (ReserveAddress)
	ResBytes    uint64 // their bytes
	Streams     int    // streams made by NewStream and not closed
	Events      int    // events made by NewEvent and not closed
	// Details lists up to 16 of the leaked allocations, lowest address
	// first, e.g. "Malloc #3: 1 MiB at 0x7f0000200000".
	Details []string
}

// Empty reports whether nothing at all is outstanding, streams and events
// included.
func (r LeakReport) Empty() bool {
	return !r.leaksMemory() && r.Streams == 0 && r.Events == 0
}

func (r LeakReport) leaksMemory() bool {
	return r.Allocs+r.AsyncAllocs+r.HostBuffers+r.Physical+r.Reserved > 0
}

// String summarises the report on one line (plus details).
func (r LeakReport) String() string {
	if r.Empty() {
		return "nothing outstanding"
	}
	var parts []string
	add := func(n int, what string, b uint64) {
		if n > 0 {
			parts = append(parts, fmt.Sprintf("%d %s (%s)", n, what, units.Format(b)))
		}
	}
	add(r.Allocs, "Malloc allocations", r.AllocBytes)
	add(r.AsyncAllocs, "MallocAsync allocations", r.AsyncBytes)
	add(r.HostBuffers, "pinned host buffers", r.HostBytes)
	add(r.Physical, "physical memory handles", r.PhysBytes)
	add(r.Reserved, "address reservations", r.ResBytes)
	if r.Streams > 0 {
		parts = append(parts, fmt.Sprintf("%d open streams", r.Streams))
	}
	if r.Events > 0 {
		parts = append(parts, fmt.Sprintf("%d open events", r.Events))
	}
	s := strings.Join(parts, ", ")
	if len(r.Details) > 0 {
		s += ": " + strings.Join(r.Details, "; ")
	}
	return s
}

// LeakError is the error Close returns when memory was still allocated.
type LeakError struct {
	Device string // e.g. "sim#3 (8 GiB)"
	Report LeakReport
}

func (e *LeakError) Error() string {
	return fmt.Sprintf("%s: closed with memory still allocated: %s", e.Device, e.Report)
}

// Is makes errors.Is(err, ErrLeak) true.
func (e *LeakError) Is(target error) bool { return target == ErrLeak }

// Leaks reports what the device holds now: live allocations, pinned
// buffers, open streams and events. After Close it reports nothing.
func (d *Device) Leaks() LeakReport {
	d.mu.RLock()
	defer d.mu.RUnlock()
	if d.closed.Load() {
		return LeakReport{}
	}
	return d.leaksLocked()
}

func (d *Device) leaksLocked() LeakReport {
	r := LeakReport{
		Allocs: d.nMalloc, AllocBytes: d.mallocReq,
		AsyncAllocs: d.pool.nUsed, AsyncBytes: d.pool.usedReq,
		Streams: len(d.streams), Events: d.events,
		Physical: len(d.vm.phys), PhysBytes: d.vm.physBytes,
		Reserved: d.vm.res.len(), ResBytes: d.vm.resBytes,
	}
	for _, h := range d.host {
		r.HostBuffers++
		r.HostBytes += h.n
	}
	d.live.each(func(n *tnode[rec]) bool {
		if len(r.Details) >= maxLeakDetails {
			return false
		}
		switch n.v.kind {
		case kMalloc, kMapped:
			r.Details = append(r.Details, fmt.Sprintf("%s #%d: %s at 0x%x", n.v.kind, n.v.id, units.Format(n.v.size), n.k1))
		case kSegment:
			for b := d.pool.blocks.get(n.k1, 0).v; b != nil && len(r.Details) < maxLeakDetails; b = b.next {
				if b.state == bUsed {
					r.Details = append(r.Details, fmt.Sprintf("MallocAsync #%d: %s at 0x%x", b.id, units.Format(b.req), b.start))
				}
			}
		}
		return true
	})
	if n := r.HostBuffers - countMappedDetails(r.Details); n > 0 && len(r.Details) < maxLeakDetails {
		r.Details = append(r.Details, fmt.Sprintf("%d unmapped pinned host buffers", n))
	}
	return r
}

func countMappedDetails(details []string) int {
	n := 0
	for _, s := range details {
		if strings.HasPrefix(s, kMapped.String()) {
			n++
		}
	}
	return n
}
