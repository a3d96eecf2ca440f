package vram

// The allocation transaction: one Allocate's allocation of a group,
// as a type with named steps, run in order with the group lock, planMu
// and useMu held:
//
//  1. take: the group's queue (and its stream), under mu;
//  2. plan: read the budget (the account's room and the registry's
//     figures) and plan once against the allocator's cost (budget.go);
//  3. grow: when the plan falls short for want of a broker's lease,
//     reserve what the group's arrays take unchunked in the account,
//     which claims it, and plan again within what it grants;
//  4. evict: idle clients of other groups, when the plan fails or chunks
//     for want of their memory (evict.go);
//  5. setAside: free the arrays being replaced first, only when the plan
//     needs their memory (or a host array the pinned-memory limit does);
//  6. reserve: with a broker's lease, the plan's device bytes reserved in
//     the account, which reports them before they are taken (planning
//     again within the lease when it comes short);
//  7. allocate: every planned array, all or nothing;
//  8. install: the new arrays in their clients, the responses built and
//     their OnAllocated calls queued, under mu;
//  9. deliver: free what the new arrays replaced, settle the groups'
//     claims (replan.go); Allocate then makes the hook calls with no lock
//     held;
//
// and rollback, on a failure after step 1: the queue is put back, and
// the owners of arrays set aside or evicted are told (OnInvalidate) and
// named. A cancelled context stops the transaction until step 3, and
// leaves everything as it was.

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/vramkit/vram/account"
	"github.com/vramkit/vram/device"
	"github.com/vramkit/vram/internal/units"
)

// allocTx is one allocation of a group. Its fields are the
// transaction's own, touched by one goroutine.
type allocTx struct {
	m       *Manager
	trigger *Client
	group   string
	ac      allocConfig

	stream       device.Stream
	q            map[*Client]map[string]ArrayRequest // the queue taken
	requesters   []*Client                           // q's clients, by id
	gb           groupBudget
	plan         groupPlan
	todo         []pending     // the arrays of plan
	made         []*allocation // todo's arrays, once allocated
	setAside     []freeWork    // replaced arrays freed before allocating
	replaced     []freeWork    // arrays the new ones replaced, freed after install
	hostRetry    bool          // host arrays were set aside after a host failure
	freeErrs     map[*Client]error
	victims      []*Client            // clients evicted for the group (evict.go), their OnInvalidate queued
	evictedBytes uint64               // device bytes their arrays took, as stated
	roomFor      string               // what eviction makes room for, in its reason ("": the group)
	res          *account.Reservation // room the account holds for the plan (a broker's lease); nil: none
}

// allocateGroup is Allocate with the group lock, planMu and useMu
// held: the transaction's steps in order.
func (m *Manager) allocateGroup(ctx context.Context, trigger *Client, group string, ac allocConfig) (groupOutcome, error) {
	if res, done, err := m.rebroadcast(trigger, group); done { // nothing queued (below)
		return res, err
	}
	tx := &allocTx{m: m, trigger: trigger, group: group, ac: ac, freeErrs: map[*Client]error{}}
	if err := tx.take(); err != nil {
		return groupOutcome{}, err
	}
	defer func() { tx.res.Release() }() // the lease may be given back again
	planErr := tx.grow(ctx, tx.planOnce(ctx))
	// The last point where a cancelled Allocate leaves everything as it
	// was: nothing has been freed or allocated yet.
	if err := ctx.Err(); err != nil {
		tx.restoreQueue()
		return groupOutcome{}, fmt.Errorf("allocate group %q: %w", group, err)
	}
	tx.warn(planErr) // errors.go
	if err := tx.evict(ctx, planErr); err != nil {
		return tx.rollback(tx.claim(err))
	}
	if !tx.gb.fitsBeside(tx.plan.ChunkPlan) {
		tx.setAsideReplaced(false)
	}
	if err := tx.reserve(ctx); err != nil {
		return tx.rollback(err)
	}
	if err := tx.allocate(ctx); err != nil {
		return tx.rollback(err)
	}
	res := tx.install()
	tx.freeReplaced(&res)
	res.invalidated = tx.victims
	tx.settleClaims()
	return res, nil
}

