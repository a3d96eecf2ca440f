package vram

// The budget Allocate plans a group with: its rules, stated here once.
//
// A group may take at most:
//
//   - of the device, its free memory plus what the arrays being replaced
//     take, as the allocator states what the arrays take from the device
//     (alloc.Coster; alloc/cost.go). The device hands memory out in pages
//     (2 MiB on current drivers and on the simulator), and an allocator
//     that rounds finer (the Pool and the AsyncPool round to 512 B) gets
//     it as segments of whole pages: an array above the Pool's
//     small-request size (1 MiB) may cost its bytes rounded up to a page,
//     and the small ones share pages (alloc.PageCost). The allocator's
//     cache is not counted free: it is trimmed, and the plan made again,
//     only when the plan fails for want of memory or has more chunks than
//     the cache given back would leave (planOnce; the trim waits no longer
//     than Allocate's context);
//   - in Active mode, the sum of the members' caps less what they hold,
//     and for each requester its own cap less what it holds (below), in
//     the bytes the allocator charges (each array rounded to its
//     granularity, 512 B for the Pool), the arrays being replaced counted
//     free;
//   - under a cap (WithCap, SetCap, or an alloc.Limit in the WithWrap
//     chain), the room it leaves (alloc.Coster's Room), in charged bytes,
//     less what SetCap put the arrays over it;
//   - less, of the device, what other groups claim back from busy groups
//     (replan.go).
//
// The plan is made once against these, with the fewest chunks whose
// arrays fit all of them (Plan with PlanOptions.Cost), and the arrays are
// allocated with alloc.AllocExact, so the Pool takes no more than it
// stated. An allocator that does not state its cost (a wrapper that does
// not forward alloc.Coster) is taken to give every array a segment of its
// own, its bytes rounded up to a page; should it still run the device out
// (its growth policy hidden behind the wrapper), allocateGroup gives the
// arrays back and plans again with what it took kept back, up to three
// times. Allocations of all groups are serialized from reading the free
// memory to the last allocation (planMu), so two groups never plan
// against the same free memory. A refusal names each figure
// (groupBudget.String) and what would raise the one that binds (advice).

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
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
	trimmed  bool   // the cache was given back before free was read (planOnce)
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
	// capAt is the manager's cap (its alloc.Limit's) when the budget was
	// read, read before room: an allocation refused under a cap that is
	// no longer capAt was planned under another (SetCap meanwhile).
	capAt uint64

	// own is, in Active mode, each requester's own room
	// (below); nil in Passive mode.
	own map[*Client]ownRoom

	// lost is device memory an allocator that does not state its cost
	// took beyond it in earlier tries of this allocation, kept back.
	lost uint64
	// claimed is device memory other groups claim back from busy groups
	// (replan.go), kept back for them.
	claimed uint64
	// With a broker's lease (leased; package account), leaseBytes is what the
	// allocator may hold under it, leaseHeld what it holds, its cache
	// included, and leaseReplaced what the arrays being replaced take
	// (device bytes, as the allocator states them): the group plans
	// within the lease less what the allocator holds beside them.
	leased                               bool
	leaseBytes, leaseHeld, leaseReplaced uint64
	shrink                               bool // the broker asks the account to shrink
	// cached is the allocator's cache when the budget was read (held,
	// not in use: neither free nor outside the lease); trimming says a
	// trim of it was in flight.
	cached   uint64
	trimming bool

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

