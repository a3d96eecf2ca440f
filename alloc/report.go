package alloc

// The memory report (PyTorch's torch.cuda.memory_summary, RMM's
// statistics adaptor): what an allocator holds and how it is laid out,
// built on demand from the books it already keeps, never on the hot path.
// Every out-of-memory error carries one (OutOfMemoryError), and an
// observer can be told of each such failure (OOMObservable).
//
// Fragmentation is defined once, here: the share of the cache that a
// request as large as the whole cache could not use,
//
//	1 − LargestFree / Cached
//
// 0 when nothing is cached or the cache is one block, near 1 when it is
// in many small pieces. It says whether cached memory lies in one piece,
// not whether the allocator holds too much (Cached / Reserved says that).

import (
	"fmt"
	"strings"
	"sync/atomic"

	"github.com/vramkit/vram/device"
	"github.com/vramkit/vram/internal/units"
)

// MemoryReport is an allocator's memory at one moment: its Stats and the
// layout of its cache. Bytes are as the allocator spends them. A plain
// value: copy and read it freely.
type MemoryReport struct {
	// Allocator names the allocator: its name in the registry
	// (registry.go: "direct", "pool", "async", "expandable"), "pinned"
	// for PinnedPool, or an unknown allocator's type.
	Allocator string
	// Stats are the allocator's counters, read with the layout below
	// (under the same lock, for the caching allocators).
	Stats
	// Layout says that the fields below it are known: false for an
	// allocator whose cache is the device's (AsyncPool).
	Layout bool
	// LargestFree is the largest cached free block, in bytes.
	LargestFree uint64
	// FreeBlocks is the number of cached free blocks.
	FreeBlocks int
	// Pending is the cached bytes freed on a stream whose work up to the
	// free is not yet known done, so that only that stream may reuse
	// them.
	Pending uint64
	// Segments is the device allocations held: Pool's segments,
	// PinnedPool's buffers, Direct's live allocations, a range
	// allocator's ranges.
	Segments int
	// PeakSegments is the most Segments at once since the last
	// ResetPeaks (Segments itself where the allocator keeps no peak).
	PeakSegments int
	// Streams is the number of streams whose frees the allocator tracks.
	Streams int
	// PageSize, Pages and PeakPages are a paging allocator's page size in
	// bytes and its pages mapped now and at most; zero for the others.
	PageSize, Pages, PeakPages uint64
	// Cap and CapUsed are a Limit adaptor's cap and the bytes charged
	// against it; zero when no Limit is in the chain (Cap zero too when
	// its cap is NoCap).
	Cap, CapUsed uint64
}

// Fragmentation is 1 − LargestFree / Cached (see the file overview): the
// share of cached bytes outside the largest free block. 0 when nothing
// is cached or the layout is unknown.
func (r MemoryReport) Fragmentation() float64 {
	c := r.Cached()
	if !r.Layout || c == 0 || r.LargestFree >= c {
		return 0
	}
	return 1 - float64(r.LargestFree)/float64(c)
}

