// `vram replay`: RMM allocation logs replayed against the allocators on an
// address-only simulated device, with a table of what each spent and an
// optional plot.

package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/vramkit/vram/alloc"
	"github.com/vramkit/vram/device"
	"github.com/vramkit/vram/internal/units"
	"github.com/vramkit/vram/trace"
)

// replayRow is one allocator's replay of one trace: an element of `vram
// replay --json`'s array. Bytes are bytes.
type replayRow struct {
	Trace             string  `json:"trace"`
	Allocator         string  `json:"allocator"`
	Events            int     `json:"events"`
	Allocs            int     `json:"allocs"`
	Frees             int     `json:"frees"`
	PeakLiveBytes     uint64  `json:"peak_live_bytes"`
	PeakInUseBytes    uint64  `json:"peak_in_use_bytes"`
	PeakReservedBytes uint64  `json:"peak_reserved_bytes"`
	ReservedOverLive  float64 `json:"reserved_over_live"`
	DeviceAllocs      uint64  `json:"device_allocs"`
	DeviceFrees       uint64  `json:"device_frees"`
	CacheHits         uint64  `json:"cache_hits"`
	FailedAllocs      int     `json:"failed_allocs"`
	UnmatchedFrees    int     `json:"unmatched_frees"`
	EventsPerSecond   float64 `json:"events_per_second"`
	WallSeconds       float64 `json:"wall_seconds"`
	DeviceBytes       uint64  `json:"device_bytes"` // size of the simulated device

	// TracePeakLiveBytes is the trace's own peak of live bytes, as
	// logged; PeakLiveBytes is what this allocator's replay reached,
	// less where allocations failed.
	TracePeakLiveBytes uint64 `json:"trace_peak_live_bytes"`

	// PageBytes is the simulated device's page (its granularity);
	// FloorPages the pages the trace's peak of live bytes needs,
	// ⌈trace_peak_live_bytes / page_bytes⌉, which no allocator can hold
	// less than; PeakReservedPages the allocator's peak reserved bytes in
	// pages, rounded up.
	PageBytes         uint64 `json:"page_bytes"`
	FloorPages        uint64 `json:"floor_pages"`
	PeakReservedPages uint64 `json:"peak_reserved_pages"`

	// PyTorch is what PyTorch's own allocator did, for a snapshot input.
	PyTorch *pytorchFigures `json:"pytorch,omitempty"`

	// Summary is the allocator's memory report at its peak of reserved
	// bytes (--summary; replay_summary.go).
	Summary *summaryJSON `json:"summary,omitempty"`
	report  *alloc.MemoryReport

	traceIndex int // which of the command's traces, for grouping the table
}

type replayFlags struct {
	allocators string   // --allocator: comma-separated kinds
	vram       sizeFlag // --vram: device size; 0 bytes = large enough for the trace
	plot       string   // --plot: PNG or SVG file
	snapshot   string   // --snapshot-out: PyTorch snapshot of the first allocator's replay
	summary    bool     // --summary: each allocator's memory report at its peak
}

