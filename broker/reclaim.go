package broker

// Claims and cooperative reclaim.
//
// A claim raises a lease's limit. What is free is granted at once; the
// part within the lease's guaranteed share that is not free is lent out,
// so the broker lowers the borrowers' limits (largest borrowed part
// first, never below a borrower's own guaranteed part or its context)
// and asks each one that now occupies more than its limit to shrink, by
// a deadline, on its Watch stream. A borrower shrinks (at its next chunk
// boundary, for a vram batch) and Reports what it holds: that is the
// acknowledgement. As memory comes back the waiting claims are granted,
// first come first served. At the deadline a claim still waiting fails
// with ErrReclaimTimeout naming who holds what, and each borrower that
// had not shrunk is marked overdue: in the error, in Status and in the
// metrics. Nothing is killed; an overdue borrower that shrinks later
// gives its memory back all the same.
//
// Beyond its guaranteed part a lease only borrows what is free, and only
// when its connection watches (it must be able to hear a request to
// shrink).

import (
	"cmp"
	"fmt"
	"slices"
	"time"

	"github.com/vramkit/vram/internal/units"
)

// waitFor is the limit a claim waits for: what it asks, up to the
// lease's guaranteed part (or its limit, if higher).
func (d *device) waitFor(c *claim) uint64 {
	return min(c.want, max(d.guaranteed(c.l), c.l.limit))
}

// grantFor is the most a claim is granted out of room: what it asks, but
// beyond the guaranteed part only for a watching connection.
func (d *device) grantFor(c *claim, room uint64) uint64 {
	want := c.want
	if !c.l.sess.watching {
		want = d.waitFor(c)
	}
	return min(want, room, d.maxLimit(c.l))
}

// serveLocked grants the waiting claims, in order, while the memory is
// there; if some still wait, it reclaims what they lack.
func (s *Server) serveLocked(d *device) {
	for len(d.claims) > 0 {
		c := d.claims[0]
		l := c.l
		room := d.room(l)
		if room < d.waitFor(c) {
			break
		}
		l.limit = max(l.limit, d.grantFor(c, room))
		s.settleLocked(l)
		s.counts[d.index].granted++
		s.finishClaimLocked(c, nil)
	}
	if len(d.claims) > 0 {
		s.reclaimLocked(d)
	}
}

// reclaimLocked lowers borrowers' limits until what the waiting claims
// lack is free or on its way back.
func (s *Server) reclaimLocked(d *device) {
	// Two shortfalls: of memory (what the claims lack beyond what is free
	// or on its way back) and of limits (beyond what the others' limits
	// leave); lowering borrowers' limits cures both.
	var need, needLimits, coming uint64
	claimants := map[*lease]bool{}
	for _, c := range d.claims {
		claimants[c.l] = true
		w := d.waitFor(c)
		need = units.SatAdd(need, w-min(w, c.l.occupied()))
		needLimits = units.SatAdd(needLimits, w-min(w, c.l.limit))
	}
	for _, l := range d.sortedLeases() {
		if l.usage() > max(l.limit, l.ctx) {
			s.startReclaimLocked(l) // over its limit: asked to shrink, if it was not
			coming = units.SatAdd(coming, l.usage()-max(l.limit, l.ctx))
		}
	}
	have := units.SatAdd(d.free(), coming)
	haveLimits := d.total - min(d.total, d.limitsLocked())
	short := max(need-min(need, have), needLimits-min(needLimits, haveLimits))
	if short == 0 {
		return
	}
	for _, b := range d.lenders(claimants) {
		take := min(b.limit-d.floor(b), short)
		b.limit -= take
		short -= take
		s.startReclaimLocked(b)
		if short == 0 {
			return
		}
	}
}

// floor is the lowest a borrower's limit is taken to: its guaranteed part,
// or its context if that is more.
func (d *device) floor(l *lease) uint64 { return max(d.guaranteed(l), l.ctx) }

// lenders are the leases whose limits are above their floors, the
// largest surplus first (ties by id).
func (d *device) lenders(skip map[*lease]bool) []*lease {
	var ls []*lease
	for _, l := range d.sortedLeases() {
		if !skip[l] && l.limit > d.floor(l) {
			ls = append(ls, l)
		}
	}
	slices.SortStableFunc(ls, func(a, b *lease) int { return cmp.Compare(b.limit-d.floor(b), a.limit-d.floor(a)) })
	return ls
}

// startReclaimLocked asks l to shrink to its limit when it occupies more
// (a reclaim already in flight takes the lower target and keeps its
// deadline).
func (s *Server) startReclaimLocked(l *lease) {
	target := max(l.limit, l.ctx) // its context cannot be given back
	if l.usage() <= target {
		return // the grant was unused: free at once, no one to wait for
	}
	if r := l.reclaim; r != nil {
		r.target = target
		return
	}
	s.nextReclaim++
	r := &reclaim{id: s.nextReclaim, target: target, deadline: time.Now().Add(s.cfg.ReclaimTimeout)}
	r.timer = time.AfterFunc(s.cfg.ReclaimTimeout, func() { s.reclaimTimedOut(l, r) })
	l.reclaim = r
	s.counts[l.dev.index].reclaims++
}

// settleLocked ends l's reclaim once it occupies no more than its limit.
func (s *Server) settleLocked(l *lease) {
	if r := l.reclaim; r != nil && l.usage() <= max(l.limit, l.ctx) {
		r.timer.Stop()
		l.reclaim = nil
	}
}

// finishClaimLocked ends a claim: granted (err nil) or failed.
func (s *Server) finishClaimLocked(c *claim, err error) {
	d := c.l.dev
	if i := slices.Index(d.claims, c); i >= 0 {
		d.claims = slices.Delete(d.claims, i, i+1)
	}
	c.l.claim = nil
	c.timer.Stop()
	c.err = err
	close(c.done)
}

// claimTimedOut fails a claim still waiting at its deadline, naming the
// borrowers that have not shrunk.
func (s *Server) claimTimedOut(c *claim) {
	s.mu.Lock()
	defer s.mu.Unlock()
	l := c.l
	if l.claim != c {
		return // granted or ended meanwhile
	}
	d := l.dev
	for _, o := range d.leases {
		if r := o.reclaim; r != nil && !time.Now().Before(r.deadline) {
			s.markOverdueLocked(o, r)
		}
	}
	room := d.room(l)
	w := d.waitFor(c)
	s.counts[d.index].timedOut++
	s.finishClaimLocked(c, fmt.Errorf("claim of %s for %s on device %d: %s still lent out after %v: %s: %w",
		units.Format(c.want), l.label(), d.index, units.Format(w-min(w, room)), s.cfg.ReclaimTimeout, d.holders(l), ErrReclaimTimeout))
	s.afterChangeLocked(d)
}

// reclaimTimedOut marks a borrower that has not shrunk by its deadline.
func (s *Server) reclaimTimedOut(l *lease, r *reclaim) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if l.reclaim != r {
		return
	}
	s.markOverdueLocked(l, r)
	s.afterChangeLocked(l.dev)
}

func (s *Server) markOverdueLocked(l *lease, r *reclaim) {
	if r.overdue {
		return
	}
	r.overdue = true
	l.missed++
	s.counts[l.dev.index].missed++
	s.log.Warn("vram broker: a borrower missed its deadline to shrink", "lease", l.label(), "device", l.dev.index,
		"holds", units.Format(l.usage()), "target", units.Format(r.target), "deadline", r.deadline.Format(time.RFC3339Nano))
}
