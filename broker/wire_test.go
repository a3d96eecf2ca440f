package broker

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/vramkit/vram/broker/brokerpb"
)

// frame is m as the wire frames it.
func frame(m proto.Message) []byte {
	b, err := proto.Marshal(m)
	if err != nil {
		panic(err)
	}
	return append(binary.BigEndian.AppendUint32(nil, uint32(len(b))), b...)
}

// closedByBroker reports whether the broker closed c: a read that ends
// other than by the deadline, which only bounds a broker that never does.
func closedByBroker(c net.Conn) bool {
	_ = c.SetReadDeadline(time.Now().Add(time.Minute))
	_, err := io.Copy(io.Discard, c)
	var ne net.Error
	return !errors.As(err, &ne) || !ne.Timeout()
}

// What the protocol does not allow ends the connection at once, and with
// it the leases it held; the broker serves others beside it.
func TestProtocolViolationsEndTheConnection(t *testing.T) {
	acquire := frame(&brokerpb.Request{Call: 1, Body: &brokerpb.Request_Acquire{Acquire: &brokerpb.AcquireRequest{LeaseId: 1, Spec: &brokerpb.LeaseSpec{Proportion: 0.5}}}})
	for name, tc := range map[string]struct {
		preface string
		then    []byte // after the preface and an acquire
	}{
		"a wrong preface":              {preface: "vram broker 9\n"},
		"a frame over the bound":       {preface: preface, then: binary.BigEndian.AppendUint32(nil, maxMessageBytes+1)},
		"a frame that does not decode": {preface: preface, then: []byte{0, 0, 0, 3, 0xff, 0xff, 0xff}},
		"call 0":                       {preface: preface, then: frame(&brokerpb.Request{Body: &brokerpb.Request_Status{Status: &brokerpb.StatusRequest{}}})},
	} {
		t.Run(name, func(t *testing.T) {
			s, path := startServer(t, oneDevice(GiB))
			c, err := net.Dial("unix", path)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			in := append([]byte(tc.preface), acquire...)
			if _, err := c.Write(append(in, tc.then...)); err != nil {
				t.Fatal(err)
			}
			if _, err := dial(t, path).Status(ctxT(t)); err != nil { // beside it
				t.Fatal(err)
			}
			if !closedByBroker(c) {
				t.Fatalf("the broker kept the connection open for a minute")
			}
			if !waitFor(time.Minute, func() bool { return len(s.Status().Devices[0].Leases) == 0 }) {
				t.Errorf("the connection's lease outlived it: %+v", s.Status().Devices[0].Leases)
			}
		})
	}
}

// A caller that stops waiting for a claim has the broker end it (counted
// as cancelled), long before the reclaim deadline.
func TestCancelledClaimEndsAtTheBroker(t *testing.T) {
	cfg := oneDevice(8 * GiB)
	cfg.ReclaimTimeout = 10 * time.Minute
	s, path := startServer(t, cfg)
	a, b, _, _ := lent(t, path, "stubborn", 8*GiB)
	ctx, cancel := context.WithCancel(ctxT(t))
	done := make(chan error, 1)
	go func() {
		_, err := b.Claim(ctx, 4*GiB)
		done <- err
	}()
	reclaiming := func() bool { l, _ := leaseOf(s.Status(), a.ID()); return l.Reclaim != nil }
	if !waitFor(time.Minute, reclaiming) {
		t.Fatal("the claim never asked the borrower to shrink")
	}
	cancel()
	if err := <-done; !is(err, context.Canceled) {
		t.Fatalf("the cancelled claim: %v, want context.Canceled", err)
	}
	if !waitFor(30*time.Second, func() bool { return s.counters(0).cancelled == 1 }) {
		t.Errorf("the broker still waits on a claim its caller cancelled: counters %+v", s.counters(0))
	}
}

// A call the broker does not know is answered with an error that says
// so, and the connection goes on.
func TestUnknownCallIsAnswered(t *testing.T) {
	_, path := startServer(t, oneDevice(GiB))
	api := rawClient(t, path)
	_, err := api.cc.call(ctxT(t), "nothing", &brokerpb.Request{})
	if !is(err, ErrInvalid) {
		t.Fatalf("a request with no body: %v, want ErrInvalid", err)
	}
	if _, err := api.Acquire(ctxT(t), &brokerpb.AcquireRequest{LeaseId: 1, Spec: &brokerpb.LeaseSpec{}}); err != nil {
		t.Fatalf("the connection after it: %v", err)
	}
}

