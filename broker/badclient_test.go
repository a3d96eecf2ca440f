package broker

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/vramkit/vram/broker/brokerpb"
)

// rawAPI speaks the protocol directly, as a client of another language,
// or a bad one, would: each call made once, on a connection that has no
// watch unless it opens one, and none of a Client's bookkeeping.
type rawAPI struct{ cc *clientConn }

// rawClient connects a rawAPI to the broker at path until the test ends.
func rawClient(t testing.TB, path string) rawAPI {
	t.Helper()
	r, err := dialRaw(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.cc.close)
	return r
}

func dialRaw(path string) (rawAPI, error) {
	nc, err := net.Dial("unix", path)
	if err != nil {
		return rawAPI{}, err
	}
	return rawAPI{newClientConn(nc, path, func(*brokerpb.LeaseState) {})}, nil
}

func (r rawAPI) Acquire(ctx context.Context, req *brokerpb.AcquireRequest) (*brokerpb.LeaseState, error) {
	return r.cc.lease(ctx, "acquire", acquireRequest(req))
}

func (r rawAPI) Claim(ctx context.Context, req *brokerpb.ClaimRequest) (*brokerpb.LeaseState, error) {
	return r.cc.lease(ctx, "claim", claimRequest(req))
}

func (r rawAPI) Report(ctx context.Context, req *brokerpb.ReportRequest) (*brokerpb.LeaseState, error) {
	return r.cc.lease(ctx, "report", reportRequest(req))
}

func (r rawAPI) Change(ctx context.Context, req *brokerpb.ChangeRequest) (*brokerpb.LeaseState, error) {
	return r.cc.lease(ctx, "change", changeRequest(req))
}

func (r rawAPI) Release(ctx context.Context, req *brokerpb.ReleaseRequest) (*brokerpb.ReleaseReply, error) {
	rep, err := r.cc.call(ctx, "release", releaseRequest(req))
	return rep.GetReleased(), err
}

// Watch opens a watch on the connection and returns its Hello.
func (r rawAPI) Watch(ctx context.Context) (*brokerpb.Hello, error) { return r.cc.openWatch(ctx) }