// String formats the report as a table, one figure a line, in the manner
// of torch.cuda.memory_summary.
func (r MemoryReport) String() string {
	var b strings.Builder
	name := r.Allocator
	if name == "" {
		name = "allocator"
	}
	fmt.Fprintf(&b, "%s memory report\n", name)
	line := func(what, cur, peak string) {
		fmt.Fprintf(&b, "  %-22s %12s", what, cur)
		if peak != "" {
			fmt.Fprintf(&b, "   peak %s", peak)
		}
		b.WriteByte('\n')
	}
	line("allocated", units.Format(r.InUse), units.Format(r.PeakInUse))
	line("reserved", units.Format(r.Reserved), units.Format(r.PeakReserved))
	line("cached", units.Format(r.Cached()), "")
	if r.Layout {
		line("largest free block", units.Format(r.LargestFree), "")
		line("fragmentation", fmt.Sprintf("%.1f%%", 100*r.Fragmentation()), "")
		line("free blocks", fmt.Sprint(r.FreeBlocks), "")
		if r.Pending > 0 {
			line("pending on streams", units.Format(r.Pending), "")
		}
		line("segments", fmt.Sprint(r.Segments), fmt.Sprint(r.PeakSegments))
	} else {
		line("largest free block", "unknown", "")
	}
	if r.PageSize > 0 {
		line("pages mapped", fmt.Sprintf("%d × %s", r.Pages, units.Format(r.PageSize)), fmt.Sprint(r.PeakPages))
	}
	if r.Cap > 0 {
		line("cap", units.Format(r.Cap), "")
		line("charged to the cap", units.Format(r.CapUsed), "")
	}
	line("allocs", fmt.Sprintf("%d", r.Allocs), "")
	line("cache hits", fmt.Sprintf("%d", r.CacheHits), "")
	line("frees", fmt.Sprintf("%d", r.Frees), "")
	line("device allocs / frees", fmt.Sprintf("%d / %d", r.DeviceAllocs, r.DeviceFrees), "")
	line("retries", fmt.Sprint(r.Retries), "")
	line("out of memory", fmt.Sprint(r.OOMs), "")
	return b.String()
}

// Reporter is an allocator that reports its memory. Every allocator and
// adaptor in this package implements it, safely for concurrent use with
// its other methods.
type Reporter interface{ Report() MemoryReport }

// ReportOf is a.Report() when a is a Reporter, else a report of a's
// Stats alone (Layout false).
func ReportOf(a Allocator) MemoryReport {
	if r, ok := a.(Reporter); ok {
		return r.Report()
	}
	return MemoryReport{Allocator: fmt.Sprintf("%T", a), Stats: a.Stats()}
}

// OutOfMemoryError is the error of an allocation refused for want of
// memory. Its message is the allocator's, short; Report holds the
// allocator's memory at the failure. It wraps device.ErrOutOfMemory (and,
// from a Limit, ErrLimit): reach it with errors.As.
type OutOfMemoryError struct {
	Size   uint64  // bytes asked for
	Stream uintptr // the stream's handle (0 when none was given)
	err    error
	report MemoryReport
}

func (e *OutOfMemoryError) Error() string { return e.err.Error() }

// Unwrap returns the allocator's error, which wraps device.ErrOutOfMemory.
func (e *OutOfMemoryError) Unwrap() error { return e.err }

// Report is the allocator's memory just after it refused the allocation
// (its OOMs count this failure).
func (e *OutOfMemoryError) Report() MemoryReport { return e.report }

// OOMObserver is called once for each allocation an allocator refuses
// for want of memory, with the error the Alloc returns, before it
// returns, on its goroutine, with no lock of the allocator held (it may
// call the allocator's Stats, Report and Trim). It must be safe to call
// from many goroutines at once.
type OOMObserver func(*OutOfMemoryError)

// OOMObservable is an allocator that calls an observer at each
// allocation it refuses for want of memory (PyTorch's
// OutOfMemoryObserver, RMM's failure callback). SetOOMObserver replaces
// the observer (nil removes it); it is safe to call at any time. Every
// allocator in this package implements it; an adaptor also sets it on its
// upstream, so that each failure in the chain is observed once, by the
// allocator that refused it.
type OOMObservable interface{ SetOOMObserver(OOMObserver) }

// ObserveOOM sets f as a's observer and reports whether a is
// OOMObservable.
func ObserveOOM(a Allocator, f OOMObserver) bool {
	o, ok := a.(OOMObservable)
	if ok {
		o.SetOOMObserver(f)
	}
	return ok
}

// oomHook holds an observer. The zero value has none; safe for
// concurrent use.
type oomHook struct{ f atomic.Pointer[OOMObserver] }

func (h *oomHook) SetOOMObserver(f OOMObserver) {
	if f == nil {
		h.f.Store(nil)
		return
	}
	h.f.Store(&f)
}