// FuzzWire writes the input to the broker after the preface, as a client
// would, and closes: no input may panic the broker, the broker ends the
// connection, every lease the input acquired ends with it, and the
// table's invariants hold.
func FuzzWire(f *testing.F) {
	req := func(call uint64, timeout int64, body any) []byte {
		r := &brokerpb.Request{Call: call, TimeoutNanos: timeout}
		switch b := body.(type) {
		case *brokerpb.AcquireRequest:
			r.Body = &brokerpb.Request_Acquire{Acquire: b}
		case *brokerpb.ClaimRequest:
			r.Body = &brokerpb.Request_Claim{Claim: b}
		case *brokerpb.WatchRequest:
			r.Body = &brokerpb.Request_Watch{Watch: b}
		case *brokerpb.CancelRequest:
			r.Body = &brokerpb.Request_Cancel{Cancel: b}
		case *brokerpb.ReleaseRequest:
			r.Body = &brokerpb.Request_Release{Release: b}
		}
		return frame(r)
	}
	cat := func(bs ...[]byte) (out []byte) {
		for _, b := range bs {
			out = append(out, b...)
		}
		return out
	}
	f.Add(cat(req(1, 0, &brokerpb.WatchRequest{}), req(2, 0, &brokerpb.AcquireRequest{LeaseId: 1, Spec: &brokerpb.LeaseSpec{Proportion: 0.5}}),
		req(3, 1e6, &brokerpb.ClaimRequest{LeaseId: 1, LimitBytes: 1 << 30}), req(3, 0, &brokerpb.CancelRequest{})))
	f.Add(cat(req(1, 0, &brokerpb.AcquireRequest{LeaseId: 1, Spec: &brokerpb.LeaseSpec{}}), req(2, 0, &brokerpb.ReleaseRequest{LeaseId: 1}),
		req(1, 0, &brokerpb.WatchRequest{}), req(4, 0, &brokerpb.WatchRequest{})))
	f.Add([]byte{0, 0, 0, 3, 0xff, 0xff, 0xff})
	f.Add([]byte{0xff, 0xff, 0xff, 0xff})
	cfg := oneDevice(GiB)
	cfg.ReclaimTimeout = 10 * time.Millisecond
	s, path := startServer(f, cfg)
	f.Fuzz(func(t *testing.T, in []byte) {
		c, err := net.Dial("unix", path)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		closed := make(chan bool, 1)
		go func() { closed <- closedByBroker(c) }()
		if _, err := c.Write(append([]byte(preface), in...)); err != nil && !errors.Is(err, net.ErrClosed) && !isReset(err) {
			t.Fatal(err)
		}
		_ = c.(*net.UnixConn).CloseWrite()
		if !<-closed {
			t.Fatal("the broker kept the connection open for a minute after it closed its end")
		}
		if !waitFor(time.Minute, func() bool { return len(s.Status().Devices[0].Leases) == 0 }) {
			t.Fatalf("leases outlived their connection: %+v", s.Status().Devices[0].Leases)
		}
		if b := s.Broken(); len(b) > 0 {
			t.Fatalf("invariants broken: %q", b)
		}
	})
}

// isReset reports whether err is a write to a connection the broker
// closed first (it refused what it read).
func isReset(err error) bool {
	var oe *net.OpError
	return errors.As(err, &oe) && oe.Op == "write"
}

// brokenConn is a connection whose broker is gone but whose end the
// reader has not seen yet: the preface is written, every later write
// fails as a write to a closed socket does, and a read waits until the
// connection is closed.
type brokenConn struct {
	net.Conn     // nil: only what is overridden is called
	writes   int // the writer's lock serializes writes
	closed   chan struct{}
	once     sync.Once
}

func (c *brokenConn) Write(b []byte) (int, error) {
	if c.writes++; c.writes == 1 {
		return len(b), nil // the preface
	}
	return 0, &net.OpError{Op: "write", Net: "unix", Err: errors.New("write: broken pipe")}
}

func (c *brokenConn) Read([]byte) (int, error) {
	<-c.closed
	return 0, io.EOF
}

func (c *brokenConn) Close() error {
	c.once.Do(func() { close(c.closed) })
	return nil
}

// A call whose request cannot be written (the broker died, and the
// reader has not seen the end yet) fails as a call on a connection that
// ended: ErrUnavailable, which a release takes as the lease ended with
// the connection, not the socket's raw error.
func TestCallOnADeadConnection(t *testing.T) {
	nc := &brokenConn{closed: make(chan struct{})}
	cc := newClientConn(nc, "b.sock", func(*brokerpb.LeaseState) {})
	defer cc.close()
	_, err := cc.call(context.Background(), "release", releaseRequest(&brokerpb.ReleaseRequest{LeaseId: 1}))
	if !errors.Is(err, ErrUnavailable) || !errors.Is(err, errConnEnded) {
		t.Fatalf("call with the write failing: %v; want an error wrapping ErrUnavailable and errConnEnded", err)
	}
	cc.mu.Lock()
	left := len(cc.calls)
	cc.mu.Unlock()
	if left != 0 {
		t.Errorf("%d calls left waiting for a reply on the ended connection", left)
	}
}
