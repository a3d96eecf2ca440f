package broker

// The watch: a connection's one event stream. Its call is answered with
// a Hello at once; then a goroutine of the connection sends, as events of
// the call, the states of the connection's leases that
// afterChangeLocked marked dirty, outside mu, until the connection ends.

import (
	"fmt"

	"github.com/vramkit/vram/broker/brokerpb"
)

// watch opens the connection's watch as call.
func (sc *serverConn) watch(call uint64) {
	if err := sc.canWait(call); err != nil {
		sc.replyError(call, err)
		return
	}
	hello, err := sc.s.startWatch(sc.sess)
	if err != nil {
		sc.replyError(call, err)
		return
	}
	ctx, end := sc.startWait(call, 0)
	event := func(ev *brokerpb.Event) bool {
		return sc.send(&brokerpb.Reply{Call: call, Body: &brokerpb.Reply_Event{Event: ev}})
	}
	ok := event(&brokerpb.Event{Kind: &brokerpb.Event_Hello{Hello: hello}})
	sc.spawn(func() {
		defer end()
		defer sc.s.stopWatch(sc.sess)
		for ok {
			select {
			case <-sc.sess.wake:
			case <-ctx.Done():
				return
			}
			for _, st := range sc.s.drain(sc.sess) {
				if ok = event(&brokerpb.Event{Kind: &brokerpb.Event_Lease{Lease: st}}); !ok {
					break
				}
			}
		}
	})
}

// startWatch makes sess's watch the one that hears of its leases, with
// every lease queued to be sent once; a second watch on the same
// connection is refused.
func (s *Server) startWatch(sess *session) (*brokerpb.Hello, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if sess.watching {
		return nil, fmt.Errorf("watch: the connection has a watch already (one a connection): %w", ErrLimit)
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
