package vram

// Cancellation of the calls that take a context: a cancelled call
// returns an error wrapping ctx.Err() and leaves the queue, the arrays
// and the pools as they were.

import (
	"context"
	"errors"
	"maps"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vramkit/vram/account"
	"github.com/vramkit/vram/alloc"
	"github.com/vramkit/vram/device"
)

// cancelOnStats cancels a context from the allocator's Stats, which
// Allocate reads once it has planned (to see what the allocator caches):
// a cancellation in the middle of the plan.
type cancelOnStats struct {
	alloc.Allocator
	cancel atomic.Pointer[context.CancelFunc]
}

func (a *cancelOnStats) Stats() alloc.Stats {
	if f := a.cancel.Swap(nil); f != nil {
		(*f)()
	}
	return a.Allocator.Stats()
}

func TestAllocateCancelled(t *testing.T) {
	tests := map[string]struct {
		// wait is where the cancelled call waits: "" for nowhere (ctx is
		// done before the call), "group" for another allocation of its
		// group, "plan" for another group's, "stats" for the plan itself.
		wait string
	}{
		"before the call":              {""},
		"waiting for its group's lock": {"group"},
		"waiting for another group":    {"plan"},
		"during the plan":              {"stats"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			var wrap *cancelOnStats
			m, _, _ := newManager(t, 64*MiB, WithWrap(func(a alloc.Allocator) alloc.Allocator {
				wrap = &cancelOnStats{Allocator: a}
				return wrap
			}))
			var hooks atomic.Int32
			c := register(t, m, ClientOptions{Name: "c", Group: "g",
				OnAllocated: func(*ArrayResponse) { hooks.Add(1) }, OnInvalidate: func(error) { hooks.Add(1) }})
			must(t, c.Queue(map[string]ArrayRequest{"x": req(Float32, 0, 1000)}))
			if _, err := c.Allocate(context.Background()); err != nil {
				t.Fatal(err)
			}
			hooks.Store(0)
			queued := map[string]ArrayRequest{"x": req(Float32, 0, 4000), "y": req(Int32, 0, 4000)}
			must(t, c.Queue(queued))
			x, held, freeBefore := c.Arrays()["x"], c.Held(), free(t, m)

			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			switch tc.wait {
			case "":
				cancel()
			case "group":
				_, l, _ := m.groupLock(c)
				l <- struct{}{}
				defer func() { <-l }()
				time.AfterFunc(10*time.Millisecond, cancel)
			case "plan":
				m.planMu <- struct{}{}
				defer func() { <-m.planMu }()
				time.AfterFunc(10*time.Millisecond, cancel)
			case "stats":
				wrap.cancel.Store(&cancel)
			}
			resp, err := c.Allocate(ctx)
			if !errors.Is(err, context.Canceled) || resp != nil {
				t.Fatalf("Allocate = %v, %v; want an error wrapping context.Canceled", resp, err)
			}
			if got := c.Queued(); !maps.EqualFunc(got, queued, func(a, b ArrayRequest) bool { return a.Bytes() == b.Bytes() }) {
				t.Errorf("queue after the cancelled Allocate: %v; want %v", got, queued)
			}
			if now := c.Arrays()["x"]; now != x || x.Freed() || c.Held() != held || len(c.Arrays()) != 1 {
				t.Errorf("arrays after the cancelled Allocate: x %v (was %v, freed %v), held %d (was %d)", now, x, x.Freed(), c.Held(), held)
			}
			if f := free(t, m); f != freeBefore {
				t.Errorf("device free memory %d after, %d before", f, freeBefore)
			}
			if n := hooks.Load(); n != 0 {
				t.Errorf("%d hook calls after a cancelled Allocate, want none", n)
			}
			if tc.wait == "group" || tc.wait == "plan" {
				return // the locks are held until the test ends
			}
			// Nothing is left locked: the next Allocate goes through.
			if resp, err := c.Allocate(context.Background()); err != nil || resp.Arrays()["y"] == nil {
				t.Errorf("Allocate after the cancelled one = %v, %v", resp, err)
			}
		})
	}
}

// TestAllocateCancelledWaitReleases checks that an Allocate that gave up
// waiting for a lock leaves it to the next caller.
func TestAllocateCancelledWaitReleases(t *testing.T) {
	m, _, _ := newManager(t, 64*MiB)
	c := register(t, m, ClientOptions{Group: "g"})
	must(t, c.Queue(map[string]ArrayRequest{"x": req(Float32, 0, 100)}))
	m.planMu <- struct{}{}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if _, err := c.Allocate(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Allocate behind a held lock with a deadline: %v; want DeadlineExceeded", err)
	}
	<-m.planMu
	if _, err := c.Allocate(context.Background()); err != nil {
		t.Fatalf("Allocate once the lock is free: %v", err)
	}
}

// blockStream enqueues on c's stream a kernel that waits until the
// returned function is called.
func blockStream(t *testing.T, m *Manager, c *Client) (release func()) {
	t.Helper()
	s, err := c.Stream()
	if err != nil {
		t.Fatal(err)
	}
	l, ok := m.Device().(device.FuncLauncher)
	if !ok {
		t.Skip("the device runs no Go kernels")
	}
	gate := make(chan struct{})
	if err := l.LaunchFunc(s, 1, func(device.View, int, int) error { <-gate; return nil }); err != nil {
		t.Fatal(err)
	}
	var once atomic.Bool
	release = func() {
		if once.CompareAndSwap(false, true) {
			close(gate)
		}
	}
	t.Cleanup(release)
	return release
}

