package vram

// PlanError: why a request set does not fit its budget, with the figures
// and what to change; the hints and the rounding of its figures.

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"math/bits"
	"slices"
	"strconv"
	"strings"

	"github.com/vramkit/vram/internal/units"
)

// PlanError is the error Plan returns when a request set cannot be made
// to fit. It wraps ErrUnchunkable or ErrRunTooLarge and carries the
// figures its message is made of. It is immutable once returned and safe
// to share.
type PlanError struct {
	Err              error  // ErrUnchunkable or ErrRunTooLarge
	Need             uint64 // device bytes the smallest possible plan needs
	Budget           uint64 // the budget, bytes
	UnchunkableBytes uint64 // U
	RunBytes         uint64 // C(1): chunkable bytes of one run (one buffer)
	Buffers          int    // k
	Chunkable        int    // number of chunkable device requests
	Pages            uint64 // bytes of Need beyond the rounded sizes: what the allocator takes in whole device pages (PlanOptions.Cost)
	UnchunkableCost  uint64 // U as the allocator takes it from the device (PlanOptions.Cost); U without one
	Hint             string // what to change
}

// Error says what the smallest plan needs, what the budget is, and what to
// change.
func (e *PlanError) Error() string {
	// What is needed is rounded up and what there is down, so that the
	// two never read the same.
	var b strings.Builder
	run := satMul(uint64(max(e.Buffers, 1)), e.RunBytes)
	pages := ""
	if e.Pages > 0 {
		pages = fmt.Sprintf(", with %s the allocator takes in whole device pages", bytesUp(e.Pages))
	}
	switch {
	case e.Chunkable == 0:
		fmt.Fprintf(&b, "the arrays need %s%s but the budget is %s, and none of them can be chunked",
			needed(e.Need), pages, bytesDown(e.Budget))
	case errors.Is(e.Err, ErrUnchunkable) && e.UnchunkableBytes == 0:
		fmt.Fprintf(&b, "the budget is %s, leaving no room for any run: one run of the chunked arrays needs %s (%d × %s per run%s)",
			bytesDown(e.Budget), bytesUp(max(run, e.Need)), e.Buffers, bytesUp(e.RunBytes), pages)
	case errors.Is(e.Err, ErrUnchunkable):
		fixed := bytesUp(e.UnchunkableBytes)
		if e.UnchunkableCost > e.UnchunkableBytes {
			fixed += fmt.Sprintf(" (%s in whole device pages)", bytesUp(e.UnchunkableCost))
		}
		fmt.Fprintf(&b, "unchunkable arrays need %s but the budget is %s, leaving no room for any run (one run of the chunked arrays needs %s more, %s in all%s)",
			fixed, bytesDown(e.Budget), bytesUp(run), needed(e.Need), pages)
	default:
		fmt.Fprintf(&b, "one run needs %s (unchunkable %s + %d × %s per run%s) but the budget is %s",
			needed(e.Need), bytesUp(e.UnchunkableBytes), e.Buffers, bytesUp(e.RunBytes), pages, bytesDown(e.Budget))
	}
	if e.Hint != "" {
		b.WriteString("; ")
		b.WriteString(e.Hint)
	}
	b.WriteString(": ")
	b.WriteString(e.Err.Error())
	return b.String()
}

// Unwrap returns ErrUnchunkable or ErrRunTooLarge.
func (e *PlanError) Unwrap() error { return e.Err }