// giveBack counts bytes of device memory the allocator holds (its cache,
// a victim's arrays) as given back: free on the device, and no longer
// held under a broker's lease.
func (b *groupBudget) giveBack(bytes uint64) {
	b.free = satAdd(b.free, bytes)
	b.leaseHeld -= min(b.leaseHeld, bytes)
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
func planSizes(reqs map[*Client]map[string]ArrayRequest, plan groupPlan) []uint64 {
	var sizes []uint64
	for client, labels := range reqs {
		for label, r := range labels {
			if !r.Memory.OnDevice() {
				continue
			}
			n, _ := elements(plan.shapes[client][label])
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

// groupPlan is a group's plan and each requester's shapes, by client
// (the plan's ChunkedShapes has them by name, for its readers).
type groupPlan struct {
	ChunkPlan
	shapes map[*Client]map[string][]int
}

// planGroupOnce plans reqs as Plan does, keeping the shapes by client.
func planGroupOnce(reqs map[*Client]map[string]ArrayRequest, budget uint64, opts PlanOptions) (groupPlan, error) {
	p, shapes, err := planClients(reqs, budget, opts)
	return groupPlan{p, shapes}, err
}

// planGroup plans reqs within b, once: with the allocator's stated cost
// bounded by the device's memory and the charged bytes by the caps (see
// planCost). On an error, b holds the budget it was made against, for
// the message.
func planGroup(reqs map[*Client]map[string]ArrayRequest, b *groupBudget, opts PlanOptions) (groupPlan, error) {
	b.budget, opts.Cost = b.planCost()
	p, err := planGroupOnce(reqs, b.budget, opts)
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

// planBudget reads the budget and plans the group once.
func (tx *allocTx) planBudget() error {
	if err := tx.m.readBudget(&tx.gb); err != nil {
		return fmt.Errorf("allocate group %q: %w", tx.group, err)
	}
	plan, err := planGroup(tx.q, &tx.gb, PlanOptions{Granularity: tx.gb.gran, Buffers: tx.ac.buffers, DeviceBytes: tx.m.dev.Info().TotalBytes, more: tx.gb.advice})
	if err == nil {
		tx.plan = plan
		return nil
	}
	var pe *PlanError
	if !errors.As(err, &pe) && !errors.Is(err, ErrRunTooLarge) && !errors.Is(err, ErrOutOfMemory) {
		return fmt.Errorf("allocate group %q: %w", tx.group, err) // the requests themselves
	}
	return fmt.Errorf("allocate group %q with %w: %w", tx.group, tx.gb.budgetErr(), err)
}

// planOnce reads the budget and plans the group against the allocator's
// stated cost, trimming the allocator's cache and planning again only
// when that could help (trimWouldHelp); errors say what bounds the
// budget.
//
// A trim waits for work: every stream that owns cached blocks must reach
// the frees that cached them before their pages go back, and that work
// may be another group's, a long kernel included. So the plan is made
// with the device's free memory as it is, the cache left alone, and the
// cache is given back only when the plan falls short for want of memory:
// it fails, or it has more chunks than it would with the cached bytes
// given back. The trim waits no longer than Allocate's context: when the
// context ends first, Allocate fails with its error and the trim
// finishes in the background (account.Trim).
func (tx *allocTx) planOnce(ctx context.Context) error {
	tx.gb.trimmed = false
	err := tx.planBudget()
	if tx.trimWouldHelp(err) {
		if terr := tx.m.acct.Trim(ctx); terr != nil {
			return fmt.Errorf("allocate group %q: %w", tx.group, terr)
		}
		tx.gb.trimmed = true
		err = tx.planBudget()
	}
	return err
}

// trimWouldHelp reports whether giving the cache back could improve on
// the plan just made against tx.gb (err its error): it failed for want
// of memory, or planning with the cached bytes counted free gives fewer
// chunks.
func (tx *allocTx) trimWouldHelp(err error) bool {
	if tx.gb.cached == 0 && !tx.gb.trimming {
		return false
	}
	if err != nil {
		return forWantOfMemory(err)
	}
	if tx.plan.Chunks <= 1 {
		return false
	}
	gb := tx.gb
	gb.giveBack(gb.cached)
	p, perr := planGroup(tx.q, &gb, PlanOptions{Granularity: gb.gran, Buffers: tx.ac.buffers})
	return perr == nil && p.Chunks < tx.plan.Chunks
}

// forWantOfMemory reports whether a plan's error says the budget was too
// small (rather than that the requests are bad).
func forWantOfMemory(err error) bool {
	var pe *PlanError
	return errors.As(err, &pe) || errors.Is(err, ErrUnchunkable) ||
		errors.Is(err, ErrRunTooLarge) || errors.Is(err, ErrOutOfMemory)
}

// readBudget reads the account's room (the device's free memory, the
// allocator's statement of costs, the room its caps and a broker's lease
// leave; the allocator's cache is not counted free: a cached block may be
// too fragmented to serve, and trimming waits for other streams' work;
// see planOnce), then what the arrays being replaced and the group hold.
// useMu must be held.
func (m *Manager) readBudget(b *groupBudget) error {
	r, err := m.acct.Room()
	if err != nil {
		return err
	}
	b.free, b.capAt, b.over, b.page = r.Free, r.Cap, r.Over, r.Page
	b.gran = r.Granularity
	if b.gran == 0 {
		b.gran = DefaultGranularity
	}
	b.coster, b.kind, b.capped, b.room = r.Coster, "the allocator", r.CapRoom < math.MaxUint64, r.CapRoom
	if r.Coster != nil {
		b.kind = "the " + r.Kind.String() + " allocator"
	}
	b.leased, b.leaseBytes, b.leaseHeld, b.shrink = r.Leased, r.Lease, r.Held, r.Shrink
	b.cached, b.trimming = r.Cached, r.Trimming
	m.mu.Lock()
	m.heldLocked(b)
	m.mu.Unlock()
	return nil
}

// heldLocked reads into b what the arrays being replaced take, and in
// Active mode the group's caps and what its members hold. It is read
// after the free memory and the cap's room: an array freed meanwhile
// (Client.Free) is then left out of one figure or both, never counted in
// both. m.mu must be held.
func (m *Manager) heldLocked(b *groupBudget) {
	b.replaced, b.caps, b.held = 0, 0, 0
	b.claimed = m.claimedLocked(b.group)
	for _, c := range b.requesters {
		if !c.closed {
			b.replaced += c.replacedLocked(b.queue[c])
		}
	}
	if b.mode == Active {
		for _, c := range m.reg.members(b.group) {
			b.caps += m.capLocked(c)
			b.held += c.held
		}
	}
	m.ownRoomLocked(b)
	b.leaseReplaced = 0
	if b.leased {
		b.leaseReplaced = b.cost(replacedSizesLocked(b.requesters, b.queue))
	}
}

// replacedSizesLocked lists the bytes of the device arrays the
// requesters hold under the labels they queued: the arrays being
// replaced, as the device counts them (their charged bytes may be less
// than the pages they take). m.mu must be held.
func replacedSizesLocked(requesters []*Client, queue map[*Client]map[string]ArrayRequest) []uint64 {
	var sizes []uint64
	for _, c := range requesters {
		if c.closed {
			continue
		}
		for l := range queue[c] {
			for _, a := range c.arrays[l] {
				if d := a.dev; d != nil && d.memory == Device {
					sizes = append(sizes, d.Bytes())
				}
			}
		}
	}
	return sizes
}

// Each member's own cap, in the Active limit mode.
//
// A group's budget in Active mode is the sum of its members' caps less
// what they hold (above); on top of it each requester's arrays must
// fit its own cap less what it holds beyond the arrays being replaced,
// in the bytes the allocator charges. Each requester is planned alone
// within its own room, with the group's buffers in flight once the group
// is chunked; the shortest chunk any of them needs bounds the group's
// chunk length (PlanOptions.MaxChunkLength), so the group takes the
// largest chunk count of theirs. (cubie bounds the group's sum only.)

// ownRoomLocked reads into b each requester's own room: its cap less what
// it holds beyond the arrays being replaced (Active mode only). m.mu must
// be held.
func (m *Manager) ownRoomLocked(b *groupBudget) {
	b.own = nil
	if b.mode != Active {
		return
	}
	b.own = make(map[*Client]ownRoom, len(b.requesters))
	for _, c := range b.requesters {
		if c.closed {
			continue
		}
		held := c.held - min(c.held, c.replacedLocked(b.queue[c]))
		cp := m.capLocked(c)
		b.own[c] = ownRoom{cap: cp, held: held, room: cp - min(cp, held)}
	}
}

// ownRoom is one requester's cap, what it holds beyond the arrays being
// replaced, and what that leaves (allocator bytes).
type ownRoom struct{ cap, held, room uint64 }

// replacedLocked is what c's arrays under the labels of reqs take, as
// charged: the arrays an allocation of reqs replaces. m.mu must be held.
func (c *Client) replacedLocked(reqs map[string]ArrayRequest) uint64 {
	var n uint64
	for l := range reqs {
		for _, a := range c.arrays[l] {
			n += a.charged
		}
	}
	return n
}

// withinOwnCaps returns p, the group's plan, or the plan made again with
// a chunk length short enough for every requester's arrays to fit its
// own room (b.own); an error when one's arrays cannot, however chunked.
func withinOwnCaps(reqs map[*Client]map[string]ArrayRequest, b *groupBudget, opts PlanOptions, p groupPlan) (groupPlan, error) {
	if b.own == nil {
		return p, nil
	}
	clients := slices.SortedFunc(maps.Keys(reqs), byID)
	for range 3 { // the bound only falls; twice settles it (once the group is chunked, with its buffers)
		bound := 0
		for _, c := range clients {
			o := PlanOptions{Granularity: opts.Granularity, Buffers: opts.Buffers, DeviceBytes: opts.DeviceBytes, more: opts.more}
			if p.Chunks > 1 {
				o.MaxChunkLength = p.ChunkLength // chunked as the group is, with its buffers
			}
			r, ok := b.own[c]
			if !ok {
				continue // closed meanwhile: its arrays are freed at install
			}
			q, _, err := planOwners([]planOwner{{name: c.String(), reqs: reqs[c]}}, r.room, o)
			if err != nil {
				return p, fmt.Errorf("%v's arrays do not fit its own cap in the Active limit mode (%s, %s of it held besides the arrays being replaced; raise its proportion, free what it holds, or use the Passive mode): %w",
					c, units.Format(r.cap), units.Format(r.held), err)
			}
			if q.Chunks > 1 && q.ChunkLength < p.ChunkLength && (bound == 0 || q.ChunkLength < bound) {
				bound = q.ChunkLength
			}
		}
		if bound == 0 {
			return p, nil
		}
		opts.MaxChunkLength = bound
		next, err := planGroupOnce(reqs, b.budget, opts)
		if err != nil {
			return p, err
		}
		p = next
	}
	return p, nil
}

// claimedLocked is the device memory other groups than group have claimed
// back from busy groups. m.mu must be held.
func (m *Manager) claimedLocked(group string) uint64 {
	var sum uint64
	for name, g := range m.reg.groups {
		if name != group {
			sum = satAdd(sum, g.claim)
		}
	}
	return sum
}