// take takes the group's queue and stream.
func (tx *allocTx) take() error {
	m := tx.m
	m.mu.Lock()
	if err := m.checkLocked(tx.trigger); err != nil {
		m.mu.Unlock()
		return err
	}
	g := m.reg.groups[tx.group]
	if g == nil || len(g.queue) == 0 {
		m.mu.Unlock()
		return fmt.Errorf("allocate for %v: group %q has no requests queued (queue them with Client.Queue first; "+
			"another member's Allocate may have allocated them already): %w", tx.trigger, tx.group, ErrNothingQueued)
	}
	q := g.queue
	g.queue = map[*Client]map[string]ArrayRequest{}
	tx.q = q
	tx.requesters = slices.SortedFunc(maps.Keys(q), byID)
	tx.gb = groupBudget{mode: m.mode, group: tx.group, requesters: tx.requesters, queue: q}
	m.mu.Unlock()
	s, err := m.groups.GroupStream(tx.group)
	if err != nil {
		tx.restoreQueue()
		return fmt.Errorf("allocate group %q: %w", tx.group, err)
	}
	tx.stream = s
	return nil
}

// restoreQueue puts the requests taken back in their clients' queues,
// unless a client has queued since: its newer set replaced them.
func (tx *allocTx) restoreQueue() {
	m := tx.m
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, c := range tx.requesters {
		if c.closed {
			continue
		}
		if _, newer := m.reg.groups[c.group].queue[c]; !newer {
			m.queueLocked(c, c.group, tx.q[c])
		}
	}
}

// setAsideReplaced frees the arrays being replaced before the new ones
// are allocated (only host arrays with hostOnly), adding them to
// tx.setAside: the plan needs their memory. A failure after this tells
// their owners.
func (tx *allocTx) setAsideReplaced(hostOnly bool) {
	m := tx.m
	m.mu.Lock()
	var old []freeWork
	for _, c := range tx.requesters {
		if c.closed {
			continue
		}
		var as []*allocation
		for _, l := range slices.Sorted(maps.Keys(tx.q[c])) {
			if hostOnly && !c.holdsHostLocked(l) {
				continue
			}
			as = append(as, c.takeLocked(l)...)
		}
		if len(as) > 0 {
			old = append(old, freeWork{c: c, allocs: as, s: tx.stream})
		}
	}
	m.mu.Unlock()
	m.freeEach(old, tx.freeErrs)
	tx.setAside = append(tx.setAside, old...)
	if !hostOnly {
		tx.gb.held -= min(tx.gb.held, tx.gb.replaced)
		tx.gb.replaced = 0
	}
}

// maxReplans bounds how often Allocate plans a group again after an
// allocator that does not state its cost took more of the device than
// it was counted to.
const maxReplans = 3

// allocate allocates the plan's arrays, all or nothing. A host array
// that does not fit beside the host arrays it replaces sets those aside
// and tries once more. With an allocator that does not state its cost,
// a device that runs out makes it plan again with what the allocator
// took beyond the counted cost kept back; an allocation refused under a
// cap SetCap changed since the plan makes it plan again under the new.
func (tx *allocTx) allocate(ctx context.Context) error {
	for attempt := 0; ; attempt++ {
		tx.todo = pendingOf(tx.requesters, tx.q, tx.plan)
		made, failed, beyond, err := tx.m.allocAll(tx.todo, tx.stream, &tx.gb)
		if err == nil {
			tx.made = made
			return nil
		}
		if !errors.Is(err, ErrOutOfMemory) {
			return tx.failure(failed, err)
		}
		// Only a device array's failure says anything about device
		// memory; a host array's is its own limit's.
		if tx.todo[failed].req.Memory != Device {
			if tx.hostRetry {
				return tx.failure(failed, err)
			}
			tx.hostRetry = true
			n := len(tx.setAside)
			if tx.setAsideReplaced(true); len(tx.setAside) > n {
				continue
			}
			return tx.failure(failed, err)
		}
		if attempt < maxReplans && tx.capChanged() {
			// The cap changed (SetCap) after the group was planned:
			// plan again under the cap it has now.
			if perr := tx.replan(ctx, 0); perr != nil {
				return tx.failure(failed, errors.Join(err, perr))
			}
			continue
		}
		if tx.gb.stated() || beyond == 0 || attempt >= maxReplans {
			return tx.failure(failed, err)
		}
		if perr := tx.replan(ctx, beyond); perr != nil {
			return tx.failure(failed, errors.Join(err, perr))
		}
	}
}

