// `vram replay --summary`: each allocator's memory report
// (alloc.MemoryReport) taken at its peak of reserved bytes during the
// replay, printed under the table (and in --json's rows).

package main

import (
	"context"
	"fmt"
	"io"

	"github.com/vramkit/vram/alloc"
	"github.com/vramkit/vram/device"
	"github.com/vramkit/vram/trace"
)

// peakWatch wraps an allocator and keeps its report at the peak of
// Reserved, at the moment of that peak with the most bytes in use (where
// the cache is under most pressure): after each Alloc that takes
// (Reserved, InUse) past the most seen, it takes a new report, which costs
// a few tree lookups. Not safe for concurrent use (a replay runs on one
// goroutine).
type peakWatch struct {
	alloc.Allocator
	reserved, inUse uint64             // the most seen, in that order
	rep             alloc.MemoryReport // the report then
	seen            bool               // rep was taken
}

// Alloc allocates and, past the peak, takes the report.
func (w *peakWatch) Alloc(n uint64, s device.Stream) (device.Ptr, error) {
	p, err := w.Allocator.Alloc(n, s)
	if err == nil {
		st := w.Allocator.Stats()
		if !w.seen || st.Reserved > w.reserved || (st.Reserved == w.reserved && st.InUse > w.inUse) {
			w.reserved, w.inUse = st.Reserved, st.InUse
			w.rep, w.seen = alloc.ReportOf(w.Allocator), true
		}
	}
	return p, err
}

// ResetPeaks forwards to the allocator (a replay resets peaks first).
func (w *peakWatch) ResetPeaks() {
	if r, ok := w.Allocator.(alloc.PeakResetter); ok {
		r.ResetPeaks()
	}
}

// report is the report at the peak, with the failures and retries of
// the whole replay, or nil when nothing was allocated.
func (w *peakWatch) report(res trace.Result) *alloc.MemoryReport {
	if !w.seen {
		return nil
	}
	r := w.rep
	r.Retries, r.OOMs = res.Final.Retries, res.Final.OOMs
	return &r
}

// replayOne replays events against kind as replayKind does; with
// summary it also returns the allocator's report at its peak of
// reserved bytes.
func replayOne(ctx context.Context, events []trace.Event, spec device.Spec, kind alloc.Entry, opts trace.Options,
	snapshotOut string, summary bool) (trace.Result, *alloc.MemoryReport, error) {
	if !summary {
		res, err := replayKind(ctx, events, spec, kind, opts, snapshotOut)
		return res, nil, err
	}
	var w *peakWatch
	newAlloc := func(dev device.Device) (alloc.Allocator, error) {
		a, err := kind.New(dev, alloc.Configs{})
		if err != nil {
			return nil, err
		}
		w = &peakWatch{Allocator: a}
		return w, nil
	}
	if snapshotOut == "" {
		res, err := trace.ReplayOnContext(ctx, events, specFactory(spec), newAlloc, opts)
		if err != nil {
			return res, nil, err
		}
		return res, w.report(res), nil
	}
	res, h, err := trace.RecordReplay(events, specFactory(spec), newAlloc, opts)
	if err != nil {
		return res, nil, err
	}
	if err := trace.WriteSnapshotFile(snapshotOut, h); err != nil {
		return res, nil, fmt.Errorf("--snapshot-out: %w", err)
	}
	return res, w.report(res), nil
}

// printSummaries writes each row's report at its peak, after the tables.
func printSummaries(w io.Writer, rows []replayRow) {
	for _, r := range rows {
		if r.report == nil {
			continue
		}
		fmt.Fprintf(w, "\n%s, %s at its peak of reserved bytes, when the most was allocated (retries and out of memory: the whole replay):\n%s",
			r.Trace, r.Allocator, r.report)
	}
}

// summaryJSON is a report at the peak in `vram replay --json --summary`'s
// rows. Bytes are bytes.
type summaryJSON struct {
	InUseBytes        uint64  `json:"in_use_bytes"`
	PeakInUseBytes    uint64  `json:"peak_in_use_bytes"`
	ReservedBytes     uint64  `json:"reserved_bytes"`
	CachedBytes       uint64  `json:"cached_bytes"`
	LargestFreeBytes  uint64  `json:"largest_free_bytes"`
	Fragmentation     float64 `json:"fragmentation"` // 1 − largest free block / cached
	LayoutKnown       bool    `json:"layout_known"`  // false: largest free block and fragmentation unknown
	FreeBlocks        int     `json:"free_blocks"`
	PendingBytes      uint64  `json:"pending_bytes"`
	Segments          int     `json:"segments"`
	PeakSegments      int     `json:"peak_segments"`
	Allocs            uint64  `json:"allocs"`
	CacheHits         uint64  `json:"cache_hits"`
	DeviceAllocs      uint64  `json:"device_allocs"`
	DeviceFrees       uint64  `json:"device_frees"`
	Retries           uint64  `json:"retries"`
	OutOfMemoryErrors uint64  `json:"out_of_memory_errors"`
}

// withSummary adds report r, when not nil, to row.
func withSummary(row replayRow, r *alloc.MemoryReport) replayRow {
	if r == nil {
		return row
	}
	row.report = r
	row.Summary = &summaryJSON{
		InUseBytes: r.InUse, PeakInUseBytes: r.PeakInUse, ReservedBytes: r.Reserved, CachedBytes: r.Cached(),
		LargestFreeBytes: r.LargestFree, Fragmentation: r.Fragmentation(), LayoutKnown: r.Layout,
		FreeBlocks: r.FreeBlocks, PendingBytes: r.Pending, Segments: r.Segments, PeakSegments: r.PeakSegments,
		Allocs: r.Allocs, CacheHits: r.CacheHits, DeviceAllocs: r.DeviceAllocs, DeviceFrees: r.DeviceFrees,
		Retries: r.Retries, OutOfMemoryErrors: r.OOMs,
	}
	return row
}
