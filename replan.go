package vram

// What a group's budget allows now, and the changes a running batch
// re-plans for.
//
// The manager's cap (WithCap) may change while it runs: SetCap, which a
// broker's lease drives the same way. A group whose Allocate fails for
// want of memory that busy clients of other groups hold (a running batch
// cannot be evicted) claims it back: until its group allocates, or its
// last member leaves, every other group plans with the claim kept back.
// Each such change is one BudgetChange, counted and explained. A batch
// (package batch) compares the count between chunks and, when it moved,
// asks PlanNow what its arrays would be planned at now: when the length
// differs, it finishes the chunks in flight, re-allocates at the new
// length and goes on. Nothing here frees an array: memory comes back
// only as batches re-plan, and WaitWithinCap waits for that.
//
// Locks: capMu serializes SetCap and is taken before allocMu; bcMu
// (the notices) and freed's own lock are taken last and never held over
// anything else.

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/vramkit/vram/alloc"
	"github.com/vramkit/vram/internal/units"
)

// BudgetChange is the latest change to what the manager's groups may
// plan with: a new cap, a claim made or met. A plain value.
type BudgetChange struct {
	Seq uint64    // changes so far (0: none yet)
	Why string    // the latest change, in words
	At  time.Time // when it was made
	// Ended, once set, says why the budget ended for good (the broker's
	// lease ended, wrapping ErrLease): the groups may hold nothing, and a
	// batch stops at its next chunk boundary rather than keep memory the
	// broker may grant to others.
	Ended error
}

// budgetNotices is the manager's count of budget changes and the wait for
// the next one.
type budgetNotices struct {
	mu   sync.Mutex // protects the fields below
	last BudgetChange
	next chan struct{} // closed and replaced at each change
}

// signal is a broadcast: every channel taken before a signal is closed
// by it.
type signal struct {
	mu sync.Mutex // protects ch
	ch chan struct{}
}

func (s *signal) wait() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ch == nil {
		s.ch = make(chan struct{})
	}
	return s.ch
}

func (s *signal) broadcast() {
	s.mu.Lock()
	if s.ch != nil {
		close(s.ch)
		s.ch = nil
	}
	s.mu.Unlock()
}

// note records a budget change and wakes its waiters.
func (m *Manager) note(why string) { m.noteEnd(why, nil) }

// noteEnd records a budget change, one that ends the budget for good
// when ended is not nil (later changes keep it ended).
func (m *Manager) noteEnd(why string, ended error) {
	n := &m.notices
	n.mu.Lock()
	if ended == nil {
		ended = n.last.Ended
	}
	n.last = BudgetChange{Seq: n.last.Seq + 1, Why: why, At: time.Now(), Ended: ended}
	if n.next != nil {
		close(n.next)
		n.next = nil
	}
	n.mu.Unlock()
	m.log.Debug("vram: budget change", "why", why)
}

// BudgetChange is the latest change to what the manager's groups may plan
// with (Seq 0 before the first). A batch reads it between chunks.
func (m *Manager) BudgetChange() BudgetChange {
	m.notices.mu.Lock()
	defer m.notices.mu.Unlock()
	return m.notices.last
}

// WaitBudgetChange waits for a change after the one numbered seq and
// returns the latest; it returns at once when there is one already. When
// ctx is done first it returns an error wrapping ctx.Err().
func (m *Manager) WaitBudgetChange(ctx context.Context, seq uint64) (BudgetChange, error) {
	for {
		n := &m.notices
		n.mu.Lock()
		last := n.last
		if n.next == nil {
			n.next = make(chan struct{})
		}
		next := n.next
		n.mu.Unlock()
		if last.Seq > seq {
			return last, nil
		}
		select {
		case <-next:
		case <-ctx.Done():
			return last, fmt.Errorf("wait for a budget change after %d: %w", seq, ctx.Err())
		}
	}
}

