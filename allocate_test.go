package vram

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vramkit/vram/account"
	"github.com/vramkit/vram/alloc"
	"github.com/vramkit/vram/device"
	"github.com/vramkit/vram/device/sim"
	"github.com/vramkit/vram/internal/units"
)

// BenchmarkAllocateBesideLongKernels measures one group's Allocate (queue
// 4 arrays of 1 MiB, allocate them, free them) on a 256 MiB simulator,
// alone and beside a second group that runs 20 ms kernels back to back on
// its own stream, allocating and freeing an 8 MiB array around each, so
// that the allocator always caches memory that group's stream has still
// to reach. An Allocate that waits for the other group's work (a trim at
// every budget read once did) takes about a kernel; one that does not
// stays at its cost alone. BENCHMARKS.md has the figures.
func BenchmarkAllocateBesideLongKernels(b *testing.B) {
	for _, beside := range []bool{false, true} {
		name := "alone"
		if beside {
			name = "beside 20ms kernels"
		}
		b.Run(name, func(b *testing.B) {
			dev := newSim(b, 256*units.MiB)
			m, err := New(dev, WithAllocatorChoice(account.Choice{Kind: Pool}))
			if err != nil {
				b.Fatal(err)
			}
			defer m.Close()
			if beside {
				stop := longKernelsLoop(b, m, dev)
				defer stop()
			}
			c, err := m.Register(ClientOptions{Name: "measured", Group: "measured"})
			if err != nil {
				b.Fatal(err)
			}
			reqs := map[string]ArrayRequest{}
			for _, l := range []string{"a", "b", "c", "d"} {
				reqs[l] = ArrayRequest{Shape: []int{1 << 20}, DType: Uint8, Unchunkable: true}
			}
			for b.Loop() {
				if err := c.Queue(reqs); err != nil {
					b.Fatal(err)
				}
				if _, err := c.Allocate(context.Background()); err != nil {
					b.Fatal(err)
				}
				for l := range reqs {
					if err := c.Free(l); err != nil {
						b.Fatal(err)
					}
				}
			}
		})
	}
}

// longKernelsLoop runs, until stop, a client of its own group that
// allocates an 8 MiB array, launches a 20 ms kernel on its stream and
// frees the array behind it, again and again.
func longKernelsLoop(b *testing.B, m *Manager, dev *sim.Device) (stop func()) {
	k, err := m.Register(ClientOptions{Name: "kernels", Group: "kernels"})
	if err != nil {
		b.Fatal(err)
	}
	s, err := k.Stream()
	if err != nil {
		b.Fatal(err)
	}
	quit := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		x := map[string]ArrayRequest{"x": {Shape: []int{8 << 20}, DType: Uint8, Unchunkable: true}}
		for {
			select {
			case <-quit:
				return
			default:
			}
			if err := k.Queue(x); err != nil {
				b.Error(err)
				return
			}
			if _, err := k.Allocate(context.Background()); err != nil {
				b.Error(err)
				return
			}
			if err := dev.LaunchFunc(s, 1, func(device.View, int, int) error { time.Sleep(20 * time.Millisecond); return nil }); err != nil {
				b.Error(err)
				return
			}
			if err := k.Free("x"); err != nil {
				b.Error(err)
				return
			}
			if err := k.Sync(context.Background()); err != nil {
				b.Error(err)
				return
			}
		}
	}()
	// The first kernel is running, its array freed behind it.
	time.Sleep(5 * time.Millisecond)
	return func() {
		close(quit)
		wg.Wait()
	}
}

// BenchmarkAllocate queues and allocates 8 arrays for one client
// and frees them again, through the Pool allocator.
func BenchmarkAllocate(b *testing.B) {
	dev := newSim(b, units.GiB, func(c *sim.Config) { c.AddressOnly = true })
	m, err := New(dev)
	if err != nil {
		b.Fatal(err)
	}
	defer m.Close()
	c, _ := m.Register(ClientOptions{})
	reqs := map[string]ArrayRequest{}
	for l := range 8 {
		reqs[fmt.Sprintf("a%d", l)] = ArrayRequest{Shape: []int{4, 10_000}, DType: Float32, ChunkAxis: 1}
	}
	b.ReportAllocs()
	for b.Loop() {
		if err := c.Queue(reqs); err != nil {
			b.Fatal(err)
		}
		if _, err := c.Allocate(context.Background()); err != nil {
			b.Fatal(err)
		}
		if err := m.FreeAll(); err != nil {
			b.Fatal(err)
		}
	}
}

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

