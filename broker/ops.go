package broker

// The operations on the lease table, one per request, each under mu.
// Every one checks its request (validate.go) and the caller's right to
// the lease first, so that a refusal changes nothing, and ends with
// afterChangeLocked: waiting claims served, reclaims started, holders told.

import (
	"context"
	"fmt"
	"time"

	"github.com/vramkit/vram/broker/brokerpb"
	"github.com/vramkit/vram/internal/units"
)

// ownLocked finds lease id for sess to act on: its own process's lease,
// or any lease when sess is root.
func (s *Server) ownLocked(sess *session, id uint64, op string) (*lease, error) {
	if err := checkID(id); err != nil {
		return nil, err
	}
	l := s.leases[id]
	if l == nil {
		return nil, fmt.Errorf("%s lease %016x: no such lease (released, or its connection closed): %w", op, id, ErrNotFound)
	}
	if l.sess.pid != sess.pid && sess.uid != 0 {
		return nil, fmt.Errorf("%s %s: the lease is pid %d's (uid %d); pid %d (uid %d) may not: %w",
			op, l.label(), l.sess.pid, l.sess.uid, sess.pid, sess.uid, ErrPermission)
	}
	return l, nil
}

// acquire opens a lease (or, for a rejoin, replaces the entry a lost
// connection of the same process left).
func (s *Server) acquire(sess *session, req *brokerpb.AcquireRequest) (*brokerpb.LeaseState, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	sp, err := checkAcquire(req, s.devices)
	if err != nil {
		return nil, err
	}
	if sess.closed || s.stopped {
		return nil, fmt.Errorf("acquire: the connection is closing: %w", ErrReleased)
	}
	id := req.GetLeaseId()
	old := s.leases[id]
	switch {
	case old != nil && (!req.GetRejoin() || old.sess.pid != sess.pid):
		return nil, fmt.Errorf("acquire lease %016x: the id is %s's; choose another (rejoin only replaces a lease of the same process): %w", id, old.label(), ErrExists)
	case old == nil && len(s.leases) >= s.cfg.MaxLeases:
		return nil, fmt.Errorf("acquire: the broker holds %d leases, its limit: %w", len(s.leases), ErrLimit)
	case len(sess.leases) >= s.cfg.MaxLeasesPerConn && (old == nil || old.sess != sess):
		return nil, fmt.Errorf("acquire: the connection holds %d leases, the limit of one connection: %w", len(sess.leases), ErrLimit)
	}
	d := sp.dev
	warn, err := s.joinLocked(d, sp.units, old)
	if err != nil {
		return nil, fmt.Errorf("acquire %q on device %d: %w", sp.name, d.index, err)
	}
	if old != nil {
		s.dropLocked(old, fmt.Errorf("%s: replaced by a rejoin: %w", old.label(), ErrReleased))
	}
	l := &lease{id: id, sess: sess, name: sp.name, asked: sp.asked, units: sp.units, cap: sp.cap, inPools: true}
	d.add(l)
	s.leases[id] = l
	sess.leases[id] = l
	if req.GetRejoin() {
		// What it holds is a fact, counted whatever the room; its limit
		// is what it had, as far as there is room (if less than it
		// holds, it is asked to shrink when someone claims).
		l.held = req.GetHeldBytes()
		l.limit = min(max(req.GetLimitBytes(), l.usage()), d.room(l), d.maxLimit(l))
	} else {
		l.limit = min(d.guaranteed(l), d.room(l))
	}
	if warn != "" {
		s.log.Warn(warn, "lease", l.label(), "device", d.index)
	}
	s.afterChangeLocked(d)
	return s.stateLocked(l), nil
}

// joinLocked takes the share units on d for a new lease that replaces
// old (nil: none), leaving the pools as they were on a refusal.
func (s *Server) joinLocked(d *device, units uint64, old *lease) (string, error) {
	if old != nil && old.dev == d {
		warn, err := d.pools.Move(old.units, units)
		if err == nil {
			old.inPools = false // its share is the new lease's now
		}
		return warn, err
	}
	return d.pools.Join(units)
}

// change gives a lease another proportion and cap.
func (s *Server) change(sess *session, req *brokerpb.ChangeRequest) (*brokerpb.LeaseState, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	l, err := s.ownLocked(sess, req.GetLeaseId(), "change")
	if err != nil {
		return nil, err
	}
	d := l.dev
	u, err := checkProportion("proportion", req.GetProportion())
	if err != nil {
		return nil, err
	}
	if err := checkSize("cap_bytes", req.GetCapBytes(), d); err != nil {
		return nil, err
	}
	warn, err := d.pools.Move(l.units, u)
	if err != nil {
		return nil, fmt.Errorf("change %s: %w", l.label(), err)
	}
	l.units, l.asked, l.cap = u, req.GetProportion(), req.GetCapBytes()
	if l.cap > 0 && l.limit > l.cap {
		l.limit = l.cap // a lower cap lowers the limit: the holder is told to shrink
		s.startReclaimLocked(l)
	}
	if warn != "" {
		s.log.Warn(warn, "lease", l.label(), "device", d.index)
	}
	s.afterChangeLocked(d)
	return s.stateLocked(l), nil
}

