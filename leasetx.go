package vram

// The allocation transaction's steps for a broker's lease (lease.go's
// overview, points 2 and 3) and the lease's clause of the budget. Each
// runs with the group lock, planMu and allocMu (for reading) held, so it
// updates the cap through applyLocked, never SetCap.

import (
	"context"
	"fmt"
	"time"

	"github.com/vramkit/vram/internal/units"
)

// leaseClauseLocked puts the lease in b: what the allocator may hold
// under it, what it holds, and what of that the arrays being replaced
// take, as the allocator states their cost (their charged bytes may be
// less than the pages they take). allocMu and m.mu must be held.
func (m *Manager) leaseClauseLocked(b *groupBudget) {
	f := m.lease
	b.leased = f != nil
	if f == nil {
		return
	}
	b.leaseBytes = f.budget().Bytes
	b.leaseHeld = m.al.Stats().Reserved
	var sizes []uint64
	for _, c := range b.requesters {
		if c.closed {
			continue
		}
		for l := range b.queue[c] {
			for _, a := range c.arrays[l] {
				if d := a.dev; d != nil && d.memory == Device {
					sizes = append(sizes, d.Bytes())
				}
			}
		}
	}
	b.leaseReplaced = b.cost(sizes)
}

// holdLease keeps the follower from giving the lease back while the
// transaction runs; the func it returns ends that and has the follower
// report what the allocator then holds.
func (tx *allocTx) holdLease() (done func()) {
	if f := tx.m.lease; f != nil {
		return f.hold()
	}
	return func() {}
}

// hold keeps the follower from giving the lease back until the func it
// returns is called, which has it report what the allocator then holds.
func (f *leaseFollower) hold() (done func()) {
	f.mu.Lock()
	f.busy++
	f.mu.Unlock()
	return func() {
		f.mu.Lock()
		if f.busy--; f.busy == 0 {
			f.reserving = 0
		}
		f.mu.Unlock()
		f.wake()
	}
}

// ClaimLease makes room under the broker's lease for an allocation of
// bytes made through Allocator directly (libvram's hooks), for which no
// Allocate claims: when what the allocator holds and bytes, as its cap
// charges them, pass the lease, it claims the difference, waiting under
// ctx for borrowers to shrink. The lease is not given back until done is
// called, after the allocation. Without a lease it does nothing. A claim
// the broker refuses, or grants only in part, is an error wrapping
// ErrLease and ErrOutOfMemory, naming the figures.
func (m *Manager) ClaimLease(ctx context.Context, bytes uint64) (done func(), err error) {
	f := m.lease
	if f == nil || m.capLim == nil {
		return func() {}, nil
	}
	done = f.hold()
	if err := f.l.Err(); err != nil {
		done()
		return nil, fmt.Errorf("%s has ended: %w (%w, %w)", f.l, err, ErrLease, ErrOutOfMemory)
	}
	charged, ok := units.RoundUp(bytes, max(m.capLim.Granularity(), 1))
	if !ok {
		charged = bytes
	}
	want := satAdd(m.al.Stats().Reserved, charged)
	if want <= f.budget().Bytes {
		return done, nil
	}
	start := time.Now()
	got, err := f.claim(ctx, want)
	f.countClaim(start, want, got, err)
	if err == nil {
		f.apply(got)
	}
	switch {
	case err != nil:
		err = fmt.Errorf("a claim of %s of %s, for %s more: %w (%w, %w)", units.Format(want), f.l, units.Format(bytes), err, ErrLease, ErrOutOfMemory)
	case got.Bytes < want:
		err = fmt.Errorf("%s granted %s of the %s claimed, for %s more: beyond its guaranteed %s the broker lends only what no other lease holds or was granted (vram broker status shows who): %w (%w)",
			f.l, units.Format(got.Bytes), units.Format(want), units.Format(bytes), units.Format(got.Guaranteed), ErrLease, ErrOutOfMemory)
	}
	if err != nil {
		done()
		return nil, err
	}
	return done, nil
}