// fail wraps err, an allocation's out-of-memory error, with report rep
// (built by the caller after counting the failure), tells the observer
// and returns the error to give the caller.
func (h *oomHook) fail(n uint64, s device.Stream, err error, rep MemoryReport) error {
	e := &OutOfMemoryError{Size: n, err: err, report: rep}
	if s != nil {
		e.Stream = s.Handle()
	}
	if f := h.f.Load(); f != nil {
		(*f)(e)
	}
	return e
}

// layoutLocked is the free index's part of a report: the largest free
// block, the number of free blocks and the bytes waiting on a stream.
func (x *freeIndex) layoutLocked(r *MemoryReport) {
	r.LargestFree = x.largest()
	for c := range x.shared {
		r.FreeBlocks += x.shared[c].n
	}
	for _, st := range x.streams {
		for c := range st.free {
			r.FreeBlocks += st.free[c].n
			r.Pending += st.free[c].bytes
		}
	}
	r.Streams = len(x.streams)
}

// reportFiller is a strategy that adds figures of its own to the core's
// report (pages, for a paging strategy). Called with the core's lock
// held.
type reportFiller interface{ fillReportLocked(r *MemoryReport) }

// Report is the allocator's memory now, read under its lock: Stats, the
// cache's layout, segments (buffers, for a PinnedPool) and their peak.
func (c *core) Report() MemoryReport {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.reportLocked()
}

func (c *core) reportLocked() MemoryReport {
	if !c.closed {
		c.syncGenLocked()
	}
	r := MemoryReport{Allocator: c.name, Stats: c.st, Layout: true, Segments: c.nsegs}
	r.PeakSegments = max(c.peakSegs, c.nsegs)
	c.idx.layoutLocked(&r)
	if f, ok := c.strat.(reportFiller); ok {
		f.fillReportLocked(&r)
	}
	return r
}

// outOfMemory is the error of an Alloc of n bytes on s that failed for
// want of memory with err, its OOMs already counted.
func (c *core) outOfMemory(n uint64, s device.Stream, err error) error {
	return c.oomHook.fail(n, s, err, c.Report())
}

// Report is Direct's memory: every live allocation is a segment, and
// nothing is cached.
func (d *Direct) Report() MemoryReport {
	d.mu.Lock()
	segs := len(d.live)
	d.mu.Unlock()
	return MemoryReport{Allocator: NameDirect, Stats: d.st.stats(), Layout: true, Segments: segs, PeakSegments: segs}
}

// Report is the AsyncPool's Stats: the layout of the device's pool is not
// known.
func (a *AsyncPool) Report() MemoryReport {
	return MemoryReport{Allocator: NameAsync, Stats: a.Stats()}
}

// Report is the upstream's, with the cap, the bytes charged against it
// and the Limit's refusals added to OOMs.
func (l *Limit) Report() MemoryReport {
	r := ReportOf(l.up)
	r.OOMs += l.ooms.Load()
	r.Cap, r.CapUsed = l.Cap(), l.Used()
	if r.Cap == NoCap {
		r.Cap = 0
	}
	return r
}

// SetOOMObserver sets the observer of the Limit's refusals and of its
// upstream's out of memory.
func (l *Limit) SetOOMObserver(f OOMObserver) {
	l.oom.SetOOMObserver(f)
	ObserveOOM(l.up, f)
}

// Report is the upstream's.
func (t *Trace) Report() MemoryReport { return ReportOf(t.up) }

// SetOOMObserver sets the upstream's observer.
func (t *Trace) SetOOMObserver(f OOMObserver) { ObserveOOM(t.up, f) }

var (
	_ Reporter      = (*Pool)(nil)
	_ Reporter      = (*PinnedPool)(nil)
	_ Reporter      = (*Direct)(nil)
	_ Reporter      = (*AsyncPool)(nil)
	_ Reporter      = (*Limit)(nil)
	_ Reporter      = (*Trace)(nil)
	_ OOMObservable = (*Pool)(nil)
	_ OOMObservable = (*PinnedPool)(nil)
	_ OOMObservable = (*Direct)(nil)
	_ OOMObservable = (*AsyncPool)(nil)
	_ OOMObservable = (*Limit)(nil)
	_ OOMObservable = (*Trace)(nil)
)