// replan plans again with beyond more device bytes kept back. The
// allocation just failed for want of memory, and the arrays it made went
// back to the allocator's cache: it is trimmed first (account.Trim).
func (tx *allocTx) replan(ctx context.Context, beyond uint64) error {
	m := tx.m
	m.replans.Add(1)
	tx.gb.lost = satAdd(tx.gb.lost, beyond)
	if _, st := m.acct.Stats(); st.Cached() > 0 {
		if err := m.acct.Trim(ctx); err != nil {
			return err
		}
		tx.gb.trimmed = true
	}
	err := m.readBudget(&tx.gb)
	if err == nil {
		var next groupPlan
		if next, err = planGroup(tx.q, &tx.gb, PlanOptions{Granularity: tx.gb.gran, Buffers: tx.ac.buffers}); err == nil {
			tx.plan = next
			if !tx.gb.fitsBeside(tx.plan.ChunkPlan) {
				tx.setAsideReplaced(false)
			}
			return nil
		}
	}
	return fmt.Errorf("plan again with %s less: %w", units.Format(tx.gb.lost), err)
}

// capChanged reports whether the cap changed (SetCap, the broker's
// lease) since the budget was read.
func (tx *allocTx) capChanged() bool {
	r, err := tx.m.acct.Room()
	return err == nil && r.Cap != tx.gb.capAt
}

// grow is the transaction's step for a plan (or its error, planErr) that
// falls short for want of the broker's lease: it reserves what the
// group's arrays take unchunked in the account, which claims it from the
// broker (waiting under the Allocate's context), and plans again within
// what the broker grants. It returns the error the transaction goes on
// with: a failed claim is that error only when there was no plan.
func (tx *allocTx) grow(ctx context.Context, planErr error) error {
	if !tx.shortOfLease(planErr) || tx.gb.shrink {
		return planErr // or asked to give memory back
	}
	before, want := tx.gb.leaseBytes, tx.leaseWant()
	if want <= before {
		return planErr // no more would help
	}
	err := tx.reserveBytes(ctx, want-min(want, tx.gb.leaseHeld))
	var short *account.ShortError
	switch {
	case err == nil:
	case !errors.As(err, &short): // the lease ended, or the broker was not told
		return errors.Join(planErr, fmt.Errorf("allocate group %q: %w", tx.group, err))
	case short.Refused() && planErr == nil: // the chunked plan goes on within the lease
		tx.m.log.Debug("vram: a claim of more of the broker's lease failed; the group goes on chunked", "group", tx.group, "err", err)
		return nil
	case short.Refused():
		return fmt.Errorf("%w; %w", planErr, err)
	case short.Lease.Bytes <= before:
		return planErr
	}
	if err := tx.planOnce(ctx); err != nil {
		if short != nil {
			return fmt.Errorf("%w; %v", err, short)
		}
		return err
	}
	return nil
}

