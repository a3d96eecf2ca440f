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
	"fmt"
	"math"
	"math/bits"

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
	// Buffers is the number of chunk buffers in flight (k): 1, or 2 or 3
	// (batch.MaxBuffers, what package batch runs), which overlap one chunk's
	// copies with another's compute. Values below 1 mean 1.
	Buffers int `json:"buffers,omitempty"`
	// Cost, when set, is what device arrays of the given sizes (bytes,
	// unrounded; a chunkable array once per buffer) take from the
	// device: an allocator's own statement (alloc.Coster). It must be
	// non-decreasing in every size. The budget then bounds Cost instead
	// of the sum of the sizes rounded to Granularity. A function: Plan
	// is then pure only as far as Cost is.
	Cost func(sizes []uint64) uint64 `json:"-"`
	// MaxChunkLength, when above 0 and below the runs, bounds the chunk
	// length: the runs are cut into chunks of at most this many (with
	// Buffers buffers in flight) even where fewer, longer chunks fit the
	// budget. It cannot cut requests that are not chunkable. (Allocate
	// sets it so that each member's arrays fit its own cap in the Active
	// limit mode.)
	MaxChunkLength int `json:"max_chunk_length,omitempty"`
	// DeviceBytes, when above 0, is the device's whole memory: no budget
	// on it can pass that, so a PlanError whose smallest plan needs more
	// says so and advises what would shrink the need, not a larger
	// budget. (Allocate sets it; vram plan gives the device's.)
	DeviceBytes uint64 `json:"device_bytes,omitempty"`

	// more, when set, says what else would make the requests fit, for
	// the end of a PlanError's Hint (Allocate's: what would give the
	// group more memory). It is called only when Plan fails.
	more func() string
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
	// DeviceBytes is what the plan's device arrays take from the device:
	// their PlanOptions.Cost, else BytesPerChunk. It is ≤ Budget.
	DeviceBytes uint64 `json:"device_bytes"`
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
// start and number n (ChunkLength, or LastChunkLength for the last). An
// index out of range is an error wrapping ErrChunkRange, and so is any
// chunk of a plan with no runs (nothing in it chunkable), whose arrays
// are whole: copy them with ToDevice and FromDevice.
func (p ChunkPlan) Chunk(i int) (start, n int, err error) {
	if i < 0 || i >= p.Chunks {
		return 0, 0, fmt.Errorf("chunk %d of a plan of %d chunk(s); want 0 ≤ i < %d: %w", i, p.Chunks, p.Chunks, ErrChunkRange)
	}
	if p.TotalRuns == 0 {
		return 0, 0, fmt.Errorf("chunk %d of a plan with no runs (none of its requests is chunkable): its arrays are allocated whole; copy them with ToDevice and FromDevice: %w", i, ErrChunkRange)
	}
	start = i * p.ChunkLength
	return start, min(p.ChunkLength, p.TotalRuns-start), nil
}

// Span returns chunk i as the Span of axis to copy with ToDeviceChunk and
// FromDeviceChunk; an index out of range is an error wrapping
// ErrChunkRange (never an empty span that would copy nothing).
func (p ChunkPlan) Span(i, axis int) (Span, error) {
	start, n, err := p.Chunk(i)
	if err != nil {
		return Span{}, err
	}
	return Span{Axis: axis, Start: start, Len: n}, nil
}