func TestSyncCancelled(t *testing.T) {
	tests := map[string]struct {
		ctx  func() (context.Context, context.CancelFunc)
		want error
	}{
		"cancelled": {func() (context.Context, context.CancelFunc) {
			ctx, cancel := context.WithCancel(context.Background())
			time.AfterFunc(10*time.Millisecond, cancel)
			return ctx, cancel
		}, context.Canceled},
		"deadline": {func() (context.Context, context.CancelFunc) {
			return context.WithTimeout(context.Background(), 10*time.Millisecond)
		}, context.DeadlineExceeded},
		"done before the call": {func() (context.Context, context.CancelFunc) {
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			return ctx, cancel
		}, context.Canceled},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			m, _, _ := newManager(t, 64*MiB)
			c := register(t, m, ClientOptions{})
			release := blockStream(t, m, c)
			ctx, cancel := tc.ctx()
			defer cancel()
			done := make(chan error, 1)
			go func() { done <- c.Sync(ctx) }()
			select {
			case err := <-done:
				if !errors.Is(err, tc.want) {
					t.Errorf("Sync = %v; want an error wrapping %v", err, tc.want)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("Sync waited for a stream that never finishes despite its context")
			}
			release()
			if err := c.Sync(context.Background()); err != nil {
				t.Errorf("Sync once the stream is free: %v", err)
			}
		})
	}
}

func TestCopyCancelled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	m, _, _ := newManager(t, 64*MiB)
	c := register(t, m, ClientOptions{})
	must(t, c.Queue(map[string]ArrayRequest{"x": req(Float32, 0, 8)}))
	resp, err := c.Allocate(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	d := resp.Arrays()["x"]
	h, err := m.NewHostArray([]int{8}, Float32, Pinned, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Free()
	sp := Span{Axis: 0, Start: 0, Len: 8}
	for name, run := range map[string]func(context.Context) error{
		"ToDevice":        func(ctx context.Context) error { return c.ToDevice(ctx, d, h) },
		"FromDevice":      func(ctx context.Context) error { return c.FromDevice(ctx, h, d) },
		"ToDeviceChunk":   func(ctx context.Context) error { return c.ToDeviceChunk(ctx, d, h, sp) },
		"FromDeviceChunk": func(ctx context.Context) error { return c.FromDeviceChunk(ctx, h, d, sp) },
	} {
		t.Run(name, func(t *testing.T) {
			// The device holds zeros, the host ones: a copy that ran
			// would change one side.
			for i := range h.Float32s() {
				h.Float32s()[i] = 0
			}
			must(t, c.ToDevice(context.Background(), d, h))
			must(t, c.Sync(context.Background()))
			for i := range h.Float32s() {
				h.Float32s()[i] = 1
			}
			if err := run(ctx); !errors.Is(err, context.Canceled) {
				t.Fatalf("%s with a cancelled context = %v; want an error wrapping context.Canceled", name, err)
			}
			must(t, c.Sync(context.Background()))
			got := make([]float32, 8)
			copy(got, h.Float32s())
			must(t, c.FromDevice(context.Background(), h, d))
			must(t, c.Sync(context.Background()))
			for i, v := range h.Float32s() {
				if got[i] != 1 || v != 0 {
					t.Fatalf("element %d: host %v before the check (want 1), device %v (want 0): the cancelled copy ran", i, got[i], v)
				}
			}
		})
	}
}

// TestFreeWaitsUnderDirect backs the package doc's word on frees: under
// Direct, a client's Free waits for the work of another group's stream
// (as cuMemFree waits for the device); under the pools it does not.
func TestFreeWaitsUnderDirect(t *testing.T) {
	for kind, waits := range map[AllocatorKind]bool{Direct: true, Pool: false, AsyncPool: false} {
		t.Run(kind.String(), func(t *testing.T) {
			m, dev, _ := newManager(t, 64*MiB, WithAllocatorChoice(account.Choice{Kind: kind}))
			a := register(t, m, ClientOptions{Name: "a", Group: "a"})
			b := register(t, m, ClientOptions{Name: "b", Group: "b"})
			holdBytes(t, a, int(MiB))
			s, err := b.Stream()
			must(t, err)
			open := gateStream(t, dev, s) // b's stream busy until open
			done := make(chan error, 1)
			go func() { done <- a.Free("x") }()
			wait := 100 * time.Millisecond // a Free that waits must not return in this
			if !waits {
				wait = 10 * time.Second // a Free that does not wait returns in this, however loaded the machine
			}
			select {
			case err := <-done:
				open()
				must(t, err)
				if waits {
					t.Fatal("Free returned while another group's stream was still at work")
				}
			case <-time.After(wait):
				open()
				if !waits {
					t.Fatal("Free waited for another group's stream")
				}
				must(t, <-done)
			}
			must(t, b.Sync(context.Background()))
		})
	}
}
