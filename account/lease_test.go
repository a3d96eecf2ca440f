//go:build linux

package account_test

// An account's lease from the node broker, through its manager, in one
// process: managers on simulated devices that share one memory
// (sim:shared), each with a lease from a broker served in the test. The tests with real processes (a
// race, kill -9, a batch shrunk by another's claim) are cmd/vram's
// (leaseproc_test.go).

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vramkit/vram"
	"github.com/vramkit/vram/batch"
	"github.com/vramkit/vram/broker"
	"github.com/vramkit/vram/device/sim"
)

const leaseMiB = 1 << 20

var leaseSeq atomic.Int64

var quietLog = slog.New(slog.NewTextHandler(io.Discard, nil))

// leaseWorld is a broker of one shared simulated device and the
// managers leasing from it.
type leaseWorld struct {
	socket, dir, name string
	total             uint64
	srv               *broker.Server
}

// newLeaseWorld serves a broker of a shared device of total bytes (no
// context: the managers of one process would pay one, their devices one
// each) until the test ends.
func newLeaseWorld(t *testing.T, total uint64, reclaim time.Duration) *leaseWorld {
	t.Helper()
	dir, err := os.MkdirTemp("", "vl")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	w := &leaseWorld{socket: filepath.Join(dir, "b.sock"), dir: dir, name: fmt.Sprintf("lease%d", leaseSeq.Add(1)), total: total}
	probe := w.device(t)
	w.srv, err = broker.NewServer(broker.Config{Devices: []broker.Device{{Name: "shared", ID: probe.Info().ID, Total: total}},
		ReclaimTimeout: reclaim, Logger: quietLog})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := broker.Listen(w.socket, 0o600, -1)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- w.srv.Serve(ln) }()
	t.Cleanup(func() {
		w.srv.Stop()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return w
}

// device opens the shared device, closed when the test ends.
func (w *leaseWorld) device(t *testing.T) *sim.Device {
	t.Helper()
	d, err := sim.New(sim.Config{TotalBytes: w.total, NoContext: true, AddressOnly: true, Shared: w.name, SharedDir: w.dir})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Close() })
	return d
}

// manager is a manager of a new Device of the shared device with a lease
// named name, closed when the test ends.
func (w *leaseWorld) manager(t *testing.T, name string) *vram.Manager {
	t.Helper()
	m, err := vram.New(w.device(t), vram.WithBroker(w.socket), vram.WithLease(vram.LeaseOptions{Name: name}), vram.WithLogger(quietLog))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := m.Close(); err != nil {
			t.Errorf("close %s: %v", name, err)
		}
	})
	return m
}

// holdArray allocates an unchunkable device array of bytes for a new
// client of m.
func holdArray(ctx context.Context, m *vram.Manager, name string, bytes int) (*vram.Client, error) {
	c, err := m.Register(vram.ClientOptions{Name: name, Group: name})
	if err != nil {
		return nil, err
	}
	if err := c.Queue(map[string]vram.ArrayRequest{"a": {Shape: []int{bytes}, DType: vram.Uint8, Unchunkable: true}}); err != nil {
		return nil, errors.Join(err, c.Close())
	}
	if _, err := c.Allocate(ctx); err != nil {
		return nil, errors.Join(err, c.Close())
	}
	return c, nil
}

// leaseOf is m's lease in the broker's status.
func (w *leaseWorld) leaseOf(t *testing.T, m *vram.Manager) broker.LeaseStatus {
	t.Helper()
	ls, ok := m.Account().Lease()
	if !ok {
		t.Fatal("the manager has no lease")
	}
	for _, l := range w.srv.Status().Devices[0].Leases {
		if strings.Contains(ls.ID, l.ID) {
			return l
		}
	}
	t.Fatalf("lease %s is not in the broker's status", ls.ID)
	return broker.LeaseStatus{}
}

