package vram

// Eviction: the allocation transaction's step that frees idle clients of
// other groups when a group does not fit (cubie's idle-owner eviction).
//
// When the plan fails for want of memory, or needs more chunks than the
// memory held by idle clients of other groups would allow, the step
// lists the candidates: open clients of other groups that hold device
// memory, have not opted out (ClientOptions.NoEvict, or no OnInvalidate
// hook to be told with) and are idle (no work mark open, and the GPU
// done with the work before each mark's End; workmarks.go), least
// recently used first. It plans with every
// candidate's memory counted free (as the allocator states it: alloc.Coster
// for the device, the charged bytes for a cap) to find the fewest chunks
// eviction can reach, and evicts nothing when that is no better than the
// plan without it. Otherwise it evicts the shortest run of candidates,
// oldest first, whose memory reaches that plan, then reads the budget
// again and plans with the real figures, evicting the next candidate
// while the plan still falls short and candidates remain (an array that
// shared pages with others may give back less than stated).
//
// A victim is rechecked under its work lock as its arrays are taken, so
// a mark begun meanwhile saves it. Its arrays (device and host) are
// marked evicted and freed ordered on the allocating group's stream after
// their last use, its OnInvalidate hook is queued with a reason wrapping
// ErrEvicted, and until it is allocated again its arrays' copies and its
// BeginWork fail with ErrEvicted. Freed memory cannot be given back: when
// the transaction fails after evicting, the queue is restored as on any
// failure and the error names the victims, whose hooks are called.

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/vramkit/vram/internal/units"
)

// victim is a candidate for eviction: an idle client of another group
// and what freeing its arrays gives back.
type victim struct {
	c       *Client
	device  uint64 // device bytes its device arrays take, as the allocator states them
	charged uint64 // bytes its arrays are charged under a cap
}

// evict is the transaction's eviction step, run after planOnce with its
// error (see the file's overview). It returns the error the transaction
// goes on with: nil when tx.plan is the plan to allocate.
func (tx *allocTx) evict(ctx context.Context, planErr error) error {
	if !tx.wantsRoom(planErr) {
		return planErr
	}
	cands := tx.idleCandidates()
	if len(cands) == 0 {
		return planErr
	}
	target, ok := tx.evictionTarget(cands, planErr)
	if !ok {
		return planErr
	}
	// The shortest run of candidates, oldest first, that reaches target.
	k := 1 + sort.Search(len(cands)-1, func(i int) bool {
		p, err := tx.planFreeing(cands[:i+1])
		return err == nil && p.Chunks <= target
	})
	err := planErr
	for from, to := 0, k; from < len(cands); from, to = to, to+1 {
		tx.evictClients(cands[from:to])
		if err = tx.planOnce(ctx); err == nil && tx.plan.Chunks <= target {
			return nil
		}
	}
	return err
}

// Reclaim evicts idle owners, oldest first, until the live arrays take no
// more than target, and returns how many it evicted: the account asks it
// when the broker's lease asks it to shrink (account.Owner). It waits for
// the allocation in progress, no longer than ctx.
func (o *owner) Reclaim(ctx context.Context, target uint64) int {
	m := (*Manager)(o)
	if err := lockCtx(ctx, m.planMu, "the allocation of a group"); err != nil {
		return 0
	}
	defer func() { <-m.planMu }()
	m.useMu.RLock()
	if m.isClosed() {
		m.useMu.RUnlock()
		return 0
	}
	tx := &allocTx{m: m, roomFor: "the broker's lease, which asks this process to shrink"}
	if err := m.readBudget(&tx.gb); err == nil {
		for _, v := range tx.idleCandidates() {
			if _, st := m.acct.Stats(); st.InUse <= target {
				break
			}
			tx.evictClients([]victim{v})
		}
	}
	m.useMu.RUnlock()
	deliver(tx.victims)
	return len(tx.victims)
}

// victimsErr adds to the error of a failed transaction the clients it
// evicted: their arrays are gone.
func (tx *allocTx) victimsErr(err error) error {
	if len(tx.victims) == 0 {
		return err
	}
	return fmt.Errorf("%w; before it failed it evicted idle clients of other groups (%s, %s), whose arrays are gone; their OnInvalidate hooks are called",
		err, victimNames(tx.victims), units.Format(tx.evictedBytes))
}

// wantsRoom reports whether the plan (or its error) calls for eviction:
// it failed for want of memory, or it chunks the batch.
func (tx *allocTx) wantsRoom(planErr error) bool {
	if planErr == nil {
		return tx.plan.Chunks > 1
	}
	return forWantOfMemory(planErr)
}

// evictionTarget plans with every candidate's memory free and returns its
// chunks, when that plan fits and beats the current one (planErr nil:
// tx.plan).
func (tx *allocTx) evictionTarget(cands []victim, planErr error) (int, bool) {
	best, err := tx.planFreeing(cands)
	if err != nil || (planErr == nil && best.Chunks >= tx.plan.Chunks) {
		return 0, false
	}
	return best.Chunks, true
}

// planFreeing plans the group as if vs's arrays were freed, on a copy
// of the budget.
func (tx *allocTx) planFreeing(vs []victim) (groupPlan, error) {
	gb := tx.gb
	for _, v := range vs {
		gb.giveBack(v.device)
		if gb.capped {
			gb.room = satAdd(gb.room, v.charged)
		}
	}
	return planGroup(tx.q, &gb, PlanOptions{Granularity: gb.gran, Buffers: tx.ac.buffers})
}

