package broker

// Rejoins: a lease taken back on a new connection by the process that
// held it, with what it holds.
//
// A Client whose connection is lost dials again and, greeted by a new
// session, acquires each of its leases again with rejoin set, its id,
// what it holds and its limit, its token and the broker instance that
// gave the token. The broker takes a rejoin only with the lease's token
// (token.go), and only where something ended the lease without its
// holder:
//   - an entry of the same id and uid still in the table (its old
//     connection not closed yet, or another of its user's since the
//     restart) is replaced, so that the lease is counted once;
//   - with none, only after a restart: the token is another instance's.
//     A lease this broker ended (its connection closed) is not taken
//     back: the broker may have granted its memory to others since;
//   - an entry of another uid, made since the restart, holds an id it had
//     no right to (ids are random; this one was public in the old
//     broker's status): it is ended, and the rightful holder takes the id
//     back. Its maker cannot take it again: its token is this broker's.
//
// What a rejoin holds is counted whether or not it fits; a share that no
// longer fits is dropped (joinLocked), not the lease. The reply carries a
// token of this broker's, for the next restart.

import (
	"fmt"

	"github.com/vramkit/vram/broker/brokerpb"
)

// checkRejoinLocked refuses a rejoin of sess that is not its lease's, or
// that no restart explains; old is the entry of its id, if any. It
// reports whether old is to be ended as a squatter's.
func (s *Server) checkRejoinLocked(sess *session, req *brokerpb.AcquireRequest, old *lease) (squat bool, err error) {
	id, from := req.GetLeaseId(), req.GetRejoinBroker()
	if !s.tokens.matches(id, sess.uid, from, req.GetToken()) {
		return false, fmt.Errorf("rejoin lease %016x: the token is not the lease's under this broker's key: the lease is another uid's or process's, or the broker lost its key file since the lease was acquired: %w", id, ErrPermission)
	}
	restarted := from != s.id
	switch {
	case old == nil && !restarted:
		return false, fmt.Errorf("rejoin lease %016x: this broker ended it when its connection closed, and a lease is taken back only after a restart of the broker: %w", id, ErrReleased)
	case old != nil && old.sess.uid != sess.uid && !restarted:
		return false, fmt.Errorf("rejoin lease %016x: the id is another uid's lease: %w", id, ErrExists)
	}
	return old != nil && old.sess.uid != sess.uid, nil
}
