package vram

// Queued requests and their allocation.
//
// Clients queue requests per stream group; AllocateQueue takes the whole
// group's queue, works out the group's budget, plans the requests
// together (Plan), allocates every requester's arrays at the planned
// shapes on the group's stream, installs them, frees the arrays they
// replace, and then, with no lock held, calls the requesters' and the
// other members' OnAllocated hooks. If planning or any allocation fails,
// what was allocated is freed and the queue is put back as it was. The
// arrays being replaced are freed before allocating only when the plan
// needs their memory (or, for host arrays, the pinned-memory limit does);
// a failure after that calls their owners' OnInvalidate hooks.

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"

	"github.com/vramkit/vram/alloc"
	"github.com/vramkit/vram/device"
	"github.com/vramkit/vram/internal/units"
)

// ArrayResponse is what AllocateQueue gives a client: its arrays (none for
// a notary, a group member that queued nothing) and the group's chunk
// parameters. The arrays stay the manager's: it frees them on Free,
// FreeAll, the client's Close, a later allocation under the same label,
// or SetAllocator.
//
// A response is not changed after it is delivered; it is safe to read
// from many goroutines.
type ArrayResponse struct {
	// Client is the client the response is for.
	Client *Client
	// Arrays holds the client's device arrays by label (Device and
	// Mapped requests; for Mapped, the device address of the host
	// memory), buffer 0.
	Arrays map[string]*DeviceArray
	// Host holds the client's host arrays by label (Pinned, Mapped and
	// Pageable requests), buffer 0.
	Host map[string]*HostArray
	// Buffers holds every buffer when the plan has more than one in
	// flight (double buffering): Buffers[0] is {Arrays, Host}; the
	// unchunkable arrays are the same in every buffer.
	Buffers []ArraySet
	// Chunks is the number of passes the group's runs take.
	Chunks int
	// ChunkLength is the runs per chunk: the chunk axis of every
	// chunkable array was allocated with this length.
	ChunkLength int
	// TotalRuns is the number of runs.
	TotalRuns int
	// ChunkedShapes gives the shape each of the client's arrays was
	// allocated with, by label.
	ChunkedShapes map[string][]int
	// Plan is the group's whole plan (every requester's shapes).
	Plan ChunkPlan
	// FreeErr is what went wrong freeing the arrays this allocation
	// replaced for the client (nil when nothing did; always nil for a
	// notary). It never means the allocation failed: the new arrays are
	// installed and the old ones are no longer the client's. After a
	// device reset it wraps device.ErrInvalidated: the old memory went
	// with the reset and there was nothing left to free.
	FreeErr error
}

// ArraySet is one buffer's arrays. Like the response it belongs to, it
// is not changed after delivery and is safe to read concurrently.
type ArraySet struct {
	Device map[string]*DeviceArray
	Host   map[string]*HostArray
}

// Chunk returns the runs of chunk i: see ChunkPlan.Chunk.
func (r *ArrayResponse) Chunk(i int) (start, n int) { return r.Plan.Chunk(i) }

// Span returns chunk i along axis: see ChunkPlan.Span.
func (r *ArrayResponse) Span(i, axis int) Span { return r.Plan.Span(i, axis) }