// Every bad field is refused with an error that names it; nothing
// changes.
func TestRequestValidation(t *testing.T) {
	s, path := startServer(t, oneDevice(GiB))
	api := rawClient(t, path)
	ctx := ctxT(t)
	good, err := api.Acquire(ctx, &brokerpb.AcquireRequest{LeaseId: 1, Spec: &brokerpb.LeaseSpec{Name: "good", Proportion: 0.5}})
	if err != nil {
		t.Fatal(err)
	}
	long := strings.Repeat("x", MaxNameBytes+1)
	for name, tc := range map[string]struct {
		call  func() error
		field string
	}{
		"lease id 0": {func() error {
			_, err := api.Acquire(ctx, &brokerpb.AcquireRequest{Spec: &brokerpb.LeaseSpec{}})
			return err
		}, "lease_id 0"},
		"no spec": {func() error { _, err := api.Acquire(ctx, &brokerpb.AcquireRequest{LeaseId: 2}); return err }, "spec: missing"},
		"device past the broker's": {func() error {
			_, err := api.Acquire(ctx, &brokerpb.AcquireRequest{LeaseId: 2, Spec: &brokerpb.LeaseSpec{Device: 7}})
			return err
		}, "spec.device 7: want the index of one of the broker's devices, 0 ("},
		"name too long": {func() error {
			_, err := api.Acquire(ctx, &brokerpb.AcquireRequest{LeaseId: 2, Spec: &brokerpb.LeaseSpec{Name: long}})
			return err
		}, "spec.name \"xxxx"},
		"name with a control character": {func() error {
			_, err := api.Acquire(ctx, &brokerpb.AcquireRequest{LeaseId: 2, Spec: &brokerpb.LeaseSpec{Name: "a\x1b[2J"}})
			return err
		}, "U+001B is not printable"},
		"NaN proportion": {func() error {
			_, err := api.Acquire(ctx, &brokerpb.AcquireRequest{LeaseId: 2, Spec: &brokerpb.LeaseSpec{Proportion: math.NaN()}})
			return err
		}, "spec.proportion NaN"},
		"proportion over 1": {func() error {
			_, err := api.Acquire(ctx, &brokerpb.AcquireRequest{LeaseId: 2, Spec: &brokerpb.LeaseSpec{Proportion: 1e300}})
			return err
		}, "spec.proportion 1e+300"},
		"huge cap": {func() error {
			_, err := api.Acquire(ctx, &brokerpb.AcquireRequest{LeaseId: 2, Spec: &brokerpb.LeaseSpec{CapBytes: math.MaxUint64}})
			return err
		}, "spec.cap_bytes 18446744073709551615"},
		"held without a rejoin": {func() error {
			_, err := api.Acquire(ctx, &brokerpb.AcquireRequest{LeaseId: 2, Spec: &brokerpb.LeaseSpec{}, HeldBytes: 5})
			return err
		}, "only a rejoin says what it holds"},
		"huge held on a rejoin": {func() error {
			_, err := api.Acquire(ctx, &brokerpb.AcquireRequest{LeaseId: 2, Spec: &brokerpb.LeaseSpec{}, Rejoin: true, HeldBytes: 1 << 62})
			return err
		}, "held_bytes 4611686018427387904"},
		"an id in use": {func() error {
			_, err := api.Acquire(ctx, &brokerpb.AcquireRequest{LeaseId: 1, Spec: &brokerpb.LeaseSpec{}})
			return err
		}, "the id is another lease's"},
		"huge claim": {func() error {
			_, err := api.Claim(ctx, &brokerpb.ClaimRequest{LeaseId: 1, LimitBytes: math.MaxUint64})
			return err
		}, "limit_bytes 18446744073709551615"},
		"huge report": {func() error {
			_, err := api.Report(ctx, &brokerpb.ReportRequest{LeaseId: 1, HeldBytes: 2 * GiB})
			return err
		}, "held_bytes 2147483648"},
		"change to a bad proportion": {func() error {
			_, err := api.Change(ctx, &brokerpb.ChangeRequest{LeaseId: 1, Proportion: -1})
			return err
		}, "proportion -1"},
		"release of no lease": {func() error {
			_, err := api.Release(ctx, &brokerpb.ReleaseRequest{LeaseId: 99})
			return err
		}, "release lease 0000000000000063: no such lease"},
	} {
		t.Run(name, func(t *testing.T) {
			err := tc.call()
			if err == nil || !strings.Contains(err.Error(), tc.field) {
				t.Fatalf("got %v, want an error naming %q", err, tc.field)
			}
			if !is(err, ErrInvalid) && !is(err, ErrNotFound) && !is(err, ErrExists) {
				t.Errorf("%v maps to no sentinel of the broker", err)
			}
		})
	}
	st := s.Status()
	if len(st.Devices[0].Leases) != 1 || st.Devices[0].Leases[0].Limit != good.GetLimitBytes() {
		t.Errorf("refusals changed the table: %+v", st.Devices[0])
	}
}

