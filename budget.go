package vram

// The budget Allocate plans a group with.
//
// Plan counts each array's bytes rounded to the allocator's granularity,
// which is what the allocator charges (and what a cap, WithCap or an
// alloc.Limit, and the Active caps count). The device may take more: it
// hands memory out in pages (2 MiB on current drivers and on the
// simulator), and an allocator that rounds finer than a page (the Pool
// and the AsyncPool round to 512 B) gets that memory as segments of whole
// pages. The allocator states what a set of arrays takes from the device
// (alloc.Coster; see alloc/cost.go), and the plan is made once against
// that cost: the fewest chunks whose arrays the allocator says fit the
// device's free memory and whose charged bytes fit the caps.
//
// An allocator that does not state its cost (a wrapper that does not
// forward alloc.Coster) is taken to give every array a segment of its
// own, its bytes rounded up to a page; should it still run the device out
// (its growth policy hidden behind the wrapper), allocateGroup gives the
// arrays back and plans again with what it took kept back.

import (
	"fmt"
	"math"
	"strings"

	"github.com/vramkit/vram/alloc"
	"github.com/vramkit/vram/internal/units"
)

// groupBudget is what a group may plan with and why, for Allocate's
// errors.
type groupBudget struct {
	// What the figures are read for: the group, its requesters and
	// their queued requests (the labels whose arrays are replaced).
	group      string
	requesters []*Client
	queue      map[*Client]map[string]ArrayRequest

	mode     LimitMode
	free     uint64 // device free memory (after trimming the allocator's cache, when trimmed)
	trimmed  bool   // the cache was given back before free was read (trim.go)
	replaced uint64 // allocator bytes of the arrays being replaced
	// Active mode: the members' caps and what they hold (allocator bytes).
	caps, held uint64
	// room is what the allocator's caps (WithCap, an alloc.Limit) still
	// let it charge, the arrays being replaced counted in use, when
	// capped.
	capped bool
	room   uint64
	// over is what the manager's arrays are charged beyond its cap, after
	// SetCap lowered it (replan.go): room is then 0, and the arrays being
	// replaced give back only what exceeds this.
	over uint64

	// own is, in Active mode, each requester's own room by client name
	// (owncaps.go); nil in Passive mode.
	own map[string]ownRoom

	// lost is device memory an allocator that does not state its cost
	// took beyond it in earlier tries of this allocation, kept back.
	lost uint64
	// claimed is device memory other groups claim back from busy groups
	// (replan.go), kept back for them.
	claimed uint64
	// With a broker's lease (leased; lease.go), leaseBytes is what the
	// allocator may hold under it, leaseHeld what it holds, its cache
	// included, and leaseReplaced what the arrays being replaced take
	// (device bytes, as the allocator states them): the group plans
	// within the lease less what the allocator holds beside them.
	leased                               bool
	leaseBytes, leaseHeld, leaseReplaced uint64

	gran   uint64       // the allocator's granularity
	page   uint64       // the device's allocation unit
	coster alloc.Coster // the allocator's statement of costs; nil if it makes none
	kind   string       // who takes the pages, for messages

	budget      uint64 // what Plan was given
	planDevice  uint64 // device bytes the plan's arrays take, as stated
	planReserve uint64 // of which beyond their charged bytes (whole pages)
}

// stated reports whether the allocator states its costs.
func (b *groupBudget) stated() bool {
	if b.coster == nil {
		return false
	}
	_, ok := b.coster.Cost(nil)
	return ok
}

// cost is the device bytes that arrays of sizes take: as the allocator
// states it, else each array's bytes rounded up to a page.
func (b *groupBudget) cost(sizes []uint64) uint64 {
	if b.coster != nil {
		if c, ok := b.coster.Cost(sizes); ok {
			return c
		}
	}
	return alloc.PageCost(sizes, b.gran, b.page, 0)
}

// device is the device memory the group may plan with: the free memory
// and the arrays being replaced, less what was lost in earlier tries.
func (b *groupBudget) device() uint64 {
	d := min(satAdd(b.free, b.replaced), b.leaseRoom())
	return d - min(d, satAdd(b.lost, b.claimed))
}

// leaseRoom is what the broker's lease leaves the group (MaxUint64
// without one): the lease less what the allocator holds, the arrays
// being replaced counted free.
func (b *groupBudget) leaseRoom() uint64 {
	if !b.leased {
		return math.MaxUint64
	}
	r := satAdd(b.leaseBytes, b.leaseReplaced)
	return r - min(r, b.leaseHeld)
}

