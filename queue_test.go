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
)

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

func TestChunkedAllocation(t *testing.T) {
	for name, tc := range map[string]struct {
		mode           LimitMode
		proportion     float64
		buffers        int
		wantChunks     int
		wantBudget     uint64
		wantBufferSets int
	}{
		// 64 MiB device, Direct (2 MiB granularity: no slack): 48 MiB of runs.
		"passive: fits in free memory":         {Passive, 0.25, 1, 1, 64 * MiB, 1},
		"active: chunked to the client's cap":  {Active, 0.25, 1, 3, 16 * MiB, 1},
		"active, double buffered":              {Active, 0.25, 2, 6, 16 * MiB, 2},
		"active, double buffered, but it fits": {Active, 1, 2, 1, 64 * MiB, 1},
	} {
		t.Run(name, func(t *testing.T) {
			m, _, _ := newManager(t, 64*MiB, WithLimitMode(tc.mode))
			c := register(t, m, ClientOptions{Proportion: tc.proportion, Group: "g"})
			const runs = 6 * 1024 * 1024 // × 8 B = 48 MiB
			if err := c.Queue(map[string]ArrayRequest{"x": req(Float64, 0, runs)}); err != nil {
				t.Fatal(err)
			}
			resp, err := c.Allocate(context.Background(), WithBuffers(tc.buffers))
			if err != nil {
				t.Fatal(err)
			}
			if resp.Plan.Chunks != tc.wantChunks || resp.Plan.Budget != tc.wantBudget {
				t.Fatalf("chunks %d, budget %d; want %d, %d", resp.Plan.Chunks, resp.Plan.Budget, tc.wantChunks, tc.wantBudget)
			}
			if len(resp.Buffers) != tc.wantBufferSets {
				t.Fatalf("%d buffer sets, want %d", len(resp.Buffers), tc.wantBufferSets)
			}
			seen := map[device.Ptr]bool{}
			for i, set := range resp.Buffers {
				x := set.Device["x"]
				if x == nil || x.Dim(0) != resp.Plan.ChunkLength || seen[x.Ptr()] {
					t.Errorf("buffer %d: %v", i, x)
				} else {
					seen[x.Ptr()] = true
				}
			}
			if resp.Arrays()["x"] != resp.Buffers[0].Device["x"] {
				t.Error("Arrays is not buffer 0")
			}
			covered := 0
			for i := range resp.Plan.Chunks {
				start, n, err := resp.Chunk(i)
				if err != nil || start != covered || n < 1 || n > resp.Plan.ChunkLength {
					t.Errorf("Chunk(%d) = %d, %d after %d runs", i, start, n, covered)
				}
				covered += n
			}
			if covered != resp.Plan.TotalRuns {
				t.Errorf("chunks cover %d runs of %d", covered, resp.Plan.TotalRuns)
			}
			if c.Held() != resp.Plan.BytesPerChunk {
				t.Errorf("held %d, plan %d", c.Held(), resp.Plan.BytesPerChunk)
			}
		})
	}
}

