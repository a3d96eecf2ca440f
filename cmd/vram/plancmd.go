// `vram plan`: a request set in JSON (vram.RequestSet, the library's
// schema) → the chunk plan vram.Plan makes for it.

package main

import (
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strings"

	"github.com/spf13/cobra"

	"github.com/vramkit/vram"
	"github.com/vramkit/vram/alloc"
	"github.com/vramkit/vram/batch"
	"github.com/vramkit/vram/internal/units"
)

// planFlags are plan's own flags; each overrides the input's value.
type planFlags struct {
	budget      string // --budget: a size; "" = the input's, else the device's free memory
	granularity string // --granularity: a size; "" = the input's, else the allocator's
	buffers     int    // --buffers: 0 = the input's, else 1
	allocator   string // --allocator: whose granularity to plan for
}

func (a *app) planCommand() *cobra.Command {
	var f planFlags
	cmd := &cobra.Command{
		Use:   "plan [FILE]",
		Short: "Plan how a request set is chunked to fit a memory budget",
		Long: `Plan reads a request set as JSON from FILE, or from stdin when FILE is
missing or "-", and prints the chunk plan: how many chunks, how many runs in
each, the bytes one chunk takes and each array's chunked shape.

	{"budget": 268435456, "granularity": 512, "buffers": 1,
	 "requests": {"outputs": {"state": {"shape": [201, 4, 1000000],
	   "dtype": "float32", "chunk_axis": 2, "unchunkable": false,
	   "total_runs": 1000000}}}}

"requests" maps client → label → array request; "shape" and "dtype" are
required, "chunk_axis" defaults to 0 (an axis past the shape is refused
unless "unchunkable" is true), "total_runs" to the length of the chunk
axis, "memory" (device, pinned, mapped or pageable) to device. "budget"
(bytes, or a string such as "256MiB") defaults to the device's free
memory, "granularity" to the allocator's, "buffers" (2 for double
buffering) to 1; the flags below override all three.

A request set that cannot be read, or that does not fit (a planning error),
exits 1 with the reason on stderr.`,
		Example: `  vram plan requests.json
  echo '{"requests": {"out": {"x": {"shape": [100, 1000000], "dtype": "float64", "chunk_axis": 1}}}}' | vram plan --budget 256MiB
  vram plan --json --buffers 2 requests.json`,
		Args: usageArgs(0, 1, "request set FILE (or - for stdin)"),
		RunE: func(cmd *cobra.Command, args []string) error {
			name := "-"
			if len(args) == 1 {
				name = args[0]
			}
			return a.plan(name, f, cmd.Flags().Changed("buffers"))
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.budget, "budget", "", "device bytes the plan may use, e.g. 256MiB (default: the input's, else the device's free memory)")
	fl.StringVar(&f.granularity, "granularity", "", "allocation rounding unit, e.g. 512 or 2MiB (default: the input's, else the allocator's)")
	fl.IntVar(&f.buffers, "buffers", 0, "chunk buffers in flight, 1 to 3 (default: the input's, else 1)")
	fl.StringVar(&f.allocator, "allocator", planAllocator, "allocator whose granularity to plan for: "+allocatorHelp())
	return cmd
}

func (a *app) plan(name string, f planFlags, buffersSet bool) error {
	// Check the flags before reading anything.
	var budget, gran uint64
	var err error
	if f.budget != "" {
		if budget, err = units.ParseSize(f.budget); err != nil || budget == 0 {
			return usagef("--budget %q: want a positive size such as 256MiB", f.budget)
		}
	}
	if f.granularity != "" {
		if gran, err = units.ParseSize(f.granularity); err != nil || gran == 0 {
			return usagef("--granularity %q: want a positive size such as 512 or 2MiB", f.granularity)
		}
	}
	if buffersSet && (f.buffers < 1 || f.buffers > batch.MaxBuffers) {
		return usagef("--buffers %d: want 1, or up to %d buffers in flight", f.buffers, batch.MaxBuffers)
	}
	al, err := lookupAllocator(f.allocator)
	if err != nil {
		return err
	}
	in, src, err := a.readRequestSet(name)
	if err != nil {
		return err
	}
	if budget == 0 {
		budget = in.Budget
	}
	if gran == 0 {
		gran = in.Granularity
	}
	buffers := in.Buffers
	if buffersSet {
		buffers = f.buffers
	}
	if buffers == 0 {
		buffers = 1
	}
	// What the input leaves open comes from the device.
	from := planFrom{budget: budget, gran: gran, budgetFrom: "given", granFrom: "given"}
	if budget == 0 || gran == 0 {
		if from, err = a.planDevice(from, al); err != nil {
			return err
		}
	}
	a.log.Debug("plan", "budget", from.budget, "budget_from", from.budgetFrom, "granularity", from.gran,
		"granularity_from", from.granFrom, "buffers", buffers)
	plan, err := vram.Plan(in.Requests, from.budget, vram.PlanOptions{Granularity: from.gran, Buffers: buffers, DeviceBytes: from.deviceBytes})
	if err != nil {
		err = fmt.Errorf("%s: %w", src, err)
		// Say how to change the figures the hint talks about, unless the
		// need passes the whole device, and the hint says to shrink it.
		if pe := (*vram.PlanError)(nil); errors.As(err, &pe) && (from.deviceBytes == 0 || pe.Need <= from.deviceBytes) {
			how := "--budget overrides the request set's \"budget\""
			if pe.Buffers > 1 {
				how = "--budget and --buffers override the request set's \"budget\" and \"buffers\""
			}
			err = fmt.Errorf("%w\n%s", err, how)
		}
		return err
	}
	if a.json {
		return a.writeJSON(plan)
	}
	return a.printPlan(plan, in, from.budgetFrom, from.granFrom)
}

// planFrom is a plan's budget and granularity, with where each came
// from, and the device's whole memory when the budget is its free memory.
type planFrom struct {
	budget, gran         uint64
	budgetFrom, granFrom string
	deviceBytes          uint64 // 0: the budget was given
}

// readRequestSet reads the request set of FILE name ("-": stdin) and
// says where it came from, for messages.
func (a *app) readRequestSet(name string) (vram.RequestSet, string, error) {
	var r io.Reader = a.stdin
	src := "stdin"
	if name != "-" {
		file, err := os.Open(name)
		if err != nil {
			return vram.RequestSet{}, "", fmt.Errorf("read request set: %w", err)
		}
		defer file.Close()
		r, src = file, name
	} else if r == nil || isTerminal(r) {
		return vram.RequestSet{}, "", usagef("plan reads a request set from FILE or from stdin, and stdin is a terminal; give a file or pipe JSON in")
	}
	in, err := vram.ReadRequestSet(r)
	if err != nil {
		return in, src, fmt.Errorf("%s: %w", src, err)
	}
	if in.Buffers > batch.MaxBuffers { // what package batch runs
		return in, src, fmt.Errorf("%s: buffers is %d; want 1, or up to %d buffers in flight: %w", src, in.Buffers, batch.MaxBuffers, vram.ErrRequestSet)
	}
	return in, src, nil
}

// planDevice fills a budget or granularity left 0 from the device: its
// free memory, and the granularity of the allocator al on it, saying
// where each came from.
func (a *app) planDevice(from planFrom, al alloc.Entry) (planFrom, error) {
	dev, fallback, err := a.openDevice(a.spec)
	if err != nil {
		return from, err
	}
	defer dev.Close()
	if from.budget == 0 {
		free, total, err := dev.MemInfo()
		if err != nil {
			return from, fmt.Errorf("read the device's free memory for the budget: %w", err)
		}
		info := dev.Info()
		from.budget, from.deviceBytes = free, total
		from.budgetFrom = fmt.Sprintf("free memory of %s:%d, %s", info.Backend, info.Ordinal, info.Name)
		if fallback != nil {
			from.budgetFrom += ", as auto found no GPU"
		}
		from.budgetFrom += "; --budget to choose"
	}
	if from.gran == 0 {
		if from.gran, err = allocatorGranularity(al, dev); err != nil {
			return from, err
		}
		from.granFrom = "the " + al.Name + " allocator's"
	}
	return from, nil
}

func (a *app) printPlan(p vram.ChunkPlan, in vram.RequestSet, budgetFrom, granFrom string) error {
	w := a.stdout
	if p.Chunks == 1 {
		fmt.Fprintf(w, "fits in one chunk: %d runs\n", p.TotalRuns)
	} else {
		fmt.Fprintf(w, "%d chunks × %d runs (last chunk %d), %d runs in all\n",
			p.Chunks, p.ChunkLength, p.LastChunkLength, p.TotalRuns)
	}
	fmt.Fprintf(w, "budget       %s (%s)\n", units.Format(p.Budget), budgetFrom)
	fmt.Fprintf(w, "granularity  %s (%s)\n", units.Format(p.Granularity), granFrom)
	fmt.Fprintf(w, "buffers      %d in flight\n", p.Buffers)
	fmt.Fprintf(w, "device       %s per chunk = %s unchunkable + %d × %s chunked",
		units.Format(p.BytesPerChunk), units.Format(p.UnchunkableBytes), p.Buffers, units.Format(p.ChunkBytes))
	if p.Chunks > 1 {
		fmt.Fprintf(w, " (all at once: %s)", units.Format(p.FullBytes))
	}
	fmt.Fprintln(w)
	if p.HostBytes > 0 {
		fmt.Fprintf(w, "host         %s of host arrays per chunk (not counted in the budget)\n", units.Format(p.HostBytes))
	}
	fmt.Fprintln(w)
	tw := a.table()
	fmt.Fprintln(tw, "CLIENT\tLABEL\tDTYPE\tMEMORY\tSHAPE\tCHUNKED SHAPE\tBYTES")
	for _, client := range slices.Sorted(maps.Keys(p.ChunkedShapes)) {
		labels := p.ChunkedShapes[client]
		for _, label := range slices.Sorted(maps.Keys(labels)) {
			req := in.Requests[client][label]
			shape := labels[label]
			r := req
			r.Shape = shape
			note := ""
			if !req.Chunkable() {
				note = " (unchunkable)"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s%s\t%s\n", client, label, req.DType, req.Memory,
				shapeString(req.Shape), shapeString(shape), note, units.Format(r.Bytes()))
		}
	}
	return tw.Flush()
}

// shapeString writes a shape as 201×4×1000000.
func shapeString(shape []int) string {
	return strings.ReplaceAll(strings.Trim(fmt.Sprint(shape), "[]"), " ", "×")
}