// capRoom is Active mode's room, in allocator bytes (MaxUint64 in Passive).
func (b *groupBudget) capRoom() uint64 {
	if b.mode != Active {
		return math.MaxUint64
	}
	return b.caps - min(b.caps, b.held-min(b.held, b.replaced))
}

// limRoom is the room under the allocator's cap once the arrays being
// replaced are freed (MaxUint64 with no cap).
func (b *groupBudget) limRoom() uint64 {
	if !b.capped {
		return math.MaxUint64
	}
	r := satAdd(b.room, b.replaced)
	return r - min(r, b.over)
}

// charged is the sizes rounded to the allocator's granularity, summed.
func (b *groupBudget) charged(sizes []uint64) uint64 {
	var sum uint64
	for _, s := range sizes {
		sum = satAdd(sum, roundUp(s, b.gran))
	}
	return sum
}

// planCost is the budget and cost Plan is given: the device's memory, d,
// bounds the cost the allocator states and the caps, r, bound the
// charged bytes. Plan takes one budget, B = min(d, r), so each bound is
// shifted onto it: cost ≤ d and charged ≤ r exactly when
// max(cost − (d − B), charged − (r − B)) ≤ B (a saturated figure stays
// saturated: it never fits).
func (b *groupBudget) planCost() (budget uint64, cost func([]uint64) uint64) {
	d, r := b.device(), min(b.capRoom(), b.limRoom())
	budget = min(d, r)
	less := func(x, y uint64) uint64 {
		if x == math.MaxUint64 {
			return x
		}
		return x - min(x, y)
	}
	return budget, func(sizes []uint64) uint64 {
		return max(less(b.cost(sizes), d-budget), less(b.charged(sizes), r-budget))
	}
}

// String explains the budget: where each figure comes from, and what
// bounds it.
func (b *groupBudget) String() string {
	var s strings.Builder
	// What there is is written as the plan's errors write it (rounded
	// down), so that the budget and the bound it is never read apart.
	fmt.Fprintf(&s, "%s mode, budget %s: %s free on the device", b.mode, bytesDown(b.budget), bytesDown(b.free))
	if b.trimmed {
		s.WriteString(" after trimming the allocator's cache")
	}
	if b.replaced > 0 {
		fmt.Fprintf(&s, " + %s of arrays being replaced", units.Format(b.replaced))
	}
	if b.lost > 0 {
		fmt.Fprintf(&s, " − %s that %s took beyond what it was counted to take in an earlier try (its growth policy)",
			units.Format(b.lost), b.kind)
	}
	if b.claimed > 0 {
		fmt.Fprintf(&s, " − %s other groups claim back from busy groups", units.Format(b.claimed))
	}
	if b.planReserve > 0 {
		fmt.Fprintf(&s, "; the plan's arrays take %s beyond their bytes as %s gets its memory in %s device pages",
			units.Format(b.planReserve), b.kind, units.Format(b.page))
	}
	if r := b.capRoom(); r < math.MaxUint64 {
		fmt.Fprintf(&s, ", at most %s under the group's caps (%s, less %s its members hold)",
			bytesDown(r), units.Format(b.caps), units.Format(b.held-min(b.held, b.replaced)))
	}
	if r := b.leaseRoom(); r < math.MaxUint64 {
		fmt.Fprintf(&s, ", at most %s under the broker's lease (%s, less %s the allocator holds%s)",
			bytesDown(r), units.Format(b.leaseBytes), units.Format(b.leaseHeld), replacedNote(b.leaseReplaced))
	}
	if r := b.limRoom(); r < math.MaxUint64 && r < b.leaseRoom() {
		left := bytesDown(b.room) + " left"
		if b.over > 0 {
			left = units.Format(b.over) + " over it"
		}
		fmt.Fprintf(&s, ", at most %s under the allocation cap (%s%s)",
			bytesDown(r), left, replacedNote(b.replaced))
	}
	return s.String()
}

func replacedNote(n uint64) string {
	if n == 0 {
		return ""
	}
	return " + " + units.Format(n) + " being replaced"
}

// BudgetBound says what bounded the memory a group could plan with. A
// plain value.
type BudgetBound uint8

const (
	// BoundDevice: the device's free memory (and the arrays being
	// replaced).
	BoundDevice BudgetBound = iota + 1
	// BoundCaps: the Active limit mode's caps of the group's members.
	BoundCaps
	// BoundCap: the allocation cap (WithCap, $VRAM_ALLOC_CONF's limit, an
	// alloc.Limit in the WithWrap chain).
	BoundCap
	// BoundLease: the node broker's lease (WithBroker), which other
	// processes' leases bound.
	BoundLease
)