// waitFor polls cond until it holds. It keeps no clock of its own (a
// loaded machine only makes it wait longer): a cond that never holds runs
// into the test binary's -timeout, and says what it waited for when that
// is near.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline, bounded := t.Deadline()
	for !cond() {
		if bounded && time.Until(deadline) < 5*time.Second {
			t.Fatalf("the test binary's deadline is near, still waiting: %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestLeaseClaimsAndGivesBack: a manager's Allocate claims what its
// arrays take, its held bytes reach the broker, and what it frees goes
// back to the broker; a second manager's claim past what is left fails
// with the broker's error naming the holder, and no allocation reaches
// the device past the lease (no allocator ever runs out of memory).
func TestLeaseClaimsAndGivesBack(t *testing.T) {
	w := newLeaseWorld(t, 1<<30, 300*time.Millisecond)
	a, b := w.manager(t, "a"), w.manager(t, "b")
	ctx := context.Background()
	ca, err := holdArray(ctx, a, "a", 600*leaseMiB)
	if err != nil {
		t.Fatalf("a's 600 MiB: %v", err)
	}
	waitFor(t, "a's 600 MiB reported to the broker", func() bool { return w.leaseOf(t, a).Held == 600*leaseMiB })
	if _, err := holdArray(ctx, b, "b", 600*leaseMiB); err == nil || !strings.Contains(err.Error(), `"a"`) {
		t.Fatalf("b's 600 MiB beside a's: %v; want the broker's refusal naming a", err)
	} else {
		t.Logf("b: %v", err)
	}
	if err := ca.Close(); err != nil {
		t.Fatal(err)
	}
	// a trims its cache (it was asked to shrink) and gives its lease back.
	waitFor(t, "a's lease given back", func() bool { l := w.leaseOf(t, a); return l.Held == 0 && l.Limit == 0 })
	cb, err := holdArray(ctx, b, "b", 600*leaseMiB)
	if err != nil {
		t.Fatalf("b's 600 MiB once a freed its own: %v", err)
	}
	defer cb.Close()
	for name, m := range map[string]*vram.Manager{"a": a, "b": b} {
		if st := m.Account().Allocator().Stats(); st.OOMs != 0 {
			t.Errorf("%s's allocator ran out of memory %d times; want every refusal the broker's, before the device", name, st.OOMs)
		}
		ls, _ := m.Account().Lease()
		t.Logf("%s: %+v", name, ls)
	}
}

// TestLeaseNeedsItsDevice: a manager of a device the broker does not
// serve (a private simulator has no ID) is refused, with the broker's
// devices listed; naming one of them is enough.
func TestLeaseNeedsItsDevice(t *testing.T) {
	w := newLeaseWorld(t, 1<<30, time.Second)
	dev, err := sim.New(sim.Config{TotalBytes: 1 << 30, NoContext: true, AddressOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Close()
	if _, err := vram.New(dev, vram.WithBroker(w.socket), vram.WithLogger(quietLog)); err == nil || !strings.Contains(err.Error(), "name one of the broker's devices, 0 or shared") {
		t.Fatalf("New on a private device: %v; want an error listing the broker's devices", err)
	}
	m, err := vram.New(dev, vram.WithBroker(w.socket), vram.WithLease(vram.LeaseOptions{Device: "0"}), vram.WithLogger(quietLog))
	if err != nil {
		t.Fatalf("New naming device 0: %v", err)
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	if n := len(w.srv.Status().Devices[0].Leases); n != 0 {
		t.Errorf("%d leases after Close, want 0", n)
	}
}

// TestLeaseGivenBackAfterFree: memory freed and trimmed with no request
// to shrink reaches the broker as held and given back: neither what the
// broker counts held nor the limit stays at the freed bytes, so another
// lease may borrow them.
func TestLeaseGivenBackAfterFree(t *testing.T) {
	w := newLeaseWorld(t, 1<<30, 300*time.Millisecond)
	a := w.manager(t, "a")
	c, err := holdArray(context.Background(), a, "a", 600*leaseMiB)
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "a's 600 MiB reported to the broker", func() bool { return w.leaseOf(t, a).Held == 600*leaseMiB })
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if err := a.Account().Allocator().Trim(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "a's freed memory reported and given back", func() bool { l := w.leaseOf(t, a); return l.Held == 0 && l.Limit == 0 })
}

// TestLeasePlanNowCountsTheCache: right after a batch's arrays are freed
// (a re-cut frees the old before it allocates the new) they are in the
// allocator's cache, which the lease counts as held. PlanNow plans as the
// Allocate it is for will, which gives the cache back when that makes a
// longer chunk: the plan is the one the arrays had, not one squeezed
// into what the lease has beyond the cache.
func TestLeasePlanNowCountsTheCache(t *testing.T) {
	w := newLeaseWorld(t, 1<<30, 300*time.Millisecond)
	a := w.manager(t, "a")
	c, err := a.Register(vram.ClientOptions{Name: "batch", Group: "batch"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// 4 GiB of runs on a 1 GiB device: chunked, most of the device a chunk.
	reqs := map[string]vram.ArrayRequest{"x": {Shape: []int{1 << 20, 1024}, DType: vram.Float32, ChunkAxis: 0}}
	if err := c.Queue(reqs); err != nil {
		t.Fatal(err)
	}
	resp, err := c.Allocate(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if resp.Plan.Chunks < 2 {
		t.Fatalf("plan %+v: want the batch chunked", resp.Plan)
	}
	c.Free("x")
	if st := a.Account().Allocator().Stats(); st.Cached() < st.Reserved/2 {
		t.Fatalf("allocator %+v: want the freed arrays in its cache", st)
	}
	p, err := c.PlanNow(context.Background(), map[*vram.Client]map[string]vram.ArrayRequest{c: reqs})
	if err != nil {
		t.Fatalf("PlanNow with the freed arrays cached: %v", err)
	}
	if p.ChunkLength < resp.Plan.ChunkLength {
		t.Errorf("PlanNow: chunks of %d runs; the arrays had %d, whose memory is in the cache", p.ChunkLength, resp.Plan.ChunkLength)
	}
}

// TestLeaseShrinkIsABudgetChange: a manager asked to shrink trims its
// cache, and says so as a budget change: a batch that planned while the
// allocator still held that memory (and found too little under the
// lowered lease) plans again at its next chunk.
func TestLeaseShrinkIsABudgetChange(t *testing.T) {
	w := newLeaseWorld(t, 1<<30, 2*time.Second)
	a, b := w.manager(t, "a"), w.manager(t, "b")
	ctx := context.Background()
	ca, err := holdArray(ctx, a, "a", 900*leaseMiB)
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "a's 900 MiB reported to the broker", func() bool { return w.leaseOf(t, a).Held == 900*leaseMiB })
	ca.Free("a")
	defer ca.Close()
	cb, err := holdArray(ctx, b, "b", 400*leaseMiB) // within b's guaranteed half: a is asked to shrink
	if err != nil {
		t.Fatalf("b's 400 MiB: %v", err)
	}
	defer cb.Close()
	waitFor(t, "a's trim for the broker noted as a budget change", func() bool {
		return strings.Contains(a.Account().LastChange().Why, "shrunk for the broker's lease")
	})
	t.Logf("a's last budget change: %+v", a.Account().LastChange())
}

// restartForgetting stops w's broker and serves a new one at its socket
// whose key is new: it takes no lease back.
func (w *leaseWorld) restartForgetting(t *testing.T) {
	t.Helper()
	w.srv.Stop()
	probe := w.device(t)
	srv, err := broker.NewServer(broker.Config{Devices: []broker.Device{{Name: "shared", ID: probe.Info().ID, Total: w.total}},
		Logger: quietLog})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := broker.Listen(w.socket, 0o600, -1)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	t.Cleanup(func() {
		srv.Stop()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	w.srv = srv
}

// A lease the broker does not take back after a restart ends the
// manager's budget: the account's Change.Ended wraps ErrLease, a running batch
// stops at its next chunk boundary with it, and an Allocate fails. (A
// vram run whose lease was not taken back once kept its arrays and
// finished, while the broker granted that memory to another job.)
func TestLeaseEndedStopsTheBatch(t *testing.T) {
	w := newLeaseWorld(t, 64*leaseMiB, time.Second)
	m := w.manager(t, "job")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := m.Register(vram.ClientOptions{Name: "job", Group: "job"})
	if err != nil {
		t.Fatal(err)
	}
	b := batch.New()
	defer b.Close()
	// 512 MiB of runs on 64 MiB (scratch: the device holds no bytes).
	b.Scratch(c, "x", vram.ArrayRequest{Shape: []int{128 << 20}, DType: vram.Float32})
	if err := b.Allocate(ctx, vram.WithBuffers(1)); err != nil {
		t.Fatal(err)
	}
	var ended error
	rep, err := b.Run(ctx, batch.Options{Buffers: 1}, func(_ context.Context, ch *batch.Chunk) error {
		if ch.Index != 1 {
			return nil
		}
		w.restartForgetting(t)
		for seq := uint64(0); ended == nil; {
			bc, err := m.Account().WaitChange(ctx, seq)
			if err != nil {
				return err
			}
			seq, ended = bc.Seq, bc.Ended
		}
		return nil
	})
	if !errors.Is(ended, vram.ErrLease) {
		t.Fatalf("Change.Ended = %v, want ErrLease (the batch: %+v, %v)", ended, rep, err)
	}
	if !errors.Is(err, vram.ErrLease) || rep.RunsLeft == 0 {
		t.Fatalf("the batch: %d runs left, %v; want it stopped with ErrLease", rep.RunsLeft, err)
	}
	t.Logf("the batch: %v", err)
	if _, err := holdArray(ctx, m, "after", leaseMiB); !errors.Is(err, vram.ErrLease) {
		t.Errorf("an Allocate after the lease ended: %v, want ErrLease", err)
	}
}
