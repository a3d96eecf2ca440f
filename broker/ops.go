package broker

// The operations on the lease table, one per request, each under mu.
// Every one checks its request (validate.go) and the caller's right to
// the lease first (its own connection's, or a rejoin with its token), so
// that a refusal changes nothing, and ends with afterChangeLocked:
// waiting claims served, reclaims started, holders told.

import (
	"context"
	"fmt"
	"time"

	"github.com/vramkit/vram/broker/brokerpb"
	"github.com/vramkit/vram/internal/units"
)

// ownLocked finds lease id for sess to act on: a lease of its own. No
// connection acts on another's lease, root's included: a lease is its
// holder's alone, and on a node where every container runs as root, root
// is anyone.
func (s *Server) ownLocked(sess *session, id uint64, op string) (*lease, error) {
	if err := checkID(id); err != nil {
		return nil, err
	}
	l := s.leases[id]
	if l == nil {
		return nil, fmt.Errorf("%s lease %016x: no such lease (released, or its connection closed): %w", op, id, ErrNotFound)
	}
	if l.sess != sess {
		return nil, fmt.Errorf("%s %s: the lease is another connection's (uid %d); only the connection that acquired a lease may %s it: %w",
			op, l.label(), l.sess.uid, op, ErrPermission)
	}
	return l, nil
}

// acquire opens a lease, or for a rejoin takes one back (rejoin.go).
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
	squat := false
	if req.GetRejoin() {
		squat, err = s.checkRejoinLocked(sess, req, old)
	} else if old != nil {
		err = fmt.Errorf("acquire lease %016x: the id is another lease's; choose another: %w", id, ErrExists)
	}
	if squat {
		old = nil // ended below, once the rejoin is known to fit the limits
	}
	if err == nil {
		err = s.checkCountsLocked(sess, old)
	}
	if err != nil {
		return nil, err
	}
	if squat {
		s.releaseLocked(s.leases[id], fmt.Errorf("%s: its id is another's lease, taken back by its holder after the broker's restart: %w", s.leases[id].label(), ErrReleased))
	}
	d := sp.dev
	inPools, warn, err := s.joinLocked(d, sp.units, old, req.GetRejoin())
	if err != nil {
		return nil, fmt.Errorf("acquire %q on device %d: %w", sp.name, d.index, err)
	}
	if old != nil {
		s.dropLocked(old, fmt.Errorf("%s: replaced by a rejoin: %w", old.label(), ErrReleased))
	}
	l := &lease{id: id, sess: sess, name: sp.name, asked: sp.asked, units: sp.units, cap: sp.cap, inPools: inPools}
	s.addLocked(d, l)
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
	st := s.answerLocked(l)
	st.Token = s.tokens.of(id, sess.uid, s.id)
	return st, nil
}

// checkCountsLocked refuses a lease past a limit of the broker: in all,
// of sess's uid, of sess. A rejoin that replaces old counts where old
// did.
func (s *Server) checkCountsLocked(sess *session, old *lease) error {
	switch {
	case old == nil && len(s.leases) >= s.cfg.MaxLeases:
		return fmt.Errorf("acquire: the broker holds %d leases, its limit: %w", len(s.leases), ErrLimit)
	case (old == nil || old.sess.uid != sess.uid) && s.uidLeases[sess.uid] >= s.cfg.MaxLeasesPerUID:
		return fmt.Errorf("acquire: uid %d holds %d leases, the limit of one uid: release some, or raise the broker's limit: %w", sess.uid, s.uidLeases[sess.uid], ErrLimit)
	case (old == nil || old.sess != sess) && len(sess.leases) >= s.cfg.MaxLeasesPerConn:
		return fmt.Errorf("acquire: the connection holds %d leases, the limit of one connection: %w", len(sess.leases), ErrLimit)
	}
	return nil
}

// joinLocked takes the share units on d for a new lease that replaces
// old (nil: none), leaving the pools as they were on a refusal. A rejoin
// whose share no longer fits (others took it while the broker was away)
// is taken back without one: inPools false, nothing guaranteed.
func (s *Server) joinLocked(d *device, units uint64, old *lease, rejoin bool) (inPools bool, warn string, err error) {
	if old != nil && old.dev == d && old.inPools {
		warn, err = d.pools.Move(old.units, units)
		if err == nil {
			old.inPools = false // its share is the new lease's now
		}
	} else {
		warn, err = d.pools.Join(units)
	}
	if err != nil && rejoin {
		return false, fmt.Sprintf("vram broker: a lease taken back after a restart keeps no share: its share no longer fits (%v); it is counted for what it holds, and is asked to shrink when others claim", err), nil
	}
	return err == nil, warn, err
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
	var warn string
	if l.inPools {
		warn, err = d.pools.Move(l.units, u)
	} else {
		warn, err = d.pools.Join(u) // a lease taken back without a share
	}
	if err != nil {
		return nil, fmt.Errorf("change %s: %w", l.label(), err)
	}
	l.units, l.asked, l.cap, l.inPools = u, req.GetProportion(), req.GetCapBytes(), true
	if l.cap > 0 && l.limit > l.cap {
		l.limit = l.cap // a lower cap lowers the limit: the holder is told to shrink
		s.startReclaimLocked(l)
	}
	if warn != "" {
		s.log.Warn(warn, "lease", l.label(), "device", d.index)
	}
	return s.answerLocked(l), nil
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
	return s.answerLocked(l), nil
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
	if s.uidLeases[l.sess.uid]--; s.uidLeases[l.sess.uid] == 0 {
		delete(s.uidLeases, l.sess.uid)
	}
}