// report records what a lease holds: an acknowledgement when it was
// asked to shrink.
func (s *Server) report(sess *session, req *brokerpb.ReportRequest) (*brokerpb.LeaseState, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	l, err := s.ownLocked(sess, req.GetLeaseId(), "report")
	if err != nil {
		return nil, err
	}
	if err := checkHeld(req.GetHeldBytes(), l); err != nil {
		return nil, err
	}
	l.held = req.GetHeldBytes()
	s.settleLocked(l)
	s.afterChangeLocked(l.dev)
	return s.stateLocked(l), nil
}

// release ends a lease.
func (s *Server) release(sess *session, req *brokerpb.ReleaseRequest) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	l, err := s.ownLocked(sess, req.GetLeaseId(), "release")
	if err != nil {
		return err
	}
	s.releaseLocked(l, fmt.Errorf("%s: released: %w", l.label(), ErrReleased))
	return nil
}

// releaseLocked ends l and serves its device; a claim of l that waits
// fails with why.
func (s *Server) releaseLocked(l *lease, why error) {
	d := l.dev
	s.dropLocked(l, why)
	s.afterChangeLocked(d)
}

// dropLocked takes l out of the table: its share, its claim (failed with
// why), its reclaim, its session.
func (s *Server) dropLocked(l *lease, why error) {
	if c := l.claim; c != nil {
		s.counts[l.dev.index].released++
		s.finishClaimLocked(c, why)
	}
	if r := l.reclaim; r != nil {
		r.timer.Stop()
		l.reclaim = nil
	}
	if l.inPools {
		l.dev.pools.Leave(l.units)
		l.inPools = false
	}
	l.dev.remove(l)
	delete(s.leases, l.id)
	delete(l.sess.leases, l.id)
	delete(l.sess.dirty, l.id)
}

// claim sets a lease's limit: at once when lowering it or when the
// memory is free, else after the borrowers have shrunk, waiting under
// ctx until the reclaim deadline.
func (s *Server) claim(ctx context.Context, sess *session, req *brokerpb.ClaimRequest) (*brokerpb.LeaseState, error) {
	s.mu.Lock()
	l, err := s.ownLocked(sess, req.GetLeaseId(), "claim")
	if err == nil {
		err = s.checkClaimLocked(l, req.GetLimitBytes())
	}
	if err != nil {
		s.mu.Unlock()
		return nil, err
	}
	d, want := l.dev, req.GetLimitBytes()
	if want <= l.limit {
		l.limit = want
		s.settleLocked(l)
		s.afterChangeLocked(d)
		defer s.mu.Unlock()
		return s.stateLocked(l), nil
	}
	now := time.Now()
	c := &claim{l: l, want: want, since: now, deadline: now.Add(s.cfg.ReclaimTimeout), done: make(chan struct{})}
	l.claim = c
	d.claims = append(d.claims, c)
	c.timer = time.AfterFunc(s.cfg.ReclaimTimeout, func() { s.claimTimedOut(c) })
	s.afterChangeLocked(d) // served at once if the memory is free
	s.mu.Unlock()

	select {
	case <-c.done:
	case <-ctx.Done():
		s.mu.Lock()
		if l.claim == c {
			s.counts[d.index].cancelled++
			s.finishClaimLocked(c, fmt.Errorf("claim of %s for %s on device %d: %w; %s", units.Format(want), l.label(), d.index, ctx.Err(), d.holders(l)))
			s.afterChangeLocked(d)
		}
		s.mu.Unlock()
		<-c.done
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if c.err != nil {
		return nil, c.err
	}
	return s.stateLocked(l), nil
}

// checkClaimLocked refuses a claim past the device or the lease's cap,
// or while another waits.
func (s *Server) checkClaimLocked(l *lease, want uint64) error {
	if err := checkSize("limit_bytes", want, l.dev); err != nil {
		return err
	}
	if l.cap > 0 && want > l.cap {
		return fmt.Errorf("limit_bytes %s: over %s's cap of %s: %w", units.Format(want), l.label(), units.Format(l.cap), ErrInvalid)
	}
	if l.claim != nil {
		return fmt.Errorf("claim for %s: a claim of %s waits since %s: %w", l.label(), units.Format(l.claim.want), l.claim.since.Format("15:04:05.000"), ErrBusy)
	}
	return nil
}

// stateLocked is l as the protocol describes it to its holder.
func (s *Server) stateLocked(l *lease) *brokerpb.LeaseState {
	v := l.dev.view(l)
	s.seq++
	st := &brokerpb.LeaseState{LeaseId: l.id, Seq: s.seq, Device: uint32(l.dev.index), Share: v.share,
		GuaranteedBytes: v.guaranteed, LimitBytes: v.limit, ContextBytes: v.ctx, HeldBytes: v.held}
	if v.reclaimID != 0 {
		st.Reclaim = &brokerpb.Reclaim{Id: v.reclaimID, TargetBytes: v.target, DeadlineUnixNano: v.deadline, Overdue: v.overdue}
	}
	return st
}

// afterChangeLocked ends every change to d: the waiting claims served
// (and reclaims started for those that still wait), each holder whose
// view changed told, the test hook run.
func (s *Server) afterChangeLocked(d *device) {
	s.serveLocked(d)
	for _, l := range d.leases {
		if v := d.view(l); v != l.sent {
			l.sent = v
			l.sess.markDirty(l.id)
		}
	}
	if s.check != nil {
		if msg := s.check(s); msg != "" {
			s.broken = append(s.broken, msg)
		}
	}
}
