package vram

// The chunk planner: a pure function from a set of array requests and a
// byte budget to the number of chunks and their length.
//
// Definitions (N = runs, L = a chunk length, g = granularity, k = buffers
// in flight):
//
//	bytes(r, L) = roundup(elements of r's shape with its chunk axis set to L
//	              (chunkable) or as is (unchunkable) × dtype size, g)
//	U    = Σ bytes(r, ·) over unchunkable device requests
//	C(L) = Σ bytes(r, L) over chunkable device requests
//	B    = the budget
//
// If U + C(N) ≤ B there is one chunk of length N. Otherwise, if there is
// no chunkable device request or U ≥ B: ErrUnchunkable; if U + k·C(1) > B:
// ErrRunTooLarge; else Lmax is the largest L with U + k·C(L) ≤ B (found by
// bisection: C is non-decreasing), chunks = ⌈N/Lmax⌉ and the chunk length
// is ⌈N/chunks⌉, so chunks are balanced and no plan with fewer chunks fits.
//
// Only device requests spend the budget; host requests (pinned, mapped,
// pageable) are chunked alike (their shapes follow the chunk length) but
// are counted apart, in HostBytes.

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

// DefaultGranularity is the rounding Plan uses when PlanOptions gives
// none: the allocation unit of the caching pools (CuPy, PyTorch, RMM).
const DefaultGranularity = 512

// PlanOptions tune Plan. The zero value plans for a granularity of 512
// bytes and one buffer in flight. A plain value, safe to share.
type PlanOptions struct {
	// Granularity is the allocator's rounding unit in bytes; each
	// request's bytes are rounded up to it. 0 means DefaultGranularity.
	Granularity uint64 `json:"granularity,omitempty"`
	// Buffers is the number of chunk buffers in flight (k): 1, or 2 for
	// double buffering, which overlaps one chunk's copies with another's
	// compute. Values below 1 mean 1.
	Buffers int `json:"buffers,omitempty"`
}

// ChunkPlan is the result of Plan. It marshals to JSON as is. It is a
// value whose maps are not changed after Plan returns: safe to read from
// many goroutines, not to modify while others read it.
type ChunkPlan struct {
	// Chunks is the number of passes the runs take (≥ 1).
	Chunks int `json:"chunks"`
	// ChunkLength is the number of runs per chunk, the length the chunk
	// axis of every chunkable request is allocated with.
	ChunkLength int `json:"chunk_length"`
	// LastChunkLength is the number of runs in the last chunk (≤
	// ChunkLength).
	LastChunkLength int `json:"last_chunk_length"`
	// TotalRuns is N, the number of runs.
	TotalRuns int `json:"total_runs"`
	// Buffers is the number of chunk buffers the plan allocates: 1 for a
	// single chunk, else PlanOptions.Buffers.
	Buffers int `json:"buffers"`
	// Granularity is the rounding unit the bytes were counted in.
	Granularity uint64 `json:"granularity"`
	// Budget is the device budget B the plan was made for.
	Budget uint64 `json:"budget_bytes"`
	// UnchunkableBytes is U, the device bytes of unchunkable requests.
	UnchunkableBytes uint64 `json:"unchunkable_bytes"`
	// ChunkBytes is C(ChunkLength), the device bytes of one buffer of the
	// chunkable requests.
	ChunkBytes uint64 `json:"chunk_bytes"`
	// BytesPerChunk is the device bytes the plan allocates:
	// UnchunkableBytes + Buffers × ChunkBytes. It is ≤ Budget.
	BytesPerChunk uint64 `json:"bytes_per_chunk"`
	// FullBytes is U + C(N), the device bytes of everything unchunked.
	FullBytes uint64 `json:"full_bytes"`
	// HostBytes is the host bytes (pinned, mapped, pageable) of one
	// buffer at the chunk length; they do not spend the device budget.
	HostBytes uint64 `json:"host_bytes"`
	// ChunkedShapes gives, per client and label, the shape to allocate:
	// the request's shape with the chunk axis set to ChunkLength for a
	// chunkable request, the shape as asked for the others.
	ChunkedShapes map[string]map[string][]int `json:"chunked_shapes"`
}

// Chunk returns the runs of chunk i (0 ≤ i < Chunks): they start at run
// start and number n (ChunkLength, or LastChunkLength for the last).
func (p ChunkPlan) Chunk(i int) (start, n int) {
	if i < 0 || i >= p.Chunks {
		return 0, 0
	}
	start = i * p.ChunkLength
	return start, min(p.ChunkLength, p.TotalRuns-start)
}

