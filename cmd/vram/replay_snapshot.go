// `vram replay` and PyTorch memory snapshots: a .pickle input is read as
// a log (with what PyTorch itself reserved, printed beside the
// allocators), and --snapshot-out writes a replay as a snapshot for
// PyTorch's memory visualizer.

package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"text/tabwriter"

	"github.com/vramkit/vram/alloc"
	"github.com/vramkit/vram/device"
	"github.com/vramkit/vram/internal/units"
	"github.com/vramkit/vram/internal/userfile"
	"github.com/vramkit/vram/trace"
)

// pytorchFigures are a snapshot's figures of PyTorch's own allocator, in
// `vram replay --json`'s rows of a snapshot. Bytes are bytes.
type pytorchFigures struct {
	PeakReservedBytes    uint64  `json:"peak_reserved_bytes"`
	ReservedAtStartBytes uint64  `json:"reserved_at_start_bytes"`
	PeakAllocatedBytes   uint64  `json:"peak_allocated_bytes"`
	ReservedOverLive     float64 `json:"reserved_over_live"` // PeakReservedBytes / PeakAllocatedBytes
	Segments             int     `json:"segments"`
	SegmentAllocs        int     `json:"segment_allocs"`
	SegmentFrees         int     `json:"segment_frees"`
	LiveAtStartBlocks    int     `json:"live_at_start_blocks"`
}

// readReplayTrace reads a replay's input: a PyTorch memory snapshot (a
// pickle, known by its first bytes) with PyTorch's figures, or else an
// RMM logging CSV, with none.
func readReplayTrace(ctx context.Context, path string) ([]trace.Event, *pytorchFigures, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, nil, err
	}
	head := make([]byte, 2)
	n, _ := io.ReadFull(f, head)
	f.Close()
	if !trace.IsSnapshot(head[:n]) {
		events, err := readTrace(ctx, path)
		return events, nil, err
	}
	s, err := trace.ReadSnapshotFile(path)
	if err != nil {
		return nil, nil, fmt.Errorf("read trace: %w", err)
	}
	p := s.PyTorch
	pf := &pytorchFigures{
		PeakReservedBytes:    p.PeakReserved,
		ReservedAtStartBytes: p.ReservedAtStart,
		PeakAllocatedBytes:   p.PeakAllocated,
		Segments:             p.Segments,
		SegmentAllocs:        p.SegmentAllocs,
		SegmentFrees:         p.SegmentFrees,
		LiveAtStartBlocks:    s.LiveAtStart,
	}
	if p.PeakAllocated > 0 {
		pf.ReservedOverLive = float64(p.PeakReserved) / float64(p.PeakAllocated)
	}
	return s.Events, pf, nil
}

// checkSnapshotOut checks --snapshot-out before any replay runs: one
// trace, a directory that exists, and a path that is not the trace nor
// anything but a regular file.
func checkSnapshotOut(path string, traces []string) error {
	if path == "" {
		return nil
	}
	if len(traces) > 1 {
		return usagef("--snapshot-out records one replay; give one trace (got %d)", len(traces))
	}
	if d := filepath.Dir(path); d != "." {
		if st, err := os.Stat(d); err != nil || !st.IsDir() {
			return usagef("--snapshot-out %s: the directory %s does not exist", path, d)
		}
	}
	return checkOutput("--snapshot-out", path, traces)
}

// checkOutput refuses an output path of flag that is one of the inputs
// or exists and is not a regular file: a usage error.
func checkOutput(flag, path string, inputs []string) error {
	if _, _, err := userfile.Check(path, userfile.Options{Inputs: inputs}); err != nil {
		if errors.Is(err, userfile.ErrIsInput) || errors.Is(err, userfile.ErrNotRegular) {
			return usagef("%s: %w", flag, err)
		}
		return fmt.Errorf("%s: %w", flag, err)
	}
	return nil
}

// snapshotFor is the --snapshot-out file for the replay against the
// ki-th allocator: only the first is written.
func snapshotFor(path string, ki int) string {
	if ki != 0 {
		return ""
	}
	return path
}

// replaySpec is the simulator replays run on: address-only (they need
// no bytes), with a context that takes nothing.
const replaySpec = "sim:backed=false,context=0"

// replaySpecFor is the device a replay of events runs on: base
// (replaySpec, read) of size bytes, or with size 0 of the size
// trace.DeviceBytes gives at its granularity.
func replaySpecFor(base device.Spec, events []trace.Event, size uint64) (device.Spec, error) {
	if size == 0 {
		size = trace.DeviceBytes(events, base.Info().Granularity)
	}
	if size == 0 {
		return base, nil // nothing to hold: the simulator's default size
	}
	return base.WithTotal(size)
}

// specFactory makes a fresh device of spec on each call: the device of
// one replay (trace.DeviceFactory).
func specFactory(spec device.Spec) trace.DeviceFactory {
	return func() (device.Device, error) {
		dev, _, err := device.OpenSpec(spec)
		return dev, err
	}
}

// replayKind replays events against one allocator; when snapshotOut is
// set, it records the replay and writes it there as a PyTorch snapshot.
func replayKind(ctx context.Context, events []trace.Event, spec device.Spec, kind alloc.Entry, opts trace.Options, snapshotOut string) (trace.Result, error) {
	newAlloc := func(dev device.Device) (alloc.Allocator, error) { return kind.New(dev, alloc.Configs{}) }
	if snapshotOut == "" {
		return trace.ReplayOnContext(ctx, events, specFactory(spec), newAlloc, opts)
	}
	res, h, err := trace.RecordReplay(events, specFactory(spec), newAlloc, opts)
	if err != nil {
		return res, err
	}
	if err := trace.WriteSnapshotFile(snapshotOut, h); err != nil {
		return res, fmt.Errorf("--snapshot-out: %w", err)
	}
	return res, nil
}

// printPyTorch adds PyTorch's own figures to a snapshot's table, in the
// columns they share with the allocators.
func printPyTorch(tw *tabwriter.Writer, p *pytorchFigures) {
	if p == nil {
		return
	}
	fmt.Fprintf(tw, "pytorch (recorded)\t%s\t%.3f\t-\t%d\t%d\t-\t-\t-\n", units.Format(p.PeakReservedBytes),
		p.ReservedOverLive, p.SegmentAllocs, p.SegmentFrees)
}

// pytorchNote is the line under a snapshot's table that explains
// PyTorch's row.
func pytorchNote(p *pytorchFigures) string {
	if p == nil {
		return ""
	}
	return fmt.Sprintf("pytorch (recorded): PyTorch's allocator on the GPU: %s held at the start, %d segments used, reserved/live over its own peak allocated (%s); %d blocks live at the start replayed as allocated at time 0\n",
		units.Format(p.ReservedAtStartBytes), p.Segments, units.Format(p.PeakAllocatedBytes), p.LiveAtStartBlocks)
}