// QueueRequest queues requests (label → request) for c in its stream
// group, to be allocated by the next AllocateQueue of any member of the
// group. Every request is validated first; an invalid one (an error
// wrapping ErrInvalidRequest, or ErrNotSupported for Managed memory)
// queues nothing. Queuing a label again replaces its earlier request.
// An empty (or nil) map queues nothing and returns nil once c is known to
// be open: it does not make c a requester of the next AllocateQueue.
func (m *Manager) QueueRequest(c *Client, requests map[string]ArrayRequest) error {
	if c == nil || c.m != m {
		return foreign(c)
	}
	labels := slices.Sorted(maps.Keys(requests))
	for _, l := range labels {
		if err := requests[l].Validate(); err != nil {
			return fmt.Errorf("vram: queue %s for %v: %w", l, c, err)
		}
	}
	own := make(map[string]ArrayRequest, len(requests))
	for l, r := range requests {
		r.Shape = slices.Clone(r.Shape)
		own[l] = r
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.checkLocked(c); err != nil {
		return err
	}
	if len(own) == 0 {
		return nil // nothing to queue: no queue entry, so no hook calls for it
	}
	m.queueLocked(c, c.group, own)
	return nil
}

// queueLocked merges reqs into c's queue in group.
func (m *Manager) queueLocked(c *Client, group string, reqs map[string]ArrayRequest) {
	q := m.queues[group]
	if q == nil {
		q = map[*Client]map[string]ArrayRequest{}
		m.queues[group] = q
	}
	if cur := q[c]; cur != nil {
		maps.Copy(cur, reqs)
		return
	}
	q[c] = reqs
}

// Queued returns a copy of the requests c has queued, by label.
func (m *Manager) Queued(c *Client) map[string]ArrayRequest {
	m.mu.Lock()
	defer m.mu.Unlock()
	if c == nil || c.m != m || c.closed {
		return map[string]ArrayRequest{}
	}
	return maps.Clone(m.queues[c.group][c])
}

// AllocateOption tunes one AllocateQueue; applied on the caller's
// goroutine.
type AllocateOption func(*allocConfig)

type allocConfig struct{ buffers int }

// WithBuffers plans for k chunk buffers in flight (2 for double
// buffering) and, when the batch is chunked, allocates k copies of each
// chunkable array (ArrayResponse.Buffers).
func WithBuffers(k int) AllocateOption { return func(a *allocConfig) { a.buffers = max(k, 1) } }

// groupLock returns the mutex that serializes AllocateQueue for group.
func (m *Manager) groupLock(group string) *sync.Mutex {
	m.mu.Lock()
	defer m.mu.Unlock()
	l := m.groupLocks[group]
	if l == nil {
		l = new(sync.Mutex)
		m.groupLocks[group] = l
	}
	return l
}

// AllocateQueue allocates every request queued in c's stream group,
// planned together, and delivers them.
//
// The budget. Plan counts bytes as the allocator charges them (rounded
// to its granularity, 512 B for the Pool); the group may spend, in those
// bytes, at most:
//
//   - the device's free memory, read after trimming the allocator's cache,
//     plus what the arrays being replaced take, less the page reserve of
//     the planned arrays: the device hands out whole pages (2 MiB), and an
//     allocator that rounds finer gets its memory as segments of pages, so
//     each array above the Pool's small-request size (1 MiB) may cost up
//     to its bytes rounded up to a page, and the small ones share pages
//     (see budget.go; nothing is kept for Direct, which counts whole
//     pages itself);
//   - in Active mode, the sum of the group's members' caps less what they
//     hold (arrays being replaced count as free);
//   - under an alloc.Limit found in the WithWrap chain, its cap less what
//     it counts in use.
//
// The plan has the fewest chunks whose arrays fit all three. The arrays
// are allocated with alloc.AllocExact, so an allocator that grows in
// shared segments (the Pool) takes for them no more than the reserve
// counts. When the allocator still runs the device out (one that hides
// AllocExact behind a wrapper), AllocateQueue gives the arrays back and
// plans again with what it took beyond the reserve kept back, up to three
// times. Calls for all
// groups are serialized from reading the free memory to the last
// allocation, so two groups never plan against the same free memory.
// Errors name each figure and what would raise the one that binds.
//
// Each requester's arrays are allocated on the group's stream at the
// planned shapes, replacing any it holds under the same labels. The
// arrays being replaced stay held until the new ones are allocated, and
// are freed after, unless the plan needs their memory (it does not fit
// the device's free memory, or the allocation limit, beside them): then
// they are freed first. Likewise, when a new host array (Pinned, Mapped,
// Pageable) does not fit beside the host arrays being replaced (the
// pinned-memory limit), those host arrays are freed and the allocation is
// tried once more; a failure of a host array never frees device arrays.
//
// Hooks, called after the allocation with no lock held, in client id
// order: every requester's OnAllocated with its arrays, then every other
// member of the group (a notary) with the chunk parameters and no arrays.
// They are called on this goroutine before AllocateQueue returns, except
// a client's whose earlier hook another goroutine is calling at the
// time: that goroutine calls it next (see ClientOptions: a client's hooks
// come one at a time, in event order, so an invalidation after the
// install is delivered after OnAllocated). AllocateQueue returns c's own
// response.
// With nothing queued in the group it does nothing and returns an error
// wrapping ErrNothingQueued. If c is closed while its group is being
// allocated, the other members get their arrays and hooks, and
// AllocateQueue returns an error wrapping ErrClosed.
//
// On failure (a plan error: ErrUnchunkable, ErrRunTooLarge,
// ErrRunsMismatch; an allocation error: ErrOutOfMemory) the arrays it
// allocated are freed, no OnAllocated hook is called, the queue is left
// as it was, and so are the arrays being replaced, with one exception:
// when they had to be freed first (above), they are gone; the error then
// names each owner and label, and each owner's OnInvalidate hook is
// called, as it is after SetAllocator.
//
// Freeing the replaced arrays once the new ones are in never fails the
// call: what went wrong (after a device reset, an error wrapping
// device.ErrInvalidated) is in the owner's ArrayResponse.FreeErr.
func (m *Manager) AllocateQueue(c *Client, opts ...AllocateOption) (*ArrayResponse, error) {
	ac := allocConfig{buffers: 1}
	for _, o := range opts {
		o(&ac)
	}
	if c == nil || c.m != m {
		return nil, foreign(c)
	}
	res, err := m.allocateLocking(c, ac)
	// Hooks run with no lock held, in event order (hooks.go): a failure
	// that dropped arrays tells their owners, a success delivers every
	// response, now complete.
	deliver(res.invalidated)
	if err != nil {
		return nil, err
	}
	for i, d := range res.out {
		if h := res.calls[i]; h != nil {
			d.c.markReady(h)
		}
		d.c.deliverHooks()
	}
	if res.mine == nil {
		return nil, fmt.Errorf("vram: allocate for %v: the client was closed while its group was allocated; the other members got their arrays: %w", c, ErrClosed)
	}
	return res.mine, nil
}

// allocateLocking takes c's group lock, planMu and allocMu, runs
// allocateGroup and releases them, even if it panics.
func (m *Manager) allocateLocking(c *Client, ac allocConfig) (groupOutcome, error) {
	// Lock c's group, making sure c is still in it once locked.
	var gl *sync.Mutex
	var group string
	for {
		g, err := m.StreamGroup(c)
		if err != nil {
			return groupOutcome{}, err
		}
		gl = m.groupLock(g)
		gl.Lock()
		if now, err := m.StreamGroup(c); err != nil || now != g {
			gl.Unlock()
			if err != nil {
				return groupOutcome{}, err
			}
			continue
		}
		group = g
		break
	}
	defer gl.Unlock()
	// One group plans and allocates at a time, so that each plans against
	// free memory no other allocation is taking meanwhile.
	m.planMu.Lock()
	defer m.planMu.Unlock()
	m.allocMu.RLock()
	defer m.allocMu.RUnlock()
	// Hold the group so that it stays while it is allocated, even if its
	// last member leaves meanwhile; the release (which then closes its
	// stream, waiting for its work) comes before allocMu is released.
	if _, release, err := m.groups.Hold(group); err == nil {
		defer func() {
			if err := release(); err != nil {
				m.log.Warn("vram: AllocateQueue could not close the stream of a group left with no member", "group", group, "err", err)
			}
		}()
	}
	return m.allocateGroup(c, group, ac)
}

// delivery is one hook call.
type delivery struct {
	c    *Client
	resp *ArrayResponse
}

// pending is one array to allocate.
type pending struct {
	c     *Client
	label string
	req   ArrayRequest
	shape []int
}

// groupOutcome is what allocateGroup leaves AllocateQueue to do once
// every lock is released.
type groupOutcome struct {
	out         []delivery     // responses, requesters first
	calls       []*hookCall    // out[i]'s OnAllocated call, queued not ready; nil with no hook
	mine        *ArrayResponse // the trigger's response; nil if it was closed meanwhile
	invalidated []*Client      // owners of arrays a failed call freed, their OnInvalidate queued
}

// allocateGroup is AllocateQueue with the group lock, planMu and allocMu
// held.
func (m *Manager) allocateGroup(trigger *Client, group string, ac allocConfig) (groupOutcome, error) {
	gran := granularityOf(m.al)

	// 1. Take the queue and what the budget needs, under mu.
	m.mu.Lock()
	if err := m.checkLocked(trigger); err != nil {
		m.mu.Unlock()
		return groupOutcome{}, err
	}
	q := m.queues[group]
	if len(q) == 0 {
		m.mu.Unlock()
		return groupOutcome{}, fmt.Errorf("allocate for %v: group %q has no requests queued (queue them with QueueRequest first; "+
			"another member's AllocateQueue may have allocated them already): %w", trigger, group, ErrNothingQueued)
	}
	delete(m.queues, group)
	requesters := slices.SortedFunc(maps.Keys(q), byID)
	reqs := make(map[string]map[string]ArrayRequest, len(q))
	for _, c := range requesters {
		reqs[c.String()] = q[c]
	}
	mode := m.mode
	m.mu.Unlock()

	restore := func() {
		m.mu.Lock()
		for _, c := range requesters {
			if c.closed {
				continue
			}
			dst := m.queues[c.group][c]
			for l, r := range q[c] {
				if _, newer := dst[l]; !newer {
					m.queueLocked(c, c.group, map[string]ArrayRequest{l: r})
				}
			}
		}
		m.mu.Unlock()
	}

	stream, err := m.groups.GroupStream(group)
	if err != nil {
		restore()
		return groupOutcome{}, fmt.Errorf("vram: allocate group %q: %w", group, err)
	}

	// 2. The budget and the plan.
	gb := groupBudget{mode: mode, group: group, requesters: requesters, queue: q}
	if err := m.readBudget(&gb); err != nil {
		restore()
		return groupOutcome{}, fmt.Errorf("vram: allocate group %q: %w", group, err)
	}
	plan, err := planGroup(reqs, &gb, PlanOptions{Granularity: gran, Buffers: ac.buffers})
	if err != nil {
		restore()
		var pe *PlanError
		if errors.As(err, &pe) {
			pe.Hint += "; " + gb.advice()
		}
		if pe == nil && !errors.Is(err, ErrRunTooLarge) && !errors.Is(err, ErrOutOfMemory) {
			return groupOutcome{}, fmt.Errorf("vram: allocate group %q: %w", group, err) // the requests themselves
		}
		return groupOutcome{}, fmt.Errorf("vram: allocate group %q with %s: %w", group, &gb, err)
	}

	// 3. The arrays being replaced stay held while the new ones are
	// allocated, so that a failure loses nothing, unless the plan needs
	// their memory: then they are freed first (dropOld), and a failure
	// after that tells their owners (OnInvalidate). A host array that
	// does not fit beside the host arrays it replaces (the pinned-memory
	// limit) frees those alone and tries once more (dropOld(true)).
	freeErrs := map[*Client]error{} // errors freeing replaced arrays, by owner
	var dropped []freeWork          // arrays freed before allocating
	dropOld := func(hostOnly bool) {
		m.mu.Lock()
		var old []freeWork
		for _, c := range requesters {
			if c.closed {
				continue
			}
			var as []*allocation
			for _, l := range slices.Sorted(maps.Keys(q[c])) {
				if hostOnly && !c.holdsHostLocked(l) {
					continue
				}
				as = append(as, c.takeLocked(l)...)
			}
			if len(as) > 0 {
				old = append(old, freeWork{c: c, allocs: as, s: stream})
			}
		}
		m.mu.Unlock()
		m.freeEach(old, freeErrs)
		dropped = append(dropped, old...)
		if !hostOnly {
			gb.held -= min(gb.held, gb.replaced)
			gb.replaced = 0
		}
	}
	if !gb.fitsBeside(plan) {
		dropOld(false)
	}

	// 4. Allocate, all or nothing. When the allocator takes more of the
	// device than the page reserve allows for (the Pool's growth policy
	// can: see budget.go) and the device runs out, give the arrays back
	// and plan again with what it took beyond the reserve kept back.
	opts := PlanOptions{Granularity: gran, Buffers: ac.buffers}
	var made []*allocation
	var todo []pending
	hostDropped := false
	for attempt := 0; ; attempt++ {
		todo = pendingOf(requesters, q, plan)
		var failed int
		var beyond uint64
		made, failed, beyond, err = m.allocAll(todo, stream, gb.pm)
		if err == nil {
			break
		}
		// Only a device array's failure says anything about device
		// memory; a host array's is its own limit's.
		onDevice := todo[failed].req.Memory == Device
		if !onDevice && !hostDropped && errors.Is(err, ErrOutOfMemory) {
			hostDropped = true
			n := len(dropped)
			dropOld(true)
			if len(dropped) > n {
				continue
			}
		}
		if onDevice && beyond > 0 && attempt < maxReplans && errors.Is(err, ErrOutOfMemory) {
			m.replans.Add(1)
			gb.lost = satAdd(gb.lost, beyond)
			perr := m.readBudget(&gb)
			if perr == nil {
				var next ChunkPlan
				if next, perr = planGroup(reqs, &gb, opts); perr == nil {
					plan = next
					if !gb.fitsBeside(plan) {
						dropOld(false)
					}
					continue
				}
			}
			err = errors.Join(err, fmt.Errorf("plan again with %s less: %w", units.Format(gb.lost), perr))
		}
		restore()
		p := todo[failed]
		err = fmt.Errorf("vram: allocate group %q: %s of %v (%s, array %d of %d; plan: %d chunk(s) of %d runs, %s + %s page reserve; %s): %w",
			group, p.label, p.c, fmtShape(p.req.DType, p.shape), failed+1, len(todo),
			plan.Chunks, plan.ChunkLength, units.Format(plan.BytesPerChunk), units.Format(gb.planReserve), &gb, err)
		if len(dropped) == 0 {
			return groupOutcome{}, err
		}
		// The replaced arrays are gone: say whose, and tell them.
		var lost []string
		var told []*Client
		m.mu.Lock()
		for _, w := range dropped {
			labels := make([]string, 0, len(w.allocs))
			for _, a := range w.allocs {
				if !slices.Contains(labels, a.label) {
					labels = append(labels, a.label)
				}
			}
			lost = append(lost, fmt.Sprintf("%v: %s", w.c, strings.Join(labels, ", ")))
			if w.c.onInvalidate != nil && !w.c.closed {
				w.c.postLocked(w.c.onInvalidate, true)
				told = append(told, w.c)
			}
		}
		m.mu.Unlock()
		var errs []error
		for _, w := range dropped {
			errs = append(errs, freeErrs[w.c])
		}
		lostErr := fmt.Errorf("the plan needed the memory of the arrays being replaced, so they were freed first and are gone "+
			"(%s); their owners' OnInvalidate hooks are called and their requests stay queued", strings.Join(lost, "; "))
		return groupOutcome{invalidated: told}, errors.Join(err, lostErr, errors.Join(errs...))
	}

	// 5. Install, and build the responses. made is in todo's order: each
	// requester's arrays in a run, requesters by id.
	m.mu.Lock()
	var gone []freeWork
	var res groupOutcome
	res.out = make([]delivery, 0, len(requesters))
	isReq := make(map[*Client]bool, len(requesters))
	idx := 0
	for _, c := range requesters {
		isReq[c] = true
		n := idx
		for n < len(todo) && todo[n].c == c {
			n++
		}
		mine := made[idx:n]
		idx = n
		if c.closed {
			gone = append(gone, freeWork{c: c, allocs: mine, s: stream})
			continue
		}
		resp := newResponse(c, plan, max(plan.Buffers, 1))
		byLabel := map[string][]*allocation{}
		for _, a := range mine {
			byLabel[a.label] = append(byLabel[a.label], a)
		}
		for l, as := range byLabel {
			// What l holds now (the array being replaced, or one
			// installed meanwhile) is freed once the new one is in.
			if prev := c.takeLocked(l); len(prev) > 0 {
				gone = append(gone, freeWork{c: c, allocs: prev, s: stream})
			}
			if c.arrays == nil {
				c.arrays = map[string][]*allocation{}
			}
			c.arrays[l] = as
			for _, a := range as {
				c.held += a.charged
			}
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
		resp.ChunkedShapes = plan.ChunkedShapes[c.String()]
		res.out = append(res.out, delivery{c: c, resp: resp})
	}
	// Notaries: the other open members of the group, at install time.
	for _, c := range m.reg.members(group) {
		if !isReq[c] {
			resp := newResponse(c, plan, 1)
			resp.ChunkedShapes = map[string][]int{}
			res.out = append(res.out, delivery{c: c, resp: resp})
		}
	}
	// Queue the OnAllocated calls now, in event order before any later
	// invalidation; they are made once the responses are complete.
	res.calls = make([]*hookCall, len(res.out))
	for i, d := range res.out {
		if d.c == trigger {
			res.mine = d.resp
		}
		if d.c.onAllocated != nil {
			on, resp := d.c.onAllocated, d.resp
			res.calls[i] = d.c.postLocked(func() { on(resp) }, false)
		}
	}
	if res.mine == nil && !trigger.closed {
		// The trigger moved to another group meanwhile: it gets the
		// chunk parameters of the group it asked for, and no hook call.
		res.mine = newResponse(trigger, plan, 1)
		res.mine.ChunkedShapes = map[string][]int{}
	}
	m.mu.Unlock()

	// 6. Free what was replaced. The new arrays are in: a failure here
	// does not fail the call; each owner's response carries it.
	m.freeEach(gone, freeErrs)
	for _, d := range res.out {
		d.resp.FreeErr = freeErrs[d.c]
		delete(freeErrs, d.c)
	}
	for c, err := range freeErrs { // owners closed meanwhile: no response to carry it
		m.log.Warn("vram: AllocateQueue could not free arrays it replaced, or made for a client closed meanwhile",
			"client", c.String(), "group", group, "err", err)
	}
	return res, nil
}

// freeEach frees work as freeWork does, adding the errors to errs by
// owner. allocMu must be held.
func (m *Manager) freeEach(work []freeWork, errs map[*Client]error) {
	for _, w := range work {
		if err := m.freeWork([]freeWork{w}); err != nil {
			errs[w.c] = errors.Join(errs[w.c], err)
		}
	}
}

func byID(a, b *Client) int { return cmp.Compare(a.id, b.id) }

func newResponse(c *Client, plan ChunkPlan, buffers int) *ArrayResponse {
	r := &ArrayResponse{
		Client:      c,
		Buffers:     make([]ArraySet, buffers),
		Chunks:      plan.Chunks,
		ChunkLength: plan.ChunkLength,
		TotalRuns:   plan.TotalRuns,
		Plan:        plan,
	}
	for b := range r.Buffers {
		r.Buffers[b] = ArraySet{Device: map[string]*DeviceArray{}, Host: map[string]*HostArray{}}
	}
	r.Arrays, r.Host = r.Buffers[0].Device, r.Buffers[0].Host
	return r
}

// readBudget trims the allocator's cache, reads the device's free memory
// and the allocation limit into b, and works out how the allocator takes
// pages. allocMu must be held.
func (m *Manager) readBudget(b *groupBudget) error {
	// Give the cache back so that free memory is what the device can
	// really give (a cached block may be too fragmented to serve); what
	// the allocator still caches after the trim sits in segments that
	// are partly in use, too fragmented to count on.
	if err := m.al.Trim(); err != nil && !errors.Is(err, alloc.ErrClosed) {
		return fmt.Errorf("trim the allocator: %w", err)
	}
	free, _, err := m.dev.MemInfo()
	if err != nil {
		return fmt.Errorf("read device memory: %w", err)
	}
	b.free = free
	if lim := findLimit(m.al); lim != nil {
		b.limited, b.limCap, b.limUsed = true, lim.Cap(), lim.Used()
	}
	b.pm = pageModelOf(m.al, m.dev.Info().Granularity)
	m.mu.Lock()
	m.heldLocked(b)
	m.mu.Unlock()
	return nil
}

// heldLocked reads into b what the arrays being replaced take, and in
// Active mode the group's caps and what its members hold. It is read
// after the free memory and the limit's count: an array freed meanwhile
// (Client.Free) is then left out of one figure or both, never counted in
// both. m.mu must be held.
func (m *Manager) heldLocked(b *groupBudget) {
	b.replaced, b.caps, b.held = 0, 0, 0
	for _, c := range b.requesters {
		if c.closed {
			continue
		}
		for l := range b.queue[c] {
			for _, a := range c.arrays[l] {
				b.replaced += a.charged
			}
		}
	}
	if b.mode == Active {
		for _, c := range m.reg.members(b.group) {
			b.caps += m.capLocked(c)
			b.held += c.held
		}
	}
}

// maxReplans bounds how often AllocateQueue plans a group again after
// the allocator took more of the device than the page reserve allowed.
const maxReplans = 3

// pendingOf lists the arrays plan allocates for the requesters' queues
// q, in client id and label order, each chunkable one once per buffer.
func pendingOf(requesters []*Client, q map[*Client]map[string]ArrayRequest, plan ChunkPlan) []pending {
	n := 0
	for _, c := range requesters {
		n += len(q[c]) * max(plan.Buffers, 1)
	}
	todo := make([]pending, 0, n)
	labels := make([]string, 0, 8)
	for _, c := range requesters {
		shapes := plan.ChunkedShapes[c.String()]
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

// allocAll allocates todo on s, all or nothing: made[i] is todo[i]'s
// array. Device arrays are allocated small ones first, then the rest from
// the largest down, so that a segment one of them opens serves those
// after it where it can (an allocator's large segments do not serve small
// requests). On failure it frees what it made and returns the index of
// the array that failed and how many device bytes the allocator took
// beyond those arrays' bytes and page reserve (pm), read from the
// device's free memory. allocMu must be held.
func (m *Manager) allocAll(todo []pending, s device.Stream, pm pageModel) (made []*allocation, failed int, beyond uint64, err error) {
	bytes := make([]uint64, len(todo))
	order := make([]int, len(todo))
	for i, p := range todo {
		order[i] = i
		if p.req.Memory.OnDevice() {
			n, _ := elements(p.shape)
			bytes[i] = roundUp(n*p.req.DType.Size(), pm.gran)
		}
	}
	small := func(i int) bool { return bytes[i] <= pm.small }
	slices.SortStableFunc(order, func(a, b int) int {
		if sa, sb := small(a), small(b); sa != sb {
			if sa {
				return -1
			}
			return 1
		}
		return cmp.Compare(bytes[b], bytes[a])
	})
	free0, _, ferr := m.dev.MemInfo()
	made = make([]*allocation, len(todo))
	var sizes []uint64
	for _, i := range order {
		a, err := m.allocOne(todo[i], s, pm.gran)
		if err == nil {
			made[i] = a
			if bytes[i] > 0 {
				sizes = append(sizes, bytes[i])
			}
			continue
		}
		if free, _, e := m.dev.MemInfo(); e == nil && ferr == nil && free < free0 {
			var sum uint64
			for _, n := range sizes {
				sum += n
			}
			if spent, want := free0-free, satAdd(sum, pm.reserve(sizes)); spent > want {
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

// allocOne allocates one array. allocMu must be held.
func (m *Manager) allocOne(p pending, s device.Stream, gran uint64) (*allocation, error) {
	shape := slices.Clone(p.shape)
	n, _ := elements(shape)
	bytes := n * p.req.DType.Size()
	a := &allocation{label: p.label}
	switch p.req.Memory {
	case Device:
		// A batch's arrays live long: no shared segment is grown for
		// them, so they take from the device what the reserve counts.
		ptr, err := alloc.AllocExact(m.al, bytes, s)
		if err != nil {
			return nil, err
		}
		a.dev = &DeviceArray{ptr: ptr, shape: shape, dtype: p.req.DType, memory: Device, label: p.label}
		a.dev.setLast(s)
		a.charged = roundUp(bytes, gran)
	default:
		h, err := m.newHost(shape, p.req.DType, p.req.Memory, p.label, s)
		if err != nil {
			return nil, err
		}
		a.host = h
		if p.req.Memory == Mapped {
			a.dev = &DeviceArray{ptr: h.devPtr, shape: shape, dtype: p.req.DType, memory: Mapped, label: p.label}
		}
	}
	return a, nil
}

func fmtShape(d DType, shape []int) string { return fmt.Sprintf("%v%v", d, shape) }
