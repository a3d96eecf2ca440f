package broker

// Rejoins: a lease taken back on a new connection by the process that
// held it, with what it holds.
//
// A Client whose connection is lost dials again and, greeted by a new
// session, acquires each of its leases again with rejoin set, its id,
// its token, what it holds and its limit, and the broker instance it held
// them on. The broker takes a rejoin only with the lease's token
// (token.go), and only where something ended the lease without its
// holder: an entry of the same id still in the table (its old connection
// not closed yet), replaced so that it is counted once; or, with none, a
// restart the client saw (the instance it names is not this one). A
// lease this broker ended (its connection closed) is not taken back: the
// broker may have granted its memory to others since. What a rejoin
// holds is counted whether or not it fits; a share that no longer fits
// is dropped (joinLocked), not the lease.

import (
	"fmt"

	"github.com/vramkit/vram/broker/brokerpb"
)

// checkRejoinLocked refuses a rejoin of sess that is not its lease's, or
// that no restart explains; old is the entry of its id, if any.
func (s *Server) checkRejoinLocked(sess *session, req *brokerpb.AcquireRequest, old *lease) error {
	id := req.GetLeaseId()
	if !tokenMatches(s.key, id, sess.uid, req.GetToken()) {
		return fmt.Errorf("rejoin lease %016x: the token is not the lease's under this broker's key: the lease is another uid's or process's, or the broker lost its key file since the lease was acquired: %w", id, ErrPermission)
	}
	if old == nil && (req.GetRejoinBroker() == 0 || req.GetRejoinBroker() == s.id) {
		return fmt.Errorf("rejoin lease %016x: this broker ended it when its connection closed, and a lease is taken back only after a restart of the broker: %w", id, ErrReleased)
	}
	return nil
}