// hookLog records hook calls in order.
type hookLog struct {
	mu    sync.Mutex
	calls []string
	resps map[string]*ArrayResponse
	inval map[string]int
}

func newHookLog() *hookLog {
	return &hookLog{resps: map[string]*ArrayResponse{}, inval: map[string]int{}}
}

func (h *hookLog) opts(name, group string) ClientOptions {
	return ClientOptions{
		Name:  name,
		Group: group,
		OnAllocated: func(r *ArrayResponse) {
			h.mu.Lock()
			defer h.mu.Unlock()
			h.calls = append(h.calls, name)
			h.resps[name] = r
		},
		OnInvalidate: func(error) {
			h.mu.Lock()
			defer h.mu.Unlock()
			h.inval[name]++
		},
	}
}

// reset forgets the calls so far.
func (h *hookLog) reset() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.calls, h.resps, h.inval = nil, map[string]*ArrayResponse{}, map[string]int{}
}

// invalidated counts the OnInvalidate calls of the client named name.
func (h *hookLog) invalidated(name string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.inval[name]
}

func (h *hookLog) got() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.calls)
}

func TestAllocateHooks(t *testing.T) {
	m, _, _ := newManager(t, 64*MiB)
	h := newHookLog()
	a := register(t, m, h.opts("a", "batch"))
	b := register(t, m, h.opts("b", "batch"))
	notary := register(t, m, h.opts("n", "batch"))
	outsider := register(t, m, h.opts("o", "other"))
	if err := a.Queue(map[string]ArrayRequest{
		"state": req(Float32, 1, 2, 1000), "consts": fixed(Float64, 16),
	}); err != nil {
		t.Fatal(err)
	}
	if err := b.Queue(map[string]ArrayRequest{"out": req(Float32, 2, 5, 2, 1000)}); err != nil {
		t.Fatal(err)
	}
	if err := outsider.Queue(map[string]ArrayRequest{"y": req(Float32, 0, 10)}); err != nil {
		t.Fatal(err)
	}
	// b triggers the group's allocation.
	resp, err := b.Allocate(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if got := h.got(); !slices.Equal(got, []string{"a", "b", "n"}) {
		t.Fatalf("hooks called %v, want requesters a, b then notary n", got)
	}
	if resp != h.resps["b"] {
		t.Error("Allocate did not return the trigger's own response")
	}
	ra, rb, rn := h.resps["a"], h.resps["b"], h.resps["n"]
	for name, tc := range map[string]struct {
		r      *ArrayResponse
		c      *Client
		labels []string
	}{
		"requester a": {ra, a, []string{"consts", "state"}},
		"requester b": {rb, b, []string{"out"}},
		"notary":      {rn, notary, nil},
	} {
		t.Run(name, func(t *testing.T) {
			if tc.r.Client != tc.c {
				t.Errorf("response for %v, want %v", tc.r.Client, tc.c)
			}
			if got := slices.Sorted(maps.Keys(tc.r.Arrays())); !slices.Equal(got, tc.labels) {
				t.Errorf("arrays %v, want %v", got, tc.labels)
			}
			if tc.r.Plan.Chunks != 1 || tc.r.Plan.ChunkLength != 1000 || tc.r.Plan.TotalRuns != 1000 {
				t.Errorf("chunk parameters %d × %d of %d", tc.r.Plan.Chunks, tc.r.Plan.ChunkLength, tc.r.Plan.TotalRuns)
			}
			if len(tc.labels) == 0 && (len(tc.r.Host()) != 0 || len(tc.r.ChunkedShapes()) != 0) {
				t.Errorf("a notary got host arrays or shapes: %v %v", tc.r.Host(), tc.r.ChunkedShapes())
			}
			for l, arr := range tc.r.Arrays() {
				if !slices.Equal(arr.Shape(), tc.r.ChunkedShapes()[l]) || arr.Ptr() == 0 || arr.Label() != l {
					t.Errorf("%s: shape %v (want %v), ptr %v, label %q", l, arr.Shape(), tc.r.ChunkedShapes()[l], arr.Ptr(), arr.Label())
				}
			}
		})
	}
	st := ra.Arrays()["state"]
	if st.DType() != Float32 || st.Bytes() != 8000 || st.Len() != 2000 || !slices.Equal(st.Strides(), []int{4000, 4}) || st.Memory() != Device {
		t.Errorf("state array: %v bytes %d len %d strides %v", st, st.Bytes(), st.Len(), st.Strides())
	}
	if g := granularityOf(m.Account().Allocator()); a.Held() != roundUp(8000, g)+roundUp(128, g) || b.Held() != roundUp(40000, g) {
		t.Errorf("held: a %d, b %d", a.Held(), b.Held())
	}
	if got := a.Arrays(); got["state"] != st || len(got) != 2 {
		t.Errorf("a.Arrays() = %v", got)
	}
	// The queue is empty now: an Allocate sends every member the group's
	// plan again, with no arrays (cubie's allocate_queue with an empty
	// queue), and frees nothing. The outsider's queue is untouched.
	h.reset()
	again, err := a.Allocate(context.Background())
	if err != nil || again == nil || len(again.Arrays()) != 0 || len(again.Host()) != 0 || len(again.ChunkedShapes()) != 0 ||
		again.Plan.Chunks != ra.Plan.Chunks || again.Plan.ChunkLength != ra.Plan.ChunkLength || again.Plan.TotalRuns != ra.Plan.TotalRuns {
		t.Fatalf("second Allocate: %+v, %v; want the plan again (%d × %d of %d) and no arrays", again, err, ra.Plan.Chunks, ra.Plan.ChunkLength, ra.Plan.TotalRuns)
	}
	if got := h.got(); !slices.Equal(got, []string{"a", "b", "n"}) || h.resps["a"] != again {
		t.Errorf("hooks on the empty queue: %v; want every member, a's with the response Allocate returned", got)
	}
	for _, r := range h.resps {
		if len(r.Arrays()) != 0 || r.Plan.Chunks != ra.Plan.Chunks {
			t.Errorf("%v's response again: %d arrays, %d chunks", r.Client, len(r.Arrays()), r.Plan.Chunks)
		}
	}
	if st.Freed() || a.Arrays()["state"] != st {
		t.Error("sending the plan again freed or replaced a's arrays")
	}
	if q := outsider.Queued(); len(q) != 1 {
		t.Errorf("another group's queue: %v", q)
	}
}

// TestHooksMayCallTheManager: no lock is held while a hook runs.
func TestHooksMayCallTheManager(t *testing.T) {
	m, _, _ := newManager(t, 64*MiB)
	var c *Client
	done := make(chan error, 1)
	c = register(t, m, ClientOptions{OnAllocated: func(r *ArrayResponse) {
		_ = c.Proportion()
		err := c.Queue(map[string]ArrayRequest{"again": req(Float32, 0, 5)})
		if err == nil {
			err = m.Free("x")
		}
		done <- err
	}})
	_ = c.Queue(map[string]ArrayRequest{"x": req(Float32, 0, 5)})
	if _, err := c.Allocate(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if len(c.Queued()) != 1 {
		t.Error("the hook's queued request is missing")
	}
}

func TestAllocateRacesWithClose(t *testing.T) {
	// A requester closing during its group's allocation gets nothing and
	// keeps nothing.
	m, dev, _ := newManager(t, 64*MiB)
	for range 50 {
		a := register(t, m, ClientOptions{Group: "g"})
		b := register(t, m, ClientOptions{Group: "g"})
		_ = a.Queue(map[string]ArrayRequest{"x": req(Float32, 0, 100)})
		_ = b.Queue(map[string]ArrayRequest{"y": req(Float32, 0, 100)})
		var wg sync.WaitGroup
		wg.Go(func() { _, _ = a.Allocate(context.Background()) })
		wg.Go(func() { _ = b.Close() })
		wg.Wait()
		_ = a.Close()
	}
	if r := dev.Leaks(); r.Allocs != 0 {
		t.Errorf("left on the device: %s", r)
	}
}

// TestAllocateOfATriggerClosedMeanwhile: the client whose
// Allocate allocates its group is closed meanwhile. Its arrays are
// freed, the other members get theirs, and it gets ErrClosed, not
// (nil, nil).
func TestAllocateOfATriggerClosedMeanwhile(t *testing.T) {
	var armed atomic.Bool
	var victim atomic.Pointer[Client]
	m, dev, _ := newManager(t, 64*MiB, WithWrap(func(a alloc.Allocator) alloc.Allocator {
		return allocHook{a, func() {
			if armed.CompareAndSwap(true, false) {
				_ = victim.Load().Close()
			}
		}}
	}))
	h := newHookLog()
	c := register(t, m, h.opts("c", "g"))
	n := register(t, m, h.opts("n", "g"))
	register(t, m, h.opts("o", "g"))
	_ = c.Queue(map[string]ArrayRequest{"x": req(Float32, 0, 1000)})
	_ = n.Queue(map[string]ArrayRequest{"y": req(Float32, 0, 1000)})
	victim.Store(c)
	armed.Store(true)
	resp, err := c.Allocate(context.Background())
	if resp != nil || !errors.Is(err, ErrClosed) || !strings.Contains(err.Error(), c.String()) {
		t.Fatalf("Allocate of a client closed meanwhile = %v, %v; want ErrClosed naming it", resp, err)
	}
	if got := h.got(); !slices.Equal(got, []string{"n", "o"}) || h.resps["n"].Arrays()["y"] == nil {
		t.Errorf("hooks %v; want the other requester and the notary", got)
	}
	if n.Arrays()["y"] == nil || c.Held() != 0 {
		t.Errorf("n holds %v, the closed client %d bytes", n.Arrays(), c.Held())
	}
	_ = n.Close()
	if r := dev.Leaks(); r.Allocs != 0 {
		t.Errorf("left on the device: %s", r)
	}
}

// TestAllocateReleasesItsLocksOnPanic: a panic inside the
// allocation (here an allocator's) leaves no lock held: the manager
// still serves calls and closes.
func TestAllocateReleasesItsLocksOnPanic(t *testing.T) {
	var armed atomic.Bool
	m, _, _ := newManager(t, 64*MiB, WithWrap(func(a alloc.Allocator) alloc.Allocator {
		return allocHook{a, func() {
			if armed.CompareAndSwap(true, false) {
				panic("allocator bug")
			}
		}}
	}))
	c := register(t, m, ClientOptions{Group: "g"})
	_ = c.Queue(map[string]ArrayRequest{"x": req(Float32, 0, 1000)})
	armed.Store(true)
	func() {
		defer func() {
			if r := recover(); r != "allocator bug" {
				t.Fatalf("recovered %v", r)
			}
		}()
		_, _ = c.Allocate(context.Background())
	}()
	done := make(chan error)
	go func() {
		_ = c.Queue(map[string]ArrayRequest{"x": req(Float32, 0, 1000)})
		if _, err := c.Allocate(context.Background()); err != nil { // the same group lock
			done <- err
			return
		}
		if err := m.SetAllocator(Direct); err != nil { // allocMu for writing
			done <- err
			return
		}
		done <- m.Close()
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the manager is wedged after a panic in Allocate")
	}
}

// TestPlanSentAgainIsTheGroups: the plan an empty Allocate sends again
// is the group's last one, chunks included, and is forgotten with the
// group's last member.
func TestPlanSentAgainIsTheGroups(t *testing.T) {
	m, _, _ := newManager(t, 64*MiB)
	a := register(t, m, ClientOptions{Name: "a", Group: "g"})
	// 48 MiB of runs in the 64 MiB device, twice: 2 chunks the second time.
	first, err := queueAndAllocate(t, a, map[string]ArrayRequest{"x": req(Uint8, 0, 48*int(MiB))})
	if err != nil || first.Plan.Chunks != 1 {
		t.Fatalf("first plan: %v, %v", first, err)
	}
	b := register(t, m, ClientOptions{Name: "b", Group: "g"})
	second, err := queueAndAllocate(t, b, map[string]ArrayRequest{"y": req(Uint8, 0, 48*int(MiB))})
	if err != nil || second.Plan.Chunks < 2 {
		t.Fatalf("second plan: %+v, %v; want it chunked beside a's array", second, err)
	}
	again, err := a.Allocate(t.Context())
	if err != nil || again.Plan.Chunks != second.Plan.Chunks || again.Plan.ChunkLength != second.Plan.ChunkLength {
		t.Errorf("sent again: %+v, %v; want the latest plan, %d × %d", again, err, second.Plan.Chunks, second.Plan.ChunkLength)
	}
	_ = a.Close()
	_ = b.Close()
	c := register(t, m, ClientOptions{Name: "c", Group: "g"})
	if resp, err := c.Allocate(t.Context()); resp != nil || !errors.Is(err, ErrNothingQueued) {
		t.Errorf("a new member of the emptied group: %v, %v; want ErrNothingQueued (the plan went with the group)", resp, err)
	}
}

// doorManager is a manager on a fresh 16 MiB simulator (the default
// allocator), closed when the test ends.
func doorManager(t *testing.T) *Manager {
	t.Helper()
	m, _ := managerOn(t, newSim(t, 16*MiB), WithAllocatorChoice(account.Choice{}))
	return m
}

// TestResponseMember: the response Allocate returns reaches every
// member's response of the same allocation (the one its hook gets), a
// notary's with no arrays, and none for a client outside the group.
func TestResponseMember(t *testing.T) {
	m := doorManager(t)
	var hooked *ArrayResponse
	a, err := m.Register(ClientOptions{Name: "a", Group: "g"})
	if err != nil {
		t.Fatal(err)
	}
	b, err := m.Register(ClientOptions{Name: "b", Group: "g", OnAllocated: func(r *ArrayResponse) { hooked = r }})
	if err != nil {
		t.Fatal(err)
	}
	notary, err := m.Register(ClientOptions{Name: "notary", Group: "g"})
	if err != nil {
		t.Fatal(err)
	}
	other, err := m.Register(ClientOptions{Name: "other", Group: "elsewhere"})
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range []struct {
		c     *Client
		label string
	}{{a, "x"}, {b, "y"}} {
		if err := q.c.Queue(map[string]ArrayRequest{q.label: {Shape: []int{4 << 20}, DType: Float32}}); err != nil {
			t.Fatal(err)
		}
	}
	ra, err := a.Allocate(context.Background(), WithBuffers(2))
	if err != nil {
		t.Fatal(err)
	}
	rb := ra.Member(b)
	if rb == nil || rb != hooked || rb.Buffers[1].Device["y"] == nil || rb.Plan.Chunks != ra.Plan.Chunks || ra.Plan.Chunks < 2 {
		t.Fatalf("Member(b) = %+v, hook got %p: want b's response of the same chunked plan, with both buffers", rb, hooked)
	}
	if ra.Member(a) != ra || rb.Member(a) != ra {
		t.Error("the members' responses do not reach a's own")
	}
	if rn := ra.Member(notary); rn == nil || len(rn.Arrays()) != 0 || rn.Plan.ChunkLength != ra.Plan.ChunkLength {
		t.Errorf("Member(notary) = %+v: want the chunk parameters and no arrays", rn)
	}
	if ra.Member(other) != nil {
		t.Error("Member of a client of another group is not nil")
	}
}

// TestAllocatePastTheDevice: an Allocate whose smallest plan needs more
// than the whole device says by how much and what would shrink it, not a
// budget to raise or memory to free, which cannot help.
func TestAllocatePastTheDevice(t *testing.T) {
	m, _, _ := newManager(t, 64*MiB)
	c := register(t, m, ClientOptions{Name: "solver"})
	for name, q := range map[string]map[string]ArrayRequest{
		"nothing chunkable": {"t": {Shape: []int{1 << 40}, DType: Float64, Unchunkable: true}},
		"fixed inputs":      {"t": {Shape: []int{1 << 40}, DType: Float64, Unchunkable: true}, "x": req(Float32, 1, 4, 1000)},
	} {
		t.Run(name, func(t *testing.T) {
			if err := c.Queue(q); err != nil {
				t.Fatal(err)
			}
			_, err := c.Allocate(context.Background())
			if !errors.Is(err, ErrUnchunkable) || !strings.Contains(err.Error(), "shrink them: that is 8 TiB more than the device's 64 MiB in all") {
				t.Fatalf("Allocate = %v; want ErrUnchunkable saying the device has 64 MiB in all", err)
			}
			for _, never := range []string{"raise the budget", "to give the group more"} {
				if strings.Contains(err.Error(), never) {
					t.Errorf("Allocate's error %q says %q", err, never)
				}
			}
		})
	}
}