// addLocked puts l, of its session, in the table on d.
func (s *Server) addLocked(d *device, l *lease) {
	d.add(l)
	s.leases[l.id] = l
	l.sess.leases[l.id] = l
	s.uidLeases[l.sess.uid]++
}

// claim sets a lease's limit: at once when lowering it or when the
// memory is free, else after the borrowers have shrunk, waiting under
// ctx until the reclaim deadline.
func (s *Server) claim(ctx context.Context, sess *session, req *brokerpb.ClaimRequest) (*brokerpb.LeaseState, error) {
	st, c, err := s.startClaim(sess, req)
	if c == nil {
		return st, err
	}
	return s.awaitClaim(ctx, c)
}

// startClaim begins a claim: its answer when it is known at once (c nil),
// else the claim, which waits for its memory (awaitClaim).
func (s *Server) startClaim(sess *session, req *brokerpb.ClaimRequest) (st *brokerpb.LeaseState, c *claim, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	l, err := s.ownLocked(sess, req.GetLeaseId(), "claim")
	if err == nil {
		err = s.checkClaimLocked(l, req.GetLimitBytes())
	}
	if err != nil {
		return nil, nil, err
	}
	d, want := l.dev, req.GetLimitBytes()
	if want <= l.limit {
		l.limit = want
		s.settleLocked(l)
		return s.answerLocked(l), nil, nil
	}
	now := time.Now()
	c = &claim{l: l, want: want, since: now, deadline: now.Add(s.cfg.ReclaimTimeout), done: make(chan struct{})}
	l.claim = c
	d.claims = append(d.claims, c)
	c.timer = time.AfterFunc(s.cfg.ReclaimTimeout, func() { s.claimTimedOut(c) })
	s.changedLocked(d, l) // served at once if the memory is free
	if l.claim != c {     // ended at once: granted, and the reply tells its holder
		if c.err != nil {
			return nil, nil, c.err
		}
		return s.replyLocked(l), nil, nil
	}
	s.tellLocked(l)
	return nil, c, nil
}

// awaitClaim waits, under ctx, for the claim c to be granted or to fail.
func (s *Server) awaitClaim(ctx context.Context, c *claim) (*brokerpb.LeaseState, error) {
	l := c.l
	select {
	case <-c.done:
	case <-ctx.Done():
		s.mu.Lock()
		if l.claim == c {
			d := l.dev
			s.counts[d.index].cancelled++
			s.finishClaimLocked(c, fmt.Errorf("claim of %s for %s on device %d: %w; %s", units.Format(c.want), l.label(), d.index, ctx.Err(), d.holders(l)))
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
	return s.replyLocked(l), nil
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

// answerLocked ends a change that l's holder's call made to l's device,
// as afterChangeLocked, and returns l's state for the reply, which tells
// the holder: its Watch stream is neither sent the state nor woken for it.
func (s *Server) answerLocked(l *lease) *brokerpb.LeaseState {
	s.changedLocked(l.dev, l)
	return s.replyLocked(l)
}

// replyLocked is l's state for the reply to its holder's call: the reply
// tells it, so its Watch stream need not again (one message less a call).
func (s *Server) replyLocked(l *lease) *brokerpb.LeaseState {
	st := s.stateLocked(l)
	l.sent = l.dev.view(l)
	delete(l.sess.dirty, l.id)
	return st
}

// tellLocked queues l's state for its holder's watch if it changed since
// the holder was last told.
func (s *Server) tellLocked(l *lease) {
	if v := l.dev.view(l); v != l.sent {
		l.sent = v
		l.sess.markDirty(l.id)
	}
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
func (s *Server) afterChangeLocked(d *device) { s.changedLocked(d, nil) }

// changedLocked is afterChangeLocked but for replied, a lease whose
// holder the caller tells in its reply (replyLocked).
func (s *Server) changedLocked(d *device, replied *lease) {
	s.serveLocked(d)
	for _, l := range d.leases {
		if l != replied {
			s.tellLocked(l)
		}
	}
	if s.check != nil {
		if msg := s.check(s); msg != "" {
			s.broken = append(s.broken, msg)
		}
	}
}
