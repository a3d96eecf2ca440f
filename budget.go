package vram

// The budget AllocateQueue plans a group with, and the page reserve.
//
// Plan counts each array's bytes rounded to the allocator's granularity,
// which is what the allocator charges (and what an alloc.Limit and the
// Active caps count). The device may take more: it hands memory out in
// pages (2 MiB on current drivers and on the simulator), and an allocator
// that rounds finer than a page (the Pool and the AsyncPool round to
// 512 B) gets that memory as segments of whole pages, whose unused tails
// serve later requests. A group's arrays may therefore need up to a page
// more than they count, each. The reserve is what AllocateQueue keeps
// back from the device's free memory for that, worked out for the arrays
// a plan would allocate:
//
//   - an array larger than the allocator's small-request limit may need a
//     segment of its own, its bytes rounded up to a page: it reserves that
//     rounding (less than a page; nothing for an array of whole pages);
//   - small arrays (up to the Pool's SmallSize, 1 MiB by default; for the
//     AsyncPool, half a page) share segments: when a new one is needed,
//     every earlier one holds more than a page less the largest small
//     array, so K = ⌊S/(page − x)⌋ + 1 pages hold them all (S their bytes,
//     x the largest). They reserve K pages less S, and never more than the
//     rounding of each to a page;
//   - an allocator that rounds to whole pages itself (Direct) reserves
//     nothing: Plan already counts what it spends; one the manager does
//     not know (a WithWrap that replaces it) reserves each array's
//     rounding to a page.
//
// The bound holds whatever free blocks the allocator already has (arrays
// placed there open no segment) for allocators that grow by the request
// rounded to a page: the device's stream-ordered pool always, and the
// Pool through AllocExact, which AllocateQueue uses (its Alloc would
// first try a larger shared segment, whose tail serves only later
// requests of the same class). An allocator behind a wrapper that hides
// AllocExact can still run the device out; allocateGroup then plans
// again.
//
// The reserve depends on the arrays' sizes and so on the chunk length.
// AllocateQueue plans with the device's free memory; when the plan's
// arrays do not fit with their reserve, it looks for the fewest chunks
// whose arrays do, and plans with the free memory less their reserve.

import (
	"fmt"
	"math"
	"strings"

	"github.com/vramkit/vram/alloc"
	"github.com/vramkit/vram/internal/units"
)

// pageModel is how the current allocator takes memory from the device.
type pageModel struct {
	page  uint64 // device allocation unit, bytes
	gran  uint64 // allocator rounding, bytes
	small uint64 // arrays of at most this many bytes share segments
	kind  string // who rounds, for messages: "the pool", "the async pool", …
	none  bool   // the allocator rounds to pages itself: no reserve
}

// pageModelOf describes a (possibly wrapped) allocator on a device with
// pages of page bytes. Direct rounds to pages itself (its granularity is
// the page); an allocator the manager does not know is modelled as
// giving every array a segment of its own.
func pageModelOf(a alloc.Allocator, page uint64) pageModel {
	pm := pageModel{page: page, gran: granularityOf(a)}
	if page <= pm.gran || page == 0 {
		pm.none = true
		return pm
	}
	for a != nil {
		switch u := a.(type) {
		case *alloc.Pool:
			pm.small, pm.kind = u.Config().SmallSize, "the pool"
			return pm
		case *alloc.AsyncPool:
			pm.small, pm.kind = page/2, "the device's stream-ordered pool"
			return pm
		case alloc.Adaptor:
			a = u.Upstream()
			continue
		}
		break
	}
	pm.kind = "the allocator"
	return pm
}

// reserve is the device bytes beyond Σ sizes that allocating arrays of
// sizes (each rounded to the allocator's granularity) may take; see the
// file overview.
func (pm pageModel) reserve(sizes []uint64) uint64 {
	if pm.none {
		return 0
	}
	var r, own, sum, largest uint64
	nSmall := uint64(0)
	for _, s := range sizes {
		o := roundUp(s, pm.page) - s
		if s <= pm.small {
			own = satAdd(own, o)
			sum = satAdd(sum, s)
			largest = max(largest, s)
			nSmall++
			continue
		}
		r = satAdd(r, o)
	}
	if nSmall > 0 {
		rs := own
		if largest < pm.page {
			if k := sum/(pm.page-largest) + 1; k < nSmall {
				rs = min(rs, satMul(k, pm.page)-min(sum, satMul(k, pm.page)))
			}
		}
		r = satAdd(r, rs)
	}
	return r
}