// shortOfLease reports whether the plan (planErr its error) falls short
// for want of the lease: it failed for want of memory, or chunks, and
// the lease (or the cap that follows it) bounded its budget.
func (tx *allocTx) shortOfLease(planErr error) bool {
	switch {
	case !tx.gb.leased:
		return false
	case planErr == nil && tx.plan.Chunks <= 1, planErr != nil && !forWantOfMemory(planErr):
		return false
	}
	bound := tx.gb.budgetErr().Bound
	return bound == BoundLease || bound == BoundCap
}

// leaseWant is what the allocator would hold with the group's arrays
// allocated unchunked: what it holds less the arrays being replaced, plus
// the arrays at their full length, as the allocator states their cost.
func (tx *allocTx) leaseWant() uint64 {
	var sizes []uint64
	for _, c := range tx.requesters {
		for _, r := range tx.q[c] {
			if !r.Memory.OnDevice() {
				continue
			}
			n, _ := elements(r.Shape)
			sizes = append(sizes, satMul(n, r.DType.Size()))
		}
	}
	held := tx.gb.leaseHeld
	return satAdd(held-min(held, tx.gb.replaced), tx.gb.cost(sizes))
}

// reserve is the transaction's step before it allocates, under a
// broker's lease: the account reserves the plan's device bytes, reporting
// what the allocator will hold, so that no other process's claim takes
// that memory as free meanwhile. When the lease comes short (lowered
// meanwhile, or the broker grants less), the group is planned again
// within it. Past the context check the transaction completes whatever
// its context says, so the reservation is bounded by a time of its own.
func (tx *allocTx) reserve(ctx context.Context) error {
	if !tx.gb.leased {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), account.LeaseCallTimeout)
	defer cancel()
	for attempt := 0; ; attempt++ {
		err := tx.reserveBytes(ctx, tx.gb.planDevice)
		var short *account.ShortError
		switch {
		case err == nil:
			return nil
		case !errors.As(err, &short):
			return fmt.Errorf("allocate group %q: %w", tx.group, err)
		case attempt == maxReplans:
			return fmt.Errorf("allocate group %q: %v after %d plans: %w", tx.group, short, attempt+1, ErrLease)
		}
		if err := tx.planOnce(ctx); err != nil {
			return err
		}
		if !tx.gb.fitsBeside(tx.plan.ChunkPlan) {
			tx.setAsideReplaced(false)
		}
	}
}

// reserveBytes reserves n more device bytes in the account
// (account.Reserve), in place of the transaction's reservation so far,
// which it releases once the new one holds.
func (tx *allocTx) reserveBytes(ctx context.Context, n uint64) error {
	r, err := tx.m.acct.Reserve(ctx, n)
	tx.res.Release()
	tx.res = r
	return err
}

// failure is the error of array failed of todo, with the plan's figures.
func (tx *allocTx) failure(failed int, err error) error {
	p, plan := tx.todo[failed], tx.plan
	return fmt.Errorf("allocate group %q: %s of %v (%s, array %d of %d; plan: %d chunk(s) of %d runs, %s, %s on the device; %s): %w",
		tx.group, p.label, p.c, fmtShape(p.req.DType, p.shape), failed+1, len(tx.todo),
		plan.Chunks, plan.ChunkLength, units.Format(plan.BytesPerChunk), units.Format(tx.gb.planDevice), &tx.gb, err)
}