// countClaim counts a claim of want made at start, granted got or failed
// with err.
func (f *leaseFollower) countClaim(start time.Time, want uint64, got LeaseBudget, err error) {
	f.count(func(s *LeaseStats) {
		s.Claims++
		s.ClaimWait += time.Since(start)
		if err != nil || got.Bytes < want {
			s.Refused++
		}
	})
}

// claimLease claims more of the broker's lease when the plan (or its
// error, planErr) falls short for want of it, and plans again with what
// the broker grants. It returns the error the transaction goes on with:
// a failed claim is that error only when there was no plan.
func (tx *allocTx) claimLease(planErr error) error {
	f := tx.m.lease
	if f == nil || !tx.shortOfLease(planErr) {
		return planErr
	}
	if err := f.l.Err(); err != nil {
		return fmt.Errorf("%w; %s has ended: %w (%w)", planErr, f.l, err, ErrLease)
	}
	before := f.budget()
	want := tx.leaseWant()
	if before.Shrink || want <= before.Bytes {
		return planErr // asked to give memory back, or no more would help
	}
	start := time.Now()
	got, err := f.claim(tx.ac.ctx, want)
	f.countClaim(start, want, got, err)
	if err != nil {
		if planErr == nil { // the chunked plan goes on within the lease
			tx.m.log.Debug("vram: a claim of more of the broker's lease failed; the group goes on chunked", "group", tx.group, "err", err)
			return nil
		}
		return fmt.Errorf("%w; a claim of %s of %s failed: %w", planErr, units.Format(want), f.l, err)
	}
	f.applyLocked(got)
	if got.Bytes <= before.Bytes {
		return planErr
	}
	if err := tx.planOnce(); err != nil {
		if got.Bytes < want {
			return fmt.Errorf("%w; %s granted %s of the %s claimed: beyond its guaranteed %s the broker lends only what no other lease holds or was granted (vram broker status shows who)",
				err, f.l, units.Format(got.Bytes), units.Format(want), units.Format(got.Guaranteed))
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

// reserveLease reports, before the plan's arrays are allocated, what the
// allocator will hold at most (what it holds and what they take), so that
// no claim of another process takes that memory as free meanwhile. When
// the broker's reply shows the lease lowered below it, the group is
// planned again within the lease. Past this step the transaction
// completes whatever its context says, so the report is bounded by a
// time of its own.
func (tx *allocTx) reserveLease() error {
	f, m := tx.m.lease, tx.m
	if f == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(tx.ac.ctx), leaseCallTimeout)
	defer cancel()
	for attempt := 0; ; attempt++ {
		upper := satAdd(m.al.Stats().Reserved, tx.gb.planDevice)
		if upper > f.budget().Bytes && m.cached() > 0 {
			if err := m.trimCtx(ctx); err != nil {
				return fmt.Errorf("allocate group %q within %s: %w", tx.group, f.l, err)
			}
			upper = satAdd(m.al.Stats().Reserved, tx.gb.planDevice)
		}
		f.mu.Lock()
		f.reserving = upper
		f.mu.Unlock()
		b, err := f.tell(ctx, upper)
		if err != nil {
			return fmt.Errorf("allocate group %q: report to the broker that the allocator will hold %s: %w", tx.group, units.Format(upper), err)
		}
		f.applyLocked(b)
		f.acked(upper, b)
		switch {
		case upper <= b.Bytes:
			return nil
		case attempt == maxReplans:
			return fmt.Errorf("allocate group %q: the arrays take the allocator to %s, over the %s %s gives after %d plans: %w",
				tx.group, units.Format(upper), units.Format(b.Bytes), f.l, attempt+1, ErrLease)
		}
		if err := tx.planOnce(); err != nil {
			return err
		}
		if !tx.gb.fitsBeside(tx.plan.ChunkPlan) {
			tx.setAsideReplaced(false)
		}
	}
}