// groupBudget is what a group may plan with and why, for AllocateQueue's
// errors.
type groupBudget struct {
	// What the figures are read for: the group, its requesters and
	// their queued requests (the labels whose arrays are replaced).
	group      string
	requesters []*Client
	queue      map[*Client]map[string]ArrayRequest

	mode     LimitMode
	free     uint64 // device free memory after trimming the allocator's cache
	replaced uint64 // allocator bytes of the arrays being replaced
	// Active mode: the members' caps and what they hold (allocator bytes).
	caps, held uint64
	// An alloc.Limit in the allocator chain, if limited.
	limited         bool
	limCap, limUsed uint64

	// lost is device memory the allocator took beyond the page reserve
	// in earlier tries of this allocation (its growth policy), kept back.
	lost uint64

	pm      pageModel
	reserve uint64 // device bytes kept back for page rounding in budget
	arrays  int    // device arrays reserve was counted for
	budget  uint64 // what Plan was given
	// planReserve is the reserve of the plan chosen, for its arrays.
	planReserve uint64
}

// device is the device memory the group may plan with before the reserve:
// the free memory and the arrays being replaced.
func (b *groupBudget) device() uint64 {
	d := satAdd(b.free, b.replaced)
	return d - min(d, b.lost)
}

// capRoom is Active mode's room, in allocator bytes (MaxUint64 in Passive).
func (b *groupBudget) capRoom() uint64 {
	if b.mode != Active {
		return math.MaxUint64
	}
	return b.caps - min(b.caps, b.held-min(b.held, b.replaced))
}

// limRoom is the room under the Limit (MaxUint64 with none).
func (b *groupBudget) limRoom() uint64 {
	if !b.limited {
		return math.MaxUint64
	}
	return b.limCap - min(b.limCap, b.limUsed-min(b.limUsed, b.replaced))
}

// set makes the budget the device memory less reserve (kept for n
// arrays), and no more than the caps and the limit allow.
func (b *groupBudget) set(reserve uint64, n int) uint64 {
	b.reserve, b.arrays = reserve, n
	d := b.device()
	b.budget = min(d-min(d, reserve), b.capRoom(), b.limRoom())
	return b.budget
}

// String explains the budget: where each figure comes from, and what
// bounds it.
func (b *groupBudget) String() string {
	var s strings.Builder
	fmt.Fprintf(&s, "%s mode, budget %s: %s free on the device after trimming the allocator's cache",
		b.mode, units.Format(b.budget), units.Format(b.free))
	if b.replaced > 0 {
		fmt.Fprintf(&s, " + %s of arrays being replaced", units.Format(b.replaced))
	}
	if b.lost > 0 {
		fmt.Fprintf(&s, " − %s that %s took beyond its pages in an earlier try (its growth policy)",
			units.Format(b.lost), b.pm.kind)
	}
	if b.reserve > 0 {
		fmt.Fprintf(&s, " − %s kept for %s getting its memory in %s device pages (%d arrays)",
			units.Format(b.reserve), b.pm.kind, units.Format(b.pm.page), b.arrays)
	}
	if r := b.capRoom(); r < math.MaxUint64 {
		fmt.Fprintf(&s, ", at most %s under the group's caps (%s, less %s its members hold)",
			units.Format(r), units.Format(b.caps), units.Format(b.held-min(b.held, b.replaced)))
	}
	if r := b.limRoom(); r < math.MaxUint64 {
		fmt.Fprintf(&s, ", at most %s under the allocation limit (%s, %s in use)",
			units.Format(r), units.Format(b.limCap), units.Format(b.limUsed-min(b.limUsed, b.replaced)))
	}
	return s.String()
}