func (a *app) replayCommand() *cobra.Command {
	f := replayFlags{vram: *newSizeFlag("", "16GiB")}
	cmd := &cobra.Command{
		Use:   "replay TRACE.csv|SNAPSHOT.pickle...",
		Short: "Replay allocation logs against the allocators",
		Long: `Replay reads allocation logs in RAPIDS RMM's logging CSV format
(Thread,Time,Action,Pointer,Size,Stream — what alloc.Trace and RMM's
logging_resource_adaptor write), or PyTorch memory snapshots
(torch.cuda.memory._dump_snapshot pickles, known by their first bytes:
their allocation history, after the blocks live when recording began,
allocated at time 0), and replays each against the allocators
named by --allocator, each on a fresh address-only simulated device: its
memory has addresses but no bytes, so a log that peaked at tens of GB
replays on a laptop. --device is not used (though a malformed spec is
still refused): replays always run on the simulator. --vram is at least
2 MiB, one page of the simulator; a log with no events is an error.

For each allocator it reports the log's peak live bytes, the allocator's
peak reserved bytes (and their ratio: 1.0 wastes nothing), that peak in
pages of the simulated device beside the floor, the pages the log's peak
live bytes need (⌈peak live / page⌉, which no allocator can hold less
than), device allocations and frees, cache hits, allocations refused for
want of memory, and replay speed. For a snapshot it adds what PyTorch's own allocator
did on the GPU ("pytorch (recorded)": its peak reserved over its own peak
allocated, its segment allocations and frees). --plot draws live and
reserved bytes over the log. --snapshot-out writes the replay against the
first allocator named as a PyTorch snapshot (its segments at the end of
the log and every alloc, free and segment call), which PyTorch's memory
visualizer (pytorch.org/memory_viz) opens.`,
		Example: `  vram replay trace.csv
  vram replay --allocator pool --vram 16GiB --plot replay.svg trace.csv
  vram replay --json traces/*.csv
  vram replay memory_snapshot.pickle
  vram replay --allocator pool --snapshot-out pool.pickle trace.csv`,
		Args: usageArgs(1, -1, "at least one TRACE.csv or SNAPSHOT.pickle: an RMM logging CSV (Thread,Time,Action,Pointer,Size,Stream) or a PyTorch memory snapshot"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkSnapshotOut(f.snapshot, args); err != nil {
				return err
			}
			return a.replay(args, f)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.allocators, "allocator", allNames(), "comma-separated allocators to replay against: "+allocatorHelp())
	fl.Var(&f.vram, "vram", "simulated device memory, e.g. 16GiB (default: large enough for the trace)")
	fl.StringVar(&f.plot, "plot", "", "draw live and reserved bytes over the trace into this PNG or SVG file (one trace only)")
	fl.BoolVar(&f.summary, "summary", false, "print each allocator's memory report (allocated, reserved, cached, largest free block, fragmentation, segments, retries, out of memory) at its peak of reserved bytes")
	fl.StringVar(&f.snapshot, "snapshot-out", "", "write the replay against the first --allocator as a PyTorch memory snapshot (a .pickle for pytorch.org/memory_viz; one trace only)")
	return cmd
}

func (a *app) replay(paths []string, f replayFlags) error {
	kinds, err := parseAllocators(f.allocators)
	if err != nil {
		return err
	}
	base, err := device.ParseSpec(replaySpec)
	if err != nil {
		return err
	}
	if page := base.Info().Granularity; f.vram.set && f.vram.bytes < page {
		return usagef("--vram %s%s: want at least %s, one page of the simulated device (its granularity)",
			f.vram.text, f.vram.note(), units.Format(page))
	}
	if err := checkPlot(f.plot, paths); err != nil {
		return err
	}
	samples := 0
	if f.plot != "" {
		samples = trace.MaxSamples
	}

	bar := a.progress(len(paths)*len(kinds), "replaying")
	defer bar.Finish()
	var rows []replayRow
	var lines []timeline
	for ti, path := range paths {
		events, pytorch, err := readReplayTrace(a.ctx, path)
		if err != nil {
			return err
		}
		if len(events) == 0 {
			return emptyTrace(path)
		}
		spec, err := replaySpecFor(base, events, f.vram.bytes)
		if err != nil {
			return err
		}
		dinfo := spec.Info()
		sum := trace.Summarize(events)
		a.log.Debug("replay", "trace", path, "events", sum.Events, "peak_live", sum.PeakLive,
			"device_bytes", dinfo.TotalBytes)
		for ki, kind := range kinds {
			if err := a.ctx.Err(); err != nil {
				return err
			}
			res, rep, err := replayOne(a.ctx, events, spec, kind, trace.Options{Samples: samples}, snapshotFor(f.snapshot, ki), f.summary)
			if err != nil {
				return fmt.Errorf("replay %s against %s: %w", path, kind.Name, err)
			}
			rows = append(rows, withSummary(newReplayRow(path, kind.Name, ti, res, dinfo, sum, pytorch), rep))
			if samples > 0 {
				lines = append(lines, toTimeline(kind.Name, res.Samples))
			}
			bar.Add(1)
		}
	}
	bar.Finish()
	if f.plot != "" {
		title := fmt.Sprintf("%s: live and reserved bytes", filepath.Base(paths[0]))
		if err := plotTimelines(f.plot, title, lines); err != nil {
			return err
		}
		a.log.Debug("plot written", "file", f.plot)
	}
	if a.json {
		return a.writeJSON(rows)
	}
	return a.printReplay(rows, f.plot)
}

// readTrace reads a trace file, stopping soon after ctx is done (a large
// file takes seconds to read).
func readTrace(ctx context.Context, path string) ([]trace.Event, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("read trace: %w", err)
	}
	defer f.Close()
	events, err := trace.Read(ctxReader{ctx, f})
	if err != nil {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("read trace: %s: stopped before its end: %w", path, ctx.Err())
		}
		return nil, fmt.Errorf("read trace: %s: %w", path, err)
	}
	return events, nil
}

// ctxReader is a reader that fails once its context is done.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}

// newReplayRow is one allocator's replay of the ti-th trace, at path.
// pytorch is PyTorch's own figures when the trace is a snapshot, else nil.
func newReplayRow(path, kind string, ti int, res trace.Result, dinfo device.SpecInfo, sum trace.Summary, pytorch *pytorchFigures) replayRow {
	page := dinfo.Granularity
	return replayRow{
		Trace:              filepath.Base(path),
		Allocator:          kind,
		Events:             res.Events,
		Allocs:             res.Allocs,
		Frees:              res.Frees,
		PeakLiveBytes:      res.PeakLive,
		PeakInUseBytes:     res.PeakInUse,
		PeakReservedBytes:  res.PeakReserved,
		ReservedOverLive:   res.Fragmentation(),
		DeviceAllocs:       res.DeviceAllocs,
		DeviceFrees:        res.DeviceFrees,
		CacheHits:          res.CacheHits,
		FailedAllocs:       res.FailedAllocs,
		UnmatchedFrees:     res.UnmatchedFrees,
		EventsPerSecond:    res.EventsPerSec,
		WallSeconds:        res.Wall.Seconds(),
		DeviceBytes:        dinfo.TotalBytes,
		TracePeakLiveBytes: sum.PeakLive,
		PageBytes:          page,
		FloorPages:         pagesOf(sum.PeakLive, page),
		PeakReservedPages:  pagesOf(res.PeakReserved, page),
		PyTorch:            pytorch,
		traceIndex:         ti,
	}
}