// Span returns chunk i as the Span of axis to copy with ToDeviceChunk and
// FromDeviceChunk.
func (p ChunkPlan) Span(i, axis int) Span {
	start, n := p.Chunk(i)
	return Span{Axis: axis, Start: start, Len: n}
}

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
	Hint             string // what to change
}

// Error says what the smallest plan needs, what the budget is, and what to
// change.
func (e *PlanError) Error() string {
	// What is needed is rounded up and what there is down, so that the
	// two never read the same.
	var b strings.Builder
	run := satMul(uint64(max(e.Buffers, 1)), e.RunBytes)
	switch {
	case e.Chunkable == 0:
		fmt.Fprintf(&b, "the arrays need %s but the budget is %s, and none of them can be chunked",
			bytesUp(e.Need), bytesDown(e.Budget))
	case errors.Is(e.Err, ErrUnchunkable) && e.UnchunkableBytes == 0:
		fmt.Fprintf(&b, "the budget is %s, leaving no room for any run: one run of the chunked arrays needs %s (%d × %s per run)",
			bytesDown(e.Budget), bytesUp(run), e.Buffers, bytesUp(e.RunBytes))
	case errors.Is(e.Err, ErrUnchunkable):
		fmt.Fprintf(&b, "unchunkable arrays need %s but the budget is %s, leaving no room for any run (one run of the chunked arrays needs %s more, %s in all)",
			bytesUp(e.UnchunkableBytes), bytesDown(e.Budget), bytesUp(run), bytesUp(e.Need))
	default:
		fmt.Fprintf(&b, "one run needs %s (unchunkable %s + %d × %s per run) but the budget is %s",
			bytesUp(e.Need), bytesUp(e.UnchunkableBytes), e.Buffers, bytesUp(e.RunBytes), bytesDown(e.Budget))
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

// planItem is one request as the planner sees it.
type planItem struct {
	client, label string
	req           ArrayRequest
	chunkable     bool
	perRun        uint64 // chunkable: bytes of one run (axis set to 1), unrounded
	fixed         uint64 // unchunkable: bytes, unrounded
}

// Plan decides how many chunks a request set takes under a budget of
// device bytes. requests maps client → label → request (the clients
// planned together, e.g. one stream group). Plan is a pure function: the
// same input always gives the same plan, and it touches no device.
//
// The rules (N = runs, L = chunk length, k = opts.Buffers, B = budget):
// a request is chunkable unless Unchunkable, or its shape has no axis
// ChunkAxis, or that axis has length 1. N is the TotalRuns (Runs) of the
// chunkable requests, which must agree, or with none chunkable the
// largest TotalRuns. A request's bytes at L are its shape with the chunk
// axis set to L (chunkable) or as is, times the dtype size, rounded up to
// opts.Granularity; U sums the unchunkable device requests, C(L) the
// chunkable ones. If U + C(N) ≤ B: one chunk of N runs. Else, with no
// chunkable device request or U ≥ B, ErrUnchunkable; with U + k·C(1) > B,
// ErrRunTooLarge; otherwise chunks = ⌈N / Lmax⌉ for the largest Lmax
// with U + k·C(Lmax) ≤ B, of ⌈N / chunks⌉ runs each.
//
// Budget semantics. The budget is in the bytes the allocator charges:
// each array rounded to its granularity, as the allocator, an
// alloc.Limit and the Active caps count them. So a plan that fits B
// fits an allocator (or a Limit) with B bytes to give, exactly. What the
// device gives is another matter when the allocator rounds finer than
// the device's page (the Pool and the AsyncPool round to 512 B, the
// device to 2 MiB): its segments are whole pages. AllocateQueue plans
// with the device's free memory less the page reserve the planned arrays
// may need (see AllocateQueue), so that its plans fit the device too;
// give Plan a budget with that margin taken off when planning for a
// device by hand, or a granularity of the device's page (Direct's).
//
// Errors: a request that fails Validate (wrapping ErrInvalidRequest or
// ErrNotSupported), chunkable requests that disagree on their runs
// (ErrRunsMismatch), and a *PlanError wrapping ErrUnchunkable or
// ErrRunTooLarge when no plan fits.
func Plan(requests map[string]map[string]ArrayRequest, budget uint64, opts PlanOptions) (ChunkPlan, error) {
	g := opts.Granularity
	if g == 0 {
		g = DefaultGranularity
	}
	k := max(opts.Buffers, 1)

	count := 0
	for _, labels := range requests {
		count += len(labels)
	}
	items := make([]planItem, 0, count)
	runs := -1
	maxRuns := 0
	nChunkableDev := 0
	for client, labels := range requests {
		for label, r := range labels {
			if err := r.Validate(); err != nil {
				return ChunkPlan{}, fmt.Errorf("request %s/%s: %w", client, label, err)
			}
			it := planItem{client: client, label: label, req: r, chunkable: r.Chunkable()}
			elems, _ := r.Elements() // Validate checked it
			size := r.DType.Size()
			if it.chunkable {
				it.perRun = elems / uint64(r.Shape[r.ChunkAxis]) * size
				n := r.Runs()
				switch {
				case runs < 0:
					runs = n
				case n != runs:
					return ChunkPlan{}, runsMismatch(requests)
				}
				if r.Memory.OnDevice() {
					nChunkableDev++
				}
			} else {
				it.fixed = elems * size
				maxRuns = max(maxRuns, r.Runs())
			}
			items = append(items, it)
		}
	}
	if runs < 0 {
		runs = maxRuns
	}
	// Bytes per run of the chunkable requests, on the device and on the
	// host.
	var devRuns, hostRuns []uint64
	for i := range items {
		if items[i].chunkable {
			if items[i].req.Memory.OnDevice() {
				devRuns = append(devRuns, items[i].perRun)
			} else {
				hostRuns = append(hostRuns, items[i].perRun)
			}
		}
	}

	p := ChunkPlan{
		TotalRuns:   runs,
		Granularity: g,
		Budget:      budget,
	}
	var u uint64
	for i := range items {
		if !items[i].chunkable && items[i].req.Memory.OnDevice() {
			u = satAdd(u, roundUp(items[i].fixed, g))
		}
	}
	p.UnchunkableBytes = u
	cN := chunkBytes(devRuns, runs, g)
	p.FullBytes = satAdd(u, cN)

	length := runs
	switch {
	case fitsIn(p.FullBytes, budget):
		p.Chunks, p.Buffers = 1, 1
	case nChunkableDev == 0 || u >= budget:
		e := &PlanError{Err: ErrUnchunkable, Need: p.FullBytes, Budget: budget, UnchunkableBytes: u,
			Buffers: k, Chunkable: nChunkableDev, RunBytes: chunkBytes(devRuns, 1, g)}
		if nChunkableDev == 0 {
			e.Hint = fmt.Sprintf("give the largest requests a chunk axis along their runs (%s), or %s",
				largestUnchunkable(items, 3), raiseHint(e.Need, budget))
		} else {
			e.Need = satAdd(u, satMul(uint64(k), e.RunBytes))
			if u > 0 {
				e.Hint = fmt.Sprintf("make the large fixed inputs chunkable, shrink them, or %s", raiseHint(e.Need, budget))
			} else {
				e.Hint = raiseHint(e.Need, budget)
			}
		}
		return ChunkPlan{}, e
	default:
		c1 := chunkBytes(devRuns, 1, g)
		need1 := satAdd(u, satMul(uint64(k), c1))
		if !fitsIn(need1, budget) {
			e := &PlanError{Err: ErrRunTooLarge, Need: need1, Budget: budget, UnchunkableBytes: u,
				RunBytes: c1, Buffers: k, Chunkable: nChunkableDev}
			var ways []string
			ways = append(ways, raiseHint(need1, budget))
			if k > 1 {
				ways = append(ways, "use fewer buffers in flight")
			}
			if u > 0 {
				ways = append(ways, "make more of the fixed arrays chunkable")
			}
			ways = append(ways, "make the per-run arrays smaller")
			e.Hint = strings.Join(ways[:len(ways)-1], ", ") + " or " + ways[len(ways)-1]
			return ChunkPlan{}, e
		}
		// Largest L in [1, N) with U + k·C(L) ≤ B, that is with
		// C(L) ≤ A = ⌊(B − U)/k⌋: lo fits, hi does not (U + k·C(N) ≥
		// U + C(N) > B). With S the bytes of one run unrounded and m the
		// chunkable arrays, S·L ≤ C(L) < S·L + m·g, which brackets the
		// answer to a few values before bisecting.
		a := (budget - u) / uint64(k)
		fits := func(l int) bool { return fitsIn(chunkBytes(devRuns, l, g), a) }
		lo, hi := 1, runs
		var perRun uint64
		for _, r := range devRuns {
			perRun = satAdd(perRun, r)
		}
		m := uint64(len(devRuns))
		if perRun > 0 {
			if l := a/perRun + 1; l < uint64(hi) && !fits(int(l)) {
				hi = int(l)
			}
			if slack := satMul(m, g); a > slack {
				if l := (a - slack) / perRun; l > uint64(lo) && l < uint64(hi) && fits(int(l)) {
					lo = int(l)
				}
			}
		}
		for hi-lo > 1 {
			mid := lo + (hi-lo)/2
			if fits(mid) {
				lo = mid
			} else {
				hi = mid
			}
		}
		p.Chunks = ceilDiv(runs, lo)
		length = ceilDiv(runs, p.Chunks)
		p.Buffers = k
	}
	p.ChunkLength = length
	p.LastChunkLength = runs - (p.Chunks-1)*length
	if p.Chunks == 1 {
		p.LastChunkLength = length
	}
	p.ChunkBytes = chunkBytes(devRuns, length, g)
	p.BytesPerChunk = satAdd(u, satMul(uint64(p.Buffers), p.ChunkBytes))
	p.HostBytes = chunkBytes(hostRuns, length, g)
	for i := range items {
		if !items[i].chunkable && !items[i].req.Memory.OnDevice() {
			p.HostBytes = satAdd(p.HostBytes, roundUp(items[i].fixed, g))
		}
	}

	// Every shape is a piece of one slab: two allocations, not one per
	// request.
	dims := 0
	for i := range items {
		dims += len(items[i].req.Shape)
	}
	slab := make([]int, 0, dims)
	p.ChunkedShapes = make(map[string]map[string][]int, len(requests))
	for i := range items {
		it := &items[i]
		m := p.ChunkedShapes[it.client]
		if m == nil {
			m = make(map[string][]int, len(requests[it.client]))
			p.ChunkedShapes[it.client] = m
		}
		at := len(slab)
		slab = append(slab, it.req.Shape...)
		shape := slab[at:len(slab):len(slab)]
		if it.chunkable {
			shape[it.req.ChunkAxis] = length
		}
		m[it.label] = shape
	}
	return p, nil
}

// chunkBytes is C(L): the rounded bytes of the chunkable requests whose
// bytes per run are perRun, at length L.
func chunkBytes(perRun []uint64, length int, g uint64) uint64 {
	var c uint64
	l := uint64(length)
	if g&(g-1) == 0 { // a power of two: round with a mask
		for _, r := range perRun {
			hi, n := bits.Mul64(r, l)
			n, carry := bits.Add64(n, g-1, 0)
			if hi|carry != 0 {
				return math.MaxUint64
			}
			c = satAdd(c, n&^(g-1))
		}
		return c
	}
	for _, r := range perRun {
		c = satAdd(c, roundUp(satMul(r, l), g))
	}
	return c
}

// runsMismatch builds the error for chunkable requests that disagree on
// their runs, listing each distinct count with the requests that have it.
func runsMismatch(requests map[string]map[string]ArrayRequest) error {
	by := map[int][]string{}
	for client, labels := range requests {
		for label, r := range labels {
			if r.Chunkable() {
				by[r.Runs()] = append(by[r.Runs()], client+"/"+label)
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

// ceilDiv is ⌈a/b⌉ for a ≥ 0 and b ≥ 1, exact up to a = MaxInt (a + b − 1
// would overflow near it).
func ceilDiv(a, b int) int {
	q := a / b
	if a%b != 0 {
		q++
	}
	return q
}

// fitsIn reports whether n bytes fit a budget. A sum that saturated
// (MaxUint64: 2⁶⁴−1 bytes or more) never fits, not even a budget of
// MaxUint64, since it stands for any larger figure too.
func fitsIn(n, budget uint64) bool { return n <= budget && n < math.MaxUint64 }

func roundUp(n, g uint64) uint64 {
	r, ok := units.RoundUp(n, g)
	if !ok {
		return math.MaxUint64
	}
	return r
}

func satAdd(a, b uint64) uint64 {
	s, carry := bits.Add64(a, b, 0)
	if carry != 0 {
		return math.MaxUint64
	}
	return s
}

func satMul(a, b uint64) uint64 {
	hi, lo := bits.Mul64(a, b)
	if hi != 0 {
		return math.MaxUint64
	}
	return lo
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