// advice says what would give the group more memory, by what bounds its
// budget.
func (b *groupBudget) advice() string {
	d := b.device()
	dev := d - min(d, b.reserve)
	var parts []string
	if dev <= b.capRoom() && dev <= b.limRoom() {
		parts = append(parts, "free device memory (other groups' arrays, other programs on the GPU)")
		if b.reserve > 0 {
			parts = append(parts, "ask for fewer, larger arrays (each may round up to a page)")
		}
		if b.pm.none && b.pm.gran > DefaultGranularity {
			parts = append(parts, fmt.Sprintf("use the Pool allocator, whose small arrays share pages (this one rounds each array up to %s)", units.Format(b.pm.gran)))
		}
	}
	if b.capRoom() < math.MaxUint64 && b.capRoom() <= min(dev, b.limRoom()) {
		parts = append(parts, "raise the members' proportions, free arrays they hold, or use the Passive limit mode")
	}
	if b.limRoom() < math.MaxUint64 && b.limRoom() <= min(dev, b.capRoom()) {
		parts = append(parts, "raise the allocation limit or free arrays under it")
	}
	return "to give the group more: " + strings.Join(parts, "; ")
}

// findLimit returns the first alloc.Limit in a's adaptor chain.
func findLimit(a alloc.Allocator) *alloc.Limit {
	for a != nil {
		if l, ok := a.(*alloc.Limit); ok {
			return l
		}
		ad, ok := a.(alloc.Adaptor)
		if !ok {
			return nil
		}
		a = ad.Upstream()
	}
	return nil
}

// devArray is a device request as the reserve sees it: its bytes per
// run (chunkable) or in all (unchunkable), unrounded.
type devArray struct {
	bytes     uint64
	chunkable bool
}

// devArrays lists the device requests of reqs.
func devArrays(reqs map[string]map[string]ArrayRequest) []devArray {
	var out []devArray
	for _, labels := range reqs {
		for _, r := range labels {
			if !r.Memory.OnDevice() {
				continue
			}
			n, _ := r.Elements()
			a := devArray{chunkable: r.Chunkable()}
			if a.chunkable {
				n /= uint64(r.Shape[r.ChunkAxis])
			}
			a.bytes = satMul(n, r.DType.Size())
			out = append(out, a)
		}
	}
	return out
}

// sizesAt lists into buf the allocator bytes (granularity g) of the
// device arrays at chunk length l with bufs buffers (chunkable arrays
// once per buffer), as a plan of that chunk length allocates them, and
// their sum.
func sizesAt(arrays []devArray, g uint64, l, bufs int, buf []uint64) (sizes []uint64, sum uint64) {
	sizes = buf[:0]
	for _, a := range arrays {
		if !a.chunkable {
			s := roundUp(a.bytes, g)
			sizes = append(sizes, s)
			sum = satAdd(sum, s)
			continue
		}
		s := roundUp(satMul(a.bytes, uint64(l)), g)
		for range bufs {
			sizes = append(sizes, s)
			sum = satAdd(sum, s)
		}
	}
	return sizes, sum
}

// planSizes lists the allocator bytes of the device arrays plan
// allocates.
func planSizes(arrays []devArray, plan ChunkPlan, buf []uint64) []uint64 {
	sizes, _ := sizesAt(arrays, plan.Granularity, plan.ChunkLength, plan.Buffers, buf)
	return sizes
}

// fits reports whether plan's arrays fit the device with their page
// reserve.
func (b *groupBudget) fits(arrays []devArray, plan ChunkPlan, buf []uint64) bool {
	r := b.pm.reserve(planSizes(arrays, plan, buf))
	if satAdd(plan.BytesPerChunk, r) > b.device() {
		return false
	}
	b.planReserve = r
	return true
}

// fitsBeside reports whether plan's arrays fit while the arrays being
// replaced are still held: within the device's free memory (less what
// was lost to the allocator's growth) with the plan's page reserve, and
// under the allocation limit as it counts now. The Active caps are not
// checked again: they bound what the group holds once the replaced
// arrays are freed, which the plan already respects.
func (b *groupBudget) fitsBeside(plan ChunkPlan) bool {
	if b.replaced == 0 {
		return true
	}
	d := b.free - min(b.free, b.lost)
	if satAdd(plan.BytesPerChunk, b.planReserve) > d {
		return false
	}
	return !b.limited || plan.BytesPerChunk <= b.limCap-min(b.limCap, b.limUsed)
}