// BudgetError is wrapped by the error of an Allocate whose group did not
// fit the memory it could plan with: its message gives the figures, and
// Bound says which of them bounded the budget, for a caller (a command)
// to say what to change in its own terms. Reach it with errors.As.
type BudgetError struct {
	Group  string
	Budget uint64      // bytes
	Bound  BudgetBound // what bounded Budget
	desc   string
}

func (e *BudgetError) Error() string { return e.desc }

// budgetErr is b as a BudgetError.
func (b *groupBudget) budgetErr() *BudgetError {
	bound := BoundDevice
	dev, caps, lim := b.device(), b.capRoom(), b.limRoom()
	switch {
	case b.leased && b.leaseRoom() <= min(satAdd(b.free, b.replaced), caps, lim):
		bound = BoundLease
	case lim < dev && lim <= caps:
		bound = BoundCap
	case caps < dev && caps < lim:
		bound = BoundCaps
	}
	return &BudgetError{Group: b.group, Budget: b.budget, Bound: bound, desc: b.String()}
}

// advice says what would give the group more memory, by what bounds its
// budget.
func (b *groupBudget) advice() string {
	dev := b.device()
	leaseBinds := b.leased && b.leaseRoom() <= satAdd(b.free, b.replaced)
	var parts []string
	if dev <= b.capRoom() && dev <= b.limRoom() && !leaseBinds {
		parts = append(parts, "free device memory (other groups' arrays, other programs on the GPU)")
		if b.planReserve > 0 || b.gran < b.page {
			parts = append(parts, "ask for fewer, larger arrays (each may round up to a page)")
		}
		if b.gran >= b.page && b.gran > DefaultGranularity {
			parts = append(parts, fmt.Sprintf("use the Pool allocator, whose small arrays share pages (this one rounds each array up to %s)", units.Format(b.gran)))
		}
	}
	if b.capRoom() < math.MaxUint64 && b.capRoom() <= min(dev, b.limRoom()) {
		parts = append(parts, "raise the members' proportions, free arrays they hold, or use the Passive limit mode")
	}
	if b.limRoom() < math.MaxUint64 && b.limRoom() <= min(dev, b.capRoom()) && !b.leased {
		parts = append(parts, "raise the allocation cap or free arrays under it")
	}
	if b.leased && (leaseBinds || b.limRoom() <= min(dev, b.capRoom())) {
		parts = append(parts, "a larger share of the broker's device (LeaseOptions), or other processes' leases given back (vram broker status shows who holds what)")
	}
	return "to give the group more: " + strings.Join(parts, "; ")
}

// planSizes lists the bytes (unrounded) of the device arrays plan
// allocates for reqs: each chunkable one once per buffer.
func planSizes(reqs map[string]map[string]ArrayRequest, plan ChunkPlan) []uint64 {
	var sizes []uint64
	for client, labels := range reqs {
		for label, r := range labels {
			if !r.Memory.OnDevice() {
				continue
			}
			n, _ := elements(plan.ChunkedShapes[client][label])
			copies := 1
			if r.Chunkable() {
				copies = max(plan.Buffers, 1)
			}
			for range copies {
				sizes = append(sizes, satMul(n, r.DType.Size()))
			}
		}
	}
	return sizes
}

// fitsBeside reports whether plan's arrays fit while the arrays being
// replaced are still held: their stated cost within the device's free
// memory (less what was lost), their charged bytes within the
// allocator's cap as it counts now. The Active caps are not checked
// again: they bound what the group holds once the replaced arrays are
// freed, which the plan already respects.
func (b *groupBudget) fitsBeside(plan ChunkPlan) bool {
	if b.replaced == 0 {
		return true
	}
	d := b.free - min(b.free, b.lost)
	if b.leased {
		d = min(d, b.leaseBytes-min(b.leaseBytes, b.leaseHeld))
	}
	return b.planDevice <= d && (!b.capped || plan.BytesPerChunk <= b.room)
}

// planGroup plans reqs within b, once: with the allocator's stated cost
// bounded by the device's memory and the charged bytes by the caps (see
// planCost). On an error, b holds the budget it was made against, for
// the message.
func planGroup(reqs map[string]map[string]ArrayRequest, b *groupBudget, opts PlanOptions) (ChunkPlan, error) {
	b.budget, opts.Cost = b.planCost()
	p, err := Plan(reqs, b.budget, opts)
	if err == nil {
		p, err = withinOwnCaps(reqs, b, opts, p)
	}
	if err != nil {
		return p, err
	}
	b.planDevice = b.cost(planSizes(reqs, p))
	b.planReserve = b.planDevice - min(b.planDevice, p.BytesPerChunk)
	return p, nil
}