// Garbage on the socket, a connection that never speaks, one that opens
// too many leases or a second stream, one that never reads its events:
// each is refused or bounded, and the broker goes on serving the others.
func TestBadClientsDoNotStallTheBroker(t *testing.T) {
	cfg := oneDevice(8 * GiB)
	cfg.MaxLeasesPerConn = 4
	cfg.MaxConns = 8
	s, path := startServer(t, cfg)
	// Garbage, and silence.
	for _, garbage := range [][]byte{[]byte("GET / HTTP/1.1\r\n\r\n"), make([]byte, 64<<10), nil} {
		c, err := net.Dial("unix", path)
		if err != nil {
			t.Fatal(err)
		}
		if garbage != nil {
			_, _ = c.Write(garbage)
		}
		defer c.Close()
	}
	// Too many leases on one connection.
	c := dial(t, path)
	for range 4 {
		acquire(t, c, LeaseOptions{Proportion: 0.01})
	}
	if _, err := c.Acquire(ctxT(t), LeaseOptions{Proportion: 0.01}); !is(err, ErrLimit) {
		t.Errorf("a fifth lease on one connection: %v, want ErrLimit", err)
	}
	// A second watch on a connection.
	api := rawClient(t, path)
	if _, err := api.Watch(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	if _, err := api.Watch(ctxT(t)); !is(err, ErrLimit) {
		t.Errorf("a second watch: %v, want ErrLimit", err)
	}
	// A stream never read while its lease changes thousands of times (it
	// may borrow: it watches); the broker sends each lease's latest state
	// once, so nothing piles up, and others are served meanwhile.
	if _, err := api.Acquire(ctxT(t), &brokerpb.AcquireRequest{LeaseId: 42, Spec: &brokerpb.LeaseSpec{Name: "deaf", Proportion: 0.5}}); err != nil {
		t.Fatal(err)
	}
	for i := range 3000 {
		if _, err := api.Report(ctxT(t), &brokerpb.ReportRequest{LeaseId: 42, HeldBytes: uint64(i)}); err != nil {
			t.Fatal(err)
		}
	}
	other := dial(t, path)
	start := time.Now()
	l := acquire(t, other, LeaseOptions{Name: "other", Proportion: 0.1})
	if err := l.Release(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	t.Logf("served another client in %v beside the bad ones", time.Since(start))
	s.mu.Lock()
	dirty := 0
	for _, sess := range s.sessions {
		dirty = max(dirty, len(sess.dirty))
	}
	s.mu.Unlock()
	if dirty > cfg.MaxLeasesPerConn {
		t.Errorf("a session has %d states queued, more than its leases", dirty)
	}
}

// Connections past MaxConns are closed on accept; those within are served.
func TestConnectionLimit(t *testing.T) {
	cfg := oneDevice(GiB)
	cfg.MaxConns = 2
	_, path := startServer(t, cfg)
	dial(t, path)
	dial(t, path)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if c, err := Dial(ctx, path, WithLogger(quiet)); err == nil {
		_ = c.Close()
		t.Error("a third connection was served past MaxConns of 2")
	}
}

// A rejoin of a lease that is still in the table (its old connection has
// not closed yet) replaces it: the lease is counted once.
func TestRejoinIsCountedOnce(t *testing.T) {
	s, path := startServer(t, oneDevice(8*GiB))
	old, api := rawClient(t, path), rawClient(t, path)
	ctx := ctxT(t)
	sp := &brokerpb.LeaseSpec{Name: "twice", Proportion: 0.5}
	first, err := old.Acquire(ctx, &brokerpb.AcquireRequest{LeaseId: 7, Spec: sp})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := api.Acquire(ctx, &brokerpb.AcquireRequest{LeaseId: 7, Spec: sp, Rejoin: true, HeldBytes: GiB, LimitBytes: 4 * GiB, Token: first.GetToken(), RejoinBroker: s.id}); err != nil {
		t.Fatal(err)
	}
	d := s.Status().Devices[0]
	if len(d.Leases) != 1 || d.Guaranteed != 4*GiB || d.Leases[0].Held != GiB {
		t.Fatalf("after the rejoin: %+v", d)
	}
	// And its manual share once: another half still fits.
	if _, err := api.Acquire(ctx, &brokerpb.AcquireRequest{LeaseId: 8, Spec: &brokerpb.LeaseSpec{Proportion: 0.5}}); err != nil {
		t.Fatalf("the other half: %v", err)
	}
}

// Every error crosses the socket as its reason and message and comes back
// matching its sentinel: the broker's own, and the ends of the caller's
// context (the broker saw the caller's deadline pass a moment before the
// caller's own clock did); an error of no known reason keeps its message
// and matches no sentinel.
func TestWireErrors(t *testing.T) {
	tests := map[string]struct {
		err  error
		want error
	}{
		"deadline": {err: fmt.Errorf("claim of 4 GiB: %w", context.DeadlineExceeded), want: context.DeadlineExceeded},
		"canceled": {err: fmt.Errorf("claim: %w", context.Canceled), want: context.Canceled},
		"reclaim":  {err: fmt.Errorf("claim: %w", ErrReclaimTimeout), want: ErrReclaimTimeout},
		"internal": {err: errors.New("the broker's own trouble")},
	}
	for _, r := range reasons {
		tests[r.reason] = struct{ err, want error }{err: fmt.Errorf("an op: %w", r.err), want: r.err}
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			e := fromWire(toWire(tc.err))
			if e.Error() != tc.err.Error() {
				t.Errorf("the message %q came back as %q", tc.err, e)
			}
			if tc.want == nil {
				if u := errors.Unwrap(e); u != nil {
					t.Errorf("%v matches %v", e, u)
				}
				return
			}
			if !is(e, tc.want) {
				t.Errorf("fromWire(toWire(%v)) = %v; want it to wrap %v", tc.err, e, tc.want)
			}
		})
	}
}