// planGroup plans reqs within b with the fewest chunks whose arrays fit
// the device with their page reserve (see the file overview), and within
// the caps and the limit. On an error, b holds the budget it was made
// against, for the message.
//
// It plans with all the device memory first; when that plan's arrays do
// not fit with their reserve, it finds by bisection the fewest chunks
// whose arrays do (the reserve mostly grows with the chunk length, not
// always: an array that reaches a whole page reserves nothing, so this
// is the fewest or close to it), and plans with the device memory less
// their reserve.
func planGroup(reqs map[string]map[string]ArrayRequest, b *groupBudget, opts PlanOptions) (ChunkPlan, error) {
	g, k := opts.Granularity, max(opts.Buffers, 1)
	arrays := devArrays(reqs)
	buf := make([]uint64, 0, len(arrays)*k)
	p, err := Plan(reqs, b.set(0, 0), opts)
	if err == nil && b.fits(arrays, p, buf) {
		return p, nil
	}
	n := p.TotalRuns
	// A plan of c ≥ 2 chunks fits with its reserve, and spends less than
	// the whole batch at once (else Plan would make that one chunk).
	feasible := func(c int) bool {
		sizes, sum := sizesAt(arrays, g, ceilDiv(n, c), k, buf)
		return sum < p.FullBytes && sum <= min(b.capRoom(), b.limRoom()) &&
			satAdd(sum, b.pm.reserve(sizes)) <= b.device()
	}
	if err != nil || n <= 1 || !feasible(n) {
		// Not even one run at a time fits: say so against the least the
		// smallest plan keeps back.
		sizes, _ := sizesAt(arrays, g, 1, k, buf)
		if _, err := Plan(reqs, b.set(b.pm.reserve(sizes), len(sizes)), opts); err != nil {
			return ChunkPlan{}, err
		}
		// The whole batch fits the budget but not the device with its
		// reserve, and chunks in k buffers would take no less.
		need := satAdd(p.BytesPerChunk, b.pm.reserve(planSizes(arrays, p, buf)))
		also := ""
		if k > 1 {
			also = " or allocate with fewer buffers"
		}
		return ChunkPlan{}, fmt.Errorf("the batch needs %s with its page reserve (%s of arrays), and no plan of %d chunk buffers takes less; free %s%s: %w",
			bytesUp(need), units.Format(p.BytesPerChunk), k, bytesUp(need-min(need, b.device())), also, ErrRunTooLarge)
	}
	lo, hi := p.Chunks, n // lo does not fit, hi does
	for hi-lo > 1 {
		if mid := lo + (hi-lo)/2; feasible(mid) {
			hi = mid
		} else {
			lo = mid
		}
	}
	// Plan with the device less this plan's reserve, but below what one
	// chunk fewer would spend, so that Plan makes hi chunks.
	full := p.FullBytes
	sizes, sum := sizesAt(arrays, g, ceilDiv(n, hi), k, buf)
	b.set(b.pm.reserve(sizes), len(sizes))
	b.budget = min(b.budget, full-1)
	if hi > 2 {
		_, fewer := sizesAt(arrays, g, ceilDiv(n, hi-1), k, buf)
		b.budget = min(b.budget, fewer-1)
	}
	if p, err := Plan(reqs, b.budget, opts); err == nil && b.fits(arrays, p, buf) {
		return p, nil
	}
	// The device less this plan's reserve would allow a longer chunk,
	// whose reserve does not fit: plan within the bytes themselves (a
	// longer chunk of the same bytes has the same arrays).
	d := b.device()
	p, err = Plan(reqs, b.set(d-min(d, sum), len(sizes)), opts)
	if err == nil && !b.fits(arrays, p, buf) {
		err = fmt.Errorf("%d chunks of %d runs need %s with their page reserve: %w", p.Chunks, p.ChunkLength,
			bytesUp(satAdd(p.BytesPerChunk, b.pm.reserve(planSizes(arrays, p, buf)))), ErrOutOfMemory)
	}
	return p, err
}