// unchunkableError is the PlanError of a set that does not fit and has no
// room for a run.
func (pl *planner) unchunkableError(budget uint64) error {
	e := &PlanError{Err: ErrUnchunkable, Budget: budget, UnchunkableBytes: pl.u, UnchunkableCost: pl.fixedCost(),
		Buffers: pl.k, Chunkable: pl.nChunkableDev, RunBytes: chunkBytes(pl.devRuns, 1, pl.g)}
	if pl.nChunkableDev == 0 {
		e.Need = pl.device(pl.runs, 1)
		e.Pages = e.Need - min(e.Need, satAdd(pl.u, chunkBytes(pl.devRuns, pl.runs, pl.g)))
		largest := largestUnchunkable(pl.items, 3)
		if pl.beyondDevice(e.Need - e.Pages) {
			e.Hint = fmt.Sprintf("give the largest requests a chunk axis along their runs (%s), or shrink them: %s", largest, pl.deviceNote(e.Need-e.Pages))
			return e
		}
		e.Hint = fmt.Sprintf("give the largest requests a chunk axis along their runs (%s), or %s", largest, raiseHint(e.Need, budget))
		pl.addMore(e)
		return e
	}
	e.Need = pl.device(1, pl.k)
	e.Pages = e.Need - min(e.Need, satAdd(pl.u, satMul(uint64(pl.k), e.RunBytes)))
	switch arrays := e.Need - e.Pages; {
	case pl.beyondDevice(arrays) && pl.u > 0:
		e.Hint = "make the large fixed inputs chunkable or shrink them: " + pl.deviceNote(arrays)
		return e
	case pl.beyondDevice(arrays):
		e.Hint = "make the per-run arrays smaller: " + pl.deviceNote(arrays)
		return e
	case pl.u > 0:
		e.Hint = fmt.Sprintf("make the large fixed inputs chunkable, shrink them, or %s", raiseHint(e.Need, budget))
	default:
		e.Hint = raiseHint(e.Need, budget)
	}
	pl.addMore(e)
	return e
}

// beyondDevice reports whether the arrays' bytes (a need less what the
// allocator takes in whole pages, which fewer, larger arrays may save)
// are more than the whole device holds (PlanOptions.DeviceBytes): then no
// budget, and nothing the caller frees, can hold them.
func (pl *planner) beyondDevice(need uint64) bool { return pl.deviceBytes > 0 && need > pl.deviceBytes }

// deviceNote says by how much the arrays' bytes pass the whole device.
func (pl *planner) deviceNote(need uint64) string {
	return fmt.Sprintf("that is %s more than the device's %s in all", bytesUp(need-pl.deviceBytes), bytesDown(pl.deviceBytes))
}

// runTooLargeError is the PlanError of a set whose one run (in k buffers)
// needs more than budget.
func (pl *planner) runTooLargeError(budget, need uint64) error {
	c1 := chunkBytes(pl.devRuns, 1, pl.g)
	e := &PlanError{Err: ErrRunTooLarge, Need: need, Budget: budget, UnchunkableBytes: pl.u,
		RunBytes: c1, Buffers: pl.k, Chunkable: pl.nChunkableDev}
	e.Pages = need - min(need, satAdd(pl.u, satMul(uint64(pl.k), c1)))
	arrays := need - e.Pages
	var ways []string
	if !pl.beyondDevice(arrays) {
		ways = append(ways, raiseHint(need, budget))
	}
	if pl.k > 1 {
		ways = append(ways, "use fewer buffers in flight")
	}
	if pl.u > 0 {
		ways = append(ways, "make more of the fixed arrays chunkable")
	}
	ways = append(ways, "make the per-run arrays smaller")
	e.Hint = ways[0]
	if len(ways) > 1 {
		e.Hint = strings.Join(ways[:len(ways)-1], ", ") + " or " + ways[len(ways)-1]
	}
	if pl.beyondDevice(arrays) {
		e.Hint += ": " + pl.deviceNote(arrays)
		return e
	}
	pl.addMore(e)
	return e
}

// addMore ends e's hint with what the caller says would help besides
// (PlanOptions.more), before e is returned: a PlanError does not change
// once it is.
func (pl *planner) addMore(e *PlanError) {
	if pl.more != nil {
		e.Hint += "; " + pl.more()
	}
}

