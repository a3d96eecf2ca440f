package broker

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/vramkit/vram/broker/brokerpb"
)

// FuzzRequests decodes requests from the input (each message's bytes
// prefixed by its kind and length; FuzzWire fuzzes the framing) and runs them
// against a table, as two connections of two uids (one of them root): no
// input may panic, every refusal wraps one of the broker's sentinels, the
// table's invariants hold after every request, and no request but an
// acquire changes what the other connection's leases are and hold (a
// claim may lower their limits; a rejoin ends a lease of another uid that
// holds its id). A rejoin whose token is one byte long carries a true
// token, so that rejoins are taken too.
func FuzzRequests(f *testing.F) {
	seed := func(msgs ...proto.Message) []byte {
		var out []byte
		for _, m := range msgs {
			b, _ := proto.Marshal(m)
			kind := map[string]byte{"AcquireRequest": 0, "ChangeRequest": 1, "ClaimRequest": 2, "ReportRequest": 3, "ReleaseRequest": 4}[string(m.ProtoReflect().Descriptor().Name())]
			out = append(out, kind, byte(len(b)))
			out = append(out, b...)
		}
		return out
	}
	f.Add(seed(&brokerpb.AcquireRequest{LeaseId: 1, Spec: &brokerpb.LeaseSpec{Name: "a", Proportion: 0.5}},
		&brokerpb.ClaimRequest{LeaseId: 1, LimitBytes: 6 << 30}, &brokerpb.ReportRequest{LeaseId: 1, HeldBytes: 5 << 30},
		&brokerpb.AcquireRequest{LeaseId: 2, Spec: &brokerpb.LeaseSpec{Proportion: 0.5}}, &brokerpb.ClaimRequest{LeaseId: 2, LimitBytes: 4 << 30}))
	f.Add(seed(&brokerpb.AcquireRequest{LeaseId: 3, Spec: &brokerpb.LeaseSpec{}}, &brokerpb.ChangeRequest{LeaseId: 3, Proportion: 0.96},
		&brokerpb.AcquireRequest{LeaseId: 4, Spec: &brokerpb.LeaseSpec{Device: 1, CapBytes: 1 << 20}, Rejoin: true, HeldBytes: 1 << 40}, &brokerpb.ReleaseRequest{LeaseId: 3}))
	f.Add(seed(&brokerpb.AcquireRequest{LeaseId: 5, Spec: &brokerpb.LeaseSpec{Proportion: 0.7}},
		&brokerpb.AcquireRequest{LeaseId: 6, Spec: &brokerpb.LeaseSpec{Proportion: 0.6}, Rejoin: true, HeldBytes: 1 << 30, Token: []byte{1}, RejoinBroker: 9},
		&brokerpb.ChangeRequest{LeaseId: 6, Proportion: 0.2}, &brokerpb.ReleaseRequest{LeaseId: 5}))
	f.Add([]byte{0, 200, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, in []byte) {
		s, err := NewServer(Config{Devices: []Device{{Name: "a", Total: 8 << 30, Context: 1 << 20}, {Name: "b", Total: 1 << 30}},
			ReclaimTimeout: time.Millisecond, MaxLeasesPerConn: 8, MaxLeases: 12, Logger: quiet})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Stop()
		s.check = checkLocked
		users := []*session{s.openSession(peerCred{pid: 10, uid: 1000}), s.openSession(peerCred{pid: 11, uid: 0})}
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		for i := 0; len(in) >= 2; i++ {
			kind, n := in[0]%5, int(in[1])
			in = in[2:]
			if n > len(in) {
				n = len(in)
			}
			msg := in[:n]
			in = in[n:]
			sess, other := users[i%2], users[(i+1)%2]
			before := leasesOf(s, other)
			if err := runRequest(ctx, s, sess, kind, msg); err != nil && !known(err) {
				t.Fatalf("request kind %d: %v wraps no sentinel of the broker", kind, err)
			}
			if b := s.broken; len(b) > 0 {
				t.Fatalf("invariants broken: %q", b)
			}
			if after := leasesOf(s, other); kind != 0 && after != before {
				t.Fatalf("request kind %d of uid %d changed uid %d's leases: %s, were %s", kind, sess.uid, other.uid, after, before)
			}
		}
		for _, sess := range users {
			s.endSession(sess)
		}
		if len(s.leases) != 0 || len(s.broken) > 0 {
			t.Fatalf("after every session ended: %d leases, broken %q", len(s.leases), s.broken)
		}
	})
}

// runRequest decodes msg as a request of kind and runs it. A message that
// does not decode is dropped, as the connection that sent it is closed
// before any handler (serve.go).
func runRequest(ctx context.Context, s *Server, sess *session, kind byte, msg []byte) error {
	decode := func(m proto.Message) bool { return proto.Unmarshal(msg, m) == nil }
	switch kind {
	case 0:
		if r := new(brokerpb.AcquireRequest); decode(r) {
			if r.GetRejoin() && len(r.GetToken()) == 1 {
				s.mu.Lock()
				r.Token = s.tokens.of(r.GetLeaseId(), sess.uid, r.GetRejoinBroker())
				s.mu.Unlock()
			}
			_, err := s.acquire(sess, r)
			return err
		}
	case 1:
		if r := new(brokerpb.ChangeRequest); decode(r) {
			_, err := s.change(sess, r)
			return err
		}
	case 2:
		if r := new(brokerpb.ClaimRequest); decode(r) {
			_, err := s.claim(ctx, sess, r)
			return err
		}
	case 3:
		if r := new(brokerpb.ReportRequest); decode(r) {
			_, err := s.report(sess, r)
			return err
		}
	case 4:
		if r := new(brokerpb.ReleaseRequest); decode(r) {
			return s.release(sess, r)
		}
	}
	return nil
}

// leasesOf describes sess's leases: ids, shares, caps and holdings.
func leasesOf(s *Server, sess *session) string {
	var b strings.Builder
	for _, l := range sortedByID(sess.leases) {
		fmt.Fprintf(&b, "%x:%d/%d/%d ", l.id, l.units, l.cap, l.held)
	}
	return b.String()
}

func known(err error) bool {
	for _, e := range []error{ErrProportion, ErrInvalid, ErrNotFound, ErrPermission, ErrLimit, ErrReclaimTimeout, ErrReleased, ErrBusy, ErrExists,
		context.DeadlineExceeded, context.Canceled} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}