// pagesText is n pages in words: "1 page", "52 pages".
func pagesText(n uint64) string {
	if n == 1 {
		return "1 page"
	}
	return fmt.Sprintf("%d pages", n)
}

// pagesOf is the pages of page bytes that n bytes need, ⌈n / page⌉.
func pagesOf(n, page uint64) uint64 {
	p := n / page
	if n%page != 0 {
		p++
	}
	return p
}

// emptyTrace is the error for a log with no events: an empty file, or one
// with only a header, blank lines or comments.
func emptyTrace(path string) error {
	what := "holds no allocation events"
	if st, err := os.Stat(path); err == nil && st.Size() == 0 {
		what = "is empty"
	}
	return fmt.Errorf("read trace: %s %s: want an RMM logging CSV, the header %s and then one line per allocate or free",
		path, what, trace.Header)
}

// toTimeline converts a replay's samples for plotting.
func toTimeline(kind string, samples []trace.Sample) timeline {
	t := timeline{Allocator: kind}
	for _, s := range samples {
		t.Events = append(t.Events, float64(s.Event))
		t.Live = append(t.Live, float64(s.Live))
		t.Reserved = append(t.Reserved, float64(s.Reserved))
	}
	return t
}

func (a *app) printReplay(rows []replayRow, plot string) error {
	for i := 0; i < len(rows); {
		r := rows[i]
		if i > 0 {
			fmt.Fprintln(a.stdout)
		}
		fmt.Fprintf(a.stdout, "%s: %d events, peak live %s (floor: %s of %s), on an address-only simulated device of %s\n",
			r.Trace, r.Events, units.Format(r.TracePeakLiveBytes), pagesText(r.FloorPages), units.Format(r.PageBytes), units.Format(r.DeviceBytes))
		if r.UnmatchedFrees > 0 {
			fmt.Fprintf(a.stdout, "%d frees of pointers never allocated in the trace were skipped\n", r.UnmatchedFrees)
		}
		tw := a.table()
		fmt.Fprintln(tw, "ALLOCATOR\tPEAK RESERVED\tRESERVED/LIVE\tPAGES (OVER FLOOR)\tDEVICE ALLOCS\tDEVICE FREES\tCACHE HITS\tFAILED\tEVENTS/S")
		for ; i < len(rows) && rows[i].traceIndex == r.traceIndex; i++ {
			r := rows[i]
			fmt.Fprintf(tw, "%s\t%s\t%.3f\t%d (%+d)\t%d\t%d\t%d\t%d\t%s\n", r.Allocator, units.Format(r.PeakReservedBytes),
				r.ReservedOverLive, r.PeakReservedPages, int64(r.PeakReservedPages)-int64(r.FloorPages), r.DeviceAllocs, r.DeviceFrees,
				r.CacheHits, r.FailedAllocs, rate(r.EventsPerSecond))
		}
		printPyTorch(tw, r.PyTorch)
		if err := tw.Flush(); err != nil {
			return err
		}
		fmt.Fprint(a.stdout, pytorchNote(r.PyTorch))
	}
	printSummaries(a.stdout, rows)
	if plot != "" {
		fmt.Fprintf(a.stdout, "\nplot: %s\n", plot)
	}
	return nil
}

// rate writes a per-second figure with a metric suffix ("1.2M").
func rate(v float64) string {
	switch {
	case v >= 1e9:
		return fmt.Sprintf("%.1fG", v/1e9)
	case v >= 1e6:
		return fmt.Sprintf("%.1fM", v/1e6)
	case v >= 1e3:
		return fmt.Sprintf("%.1fk", v/1e3)
	}
	return fmt.Sprintf("%.0f", v)
}

// checkPlot checks --plot (if given) before any replay: a format we
// write, one trace, and a path that is not the trace nor anything but a
// regular file.
func checkPlot(plot string, paths []string) error {
	if plot == "" {
		return nil
	}
	if err := checkPlotPath(plot); err != nil {
		return err
	}
	if err := checkOutput("--plot", plot, paths); err != nil {
		return err
	}
	if len(paths) > 1 {
		return usagef("--plot draws one trace; give one TRACE.csv (got %d)", len(paths))
	}
	return nil
}