// TestActiveBudgetCountsWhatTheGroupHolds: in Active mode a group plans
// within its members' caps less what they hold, and arrays being
// replaced count as free.
func TestActiveBudgetCountsWhatTheGroupHolds(t *testing.T) {
	m, _, _ := newManager(t, 64*MiB, WithLimitMode(Active))
	a := register(t, m, ClientOptions{Proportion: 0.25, Group: "g"}) // 16 MiB
	b := register(t, m, ClientOptions{Proportion: 0.25, Group: "g"}) // 16 MiB
	register(t, m, ClientOptions{Proportion: 0.25, Group: "h"})      // not in g
	_ = a.Queue(map[string]ArrayRequest{"held": fixed(Uint8, 10*int(MiB))})
	if _, err := a.Allocate(context.Background()); err != nil {
		t.Fatal(err)
	}
	_ = b.Queue(map[string]ArrayRequest{"x": req(Uint8, 0, 64*int(MiB))})
	resp, err := b.Allocate(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if resp.Plan.Budget != 22*MiB {
		t.Errorf("budget %s, want caps 32 MiB − 10 MiB held = 22 MiB", fmtBytes(resp.Plan.Budget))
	}
	// Re-allocating "held" at the same size: its own bytes count as free.
	_ = a.Queue(map[string]ArrayRequest{"held": fixed(Uint8, 10*int(MiB))})
	before := a.Arrays()["held"]
	resp, err = a.Allocate(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if !before.Freed() || resp.Arrays()["held"].Freed() {
		t.Errorf("replaced array freed %v, new one freed %v", before.Freed(), resp.Arrays()["held"].Freed())
	}
	if want := 32*MiB - b.Held(); resp.Plan.Budget != want {
		t.Errorf("re-allocation budget %s, want %s (caps − b's arrays)", fmtBytes(resp.Plan.Budget), fmtBytes(want))
	}
	if a.Held() != 10*MiB {
		t.Errorf("a holds %d after the re-allocation", a.Held())
	}
}

func fmtBytes(n uint64) string { return fmt.Sprintf("%d (%.2f MiB)", n, float64(n)/float64(MiB)) }

// TestAllocateFailures: a failed Allocate frees what it allocated,
// calls no OnAllocated hook and leaves the queue as it was; the arrays
// being replaced, its own or another member's, survive it, unless the
// plan needed their memory: then they are gone, the error names them and
// their owners' OnInvalidate hooks are called.
func TestAllocateFailures(t *testing.T) {
	for name, tc := range map[string]struct {
		held  map[string]ArrayRequest // c holds these first
		other map[string]ArrayRequest // n holds these first, and queues them again
		reqs  map[string]ArrayRequest // c queues these
		fault func(f *sim.Faults)
		is    error
		lost  []string // owners and labels the failure frees ("c/x"), in the error's order
	}{
		"unchunkable": {
			reqs: map[string]ArrayRequest{"x": fixed(Uint8, 100*int(MiB))},
			is:   ErrUnchunkable,
		},
		"run too large": {
			reqs: map[string]ArrayRequest{"k": fixed(Uint8, 40*int(MiB)), "x": req(Uint8, 1, 30*int(MiB), 4)},
			is:   ErrRunTooLarge,
		},
		"out of memory at the third array": {
			reqs:  map[string]ArrayRequest{"a": req(Float32, 0, 1000), "b": req(Float32, 0, 1000), "c": req(Float32, 0, 1000)},
			fault: func(f *sim.Faults) { f.OOMAtAlloc(3) },
			is:    ErrOutOfMemory,
		},
		"out of memory at the first array": {
			reqs:  map[string]ArrayRequest{"a": req(Float32, 0, 1000), "b": req(Float32, 0, 1000)},
			fault: func(f *sim.Faults) { f.OOMAtAlloc(1) },
			is:    ErrOutOfMemory,
		},
		"replacing its own and another member's arrays": {
			held:  map[string]ArrayRequest{"x": req(Float32, 0, 1000), "keep": req(Float32, 0, 1000)},
			other: map[string]ArrayRequest{"z": req(Float32, 0, 1000)},
			reqs:  map[string]ArrayRequest{"x": req(Float32, 0, 1000), "y": req(Float32, 0, 1000)},
			fault: func(f *sim.Faults) { f.OOMAtAlloc(2) },
			is:    ErrOutOfMemory,
		},
		"replacing another member's array": {
			other: map[string]ArrayRequest{"x": req(Float32, 0, 1000)},
			reqs:  map[string]ArrayRequest{"y": req(Float32, 0, 1000)},
			fault: func(f *sim.Faults) { f.OOMAtAlloc(2) },
			is:    ErrOutOfMemory,
		},
		"replacing arrays: a plan error": {
			held: map[string]ArrayRequest{"x": req(Float32, 0, 1000)},
			reqs: map[string]ArrayRequest{"x": fixed(Uint8, 100*int(MiB))},
			is:   ErrUnchunkable,
		},
		"replacing arrays whose memory the plan needs": {
			held:  map[string]ArrayRequest{"big": fixed(Uint8, 40*int(MiB)), "keep": req(Float32, 0, 1000)},
			other: map[string]ArrayRequest{"w": fixed(Uint8, 10*int(MiB))},
			reqs:  map[string]ArrayRequest{"big": fixed(Uint8, 40*int(MiB))},
			fault: func(f *sim.Faults) { f.OOMAtAlloc(2) },
			is:    ErrOutOfMemory,
			lost:  []string{"c/big", "n/w"},
		},
	} {
		t.Run(name, func(t *testing.T) {
			m, dev, _ := newManager(t, 64*MiB)
			h := newHookLog()
			c := register(t, m, h.opts("c", "g"))
			n := register(t, m, h.opts("n", "g"))
			freeEmpty := free(t, m)
			if tc.held != nil || tc.other != nil {
				if err := c.Queue(tc.held); err != nil {
					t.Fatal(err)
				}
				if err := n.Queue(tc.other); err != nil {
					t.Fatal(err)
				}
				if _, err := c.Allocate(context.Background()); err != nil {
					t.Fatal(err)
				}
				h.reset()
			}
			if err := c.Queue(tc.reqs); err != nil {
				t.Fatal(err)
			}
			if err := n.Queue(tc.other); err != nil {
				t.Fatal(err)
			}
			type state struct {
				queued map[string]ArrayRequest
				arrays map[string]*DeviceArray
				held   uint64
			}
			snap := func(x *Client) state { return state{x.Queued(), x.Arrays(), x.Held()} }
			before := map[*Client]state{c: snap(c), n: snap(n)}
			free0 := free(t, m)
			if tc.fault != nil {
				tc.fault(dev.Faults())
			}
			resp, err := c.Allocate(context.Background())
			if !errors.Is(err, tc.is) || resp != nil {
				t.Fatalf("got %v, %v; want %v", resp, err, tc.is)
			}
			dev.Faults().Clear()
			if got := h.got(); len(got) != 0 {
				t.Errorf("OnAllocated called on failure: %v", got)
			}
			sameReq := func(a, b ArrayRequest) bool { return fmt.Sprint(a) == fmt.Sprint(b) }
			lost := map[string]bool{}
			for _, l := range tc.lost {
				lost[l] = true
			}
			for x, was := range before {
				name := x.Name()
				if got := x.Queued(); !maps.EqualFunc(got, was.queued, sameReq) {
					t.Errorf("%s's queue after failure %v, want %v", name, got, was.queued)
				}
				now := x.Arrays()
				gone, held := 0, was.held
				for l, a := range was.arrays {
					switch {
					case lost[name+"/"+l]:
						if now[l] != nil || !a.Freed() {
							t.Errorf("%s/%s: the failure freed it, yet it is still held", name, l)
						}
						held -= roundUp(a.Bytes(), granularityOf(m.Account().Allocator()))
						gone++
					case now[l] != a || a.Freed():
						t.Errorf("%s/%s was lost by the failure: holds %v (freed %v), had %v", name, l, now[l], a.Freed(), a)
					}
				}
				if len(now) != len(was.arrays)-gone || x.Held() != held {
					t.Errorf("%s holds %v (%d bytes), had %v (%d bytes)", name, now, x.Held(), was.arrays, was.held)
				}
				if want := min(gone, 1); h.invalidated(name) != want {
					t.Errorf("%s's OnInvalidate called %d times, want %d", name, h.invalidated(name), want)
				}
			}
			if len(tc.lost) == 0 {
				if f := free(t, m); f != free0 {
					t.Errorf("device free %d after failure, was %d: something stayed allocated or was freed", f, free0)
				}
			} else {
				if !strings.Contains(err.Error(), "freed first") {
					t.Errorf("error %q does not say the replaced arrays were freed", err)
				}
				for _, l := range tc.lost {
					who, label, _ := strings.Cut(l, "/")
					owner := map[string]*Client{"c": c, "n": n}[who]
					if !strings.Contains(err.Error(), owner.String()+": "+label) {
						t.Errorf("error %q does not name %v's %s", err, owner, label)
					}
				}
				if tc.held["keep"].Shape != nil && c.Arrays()["keep"] == nil {
					t.Error("an array not being replaced was lost")
				}
			}
			if tc.is != ErrOutOfMemory {
				return
			}
			// The queue is intact: the retry succeeds, and frees what it
			// replaces only then.
			resp, err = c.Allocate(context.Background())
			if err != nil || len(resp.Arrays()) != len(tc.reqs) || resp.FreeErr != nil {
				t.Fatalf("retry: %v, %v", resp, err)
			}
			if got := h.got(); !slices.Equal(got, []string{"c", "n"}) {
				t.Errorf("hooks on retry: %v", got)
			}
			for x, was := range before {
				for l, a := range was.arrays {
					if _, requeued := was.queued[l]; requeued != a.Freed() {
						t.Errorf("%s/%s after the retry: freed %v, replaced %v", x.Name(), l, a.Freed(), requeued)
					}
				}
			}
			if f := free(t, m); f != freeEmpty-c.Held()-n.Held() {
				t.Errorf("device free %d after the retry, want %d less what c and n hold (%d, %d)", f, freeEmpty, c.Held(), n.Held())
			}
		})
	}
}

func TestAllocateErrorsCarryTheFigures(t *testing.T) {
	m, _, _ := newManager(t, 64*MiB)
	c := register(t, m, ClientOptions{Name: "solver", Group: "batch"})
	_ = c.Queue(map[string]ArrayRequest{"k": fixed(Uint8, 70*int(MiB)), "x": req(Float32, 0, 100)})
	_, err := c.Allocate(context.Background())
	for _, s := range []string{`group "batch"`, "passive mode", "budget 64 MiB", "unchunkable arrays need 70 MiB"} {
		if err == nil || !strings.Contains(err.Error(), s) {
			t.Errorf("error %v does not say %q", err, s)
		}
	}
}

func TestRunsMismatchAcrossClients(t *testing.T) {
	m, _, _ := newManager(t, 64*MiB)
	a := register(t, m, ClientOptions{Name: "a", Group: "g"})
	b := register(t, m, ClientOptions{Name: "b", Group: "g"})
	_ = a.Queue(map[string]ArrayRequest{"x": req(Float32, 0, 100)})
	_ = b.Queue(map[string]ArrayRequest{"y": req(Float32, 0, 200)})
	_, err := a.Allocate(context.Background())
	if !errors.Is(err, ErrRunsMismatch) || !strings.Contains(err.Error(), a.String()+"/x") || !strings.Contains(err.Error(), b.String()+"/y") {
		t.Fatalf("got %v", err)
	}
	if len(a.Queued()) != 1 || len(b.Queued()) != 1 {
		t.Error("queues not restored")
	}
}

func TestQueueValidation(t *testing.T) {
	m, _, _ := newManager(t, 64*MiB)
	c := register(t, m, ClientOptions{})
	for name, tc := range map[string]struct {
		r  ArrayRequest
		is error
	}{
		"zero dimension":   {ArrayRequest{Shape: []int{4, 0}, DType: Float32}, ErrInvalidRequest},
		"no shape":         {ArrayRequest{DType: Float32}, ErrInvalidRequest},
		"no dtype":         {ArrayRequest{Shape: []int{4}}, ErrInvalidRequest},
		"managed memory":   {ArrayRequest{Shape: []int{4}, DType: Float32, Memory: Managed}, ErrNotSupported},
		"size overflow":    {ArrayRequest{Shape: []int{1 << 40, 1 << 30}, DType: Float64}, ErrInvalidRequest},
		"runs disagree":    {ArrayRequest{Shape: []int{10}, DType: Float32, TotalRuns: 11}, ErrInvalidRequest},
		"negative axis":    {ArrayRequest{Shape: []int{10}, DType: Float32, ChunkAxis: -1}, ErrInvalidRequest},
		"unknown memory":   {ArrayRequest{Shape: []int{10}, DType: Float32, Memory: 9}, ErrInvalidRequest},
		"negative runs":    {ArrayRequest{Shape: []int{10}, DType: Float32, Unchunkable: true, TotalRuns: -2}, ErrInvalidRequest},
		"unknown dtype 99": {ArrayRequest{Shape: []int{10}, DType: 99}, ErrInvalidRequest},
	} {
		t.Run(name, func(t *testing.T) {
			err := c.Queue(map[string]ArrayRequest{"good": req(Float32, 0, 10), "bad": tc.r})
			if !errors.Is(err, tc.is) || !strings.Contains(err.Error(), "bad") {
				t.Errorf("got %v, want %v naming the label", err, tc.is)
			}
			if q := c.Queued(); len(q) != 0 {
				t.Errorf("a refused request set queued %v", q)
			}
		})
	}
	// Queuing again replaces the whole set, as cubie's queue_request:
	// b, not queued again, is gone.
	_ = c.Queue(map[string]ArrayRequest{"a": req(Float32, 0, 10), "b": req(Float32, 0, 10)})
	shape := []int{20}
	_ = c.Queue(map[string]ArrayRequest{"a": {Shape: shape, DType: Float64}})
	shape[0] = 99 // the queue holds its own copy
	q := c.Queued()
	if len(q) != 1 || q["a"].DType != Float64 || q["a"].Shape[0] != 20 {
		t.Errorf("queue after re-queuing a alone: %v; want a alone", q)
	}
	// A refused set leaves what was queued; an empty one drops it.
	if err := c.Queue(map[string]ArrayRequest{"bad": {}}); err == nil || len(c.Queued()) != 1 {
		t.Errorf("a refused set: %v, queue %v", err, c.Queued())
	}
	if err := c.Queue(nil); err != nil || len(c.Queued()) != 0 {
		t.Errorf("Queue(nil): %v, queue %v; want it empty", err, c.Queued())
	}
}

func TestHostMemoryRequests(t *testing.T) {
	m, dev, _ := newManager(t, 64*MiB)
	c := register(t, m, ClientOptions{})
	_ = c.Queue(map[string]ArrayRequest{
		"dev":    req(Float32, 0, 1000),
		"pinned": {Shape: []int{1000, 3}, DType: Float64, Memory: Pinned},
		"mapped": {Shape: []int{1000}, DType: Int32, Memory: Mapped},
		"page":   {Shape: []int{1000}, DType: Uint8, Memory: Pageable},
	})
	resp, err := c.Allocate(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if got := slices.Sorted(maps.Keys(resp.Arrays())); !slices.Equal(got, []string{"dev", "mapped"}) {
		t.Errorf("device arrays %v", got)
	}
	if got := slices.Sorted(maps.Keys(resp.Host())); !slices.Equal(got, []string{"mapped", "page", "pinned"}) {
		t.Errorf("host arrays %v", got)
	}
	p := resp.Host()["pinned"]
	if p.Memory() != Pinned || len(p.Float64s()) != 3000 || p.Bytes() != 24000 {
		t.Errorf("pinned: %v %d", p, len(p.Float64s()))
	}
	mp := resp.Host()["mapped"]
	if mp.DevicePtr() == 0 || resp.Arrays()["mapped"].Ptr() != mp.DevicePtr() || resp.Arrays()["mapped"].Memory() != Mapped {
		t.Errorf("mapped: host at %v, device array %v", mp.DevicePtr(), resp.Arrays()["mapped"])
	}
	if c.Held() != roundUp(4000, granularityOf(m.Account().Allocator())) {
		t.Errorf("host memory counted as held: %d", c.Held())
	}
	if r := dev.Leaks(); r.HostBuffers != 2 {
		t.Errorf("pinned buffers: %s", r)
	}
	if err := c.Free("mapped"); err != nil {
		t.Fatal(err)
	}
	if !mp.Freed() || !resp.Arrays()["mapped"].Freed() || mp.Data() != nil || resp.Arrays()["mapped"].Ptr() != 0 {
		t.Error("mapped array not freed by Free")
	}
	if r := dev.Leaks(); r.HostBuffers != 1 {
		t.Errorf("pinned buffers after freeing mapped: %s", r)
	}
}

func TestFreeFreeAllInvalidateAll(t *testing.T) {
	m, _, _ := newManager(t, 64*MiB)
	h := newHookLog()
	a := register(t, m, h.opts("a", ""))
	b := register(t, m, h.opts("b", "other"))
	alloc := func() (*ArrayResponse, *ArrayResponse) {
		_ = a.Queue(map[string]ArrayRequest{"x": req(Float32, 0, 10), "y": req(Float32, 0, 10)})
		_ = b.Queue(map[string]ArrayRequest{"x": req(Float32, 0, 10)})
		ra, err := a.Allocate(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		rb, err := b.Allocate(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		return ra, rb
	}
	free0 := free(t, m)
	ra, rb := alloc()
	if err := m.Free("x"); err != nil {
		t.Fatal(err)
	}
	if !ra.Arrays()["x"].Freed() || !rb.Arrays()["x"].Freed() || ra.Arrays()["y"].Freed() {
		t.Error("Free(x) must free x of every client and nothing else")
	}
	if err := m.Free("nothing"); err != nil {
		t.Errorf("Free of an unknown label: %v", err)
	}
	if err := m.FreeAll(); err != nil {
		t.Fatal(err)
	}
	if !ra.Arrays()["y"].Freed() || free(t, m) != free0 || a.Held() != 0 {
		t.Error("FreeAll left arrays")
	}
	if len(h.inval) != 0 {
		t.Errorf("FreeAll called OnInvalidate: %v", h.inval)
	}
	ra, _ = alloc()
	if err := m.InvalidateAll(); err != nil {
		t.Fatal(err)
	}
	if !ra.Arrays()["y"].Freed() || h.inval["a"] != 1 || h.inval["b"] != 1 {
		t.Errorf("InvalidateAll: freed %v, hooks %v", ra.Arrays()["y"].Freed(), h.inval)
	}
}

func TestSetAllocator(t *testing.T) {
	for _, kind := range []AllocatorKind{Direct, Pool, AsyncPool} {
		t.Run(kind.String(), func(t *testing.T) {
			m, _, _ := newManager(t, 64*MiB)
			h := newHookLog()
			a := register(t, m, h.opts("a", "g"))
			b := register(t, m, h.opts("b", ""))
			_ = a.Queue(map[string]ArrayRequest{"x": req(Float32, 0, 1000), "p": {Shape: []int{4}, DType: Int32, Memory: Pinned, Unchunkable: true}})
			resp, err := a.Allocate(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			_ = b.Queue(map[string]ArrayRequest{"later": req(Float32, 0, 10)})
			sa, _ := a.Stream()
			sb, _ := b.Stream()
			free0 := free(t, m)
			if err := m.SetAllocator(kind); err != nil {
				t.Fatal(err)
			}
			if allocatorKind(m) != kind {
				t.Errorf("kind %v", allocatorKind(m))
			}
			if k, st := m.Account().Stats(); k != kind || st.Allocs != 0 || st.InUse != 0 {
				t.Errorf("AllocatorStats = %v, %+v; want the new %v with nothing allocated", k, st, kind)
			}
			if !resp.Arrays()["x"].Freed() || !resp.Host()["p"].Freed() || a.Held() != 0 {
				t.Error("arrays survived SetAllocator")
			}
			if f := free(t, m); f < free0+4096 {
				t.Errorf("device free %d after SetAllocator, was %d with an array live", f, free0)
			}
			if h.inval["a"] != 1 || h.inval["b"] != 1 {
				t.Errorf("OnInvalidate calls: %v", h.inval)
			}
			if s, _ := a.Stream(); s == sa {
				t.Error("group g kept its stream")
			}
			if s, _ := b.Stream(); s == sb {
				t.Error("the default group kept its stream")
			}
			if len(b.Queued()) != 1 {
				t.Error("SetAllocator dropped queued requests")
			}
			// The new allocator serves.
			if resp, err := b.Allocate(context.Background()); err != nil || resp.Arrays()["later"].Freed() {
				t.Errorf("allocate after SetAllocator: %v", err)
			}
		})
	}
}

// noAsync hides the simulator's stream-ordered pool.
type noAsync struct{ device.Device }

func TestSetAllocatorRefusedChangesNothing(t *testing.T) {
	dev := newSim(t, 64*MiB)
	m, err := New(noAsync{dev}, WithAllocatorChoice(account.Choice{Kind: Direct}))
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	h := newHookLog()
	c := register(t, m, h.opts("c", ""))
	_ = c.Queue(map[string]ArrayRequest{"x": req(Float32, 0, 10)})
	resp, _ := c.Allocate(context.Background())
	s0, _ := c.Stream()
	err = m.SetAllocator(AsyncPool)
	if !errors.Is(err, ErrNotSupported) {
		t.Fatalf("AsyncPool on a device without one: %v", err)
	}
	if s, _ := c.Stream(); s != s0 || resp.Arrays()["x"].Freed() || len(h.inval) != 0 || allocatorKind(m) != Direct {
		t.Error("a refused SetAllocator changed something")
	}
	if _, err := New(noAsync{dev}, WithAllocatorChoice(account.Choice{Kind: AsyncPool})); !errors.Is(err, ErrNotSupported) {
		t.Errorf("New with AsyncPool on a device without one: %v", err)
	}
	if _, err := m.NewHostArray([]int{3}, Float32, Pinned, nil); !errors.Is(err, ErrNotSupported) {
		t.Errorf("pinned array on a device without host allocation: %v", err)
	}
}

func TestReallocationReplaces(t *testing.T) {
	m, _, _ := newManager(t, 64*MiB)
	c := register(t, m, ClientOptions{})
	_ = c.Queue(map[string]ArrayRequest{"x": req(Float32, 0, 1000), "keep": req(Float32, 0, 1000)})
	r1, _ := c.Allocate(context.Background())
	_ = c.Queue(map[string]ArrayRequest{"x": req(Float32, 0, 1000)})
	r2, err := c.Allocate(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if !r1.Arrays()["x"].Freed() || r1.Arrays()["keep"].Freed() || r2.Arrays()["x"].Freed() {
		t.Error("re-allocation must free the replaced label only")
	}
	if got := c.Arrays(); got["x"] != r2.Arrays()["x"] || got["keep"] != r1.Arrays()["keep"] {
		t.Errorf("client arrays %v", got)
	}
	if c.Held() != 2*roundUp(4000, granularityOf(m.Account().Allocator())) {
		t.Errorf("held %d", c.Held())
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

// TestDoubleBuffersShareUnchunkable: with two buffers in flight each
// chunkable array is allocated twice, each unchunkable one once and shared.
func TestDoubleBuffersShareUnchunkable(t *testing.T) {
	m, _, _ := newManager(t, 64*MiB, WithLimitMode(Active))
	c := register(t, m, ClientOptions{Proportion: 0.25})
	_ = c.Queue(map[string]ArrayRequest{
		"x": req(Float64, 0, 6*1024*1024),
		"k": fixed(Float64, 1000),
		"h": {Shape: []int{6 * 1024 * 1024}, DType: Uint8, Memory: Pinned},
	})
	resp, err := c.Allocate(context.Background(), WithBuffers(2))
	if err != nil {
		t.Fatal(err)
	}
	b0, b1 := resp.Buffers[0], resp.Buffers[1]
	if resp.Plan.Chunks < 2 || len(resp.Buffers) != 2 {
		t.Fatalf("%d chunks, %d buffers", resp.Plan.Chunks, len(resp.Buffers))
	}
	if b0.Device["k"] != b1.Device["k"] || b0.Device["x"] == b1.Device["x"] || b0.Host["h"] == b1.Host["h"] {
		t.Error("unchunkable arrays must be shared between buffers, chunkable ones not")
	}
	if b1.Host["h"].Len() != resp.Plan.ChunkLength {
		t.Errorf("host chunk buffer of %d runs, want %d", b1.Host["h"].Len(), resp.Plan.ChunkLength)
	}
	if c.Held() != resp.Plan.BytesPerChunk || resp.Plan.BytesPerChunk > 16*MiB {
		t.Errorf("held %d, plan %d, cap 16 MiB", c.Held(), resp.Plan.BytesPerChunk)
	}
	if err := c.Free("x"); err != nil || !b0.Device["x"].Freed() || !b1.Device["x"].Freed() {
		t.Errorf("Free(x) must free every buffer: %v", err)
	}
}

// TestReplacementNeedingTheOldMemory: when the new arrays fit only in
// the memory of the ones they replace (on the device, or under an
// allocation limit), the old ones are freed first and the allocation
// succeeds.
func TestReplacementNeedingTheOldMemory(t *testing.T) {
	for name, opts := range map[string][]Option{
		"the device": nil,
		"a limit":    {WithWrap(func(a alloc.Allocator) alloc.Allocator { return alloc.NewLimit(a, 48*MiB) })},
	} {
		t.Run(name, func(t *testing.T) {
			m, _, _ := newManager(t, 64*MiB, opts...)
			h := newHookLog()
			c := register(t, m, h.opts("c", "g"))
			big := map[string]ArrayRequest{"big": fixed(Uint8, 30*int(MiB))}
			if err := c.Queue(big); err != nil {
				t.Fatal(err)
			}
			r1, err := c.Allocate(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			_ = c.Queue(big)
			if name == "the device" {
				_ = c.Queue(map[string]ArrayRequest{"big": fixed(Uint8, 40*int(MiB))})
			}
			r2, err := c.Allocate(context.Background())
			if err != nil {
				t.Fatalf("replacing an array with one that fits only in its memory: %v", err)
			}
			if !r1.Arrays()["big"].Freed() || r2.Arrays()["big"].Freed() || c.Arrays()["big"] != r2.Arrays()["big"] || r2.FreeErr != nil {
				t.Errorf("after the replacement: old freed %v, new %v, FreeErr %v", r1.Arrays()["big"].Freed(), c.Arrays()["big"], r2.FreeErr)
			}
			if h.invalidated("c") != 0 {
				t.Error("OnInvalidate called on a replacement that succeeded")
			}
		})
	}
}

// TestFreeErrorsDoNotFailTheAllocation: after a device reset the arrays
// being replaced cannot be freed (their memory went with the reset). The
// allocation has succeeded all the same: it returns the response, calls
// the hooks, consumes the queue, and reports the free's error in
// ArrayResponse.FreeErr.
func TestFreeErrorsDoNotFailTheAllocation(t *testing.T) {
	m, dev, lb := newManager(t, 64*MiB)
	h := newHookLog()
	c := register(t, m, h.opts("c", "g"))
	register(t, m, h.opts("n", "g"))
	if err := c.Queue(map[string]ArrayRequest{"x": req(Float32, 0, 1000)}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Allocate(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := dev.Reset(); err != nil {
		t.Fatal(err)
	}
	if err := m.ReinitStreams(); err != nil {
		t.Fatal(err)
	}
	h.reset()
	_ = c.Queue(map[string]ArrayRequest{"x": req(Float32, 0, 1000)})
	resp, err := c.Allocate(context.Background())
	if err != nil || resp == nil {
		t.Fatalf("Allocate = %v, %v; want the response", resp, err)
	}
	if !errors.Is(resp.FreeErr, device.ErrInvalidated) || !strings.Contains(resp.FreeErr.Error(), "free x of "+c.String()) {
		t.Errorf("FreeErr = %v; want the free of the old x, wrapping ErrInvalidated", resp.FreeErr)
	}
	if c.Arrays()["x"] != resp.Arrays()["x"] || resp.Arrays()["x"].Freed() || len(c.Queued()) != 0 {
		t.Errorf("arrays %v, queue %v", c.Arrays(), c.Queued())
	}
	if got := h.got(); !slices.Equal(got, []string{"c", "n"}) || h.resps["n"].FreeErr != nil {
		t.Errorf("hooks %v (notary FreeErr %v)", got, h.resps["n"].FreeErr)
	}
	if strings.Contains(lb.String(), "level=WARN") {
		t.Errorf("a delivered FreeErr was logged too: %s", lb)
	}
	// The allocator took the invalidated pointer back as freed, so
	// replacing it finds nothing left to free.
	if err := m.SetAllocator(Direct); err != nil {
		t.Fatal(err)
	}
}

// allocHook calls before ahead of each Alloc of the allocator it wraps,
// to act in the middle of an Allocate.
type allocHook struct {
	alloc.Allocator
	before func()
}

func (a allocHook) Alloc(n uint64, s device.Stream) (device.Ptr, error) {
	a.before()
	return a.Allocator.Alloc(n, s)
}

func (a allocHook) Upstream() alloc.Allocator { return a.Allocator }

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

// TestHugePageableRequestIsRefused: a pageable array larger than the
// host can hold is an error wrapping ErrOutOfMemory that names its bytes,
// not a panic (which used to leave Allocate's locks held).
func TestHugePageableRequestIsRefused(t *testing.T) {
	m, _, _ := newManager(t, 64*MiB)
	c := register(t, m, ClientOptions{})
	huge := map[string]ArrayRequest{"h": {Shape: []int{1 << 59}, DType: Float64, Memory: Pageable, Unchunkable: true}}
	if err := c.Queue(huge); err != nil {
		t.Fatal(err)
	}
	resp, err := c.Allocate(context.Background())
	if resp != nil || !errors.Is(err, ErrOutOfMemory) || !strings.Contains(err.Error(), "4611686018427387904 bytes") {
		t.Fatalf("Allocate = %v, %v; want ErrOutOfMemory naming 4611686018427387904 bytes", resp, err)
	}
	if len(c.Queued()) != 1 {
		t.Error("the refused request left the queue")
	}
	if err := m.FreeAll(); err != nil { // allocMu is free
		t.Fatal(err)
	}
	for _, mem := range []MemoryType{Pageable, Pinned, Mapped} {
		h, err := m.NewHostArray([]int{1 << 59}, Float64, mem, nil)
		if h != nil || !errors.Is(err, ErrOutOfMemory) {
			t.Errorf("NewHostArray of 4 EiB %v memory = %v, %v; want ErrOutOfMemory", mem, h, err)
		}
	}
	// Within the limit, pageable memory is still served.
	if h, err := m.NewHostArray([]int{1 << 10}, Float64, Pageable, nil); err != nil || len(h.Float64s()) != 1024 {
		t.Errorf("a small pageable array: %v", err)
	}
}

// TestEmptyRequestQueuesNothing: queuing no request is a no-op; it does
// not make the client a requester whose hook Allocate calls. A group that
// was never planned has no plan to send again: ErrNothingQueued, saying
// what cubie would do.
func TestEmptyRequestQueuesNothing(t *testing.T) {
	m, _, _ := newManager(t, 64*MiB)
	h := newHookLog()
	c := register(t, m, h.opts("c", "g"))
	for name, reqs := range map[string]map[string]ArrayRequest{"nil": nil, "empty": {}} {
		if err := c.Queue(reqs); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if resp, err := c.Allocate(context.Background()); resp != nil || !errors.Is(err, ErrNothingQueued) ||
			!strings.Contains(err.Error(), "Client.Queue") || !strings.Contains(err.Error(), "cubie") {
			t.Errorf("%s: Allocate after an empty Queue = %v, %v; want ErrNothingQueued saying to queue and what cubie does", name, resp, err)
		}
	}
	if got := h.got(); len(got) != 0 {
		t.Errorf("hooks called for an empty queue: %v", got)
	}
	_ = c.Close()
	if err := c.Queue(nil); !errors.Is(err, ErrClosed) {
		t.Errorf("Queue(nil) of a closed client = %v; want ErrClosed", err)
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
