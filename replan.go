package vram

// What a group's budget allows now, and the changes a running batch
// re-plans for.
//
// The manager's cap (WithCap) may change while it runs: the account's
// SetCap, which a broker's lease drives the same way. A group whose
// Allocate fails for
// want of memory that busy clients of other groups hold (a running batch
// cannot be evicted) claims it back: until its group allocates, or its
// last member leaves, every other group plans with the claim kept back.
// Each such change is one BudgetChange (account.Change), counted and
// explained. A batch
// (package batch) compares the count between chunks and, when it moved,
// asks PlanNow what its arrays would be planned at now: when the length
// differs, it finishes the chunks in flight, re-allocates at the new
// length and goes on. Nothing here frees an array: memory comes back
// only as batches re-plan, and the account's WaitWithinCap waits for
// that.
//
// The notices are the account's (account.Change): it notes its own
// changes (the cap, the lease) and the manager notes its groups' claims
// there.

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/vramkit/vram/internal/units"
)

// PlanNow plans reqs (each client's requests; every client of c's group)
// as an Allocate of the group would plan them now: the arrays they would
// replace counted free, the group's other arrays held, the device's free
// memory (the allocator's cache counted free, as Allocate trims it when
// that makes a longer chunk), the caps and other groups' claims, with
// opts as for Allocate (WithBuffers). It allocates and frees nothing, and leaves the queues
// alone. A batch asks it between chunks what its chunk length may be.
func (c *Client) PlanNow(ctx context.Context, reqs map[*Client]map[string]ArrayRequest, opts ...AllocateOption) (ChunkPlan, error) {
	m := c.m
	ac := allocConfig{buffers: 1}
	for _, o := range opts {
		o(&ac)
	}
	group, err := m.streamGroup(c)
	if err != nil {
		return ChunkPlan{}, err
	}
	for o := range reqs {
		g, err := m.streamGroup(o)
		if err != nil {
			return ChunkPlan{}, err
		}
		if g != group {
			return ChunkPlan{}, fmt.Errorf("plan now for %v: %v is in group %q, not %q; plan one group's requests: %w", c, o, g, group, ErrInvalidRequest)
		}
	}
	if err := lockCtx(ctx, m.planMu, "the allocation of a group"); err != nil {
		return ChunkPlan{}, fmt.Errorf("plan now for %v: %w", c, err)
	}
	defer func() { <-m.planMu }()
	m.useMu.RLock()
	defer m.useMu.RUnlock()
	gb := groupBudget{mode: m.LimitMode(), group: group, requesters: slices.SortedFunc(maps.Keys(reqs), byID), queue: reqs}
	if err := m.readBudget(&gb); err != nil {
		return ChunkPlan{}, fmt.Errorf("plan now for group %q: %w", group, err)
	}
	// The allocator's cache is neither free on the device nor outside a
	// broker's lease, but the Allocate this plan is for gives it back
	// when that makes a longer chunk (planOnce): plan as it will. (Right
	// after a batch's arrays are freed they are in the cache; leaving it
	// out would plan the batch down to nothing.)
	gb.giveBack(gb.cached)
	p, err := planGroup(reqs, &gb, PlanOptions{Granularity: gb.gran, Buffers: ac.buffers})
	if err != nil {
		return p.ChunkPlan, fmt.Errorf("plan now for group %q with %s: %w", group, &gb, err)
	}
	return p.ChunkPlan, nil
}

// dropClaimLocked withdraws the claim of g (a group's record, or nil), if
// it has one, and says so. m.mu must be held.
func (m *Manager) dropClaimLocked(g *group, why string) {
	if g != nil && g.claim > 0 {
		n := g.claim
		g.claim = 0
		m.acct.Note(fmt.Sprintf("group %q's claim of %s %s", g.name, units.Format(n), why))
	}
}

// claim is the transaction's last step on a plan that failed for want of
// memory: when the memory of busy clients of other groups would make it
// fit, the group claims what its smallest plan needs (kept back from
// every other group's budget), and the error says whom it asked.
func (tx *allocTx) claim(err error) error {
	var pe *PlanError
	if !errors.As(err, &pe) || pe.Need <= pe.Budget {
		return err
	}
	busy := tx.busyHolders()
	if len(busy) == 0 {
		return err
	}
	if _, ferr := tx.planFreeing(busy); ferr != nil {
		return err // not even their memory would do
	}
	want := pe.Need // what its smallest plan takes, kept back from every other group
	names := make([]string, len(busy))
	for i, v := range busy {
		names[i] = fmt.Sprintf("%v of group %q (%s)", v.c, v.c.group, units.Format(v.device))
	}
	m := tx.m
	m.mu.Lock()
	g := m.reg.groups[tx.group]
	if g != nil { // a group whose last member left claims nothing
		g.claim = want
	}
	m.mu.Unlock()
	if g == nil {
		return err
	}
	m.acct.Note(fmt.Sprintf("group %q claims %s back from busy groups", tx.group, units.Format(want)))
	return fmt.Errorf("%w; busy clients hold what it lacks (%s): the group claims %s back, which their batches give at their next chunk boundary (Account().WaitChange), then allocate again",
		err, strings.Join(names, ", "), units.Format(want))
}

// busyHolders lists the clients of other groups that hold device memory
// and are not idle: a batch runs on their arrays.
func (tx *allocTx) busyHolders() []victim {
	return slices.DeleteFunc(tx.holders(false), func(v victim) bool { return v.c.idleNow() })
}

// settleClaims follows a successful allocation: the group's own claim is
// met, and a group that gave memory back while others claim it says so.
func (tx *allocTx) settleClaims() {
	m := tx.m
	m.mu.Lock()
	defer m.mu.Unlock()
	m.dropClaimLocked(m.reg.groups[tx.group], "met")
	var before uint64 // what the arrays it replaced were charged
	for _, w := range append(slices.Clip(tx.setAside), tx.replaced...) {
		for _, a := range w.allocs {
			before += a.charged
		}
	}
	if gave := before - min(before, tx.plan.BytesPerChunk); gave > 0 && m.claimedLocked(tx.group) > 0 {
		m.acct.Note(fmt.Sprintf("group %q gave %s back to the groups that claim memory", tx.group, units.Format(gave)))
	}
}