// rollback puts the queue back after a failed allocation; when arrays
// being replaced were set aside, it names their owners and labels and
// queues their OnInvalidate hooks.
func (tx *allocTx) rollback(err error) (groupOutcome, error) {
	tx.restoreQueue()
	err = tx.victimsErr(err)
	if len(tx.setAside) == 0 {
		return groupOutcome{invalidated: tx.victims}, err
	}
	m := tx.m
	var lost []string
	var told []*Client
	reason := fmt.Errorf("Allocate of group %q freed the arrays it was replacing and then failed: %w (%w)", tx.group, ErrFreed, err)
	m.mu.Lock()
	for _, w := range tx.setAside {
		labels := make([]string, 0, len(w.allocs))
		for _, a := range w.allocs {
			if !slices.Contains(labels, a.label) {
				labels = append(labels, a.label)
			}
		}
		lost = append(lost, fmt.Sprintf("%v: %s", w.c, strings.Join(labels, ", ")))
		if !w.c.closed && w.c.invalidateLocked(reason, true) != nil {
			told = append(told, w.c)
		}
	}
	m.mu.Unlock()
	var errs []error
	for _, w := range tx.setAside {
		errs = append(errs, tx.freeErrs[w.c])
	}
	lostErr := fmt.Errorf("the plan needed the memory of the arrays being replaced, so they were freed first and are gone "+
		"(%s); their owners' OnInvalidate hooks are called and their requests stay queued", strings.Join(lost, "; "))
	return groupOutcome{invalidated: append(told, tx.victims...)}, errors.Join(err, lostErr, errors.Join(errs...))
}

// install puts the new arrays in their clients, in place of what they
// held under the same labels (kept in tx for freeReplaced), and builds
// every response, queuing each OnAllocated call (not ready: freeReplaced
// completes the responses first) so that it comes before any later
// invalidation.
func (tx *allocTx) install() groupOutcome {
	m := tx.m
	m.mu.Lock()
	defer m.mu.Unlock()
	var res groupOutcome
	res.out = make([]delivery, 0, len(tx.requesters))
	isReq := make(map[*Client]bool, len(tx.requesters))
	idx := 0 // made is in todo's order: each requester's arrays in a run
	for _, c := range tx.requesters {
		isReq[c] = true
		n := idx
		for n < len(tx.todo) && tx.todo[n].c == c {
			n++
		}
		mine := tx.made[idx:n]
		idx = n
		if c.closed {
			tx.replaced = append(tx.replaced, freeWork{c: c, allocs: mine, s: tx.stream})
			continue
		}
		res.out = append(res.out, delivery{c: c, resp: tx.installLocked(c, mine)})
	}
	// Notaries: the other open members of the group, at install time.
	for _, c := range m.reg.members(tx.group) {
		if !isReq[c] {
			resp := newResponse(c, tx.plan.ChunkPlan, 1)
			resp.shapes = map[string][]int{}
			res.out = append(res.out, delivery{c: c, resp: resp})
		}
	}
	linkGroup(res.out)
	if g := m.reg.groups[tx.group]; g != nil {
		g.plan, g.planned = tx.plan.ChunkPlan, true // sent again by an Allocate with nothing queued
	}
	res.calls = make([]*hookCall, len(res.out))
	for i, d := range res.out {
		if d.c == tx.trigger {
			res.mine = d.resp
		}
		if d.c.onAllocated != nil {
			on, resp := d.c.onAllocated, d.resp
			res.calls[i] = d.c.postLocked(func() { on(resp) }, false)
		}
	}
	if res.mine == nil && !tx.trigger.closed {
		// The trigger moved to another group meanwhile: it gets the
		// chunk parameters of the group it asked for, and no hook call.
		res.mine = newResponse(tx.trigger, tx.plan.ChunkPlan, 1)
		res.mine.shapes = map[string][]int{}
	}
	return res
}

// installLocked gives c its arrays mine and returns its response. m.mu
// must be held.
func (tx *allocTx) installLocked(c *Client, mine []*allocation) *ArrayResponse {
	resp := newResponse(c, tx.plan.ChunkPlan, max(tx.plan.Buffers, 1))
	byLabel := map[string][]*allocation{}
	for _, a := range mine {
		byLabel[a.label] = append(byLabel[a.label], a)
	}
	for l, as := range byLabel {
		// What l holds now (the array being replaced, or one installed
		// meanwhile) is freed once the new one is in.
		if prev := c.takeLocked(l); len(prev) > 0 {
			tx.replaced = append(tx.replaced, freeWork{c: c, allocs: prev, s: tx.stream})
		}
		if c.arrays == nil {
			c.arrays = map[string][]*allocation{}
		}
		c.arrays[l] = as
		for _, a := range as {
			c.held += a.charged
		}
		c.work.evicted.Store(false)
		c.work.touch()
		for b := range resp.Buffers {
			a := as[min(b, len(as)-1)] // unchunkable: one array in every buffer
			if a.dev != nil {
				resp.Buffers[b].Device[l] = a.dev
			}
			if a.host != nil {
				resp.Buffers[b].Host[l] = a.host
			}
		}
	}
	resp.shapes = tx.plan.shapes[c]
	return resp
}