// runsMismatch builds the error for chunkable requests that disagree on
// their runs, listing each distinct count with the requests that have it.
func runsMismatch(owners []planOwner) error {
	by := map[int][]string{}
	for _, o := range owners {
		for label, r := range o.reqs {
			if r.Chunkable() {
				by[r.Runs()] = append(by[r.Runs()], o.name+"/"+label)
			}
		}
	}
	counts := make([]int, 0, len(by))
	for n := range by {
		counts = append(counts, n)
	}
	slices.Sort(counts)
	parts := make([]string, 0, len(counts))
	for _, n := range counts {
		names := by[n]
		slices.Sort(names)
		parts = append(parts, fmt.Sprintf("%d runs: %s", n, strings.Join(names, ", ")))
	}
	return fmt.Errorf("chunkable requests planned together must have the same number of runs, but %s; fix TotalRuns or mark the odd ones unchunkable: %w",
		strings.Join(parts, "; "), ErrRunsMismatch)
}

// largestUnchunkable names the n largest unchunkable device requests and
// why each cannot be chunked, for an error's hint.
func largestUnchunkable(items []planItem, n int) string {
	var fixed []planItem
	for _, it := range items {
		if !it.chunkable && it.req.Memory.OnDevice() {
			fixed = append(fixed, it)
		}
	}
	slices.SortFunc(fixed, func(a, b planItem) int {
		if c := cmp.Compare(b.fixed, a.fixed); c != 0 {
			return c
		}
		return cmp.Compare(a.client+"/"+a.label, b.client+"/"+b.label)
	})
	parts := make([]string, 0, n)
	for _, it := range fixed[:min(n, len(fixed))] {
		r := it.req
		var why string
		switch {
		case r.Unchunkable:
			why = "marked unchunkable"
		case r.ChunkAxis >= len(r.Shape):
			why = fmt.Sprintf("chunk axis %d, but its shape %v has %d axes", r.ChunkAxis, r.Shape, len(r.Shape))
		default:
			why = fmt.Sprintf("its chunk axis %d has length 1", r.ChunkAxis)
		}
		parts = append(parts, fmt.Sprintf("%s/%s: %s, %s", it.client, it.label, units.Format(it.fixed), why))
	}
	return strings.Join(parts, "; ")
}

// raiseHint says how much more budget need takes, or, when the shortfall
// is within a TiB of 2⁶⁴ (need saturated, or its figure rounded up would
// pass 2⁶⁴), that no budget can hold it.
func raiseHint(need, budget uint64) string {
	if short := need - min(need, budget); need < math.MaxUint64 && short <= math.MaxUint64-units.TiB {
		return "raise the budget by " + bytesUp(short)
	}
	return "shrink the arrays (they need about 16 EiB more than the budget, more than any budget can give)"
}

// needed writes a need rounded up, saying "or more" for a saturated
// figure (a sum that passed 2⁶⁴−1 bytes).
func needed(n uint64) string {
	if n == math.MaxUint64 {
		return bytesUp(n) + " or more"
	}
	return bytesUp(n)
}

// bytesUp writes n bytes as units.Format does ("1.5 KiB", "256 MiB"),
// rounded up to the decimal shown, so that a shortfall it names is
// enough: "raise the budget by 1.1 KiB" for 1,048 bytes, not "1 KiB".
func bytesUp(n uint64) string { return bytesRounded(n, true) }

// bytesDown writes n bytes rounded down to the decimal shown, for what
// there is.
func bytesDown(n uint64) string { return bytesRounded(n, false) }

func bytesRounded(n uint64, up bool) string {
	unit, name := uint64(units.TiB), "TiB"
	switch {
	case n < units.KiB:
		return strconv.FormatUint(n, 10) + " B"
	case n < units.MiB:
		unit, name = units.KiB, "KiB"
	case n < units.GiB:
		unit, name = units.MiB, "MiB"
	case n < units.TiB:
		unit, name = units.GiB, "GiB"
	}
	hi, lo := bits.Mul64(n, 10) // tenths of a unit: hi < 10 < unit
	tenths, rem := bits.Div64(hi, lo, unit)
	if up && rem > 0 {
		tenths++
	}
	s := strconv.FormatUint(tenths/10, 10)
	if d := tenths % 10; d != 0 {
		s += "." + strconv.FormatUint(d, 10)
	}
	return s + " " + name
}
