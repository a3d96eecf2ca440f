package broker

import (
	"errors"
	"fmt"

	"github.com/vramkit/vram/broker/brokerpb"
)

// errNoSession: a call on a connection gRPC did not tag (never happens
// with the server's stats handler in place).
var errNoSession = errors.New("broker: connection without a session")

// startWatch makes sess's Watch stream the one that hears of its leases,
// with every lease queued to be sent once; a second stream on the same
// connection is refused.
func (s *Server) startWatch(sess *session) (*brokerpb.Hello, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if sess.watching {
		return nil, fmt.Errorf("watch: the connection has a Watch stream already (one a connection): %w", ErrLimit)
	}
	sess.watching = true
	for id := range sess.leases {
		sess.markDirty(id)
	}
	h := &brokerpb.Hello{Broker: s.id, Session: sess.id, Pid: sess.pid, Uid: sess.uid, ReclaimTimeoutNanos: int64(s.cfg.ReclaimTimeout)}
	for _, d := range s.devices {
		h.Devices = append(h.Devices, deviceInfo(d))
	}
	return h, nil
}

func (s *Server) stopWatch(sess *session) {
	s.mu.Lock()
	defer s.mu.Unlock()
	sess.watching = false
}

// drain takes the states of sess's dirty leases: at most one per lease,
// the latest, however long the stream was stalled.
func (s *Server) drain(sess *session) []*brokerpb.LeaseState {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]*brokerpb.LeaseState, 0, len(sess.dirty))
	for id := range sess.dirty {
		if l := sess.leases[id]; l != nil {
			out = append(out, s.stateLocked(l))
		}
		delete(sess.dirty, id)
	}
	return out
}

func deviceInfo(d *device) *brokerpb.DeviceInfo {
	return &brokerpb.DeviceInfo{Index: uint32(d.index), Name: d.name, Id: d.id, TotalBytes: d.total, ContextBytes: d.context}
}
