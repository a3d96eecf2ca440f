package vram

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/vramkit/vram/account"
	"github.com/vramkit/vram/alloc"
	"github.com/vramkit/vram/device"
	"github.com/vramkit/vram/device/sim"
)

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

// A pinned host array that the pinned-memory limit refuses is an
// ErrOutOfMemory that says nothing about device memory: Allocate
// must not plan again for the device, nor free the device arrays being
// replaced (nor call OnInvalidate).
func TestHostOutOfMemoryIsNotDeviceOutOfMemory(t *testing.T) {
	dev := newSim(t, 64*MiB, func(c *sim.Config) { c.PinnedLimit = MiB })
	var armed atomic.Bool
	var other uint64
	m, err := New(dev, WithAllocatorChoice(account.Choice{Kind: Pool}), WithWrap(func(a alloc.Allocator) alloc.Allocator {
		return allocHook{a, func() {
			if armed.CompareAndSwap(true, false) {
				p, err := dev.Malloc(16 * MiB) // another user of the GPU
				if err != nil {
					panic(err)
				}
				other = uint64(p)
			}
		}}
	}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = m.Close()
		if other != 0 {
			_ = dev.Free(device.Ptr(other)) // the other user's, which the device check would count
		}
	})
	var inval atomic.Int32
	c, err := m.Register(ClientOptions{Name: "c", Group: "g", OnInvalidate: func(error) { inval.Add(1) }})
	if err != nil {
		t.Fatal(err)
	}
	x := req(Float32, 0, 1000, 5000) // ~19 MiB, chunkable
	if err := c.Queue(map[string]ArrayRequest{"x": x}); err != nil {
		t.Fatal(err)
	}
	r1, err := c.Allocate(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	old := r1.Arrays()["x"]
	armed.Store(true)
	err = c.Queue(map[string]ArrayRequest{
		"x": x,
		"s": fixed(Uint8, 4096),
		"p": {Shape: []int{2 * int(MiB)}, DType: Uint8, Memory: Pinned, Unchunkable: true},
	})
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.Allocate(context.Background())
	t.Logf("err: %v", err)
	if !errors.Is(err, ErrOutOfMemory) {
		t.Fatalf("want ErrOutOfMemory, got %v", err)
	}
	if old.Freed() || c.Arrays()["x"] != old {
		t.Errorf("the pinned-memory failure freed the device array being replaced (freed %v)", old.Freed())
	}
	if n := inval.Load(); n != 0 {
		t.Errorf("OnInvalidate called %d times for a pinned-memory failure", n)
	}
	if strings.Contains(err.Error(), "plan again") {
		t.Errorf("replanned device memory for a host-memory failure")
	}
	_ = other
}

// Replacing a pinned or mapped array with one of the same size, when it
// takes more than half of the pinned-memory limit: the new one does not
// fit beside the old one, so the old host array is freed and the
// allocation tried once more.
func TestReplacingAHostArrayAtItsLimit(t *testing.T) {
	for _, mem := range []MemoryType{Pinned, Mapped} {
		t.Run(mem.String(), func(t *testing.T) {
			dev := newSim(t, 64*MiB, func(c *sim.Config) { c.PinnedLimit = 4 * MiB })
			m, err := New(dev, WithAllocatorChoice(account.Choice{Kind: Direct}))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = m.Close() })
			c, _ := m.Register(ClientOptions{Name: "c", Group: "g"})
			h := map[string]ArrayRequest{"h": {Shape: []int{3 * int(MiB)}, DType: Uint8, Memory: mem, Unchunkable: true}}
			_ = c.Queue(h)
			if _, err := c.Allocate(context.Background()); err != nil {
				t.Fatal(err)
			}
			_ = c.Queue(h)
			if _, err := c.Allocate(context.Background()); err != nil {
				t.Errorf("replacing a 3 MiB %v array under a 4 MiB pinned limit: %v", mem, err)
			}
		})
	}
}