// freeReplaced frees what the new arrays replaced (and arrays made for
// clients closed meanwhile). The new arrays are in: a failure here does
// not fail the call; each owner's response carries it.
func (tx *allocTx) freeReplaced(res *groupOutcome) {
	tx.m.freeEach(tx.replaced, tx.freeErrs)
	for _, d := range res.out {
		d.resp.FreeErr = tx.freeErrs[d.c]
		delete(tx.freeErrs, d.c)
	}
	for c, err := range tx.freeErrs { // owners closed meanwhile: no response to carry it
		tx.m.log.Warn("vram: Allocate could not free arrays it replaced, or made for a client closed meanwhile",
			"client", c.String(), "group", tx.group, "err", err)
	}
}

// allocAll allocates todo on s, all or nothing: made[i] is todo[i]'s
// array. Device arrays are allocated from the largest down, so that a
// segment one of them opens serves those after it where it can. On
// failure it frees what it made and returns the index of the array that
// failed and, for an allocator that does not state its cost, how many
// device bytes it took beyond the cost counted for the arrays it made
// (read from the device's free memory). useMu must be held.
func (m *Manager) allocAll(todo []pending, s device.Stream, b *groupBudget) (made []*allocation, failed int, beyond uint64, err error) {
	bytes := make([]uint64, len(todo))
	order := make([]int, len(todo))
	for i, p := range todo {
		order[i] = i
		if p.req.Memory.OnDevice() {
			n, _ := elements(p.shape)
			bytes[i] = n * p.req.DType.Size()
		}
	}
	slices.SortStableFunc(order, func(x, y int) int { return cmp.Compare(bytes[y], bytes[x]) })
	free0, _, ferr := m.dev.MemInfo()
	made = make([]*allocation, len(todo))
	var sizes []uint64
	for _, i := range order {
		a, err := m.allocOne(todo[i], s, b.gran)
		if err == nil {
			made[i] = a
			if bytes[i] > 0 {
				sizes = append(sizes, bytes[i])
			}
			continue
		}
		if free, _, e := m.dev.MemInfo(); e == nil && ferr == nil && free < free0 && !b.stated() {
			if spent, want := free0-free, b.cost(sizes); spent > want {
				beyond = spent - want
			}
		}
		for _, j := range slices.Backward(order) {
			if made[j] != nil {
				if rerr := m.release(made[j], s); rerr != nil {
					err = errors.Join(err, fmt.Errorf("free %s of %v again: %w", todo[j].label, todo[j].c, rerr))
				}
			}
		}
		return nil, i, beyond, err
	}
	return made, 0, 0, nil
}

// linkGroup lets each response of one Allocate reach the others
// (ArrayResponse.Member).
func linkGroup(out []delivery) {
	group := make([]*ArrayResponse, len(out))
	for i, d := range out {
		group[i] = d.resp
	}
	for _, r := range group {
		r.group = group
	}
}

// pending is one array to allocate.
type pending struct {
	c     *Client
	label string
	req   ArrayRequest
	shape []int
}

func byID(a, b *Client) int { return cmp.Compare(a.id, b.id) }