// planItem is one request as the planner sees it.
type planItem struct {
	client, label string // client: its owner's name
	owner         int    // index of its owner in planner.owners
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
// with U + k·C(Lmax) ≤ B (and Lmax ≤ opts.MaxChunkLength, when that
// bounds it: then the runs are chunked even where they fit whole), of
// ⌈N / chunks⌉ runs each. A sum of 2⁶⁴−1
// bytes or more never fits. With opts.Cost, each "U + k·C(L)" above is
// instead the Cost of the device arrays' sizes at L (U: of the
// unchunkable ones alone), so the budget bounds what the allocator says
// it takes from the device.
//
// Budget semantics. Without opts.Cost the budget is in the bytes the
// allocator charges: each array rounded to its granularity, as the
// allocator, an alloc.Limit and the Active caps count them. So a plan
// that fits B fits an allocator (or a Limit) with B bytes to give,
// exactly. What the device gives is another matter when the allocator
// rounds finer than the device's page (the Pool and the AsyncPool round
// to 512 B, the device to 2 MiB): its segments are whole pages. Give
// opts.Cost (an allocator's alloc.Coster, as Allocate does) to plan
// for the device's free memory.
//
// Errors: a request that fails Validate (wrapping ErrInvalidRequest or
// ErrNotSupported), chunkable requests that disagree on their runs
// (ErrRunsMismatch), and a *PlanError wrapping ErrUnchunkable or
// ErrRunTooLarge when no plan fits.
func Plan(requests map[string]map[string]ArrayRequest, budget uint64, opts PlanOptions) (ChunkPlan, error) {
	owners := make([]planOwner, 0, len(requests))
	for name, r := range requests {
		owners = append(owners, planOwner{name: name, reqs: r})
	}
	p, _, err := planOwners(owners, budget, opts)
	return p, err
}

// planOwner is one owner's requests as Plan is given them: by label,
// under the owner's name (ChunkPlan.ChunkedShapes' key, the messages').
type planOwner struct {
	name string
	reqs map[string]ArrayRequest
}

// planClients is Plan for the manager's own path, its requests keyed by
// client: it returns, besides the plan (whose ChunkedShapes are by the
// clients' names, for the caller to read), each client's shapes by the
// client itself.
func planClients(requests map[*Client]map[string]ArrayRequest, budget uint64, opts PlanOptions) (ChunkPlan, map[*Client]map[string][]int, error) {
	clients := make([]*Client, 0, len(requests))
	owners := make([]planOwner, 0, len(requests))
	for c, r := range requests {
		clients = append(clients, c)
		owners = append(owners, planOwner{name: c.String(), reqs: r})
	}
	p, shapes, err := planOwners(owners, budget, opts)
	if err != nil {
		return p, nil, err
	}
	byClient := make(map[*Client]map[string][]int, len(clients))
	for i, c := range clients {
		byClient[c] = shapes[i]
	}
	return p, byClient, nil
}

// planOwners is Plan over owners; shapes[i] is owners[i]'s.
func planOwners(owners []planOwner, budget uint64, opts PlanOptions) (p ChunkPlan, shapes []map[string][]int, err error) {
	pl, err := newPlanner(owners, opts)
	if err != nil {
		return ChunkPlan{}, nil, err
	}
	p = ChunkPlan{TotalRuns: pl.runs, Granularity: pl.g, Budget: budget, UnchunkableBytes: pl.u}
	p.FullBytes = satAdd(pl.u, chunkBytes(pl.devRuns, pl.runs, pl.g))
	length := pl.runs
	bounded := opts.MaxChunkLength > 0 && opts.MaxChunkLength < pl.runs && pl.nChunkableDev > 0
	switch {
	case !bounded && fitsIn(pl.device(pl.runs, 1), budget):
		p.Chunks, p.Buffers = 1, 1
	case pl.nChunkableDev == 0:
		return ChunkPlan{}, nil, pl.unchunkableError(budget)
	default:
		if need := pl.device(1, pl.k); !fitsIn(need, budget) {
			if pl.fixedCost() >= budget {
				return ChunkPlan{}, nil, pl.unchunkableError(budget)
			}
			return ChunkPlan{}, nil, pl.runTooLargeError(budget, need)
		}
		lo := pl.longest(budget)
		if bounded {
			// longest assumes N runs do not fit; where they do, it
			// answers N − 1, which the bound (< N) is below anyway.
			lo = min(lo, opts.MaxChunkLength)
		}
		p.Chunks = ceilDiv(pl.runs, lo)
		length = ceilDiv(pl.runs, p.Chunks)
		p.Buffers = pl.k
	}
	return p, pl.finish(&p, length), nil
}

// planner is one Plan call's view of its requests.
type planner struct {
	owners        []planOwner
	g             uint64 // granularity
	k             int    // buffers in flight
	cost          func([]uint64) uint64
	more          func() string // PlanOptions.more
	deviceBytes   uint64        // PlanOptions.DeviceBytes; 0: unknown
	items         []planItem
	runs          int
	nChunkableDev int
	devRuns       []uint64 // bytes per run of the chunkable device requests
	hostRuns      []uint64 // and of the chunkable host requests
	fixedDev      []uint64 // bytes of the unchunkable device requests, unrounded
	u             uint64   // U: their rounded sum
	sizes         []uint64 // scratch for cost
}

// newPlanner validates the requests and works out the runs and the bytes
// per run.
func newPlanner(owners []planOwner, opts PlanOptions) (*planner, error) {
	pl := &planner{owners: owners, g: opts.Granularity, k: max(opts.Buffers, 1), cost: opts.Cost, more: opts.more,
		deviceBytes: opts.DeviceBytes, runs: -1}
	if pl.g == 0 {
		pl.g = DefaultGranularity
	}
	count := 0
	for _, o := range owners {
		count += len(o.reqs)
	}
	pl.items = make([]planItem, 0, count)
	maxRuns := 0
	for i, o := range owners {
		for label, r := range o.reqs {
			if err := r.Validate(); err != nil {
				return nil, fmt.Errorf("request %s/%s: %w", o.name, label, err)
			}
			it := planItem{client: o.name, owner: i, label: label, req: r, chunkable: r.Chunkable()}
			elems, _ := r.Elements() // Validate checked it
			size := r.DType.Size()
			switch {
			case !it.chunkable:
				it.fixed = elems * size
				maxRuns = max(maxRuns, r.Runs())
			case pl.runs >= 0 && r.Runs() != pl.runs:
				return nil, runsMismatch(owners)
			default:
				it.perRun = elems / uint64(r.Shape[r.ChunkAxis]) * size
				pl.runs = r.Runs()
			}
			pl.add(it)
		}
	}
	if pl.runs < 0 {
		pl.runs = maxRuns
	}
	return pl, nil
}

// add files one request by kind.
func (pl *planner) add(it planItem) {
	pl.items = append(pl.items, it)
	onDev := it.req.Memory.OnDevice()
	switch {
	case it.chunkable && onDev:
		pl.devRuns = append(pl.devRuns, it.perRun)
		pl.nChunkableDev++
	case it.chunkable:
		pl.hostRuns = append(pl.hostRuns, it.perRun)
	case onDev:
		pl.fixedDev = append(pl.fixedDev, it.fixed)
		pl.u = satAdd(pl.u, roundUp(it.fixed, pl.g))
	}
}

// device is what the device arrays take at chunk length l with bufs
// buffers: U + bufs·C(l), or their Cost.
func (pl *planner) device(l, bufs int) uint64 {
	if pl.cost == nil {
		return satAdd(pl.u, satMul(uint64(bufs), chunkBytes(pl.devRuns, l, pl.g)))
	}
	pl.sizes = append(pl.sizes[:0], pl.fixedDev...)
	for range bufs {
		for _, r := range pl.devRuns {
			pl.sizes = append(pl.sizes, satMul(r, uint64(l)))
		}
	}
	return pl.cost(pl.sizes)
}

// fixedCost is what the unchunkable device arrays take alone.
func (pl *planner) fixedCost() uint64 {
	if pl.cost == nil {
		return pl.u
	}
	return pl.cost(pl.fixedDev)
}

// longest is the largest L in [1, N) whose k buffers fit budget (one run
// does; N runs in one buffer do not).
func (pl *planner) longest(budget uint64) int {
	lo, hi := 1, pl.runs // lo fits, hi does not
	fits := func(l int) bool { return fitsIn(pl.device(l, pl.k), budget) }
	if pl.cost == nil {
		// U + k·C(L) ≤ B is C(L) ≤ A = ⌊(B − U)/k⌋. With S the bytes of
		// one run unrounded and m the chunkable arrays, S·L ≤ C(L) <
		// S·L + m·g, which brackets the answer to a few values.
		// A sum of 2⁶⁴−1 or more never fits (fitsIn): the budget is at
		// most one byte less.
		a := (min(budget, math.MaxUint64-1) - pl.u) / uint64(pl.k)
		fits = func(l int) bool { return fitsIn(chunkBytes(pl.devRuns, l, pl.g), a) }
		var perRun uint64
		for _, r := range pl.devRuns {
			perRun = satAdd(perRun, r)
		}
		if perRun > 0 {
			if l := a/perRun + 1; l < uint64(hi) && !fits(int(l)) {
				hi = int(l)
			}
			if slack := satMul(uint64(len(pl.devRuns)), pl.g); a > slack {
				if l := (a - slack) / perRun; l > uint64(lo) && l < uint64(hi) && fits(int(l)) {
					lo = int(l)
				}
			}
		}
	}
	for hi-lo > 1 {
		if mid := lo + (hi-lo)/2; fits(mid) {
			lo = mid
		} else {
			hi = mid
		}
	}
	return lo
}

// finish fills in p's figures and shapes for chunks of length runs, and
// returns the shapes by owner (p.ChunkedShapes has them by name).
func (pl *planner) finish(p *ChunkPlan, length int) []map[string][]int {
	p.ChunkLength = length
	p.LastChunkLength = pl.runs - (p.Chunks-1)*length
	if p.Chunks == 1 {
		p.LastChunkLength = length
	}
	p.ChunkBytes = chunkBytes(pl.devRuns, length, pl.g)
	p.BytesPerChunk = satAdd(pl.u, satMul(uint64(p.Buffers), p.ChunkBytes))
	p.DeviceBytes = pl.device(length, p.Buffers)
	p.HostBytes = chunkBytes(pl.hostRuns, length, pl.g)
	for i := range pl.items {
		if !pl.items[i].chunkable && !pl.items[i].req.Memory.OnDevice() {
			p.HostBytes = satAdd(p.HostBytes, roundUp(pl.items[i].fixed, pl.g))
		}
	}
	// Every shape is a piece of one slab: two allocations, not one per
	// request.
	dims := 0
	for i := range pl.items {
		dims += len(pl.items[i].req.Shape)
	}
	slab := make([]int, 0, dims)
	shapes := make([]map[string][]int, len(pl.owners))
	p.ChunkedShapes = make(map[string]map[string][]int, len(pl.owners))
	for i := range pl.items {
		it := &pl.items[i]
		m := shapes[it.owner]
		if m == nil {
			m = make(map[string][]int, len(pl.owners[it.owner].reqs))
			shapes[it.owner] = m
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
	return shapes
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

func satAdd(a, b uint64) uint64 { return units.SatAdd(a, b) }

func satMul(a, b uint64) uint64 { return units.SatMul(a, b) }
