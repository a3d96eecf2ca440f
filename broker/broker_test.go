package broker

import (
	"context"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/expfmt"

	"github.com/vramkit/vram/broker/brokerpb"
	"github.com/vramkit/vram/internal/share"
)

func TestAcquireStatusRelease(t *testing.T) {
	s, path := startServer(t, Config{Devices: []Device{{Name: "sim:vram=8GiB", Total: 8 * GiB, Context: 256 * MiB}}})
	c := dial(t, path)
	a := acquire(t, c, LeaseOptions{Name: "a", Proportion: 0.25})
	b := acquire(t, c, LeaseOptions{Name: "b"}) // auto: the 75% left
	// One process: its context is charged once, to the first lease.
	if got := a.Budget(); got.Guaranteed != 2*GiB || got.Limit != 2*GiB || got.Context != 256*MiB || got.Bytes() != 2*GiB-256*MiB {
		t.Errorf("a's budget %+v", got)
	}
	if got := b.Budget(); got.Guaranteed != 6*GiB || got.Limit != 6*GiB || got.Context != 0 {
		t.Errorf("b's budget %+v", got)
	}
	st := s.Status()
	d := st.Devices[0]
	if d.Guaranteed != 8*GiB || d.Granted != 8*GiB || d.Held != 256*MiB || len(d.Leases) != 2 {
		t.Errorf("device status %+v", d)
	}
	ls, ok := leaseOf(st, a.ID())
	if !ok || ls.PID == 0 || ls.Name != "a" || ls.Proportion != 0.25 || ls.Share != 0.25 || ls.Holds() != 256*MiB {
		t.Errorf("a's status %+v (found %v)", ls, ok)
	}
	// The context moves to b when a goes.
	if err := a.Release(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	if !waitFor(5*time.Second, func() bool { return b.Budget().Context == 256*MiB && b.Budget().Guaranteed == 8*GiB }) {
		t.Errorf("after a's release, b's budget %+v", b.Budget())
	}
	if err := a.Release(ctxT(t)); err != nil {
		t.Errorf("a second release: %v", err)
	}
	if err := b.Report(ctxT(t), 1); !is(err, nil) {
		t.Errorf("report: %v", err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if !waitFor(5*time.Second, func() bool { return len(s.Status().Devices[0].Leases) == 0 }) {
		t.Errorf("leases left after the client closed: %+v", s.Status().Devices[0].Leases)
	}
	if !is(b.Err(), ErrReleased) {
		t.Errorf("b.Err() = %v after Close", b.Err())
	}
}

// The broker refuses what the manager refuses, with the same words.
func TestShareRules(t *testing.T) {
	for name, tc := range map[string]struct {
		have []float64 // leases first (0: auto)
		ask  float64
		want string // "" accepted; else in the error
	}{
		"manual leaving 5% beside an auto":   {have: []float64{0}, ask: 0.95},
		"manual leaving under 5%":            {have: []float64{0}, ask: 0.96, want: "under the minimum 5%"},
		"over 100%":                          {have: []float64{0.7}, ask: 0.31, want: "over 100%; ask for a proportion of at most 0.3 (30%)"},
		"auto when under 5% is left":         {have: []float64{0.96}, ask: 0, want: "an auto lease needs at least 5%"},
		"auto pool's leases named as leases": {have: []float64{0, 0.5}, ask: 0.5, want: "the auto pool's 1 lease(s)"},
	} {
		t.Run(name, func(t *testing.T) {
			s, path := startServer(t, oneDevice(GiB))
			c := dial(t, path)
			for _, p := range tc.have {
				acquire(t, c, LeaseOptions{Proportion: p})
			}
			before := s.Status().Devices[0]
			_, err := c.Acquire(ctxT(t), LeaseOptions{Name: "new", Proportion: tc.ask})
			if tc.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if !is(err, ErrProportion) || !is(err, share.ErrProportion) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want ErrProportion saying %q", err, tc.want)
			}
			if after := s.Status().Devices[0]; after.Guaranteed != before.Guaranteed || len(after.Leases) != len(before.Leases) {
				t.Errorf("a refusal changed the table: %+v, was %+v", after, before)
			}
		})
	}
}

// A borrower asked to shrink that acknowledges lets the claim through.
func TestReclaim(t *testing.T) {
	s, path := startServer(t, oneDevice(8*GiB))
	a, b, _, _ := lent(t, path, "borrower", 7*GiB) // a borrows most of b's half
	if l, _ := leaseOf(s.Status(), a.ID()); l.Borrowed != 3*GiB {
		t.Errorf("a borrows %d, want 3 GiB", l.Borrowed)
	}
	// a shrinks when asked, as a batch would at its next chunk.
	acked := make(chan Shrink, 1)
	go func() {
		for {
			ch := a.Changed()
			if sh := a.Budget().Shrink; sh != nil {
				_ = a.Report(context.Background(), sh.Bytes)
				acked <- *sh
				return
			}
			select {
			case <-ch:
			case <-time.After(30 * time.Second):
				return
			}
		}
	}()
	got, err := b.Claim(ctxT(t), 4*GiB)
	if err != nil || got.Limit != 4*GiB {
		t.Fatalf("b's claim: %+v, %v", got, err)
	}
	sh := <-acked
	if sh.Bytes != 4*GiB || sh.Overdue {
		t.Errorf("a was asked to shrink to %+v, want 4 GiB", sh)
	}
	if ab := a.Budget(); ab.Limit != 4*GiB || ab.Shrink != nil {
		t.Errorf("a's budget after the reclaim %+v", ab)
	}
	if d := s.Status().Devices[0]; d.Free != 0 || d.Granted != 8*GiB {
		t.Errorf("device after the reclaim %+v", d)
	}
}

// A borrower that never shrinks is named: in the claim's error, the status
// and the counters; the broker keeps serving and nothing is killed.
func TestReclaimDeadlineMissed(t *testing.T) {
	cfg := oneDevice(8 * GiB)
	cfg.ReclaimTimeout = 200 * time.Millisecond
	s, path := startServer(t, cfg)
	a, b, _, cb := lent(t, path, "stubborn", 8*GiB)
	_, err := b.Claim(ctxT(t), 4*GiB)
	if !is(err, ErrReclaimTimeout) || !strings.Contains(err.Error(), `"stubborn"`) || !strings.Contains(err.Error(), "holds 8 GiB") {
		t.Fatalf("claim: %v, want ErrReclaimTimeout naming the stubborn borrower and what it holds", err)
	}
	l, _ := leaseOf(s.Status(), a.ID())
	if l.Reclaim == nil || !l.Reclaim.Overdue || l.MissedDeadlines != 1 || l.Reclaim.Target != 4*GiB {
		t.Errorf("the borrower's status %+v (reclaim %+v)", l, l.Reclaim)
	}
	if cs := s.counters(0); cs.missed != 1 || cs.timedOut != 1 {
		t.Errorf("counters %+v", cs)
	}
	metrics := gather(t, s)
	for _, want := range []string{
		`vram_broker_lease_overdue{device="0",lease="` + a.ID() + `",name="stubborn",pid="` + strconv.Itoa(os.Getpid()) + `"} 1`,
		`vram_broker_reclaim_deadlines_missed_total{device="0",name="sim"} 1`,
		`vram_broker_claims_total{device="0",name="sim",result="timeout"} 1`,
	} {
		if !strings.Contains(metrics, want) {
			t.Errorf("metrics lack %s:\n%s", want, metrics)
		}
	}
	// Late is better than never: the memory comes back when it shrinks.
	if err := a.Report(ctxT(t), 3*GiB); err != nil {
		t.Fatal(err)
	}
	if got, err := b.Claim(ctxT(t), 4*GiB); err != nil || got.Limit != 4*GiB {
		t.Fatalf("claim after the late shrink: %+v, %v", got, err)
	}
	if _, err := cb.Acquire(ctxT(t), LeaseOptions{Name: "still serving"}); !is(err, ErrProportion) {
		t.Errorf("acquire beside two halves: %v, want ErrProportion", err)
	}
}

// A claim abandoned by its caller ends; a lease released while its claim
// waits fails the claim with ErrReleased.
func TestClaimCancelledAndReleased(t *testing.T) {
	s, path := startServer(t, oneDevice(8*GiB))
	_, b, _, cb := lent(t, path, "a", 8*GiB)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if _, err := b.Claim(ctx, 4*GiB); !is(err, context.DeadlineExceeded) {
		t.Errorf("cancelled claim: %v", err)
	}
	if !waitFor(5*time.Second, func() bool { return len(s.Status().Devices[0].Claims) == 0 }) {
		t.Errorf("claims left: %+v", s.Status().Devices[0].Claims)
	}
	errc := make(chan error, 1)
	go func() { _, err := b.Claim(context.Background(), 4*GiB); errc <- err }()
	if !waitFor(5*time.Second, func() bool { return len(s.Status().Devices[0].Claims) == 1 }) {
		t.Fatal("the claim does not wait")
	}
	if err := cb.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-errc; err == nil {
		t.Error("a claim of a closed client succeeded")
	}
	if !waitFor(5*time.Second, func() bool { return len(s.Status().Devices[0].Leases) == 1 }) {
		t.Errorf("leases: %+v", s.Status().Devices[0].Leases)
	}
}

// gather is s's metrics in the text format.
func gather(t *testing.T, s *Server) string {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(NewCollector(s))
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, mf := range mfs {
		if _, err := expfmt.MetricFamilyToText(&b, mf); err != nil {
			t.Fatal(err)
		}
	}
	return b.String()
}

// lent sets up a borrower and a claimant, each of a manual half of the
// device, on connections of their own: the claimant has given its half
// back for now, and the borrower holds borrow bytes of the device.
func lent(t *testing.T, path, borrower string, borrow uint64) (a, b *Lease, ca, cb *Client) {
	t.Helper()
	ca, cb = dial(t, path), dial(t, path)
	a = acquire(t, ca, LeaseOptions{Name: borrower, Proportion: 0.5})
	b = acquire(t, cb, LeaseOptions{Name: "claimant", Proportion: 0.5})
	if _, err := b.Claim(ctxT(t), 0); err != nil {
		t.Fatal(err)
	}
	if got, err := a.Claim(ctxT(t), borrow); err != nil || got.Limit != borrow {
		t.Fatalf("the borrower's claim: %+v, %v", got, err)
	}
	if err := a.Report(ctxT(t), borrow); err != nil {
		t.Fatal(err)
	}
	return a, b, ca, cb
}

// A call's reply tells its holder the lease's state: the Watch stream
// does not send it again (a message less a call), nor is it woken for it
// (a wake-up less a call); a change the holder did not make (another's
// share shrinking, its auto share growing) is sent.
func TestReplyIsNotSentAgain(t *testing.T) {
	s, err := NewServer(Config{Devices: []Device{{Name: "a", Total: 8 * GiB}}, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Stop()
	a, b := s.openSession(peerCred{pid: 10, uid: 1000}), s.openSession(peerCred{pid: 11, uid: 1000})
	if _, err := s.acquire(a, &brokerpb.AcquireRequest{LeaseId: 1, Spec: &brokerpb.LeaseSpec{}}); err != nil { // the auto pool
		t.Fatal(err)
	}
	if _, err := s.report(a, &brokerpb.ReportRequest{LeaseId: 1, HeldBytes: GiB}); err != nil {
		t.Fatal(err)
	}
	if len(a.dirty) != 0 || len(a.wake) != 0 {
		t.Errorf("%d states queued for the holder's stream, and %d wake-ups, after replies that told it", len(a.dirty), len(a.wake))
	}
	if _, err := s.acquire(b, &brokerpb.AcquireRequest{LeaseId: 2, Spec: &brokerpb.LeaseSpec{Proportion: 0.5}}); err != nil {
		t.Fatal(err)
	}
	s.drain(a) // its stream sends what b's lease did to its share
	if _, err := s.change(b, &brokerpb.ChangeRequest{LeaseId: 2, Proportion: 0.25}); err != nil {
		t.Fatal(err)
	}
	if _, ok := a.dirty[1]; !ok || len(a.wake) != 1 {
		t.Errorf("a change of another's share that changed this lease's is not queued for its stream (queued: %v), or the stream not woken (%d)", ok, len(a.wake))
	}
}