func newResponse(c *Client, plan ChunkPlan, buffers int) *ArrayResponse {
	r := &ArrayResponse{Client: c, Buffers: make([]ArraySet, buffers), Plan: plan}
	for b := range r.Buffers {
		r.Buffers[b] = ArraySet{Device: map[string]*DeviceArray{}, Host: map[string]*HostArray{}}
	}
	return r
}

// pendingOf lists the arrays plan allocates for the requesters' queues
// q, in client id and label order, each chunkable one once per buffer.
func pendingOf(requesters []*Client, q map[*Client]map[string]ArrayRequest, plan groupPlan) []pending {
	n := 0
	for _, c := range requesters {
		n += len(q[c]) * max(plan.Buffers, 1)
	}
	todo := make([]pending, 0, n)
	labels := make([]string, 0, 8)
	for _, c := range requesters {
		shapes := plan.shapes[c]
		labels = labels[:0]
		for l := range q[c] {
			labels = append(labels, l)
		}
		slices.Sort(labels)
		for _, l := range labels {
			r := q[c][l]
			nb := 1
			if r.Chunkable() {
				nb = plan.Buffers
			}
			for range nb {
				todo = append(todo, pending{c: c, label: l, req: r, shape: shapes[l]})
			}
		}
	}
	return todo
}

// allocOne allocates one array. useMu must be held.
func (m *Manager) allocOne(p pending, s device.Stream, gran uint64) (*allocation, error) {
	shape := slices.Clone(p.shape)
	n, _ := elements(shape)
	bytes := n * p.req.DType.Size()
	a := &allocation{label: p.label}
	switch p.req.Memory {
	case Device:
		// A batch's arrays live long: no shared segment is grown for
		// them, so they take from the device what the allocator states.
		ptr, err := m.acct.AllocExact(bytes, s)
		if err != nil {
			return nil, err
		}
		a.dev = &DeviceArray{ptr: ptr, shape: shape, dtype: p.req.DType, memory: Device, label: p.label, owner: p.c}
		a.dev.setLast(s)
		a.charged = roundUp(bytes, gran)
	default:
		h, err := m.newHost(shape, p.req.DType, p.req.Memory, p.label, s)
		if err != nil {
			return nil, err
		}
		a.host = h
		if p.req.Memory == Mapped {
			a.dev = &DeviceArray{ptr: h.devPtr, shape: shape, dtype: p.req.DType, memory: Mapped, label: p.label, owner: p.c}
		}
	}
	return a, nil
}

func fmtShape(d DType, shape []int) string { return fmt.Sprintf("%v%v", d, shape) }

// rebroadcast answers an Allocate of group with nothing queued: ok
// false when the group has requests queued (allocate them), else every
// member's response with the group's last plan and no arrays, their
// OnAllocated calls queued, or ErrNothingQueued when there is no plan.
// The group lock must be held (so no allocation of the group runs
// meanwhile).
func (m *Manager) rebroadcast(trigger *Client, group string) (res groupOutcome, ok bool, err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.checkLocked(trigger); err != nil {
		return groupOutcome{}, true, err
	}
	g := m.reg.groups[group]
	if g != nil && len(g.queue) > 0 {
		return groupOutcome{}, false, nil
	}
	if g == nil || !g.planned {
		return groupOutcome{}, true, fmt.Errorf("allocate for %v: group %q has no requests queued and no plan yet to send again (queue requests with Client.Queue first; cubie's allocate_queue does nothing here): %w",
			trigger, group, ErrNothingQueued)
	}
	members := m.reg.members(group)
	res.out = make([]delivery, 0, len(members))
	res.calls = make([]*hookCall, len(members))
	for i, c := range members {
		resp := newResponse(c, g.plan, 1)
		resp.shapes = map[string][]int{}
		res.out = append(res.out, delivery{c: c, resp: resp})
		if c == trigger {
			res.mine = resp
		}
		if c.onAllocated != nil {
			on := c.onAllocated
			res.calls[i] = c.postLocked(func() { on(resp) }, false)
		}
	}
	return res, true, nil
}