// idleCandidates lists the evictable clients of other groups that hold
// device memory and are idle now, least recently used first.
func (tx *allocTx) idleCandidates() []victim {
	cands := tx.holders(true)
	// The idle check queries events: outside m.mu.
	cands = slices.DeleteFunc(cands, func(v victim) bool { return !v.c.idleNow() })
	slices.SortStableFunc(cands, func(a, b victim) int {
		return cmp.Or(cmp.Compare(a.c.work.lastUse.Load(), b.c.work.lastUse.Load()), cmp.Compare(a.c.id, b.c.id))
	})
	return cands
}

// holders lists the open clients of other groups that hold memory, and
// what freeing their arrays would give back; evictable leaves out those
// that opted out of eviction.
func (tx *allocTx) holders(evictable bool) []victim {
	m := tx.m
	var out []victim
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, c := range m.reg.all() {
		if c.group == tx.group || (evictable && c.work.noEvict) || c.held == 0 {
			continue
		}
		var sizes []uint64
		for _, as := range c.arrays {
			for _, a := range as {
				if a.dev != nil && a.dev.memory == Device {
					sizes = append(sizes, a.dev.Bytes())
				}
			}
		}
		out = append(out, victim{c: c, device: tx.gb.cost(sizes), charged: c.held})
	}
	return out
}

// idleNow reports whether c is idle (an event that cannot be queried
// counts as done).
func (c *Client) idleNow() bool {
	c.work.mu.Lock()
	defer c.work.mu.Unlock()
	idle, _ := c.work.idleLocked()
	return idle
}

// evictClients evicts each of vs that is still idle, open, evictable and
// in another group, under its work lock: its arrays are taken and marked
// evicted and its OnInvalidate queued (in one critical section, so hooks
// keep event order), then freed on the group's stream.
func (tx *allocTx) evictClients(vs []victim) {
	m := tx.m
	room := tx.roomFor
	if room == "" {
		room = fmt.Sprintf("group %q", tx.group)
	}
	reason := fmt.Errorf("arrays evicted to make room for %s while their client was idle; queue the requests and allocate again: %w", room, ErrEvicted)
	var work []freeWork
	for _, v := range vs {
		c := v.c
		c.work.mu.Lock()
		if idle, _ := c.work.idleLocked(); idle {
			m.mu.Lock()
			if !c.closed && c.group != tx.group && c.held > 0 {
				allocs := c.takeAllLocked()
				markEvicted(allocs)
				c.work.evicted.Store(true)
				c.invalidateLocked(reason, true)
				work = append(work, freeWork{c: c, allocs: allocs, s: tx.stream})
				tx.victims = append(tx.victims, c)
				tx.evictedBytes += v.device
			}
			m.mu.Unlock()
		}
		c.work.mu.Unlock()
	}
	errs := map[*Client]error{}
	m.freeEach(work, errs)
	for c, err := range errs {
		m.log.Warn("vram: could not free the arrays of a client evicted for another group", "client", c.String(), "group", tx.group, "err", err)
	}
	if len(work) > 0 {
		m.log.Debug("vram: evicted idle clients for a group", "group", tx.group, "clients", victimNames(tx.victims), "bytes", units.Format(tx.evictedBytes))
	}
}

// markEvicted marks the arrays of allocs evicted, before they are freed.
func markEvicted(allocs []*allocation) {
	for _, a := range allocs {
		if a.dev != nil {
			a.dev.evicted.Store(true)
		}
		if a.host != nil {
			a.host.evicted.Store(true)
		}
	}
}

func victimNames(cs []*Client) string {
	names := make([]string, len(cs))
	for i, c := range cs {
		names[i] = c.String()
	}
	return strings.Join(names, ", ")
}

// Evicted reports whether the manager freed the array to make room for
// another group (then Freed is true too).
func (a *DeviceArray) Evicted() bool { return a.evicted.Load() }

// Evicted reports whether the manager freed the array to make room for
// another group (then Freed is true too).
func (h *HostArray) Evicted() bool { return h.evicted.Load() }

// Evicted reports whether c's arrays were evicted for another group and
// it has not been allocated since.
func (c *Client) Evicted() bool { return c.work.evicted.Load() }

// freedErr says why a copy through a freed device array fails: an
// evicted array's error wraps ErrEvicted and ErrFreed.
func (a *DeviceArray) freedErr() error {
	if a.evicted.Load() {
		return fmt.Errorf("device array %v was evicted to make room for another group while its client was idle; queue the client's requests and allocate again: %w (%w)", a, ErrEvicted, ErrFreed)
	}
	return fmt.Errorf("device array %v was freed (Free, FreeAll, a re-allocation of its label, Close or SetAllocator); use the arrays of the latest ArrayResponse: %w", a, ErrFreed)
}

// freedErr is DeviceArray.freedErr for a host array.
func (h *HostArray) freedErr() error {
	if h.evicted.Load() {
		return fmt.Errorf("host array %v was evicted to make room for another group while its client was idle; queue the client's requests and allocate again: %w (%w)", h, ErrEvicted, ErrFreed)
	}
	return fmt.Errorf("host array %v was freed; make another with NewHostArray: %w", h, ErrFreed)
}