// SetCap sets the cap on the device bytes the manager's arrays may take,
// as the allocator charges them (0: none), as WithCap does at New: every
// group plans within it, and an allocation past it is refused. A manager
// made without a cap gets one around its allocator, counting the arrays
// it holds. Lowered below what the arrays take, it frees nothing: running
// batches re-plan to smaller chunks between chunks (package batch), and
// WaitWithinCap waits for them. Each call is a BudgetChange.
func (m *Manager) SetCap(bytes uint64) error {
	m.capMu.Lock()
	defer m.capMu.Unlock()
	to := bytes
	if to == 0 {
		to = alloc.NoCap
	}
	m.allocMu.RLock()
	if m.isClosed() {
		m.allocMu.RUnlock()
		return closedErr("set the cap")
	}
	lim := m.capLim
	if lim != nil {
		lim.SetCap(to)
	}
	m.allocMu.RUnlock()
	if lim == nil && bytes != 0 {
		if err := m.installCap(to); err != nil {
			return err
		}
	}
	from := m.capBytes.Swap(bytes)
	if from != bytes {
		m.note(fmt.Sprintf("cap %s → %s (SetCap)", capWords(from), capWords(bytes)))
	}
	return nil
}

func capWords(n uint64) string {
	if n == 0 {
		return "none"
	}
	return units.Format(n)
}

// installCap wraps the allocator in a Limit of capBytes that counts every
// device array the clients hold.
func (m *Manager) installCap(capBytes uint64) error {
	m.allocMu.Lock()
	defer m.allocMu.Unlock()
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return closedErr("set the cap")
	}
	lim := alloc.NewLimit(m.al, capBytes)
	for _, c := range m.reg.all() {
		for _, as := range c.arrays {
			for _, a := range as {
				if d := a.dev; d != nil && d.memory == Device && !d.freed.Load() {
					lim.Adopt(d.ptr, d.Bytes())
				}
			}
		}
	}
	m.al, m.capLim = lim, lim
	m.observeOOM(lim, m.kind, m.name, nil)
	return nil
}

// Cap returns the cap (0: none) and the bytes charged under it now.
func (m *Manager) Cap() (capBytes, used uint64) {
	m.allocMu.RLock()
	defer m.allocMu.RUnlock()
	if m.capLim == nil {
		return 0, 0
	}
	return m.capBytes.Load(), m.capLim.Used()
}

// WaitWithinCap waits until the bytes charged under the cap are within
// it (at once with no cap, or when they are): after SetCap lowered it,
// until batches have re-planned and given memory back. When ctx is done
// first it returns an error wrapping ctx.Err() with both figures.
func (m *Manager) WaitWithinCap(ctx context.Context) error {
	for {
		freed := m.freed.wait()
		capBytes, used := m.Cap()
		if capBytes == 0 || used <= capBytes {
			return nil
		}
		select {
		case <-freed:
		case <-ctx.Done():
			return fmt.Errorf("wait for the arrays (%s) to come within the cap %s: %w", units.Format(used), units.Format(capBytes), ctx.Err())
		}
	}
}

// PlanNow plans reqs (each client's requests; every client of c's group)
// as an Allocate of the group would plan them now: the arrays they would
// replace counted free, the group's other arrays held, the device's free
// memory (the allocator's cache counted free, as Allocate trims it when
// that makes a longer chunk), the caps and other groups' claims, with
// opts as for Allocate (WithBuffers). It allocates and frees nothing, and leaves the queues
// alone. A batch asks it between chunks what its chunk length may be.
func (c *Client) PlanNow(ctx context.Context, reqs map[*Client]map[string]ArrayRequest, opts ...AllocateOption) (ChunkPlan, error) {
	m := c.m
	ac := allocConfig{buffers: 1, ctx: ctx}
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
	m.allocMu.RLock()
	defer m.allocMu.RUnlock()
	gb := groupBudget{mode: m.LimitMode(), group: group, requesters: slices.SortedFunc(maps.Keys(reqs), byID), queue: reqs}
	if err := m.readBudget(&gb); err != nil {
		return ChunkPlan{}, fmt.Errorf("plan now for group %q: %w", group, err)
	}
	// The allocator's cache is neither free on the device nor outside a
	// broker's lease, but the Allocate this plan is for gives it back
	// when that makes a longer chunk (trim.go): plan as it will. (Right
	// after a batch's arrays are freed they are in the cache; leaving it
	// out would plan the batch down to nothing.)
	gb.giveBack(m.cached())
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
		m.note(fmt.Sprintf("group %q's claim of %s %s", g.name, units.Format(n), why))
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
	m.note(fmt.Sprintf("group %q claims %s back from busy groups", tx.group, units.Format(want)))
	return fmt.Errorf("%w; busy clients hold what it lacks (%s): the group claims %s back, which their batches give at their next chunk boundary (Manager.WaitBudgetChange), then allocate again",
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
		m.note(fmt.Sprintf("group %q gave %s back to the groups that claim memory", tx.group, units.Format(gave)))
	}
}
