package vram

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"regexp"
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

// TestAllocateFitsTheDevice: a plan Allocate makes fits the
// device. Random request sets are queued on managers over small
// simulated devices (2 MiB pages, a little memory already held by another
// group) so that the budget is tight; Allocate may refuse with a
// plan error, but never run out of memory while allocating what it
// planned.
func TestAllocateFitsTheDevice(t *testing.T) {
	for _, kind := range []AllocatorKind{Direct, AsyncPool, Pool} {
		t.Run(kind.String(), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(5, uint64(kind)))
			outcomes := map[string]int{}
			var replans uint64
			iters := 300
			if testing.Short() {
				iters = 80
			}
			for range iters {
				data := make([]byte, 4*(1+rng.IntN(10)))
				for i := range data {
					data[i] = byte(rng.Uint32())
				}
				reqs := decodeRequests(data, 1+rng.IntN(1<<uint(rng.IntN(22))))
				for _, labels := range reqs {
					for l, r := range labels {
						r.Memory = Device // host arrays would only cost time here
						labels[l] = r
					}
				}
				// A device around the size of the batch, so that it is
				// sometimes chunked and the plans are tight.
				full := float64(fullBytes(reqs, alloc.PoolGranularity))
				total := max(4*MiB, uint64(full*(0.2+rng.Float64()))&^(2*MiB-1))
				dev := newSim(t, total, func(c *sim.Config) { c.AddressOnly = true })
				m, err := New(dev, WithAllocatorChoice(account.Choice{Kind: kind}))
				if err != nil {
					t.Fatal(err)
				}
				// Another group holds a few arrays.
				other := register(t, m, ClientOptions{Group: "other"})
				held := map[string]ArrayRequest{}
				for i := range rng.IntN(4) {
					held[fmt.Sprint("h", i)] = fixed(Uint8, 1+rng.IntN(int(total/16)))
				}
				if len(held) > 0 {
					_ = other.Queue(held)
					if _, err := other.Allocate(context.Background()); err != nil && !errors.Is(err, ErrUnchunkable) {
						t.Fatalf("holding %v on %s: %v", held, units.Format(total), err)
					}
				}
				var cs []*Client
				for name, labels := range reqs {
					c := register(t, m, ClientOptions{Name: name, Group: "g"})
					cs = append(cs, c)
					if err := c.Queue(labels); err != nil {
						t.Fatal(err)
					}
				}
				k := 1 + rng.IntN(2)
				var resp *ArrayResponse
				if len(cs) > 0 {
					resp, err = cs[0].Allocate(context.Background(), WithBuffers(k))
				}
				switch {
				case errors.Is(err, ErrOutOfMemory):
					t.Errorf("%s device: a plan that fits ran out of memory: %v", units.Format(total), err)
					outcomes["out of memory"]++
				case errors.Is(err, ErrUnchunkable), errors.Is(err, ErrRunTooLarge), errors.Is(err, ErrRunsMismatch):
					outcomes["refused"]++
				case errors.Is(err, ErrNothingQueued):
					outcomes["nothing queued"]++
				case err != nil:
					t.Fatal(err)
				case resp.Plan.Chunks > 1:
					outcomes["chunked"]++
				default:
					outcomes["one chunk"]++
				}
				replans += m.replans.Load()
				if err := m.Close(); err != nil {
					t.Fatal(err)
				}
			}
			for _, o := range []string{"one chunk", "chunked", "refused"} {
				if outcomes[o] == 0 {
					t.Errorf("no case ended %q: %v", o, outcomes)
				}
			}
			t.Logf("%v; planned again %d times", outcomes, replans)
		})
	}
}

// pageCoster states costs as alloc.PageCost does, with no cap: the
// Pool's statement when small is its SmallSize.
type pageCoster struct{ gran, page, small uint64 }

func (p pageCoster) Cost(sizes []uint64) (uint64, bool) {
	return alloc.PageCost(sizes, p.gran, p.page, p.small), true
}

func (p pageCoster) Room() uint64 { return math.MaxUint64 }

// budgetOf is a Passive budget of free device bytes with the cost c (nil:
// an allocator that states none) at granularity gran on 2 MiB pages.
func budgetOf(free uint64, c alloc.Coster, gran uint64) groupBudget {
	return groupBudget{free: free, coster: c, gran: gran, page: 2 * MiB, kind: "the pool"}
}

// TestBudgetCost: what the budget counts for a set of arrays beyond their
// bytes (the page reserve) is what the allocator states, or a page each
// for one that states nothing.
func TestBudgetCost(t *testing.T) {
	const page, g = 2 * MiB, 512
	pool := pageCoster{g, page, MiB}
	async := pageCoster{g, page, page / 2}
	direct := pageCoster{page, page, 0}
	kib := func(n uint64) uint64 { return n * 1024 }
	rep := func(n int, s uint64) []uint64 {
		out := make([]uint64, n)
		for i := range out {
			out[i] = s
		}
		return out
	}
	for name, tc := range map[string]struct {
		c     alloc.Coster
		gran  uint64
		sizes []uint64
		want  uint64 // beyond the sizes
	}{
		"no arrays":                         {pool, g, nil, 0},
		"one granule takes a page":          {pool, g, []uint64{512}, page - 512},
		"eight small arrays share one page": {pool, g, rep(8, kib(4)), page - kib(32)},
		// 6 arrays of 256 KiB: every page but the last holds more than
		// 2 MiB − 1 MiB (no small array is larger than 1 MiB), so
		// ⌊1.5 MiB / 1 MiB⌋ + 1 = 2 pages; per array it would be 6.
		"small arrays, a few pages": {pool, g, rep(6, kib(256)), 2*page - 3*MiB/2},
		// Three 1 MiB arrays: K = 3 MiB / 1 MiB + 1 = 4 is not below 3, so
		// each is counted rounded to a page.
		"1 MiB arrays count a page each":   {pool, g, rep(3, MiB), 3 * MiB},
		"a large array rounds to its page": {pool, g, []uint64{3 * MiB}, MiB},
		"whole pages reserve nothing":      {pool, g, []uint64{4 * MiB, 10 * MiB}, 0},
		"large and small together":         {pool, g, []uint64{3 * MiB, kib(4), kib(4)}, MiB + page - kib(8)},
		"async: half a page is small":      {async, g, rep(8, kib(4)), page - kib(32)},
		"states nothing: a page each":      {nil, g, rep(8, kib(4)), 8 * (page - kib(4))},
		"direct rounds to pages itself":    {direct, page, rep(8, page), 0},
	} {
		t.Run(name, func(t *testing.T) {
			b := budgetOf(0, tc.c, tc.gran)
			var sum uint64
			for _, s := range tc.sizes {
				sum += s
			}
			if got := b.cost(tc.sizes) - sum; got != tc.want {
				t.Errorf("cost(%v) − bytes = %d (%s), want %d (%s)", tc.sizes, got, units.Format(got), tc.want, units.Format(tc.want))
			}
		})
	}
}

// TestPageReserveIsEnough allocates random arrays, in random order, as
// Allocate does (alloc.AllocExact), through the Pool and the
// simulator's stream-ordered pool, on a device with exactly their bytes
// plus the reserve free. Not one allocation may fail.
func TestPageReserveIsEnough(t *testing.T) {
	for name, mk := range map[string]func(*sim.Device) (alloc.Allocator, error){
		"pool":  func(d *sim.Device) (alloc.Allocator, error) { return alloc.NewPool(d, alloc.PoolConfig{}) },
		"async": func(d *sim.Device) (alloc.Allocator, error) { return alloc.NewAsyncPool(d, alloc.AsyncConfig{}) },
	} {
		t.Run(name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(11, 12))
			tight := 0
			for range 400 {
				sizes := make([]uint64, 1+rng.IntN(12))
				var sum uint64
				for i := range sizes {
					switch rng.IntN(3) {
					case 0: // small
						sizes[i] = uint64(1 + rng.IntN(int(MiB)))
					case 1: // around a page
						sizes[i] = uint64(int(MiB) + rng.IntN(int(2*MiB)))
					default: // a few pages
						sizes[i] = uint64(1 + rng.IntN(int(6*MiB)))
					}
					sizes[i] = roundUp(sizes[i], alloc.PoolGranularity)
					sum += sizes[i]
				}
				dev, err := sim.New(sim.Config{TotalBytes: 64 * MiB, NoContext: true, AddressOnly: true})
				if err != nil {
					t.Fatal(err)
				}
				a, err := mk(dev)
				if err != nil {
					t.Fatal(err)
				}
				need, _ := a.(alloc.Coster).Cost(sizes)
				if free, _, _ := dev.MemInfo(); need > free {
					_ = a.Close()
					_ = dev.Close()
					continue
				}
				// Take all but need bytes of the device.
				var ballast []device.Ptr
				if free, _, _ := dev.MemInfo(); free > need {
					left := free - need
					for left >= 2*MiB {
						p, err := dev.Malloc(2 * MiB)
						if err != nil {
							t.Fatal(err)
						}
						ballast = append(ballast, p)
						left -= 2 * MiB
					}
				}
				if free, _, _ := dev.MemInfo(); free-need < alloc.PoolGranularity {
					tight++
				}
				s := dev.DefaultStream()
				var live []device.Ptr
				for _, i := range rng.Perm(len(sizes)) {
					p, err := alloc.AllocExact(a, sizes[i], s)
					if err != nil {
						t.Fatalf("sizes %v (%s + %s reserve): alloc %d: %v", sizes, units.Format(sum), units.Format(need-sum), sizes[i], err)
					}
					live = append(live, p)
				}
				for _, p := range live {
					_ = a.Free(p, s)
				}
				_ = a.Close()
				for _, p := range ballast {
					_ = dev.Free(p)
				}
				if err := dev.Close(); err != nil {
					t.Fatal(err)
				}
			}
			if tight < 100 {
				t.Errorf("only %d cases left the device with exactly the bytes and the reserve free", tight)
			}
		})
	}
}

// TestSmallDeviceKeepsOnlyWhatThePagesNeed: the batch of `vram run` (four
// chunkable arrays, double buffered: eight device arrays) on an 8 MiB
// device. Keeping a page for each array would leave nothing to plan
// with; the arrays of a short chunk share one page, so the batch runs in
// chunks.
func TestSmallDeviceKeepsOnlyWhatThePagesNeed(t *testing.T) {
	m, _, _ := newManager(t, 8*MiB, WithAllocatorChoice(account.Choice{Kind: Pool}))
	in := register(t, m, ClientOptions{Name: "inputs", Group: "oscillators"})
	out := register(t, m, ClientOptions{Name: "outputs", Group: "oscillators"})
	const n, samples = 100_000, 50
	_ = in.Queue(map[string]ArrayRequest{
		"init":   req(Float32, 1, 2, n),
		"params": req(Float32, 1, 4, n),
	})
	_ = out.Queue(map[string]ArrayRequest{
		"trajectories": req(Float32, 2, samples, 2, n),
		"status":       req(Int32, 0, n),
	})
	resp, err := out.Allocate(context.Background(), WithBuffers(2))
	if err != nil {
		t.Fatal(err)
	}
	p := resp.Plan
	// 428 B per run, of which the trajectories take 400: at 5,000 runs a
	// chunk (20 chunks) they are 1.9 MiB, a page each once rounded, and
	// the six other arrays (140 KB) share one page: 2 × 2 + 2 = 6 MiB of
	// 8. At 5,264 runs (19 chunks) the trajectories pass 2 MiB and take
	// two pages each: 10 MiB. A page kept for each of the eight arrays
	// would have left nothing to plan with.
	if p.Chunks != 20 || p.ChunkLength != 5000 || p.Buffers != 2 {
		t.Errorf("%d chunks of %d runs, %d buffers; want 20 of 5000, 2", p.Chunks, p.ChunkLength, p.Buffers)
	}
	if f := free(t, m); f != 2*MiB {
		t.Errorf("%s left free on the device, want 8 − 6 = 2 MiB", units.Format(f))
	}
}

// TestBudgetErrorsNameTheFigures: when a batch cannot be planned,
// Allocate's error gives the device's free memory, the page reserve
// and why it is kept, the need, and what to change.
func TestBudgetErrorsNameTheFigures(t *testing.T) {
	for name, tc := range map[string]struct {
		opts    []Option
		prop    float64
		reqs    map[string]ArrayRequest
		is      error
		mention []string
	}{
		"page reserve on a small device": {
			opts: []Option{WithAllocatorChoice(account.Choice{Kind: Pool})},
			reqs: map[string]ArrayRequest{"k": fixed(Uint8, 7*int(MiB)), "x": req(Float32, 0, 1000)},
			is:   ErrUnchunkable,
			mention: []string{
				"unchunkable arrays need 7 MiB (8 MiB in whole device pages) but the budget is 8 MiB",
				"passive mode, budget 8 MiB: 8 MiB free on the device:",
				"10 MiB in all, with 3 MiB the allocator takes in whole device pages",
				"free device memory", "fewer, larger arrays",
			},
		},
		"a cap of 8 bytes": {
			opts: []Option{WithAllocatorChoice(account.Choice{Kind: Direct}), WithLimitMode(Active)},
			prop: 1e-6, // 8 MiB × 1e-6 = 8 B
			reqs: map[string]ArrayRequest{"x": req(Float32, 0, 1<<20)},
			is:   ErrRunTooLarge,
			mention: []string{
				"one run needs 2 MiB", "but the budget is 8 B", "at most 8 B under the group's caps (8 B, less 0 B its members hold)",
				"raise the members' proportions", "raise the budget by 2 MiB",
			},
		},
		"a budget of nothing says what one run needs": {
			opts: []Option{WithAllocatorChoice(account.Choice{Kind: Direct}), WithLimitMode(Active)},
			prop: 1e-9, // a cap of 0 B
			reqs: map[string]ArrayRequest{"x": req(Float32, 0, 1<<20)},
			is:   ErrUnchunkable,
			mention: []string{
				"the budget is 0 B, leaving no room for any run: one run of the chunked arrays needs 2 MiB (1 × 2 MiB per run)",
				"raise the budget by 2 MiB", "raise the members' proportions",
			},
		},
		"limit binds": {
			opts: []Option{WithAllocatorChoice(account.Choice{Kind: Direct}), WithWrap(func(a alloc.Allocator) alloc.Allocator { return alloc.NewLimit(a, 2*MiB) })},
			reqs: map[string]ArrayRequest{"k": fixed(Uint8, 3*int(MiB)), "x": req(Float32, 0, 1000)},
			is:   ErrUnchunkable,
			mention: []string{
				"unchunkable arrays need 4 MiB but the budget is 2 MiB",
				"at most 2 MiB under the allocation cap (2 MiB left)", "raise the allocation cap",
			},
		},
		"WithCap binds": {
			opts: []Option{WithAllocatorChoice(account.Choice{Kind: Direct}), WithCap(2 * MiB)},
			reqs: map[string]ArrayRequest{"k": fixed(Uint8, 3*int(MiB)), "x": req(Float32, 0, 1000)},
			is:   ErrUnchunkable,
			mention: []string{
				"unchunkable arrays need 4 MiB but the budget is 2 MiB",
				"at most 2 MiB under the allocation cap (2 MiB left)", "raise the allocation cap or free arrays under it",
			},
		},
	} {
		t.Run(name, func(t *testing.T) {
			m, _, _ := newManager(t, 8*MiB, tc.opts...)
			c := register(t, m, ClientOptions{Group: "g", Proportion: tc.prop})
			_ = c.Queue(tc.reqs)
			_, err := c.Allocate(context.Background())
			if !errors.Is(err, tc.is) {
				t.Fatalf("got %v, want %v", err, tc.is)
			}
			for _, s := range tc.mention {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error does not say %q:\n%v", s, err)
				}
			}
		})
	}
}

// onlyAlloc hides every method but the Allocator interface's, so that an
// allocator's exact growth (alloc.ExactGrower) is out of the manager's
// reach, as behind a wrapper that does not forward it.
type onlyAlloc struct{ alloc.Allocator }

// TestPoolGrowthPolicyIsPlannedAround: five 7 MiB arrays on 40 MiB. The
// plan fits with a page reserve (35 MiB + 5 × 1 MiB). Through the Pool's
// AllocExact each array takes a segment of 8 MiB and the batch is one
// chunk. Without it (a wrapper that hides it), the Pool's first tries take
// shared 20 MiB segments, two arrays each, and the fifth finds no room:
// Allocate gives the arrays back and plans again with what the pool
// took beyond the reserve kept back, so the batch is chunked and allocated.
func TestPoolGrowthPolicyIsPlannedAround(t *testing.T) {
	pool, err := alloc.Lookup(alloc.NamePool)
	if err != nil {
		t.Fatal(err)
	}
	segmentPool := account.ChoiceOf(pool)
	segmentPool.Configs.Pool = alloc.PoolConfig{GrowthDivisor: 4} // the default, stated
	for name, tc := range map[string]struct {
		opts    []Option
		replans uint64
		chunk   int
	}{
		// The segment Pool, whose growth this is.
		"exact growth":  {opts: []Option{WithAllocatorChoice(segmentPool)}, replans: 0, chunk: 1},
		"shared growth": {opts: []Option{WithAllocatorChoice(segmentPool), WithWrap(func(a alloc.Allocator) alloc.Allocator { return onlyAlloc{a} })}, replans: 1, chunk: 2},
	} {
		t.Run(name, func(t *testing.T) {
			m, _, _ := newManager(t, 40*MiB, tc.opts...)
			c := register(t, m, ClientOptions{Group: "g"})
			reqs := map[string]ArrayRequest{}
			for i := range 5 {
				reqs[fmt.Sprint("a", i)] = req(Uint8, 0, 7*int(MiB))
			}
			_ = c.Queue(reqs)
			resp, err := c.Allocate(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if m.replans.Load() != tc.replans || resp.Plan.Chunks != tc.chunk {
				t.Errorf("planned again %d times, %d chunks; want %d, %d", m.replans.Load(), resp.Plan.Chunks, tc.replans, tc.chunk)
			}
			if len(resp.Arrays()) != 5 || c.Held() != resp.Plan.BytesPerChunk {
				t.Errorf("%d arrays, %d bytes held, plan %d", len(resp.Arrays()), c.Held(), resp.Plan.BytesPerChunk)
			}
		})
	}
}

// TestPassiveGroupsPlanInTurn: two groups that each want most of the
// device allocate at once, many times. In Passive mode each may use the
// device's free memory; they must not both plan against the same.
func TestPassiveGroupsPlanInTurn(t *testing.T) {
	m, _, _ := newManager(t, 64*MiB)
	// Opted out of eviction, which would otherwise give one group the
	// other's idle memory (TestEvict).
	a := register(t, m, ClientOptions{Group: "a", NoEvict: true})
	b := register(t, m, ClientOptions{Group: "b", NoEvict: true})
	for range 30 {
		var wg sync.WaitGroup
		var ra, rb *ArrayResponse
		var ea, eb error
		_ = a.Queue(map[string]ArrayRequest{"x": req(Uint8, 0, 40*int(MiB))})
		_ = b.Queue(map[string]ArrayRequest{"x": req(Uint8, 0, 40*int(MiB))})
		wg.Go(func() { ra, ea = a.Allocate(context.Background()) })
		wg.Go(func() { rb, eb = b.Allocate(context.Background()) })
		wg.Wait()
		if ea != nil || eb != nil {
			t.Fatalf("a: %v; b: %v", ea, eb)
		}
		if sum := ra.Plan.BytesPerChunk + rb.Plan.BytesPerChunk; sum > 64*MiB || ra.Plan.Chunks+rb.Plan.Chunks != 3 {
			t.Fatalf("the groups planned %s together, %d and %d chunks", units.Format(sum), ra.Plan.Chunks, rb.Plan.Chunks)
		}
		if err := m.FreeAll(); err != nil {
			t.Fatal(err)
		}
	}
}

// refSizesAt lists the bytes of the device arrays of reqs at chunk
// length l with bufs buffers (chunkable ones once per buffer), unrounded.
func refSizesAt(reqs map[string]map[string]ArrayRequest, l, bufs int) []uint64 {
	var sizes []uint64
	for _, labels := range reqs {
		for _, r := range labels {
			if r.Memory != Device {
				continue
			}
			n := r.Bytes()
			if !refChunkable(r) {
				sizes = append(sizes, n)
				continue
			}
			for range bufs {
				sizes = append(sizes, n/uint64(r.Shape[r.ChunkAxis])*uint64(l))
			}
		}
	}
	return sizes
}

// checkPlanGroup checks planGroup against its promises: a plan's arrays
// cost what the allocator states within the device, their charged bytes
// fit the caps, the chunks follow Plan's rules, and one chunk fewer would
// not fit; a refusal means neither the whole batch nor one run at a time
// fits.
func checkPlanGroup(t *testing.T, reqs map[string]map[string]ArrayRequest, b groupBudget, opts PlanOptions) (outcome string) {
	t.Helper()
	p, err := planGroup(byClient(reqs), &b, opts)
	counted := min(b.capRoom(), b.limRoom())
	k := max(opts.Buffers, 1)
	fits := func(l, bufs int) bool {
		sizes := refSizesAt(reqs, l, bufs)
		c := b.cost(sizes)
		return c < math.MaxUint64 && c <= b.device() && b.charged(sizes) <= counted
	}
	if err != nil {
		if errors.Is(err, ErrRunsMismatch) || errors.Is(err, ErrInvalidRequest) || errors.Is(err, ErrNotSupported) {
			return "invalid"
		}
		if !errors.Is(err, ErrUnchunkable) && !errors.Is(err, ErrRunTooLarge) {
			t.Fatalf("planGroup: unexpected error %v", err)
		}
		p0, _ := Plan(reqs, math.MaxUint64, opts)
		if fits(p0.TotalRuns, 1) || (fits(1, k) && p0.TotalRuns > 1 && hasChunkable(reqs)) {
			t.Fatalf("refused (%v), but the batch or one run at a time fits", err)
		}
		return "refused"
	}
	if !fits(p.ChunkLength, p.Buffers) {
		t.Fatalf("plan of %d chunks of %d does not fit: cost %d of %d, charged %d of %d", p.Chunks, p.ChunkLength,
			b.cost(refSizesAt(reqs, p.ChunkLength, p.Buffers)), b.device(), p.BytesPerChunk, counted)
	}
	if c := p.Chunks - 1; c >= 1 {
		bufs := k
		if c == 1 {
			bufs = 1
		}
		if l := refCeil(p.TotalRuns, c); fits(l, bufs) {
			t.Fatalf("%d chunks of %d, but %d of %d fit", p.Chunks, p.ChunkLength, c, l)
		}
	}
	if p.Chunks > 1 && p.ChunkLength != refCeil(p.TotalRuns, p.Chunks) {
		t.Fatalf("%d chunks of %d for %d runs: not balanced", p.Chunks, p.ChunkLength, p.TotalRuns)
	}
	if p.Chunks == 1 {
		return "one chunk"
	}
	bufs := k
	if p.Chunks == 2 {
		bufs = 1
	}
	if b.charged(refSizesAt(reqs, refCeil(p.TotalRuns, p.Chunks-1), bufs)) <= min(counted, b.device()) {
		return "chunked, reserve binds"
	}
	return "chunked"
}

// hasChunkable reports whether reqs has a chunkable device request.
func hasChunkable(reqs map[string]map[string]ArrayRequest) bool {
	for _, labels := range reqs {
		for _, r := range labels {
			if r.Memory == Device && refChunkable(r) {
				return true
			}
		}
	}
	return false
}

func FuzzPlanGroup(f *testing.F) {
	f.Add([]byte{4, 1, 0x55, 2, 8, 2, 0xaa, 0x01, 1, 0, 3, 0x20}, uint32(1000), uint64(8<<20), uint64(1<<40), uint8(0), false)
	f.Add([]byte{0x44, 0x82, 0xff, 0x07, 0x01, 0x02, 0x03, 0x04}, uint32(65535), uint64(3<<20), uint64(1<<20), uint8(1), true)
	f.Fuzz(func(t *testing.T, data []byte, runs uint32, free, caps uint64, k uint8, async bool) {
		reqs := decodeRequests(data, int(runs%(1<<22))+1)
		c := pageCoster{alloc.PoolGranularity, 2 * MiB, MiB}
		if async {
			c.small = MiB
		}
		b := budgetOf(free%(1<<36), c, alloc.PoolGranularity)
		b.mode, b.caps = Active, caps%(1<<36)
		checkPlanGroup(t, reqs, b, PlanOptions{Granularity: alloc.PoolGranularity, Buffers: int(k%2) + 1})
	})
}

func TestPlanGroupProperties(t *testing.T) {
	rng := rand.New(rand.NewPCG(21, 22))
	outcomes := map[string]int{}
	for range 3000 {
		data := make([]byte, 4*(1+rng.IntN(12)))
		for i := range data {
			data[i] = byte(rng.Uint32())
		}
		reqs := decodeRequests(data, 1+rng.IntN(1<<uint(rng.IntN(21))))
		full := float64(fullBytes(reqs, alloc.PoolGranularity))
		b := budgetOf(uint64(rng.Float64()*1.5*full)+uint64(rng.IntN(6))*MiB, pageCoster{alloc.PoolGranularity, 2 * MiB, MiB}, alloc.PoolGranularity)
		if rng.IntN(3) == 0 {
			b.mode, b.caps = Active, uint64(rng.Float64()*1.5*full)
		}
		outcomes[checkPlanGroup(t, reqs, b, PlanOptions{Granularity: alloc.PoolGranularity, Buffers: 1 + rng.IntN(2)})]++
	}
	for _, o := range []string{"one chunk", "chunked", "chunked, reserve binds", "refused"} {
		if outcomes[o] == 0 {
			t.Errorf("no case ended %q: %v", o, outcomes)
		}
	}
	t.Logf("%v", outcomes)
}

// refSizes lists the allocator bytes of the device arrays plan allocates,
// from its chunked shapes (independently of sizesAt).
func refSizes(reqs map[string]map[string]ArrayRequest, plan ChunkPlan) []uint64 {
	var sizes []uint64
	for client, labels := range reqs {
		for label, r := range labels {
			if r.Memory != Device {
				continue
			}
			n, _ := elements(plan.ChunkedShapes[client][label])
			copies := 1
			if refChunkable(r) {
				copies = plan.Buffers
			}
			for range copies {
				sizes = append(sizes, refBytes(ArrayRequest{Shape: []int{int(n)}, DType: r.DType, Unchunkable: true}, 0, plan.Granularity).Uint64())
			}
		}
	}
	return sizes
}

// TestBudgetExplained: every figure of a budget appears in its
// explanation, and the advice follows what binds.
func TestBudgetExplained(t *testing.T) {
	pool := pageCoster{512, 2 * MiB, MiB}
	for name, tc := range map[string]struct {
		b      groupBudget
		says   []string
		advice []string
		not    []string
	}{
		"device binds, after a replan": {
			b: groupBudget{mode: Passive, free: 10 * MiB, replaced: MiB, lost: 3 * MiB, coster: pool, gran: 512, page: 2 * MiB, kind: "the pool", planReserve: 2 * MiB},
			says: []string{"passive mode, budget 8 MiB: 10 MiB free", "+ 1 MiB of arrays being replaced",
				"− 3 MiB that the pool took beyond what it was counted to take in an earlier try", "the plan's arrays take 2 MiB beyond their bytes as the pool gets its memory in 2 MiB device pages"},
			advice: []string{"free device memory", "fewer, larger arrays"},
			not:    []string{"caps", "cap ("},
		},
		"caps bind": {
			b:      groupBudget{mode: Active, free: 10 * MiB, caps: 8 * MiB, held: 5 * MiB, replaced: MiB, coster: pool, gran: 512, page: 2 * MiB},
			says:   []string{"active mode, budget 4 MiB", "at most 4 MiB under the group's caps (8 MiB, less 4 MiB its members hold)"},
			advice: []string{"raise the members' proportions"},
			not:    []string{"free device memory", "allocation cap"},
		},
		"cap binds": {
			b:      groupBudget{mode: Passive, free: 10 * MiB, capped: true, room: 2 * MiB, coster: pool, gran: 512, page: 2 * MiB},
			says:   []string{"budget 2 MiB", "at most 2 MiB under the allocation cap (2 MiB left)"},
			advice: []string{"raise the allocation cap or free arrays under it"},
			not:    []string{"free device memory", "proportions"},
		},
		"direct rounds to pages": {
			b:      groupBudget{mode: Passive, free: 4 * MiB, coster: pageCoster{2 * MiB, 2 * MiB, 0}, gran: 2 * MiB, page: 2 * MiB},
			says:   []string{"budget 4 MiB: 4 MiB free"},
			advice: []string{"use the Pool allocator", "rounds each array up to 2 MiB"},
			not:    []string{"fewer, larger"},
		},
	} {
		t.Run(name, func(t *testing.T) {
			b := tc.b
			b.budget, _ = b.planCost()
			got, adv := b.String(), b.advice()
			for _, s := range tc.says {
				if !strings.Contains(got, s) {
					t.Errorf("%q does not say %q", got, s)
				}
			}
			for _, s := range tc.advice {
				if !strings.Contains(adv, s) {
					t.Errorf("advice %q does not say %q", adv, s)
				}
			}
			for _, s := range tc.not {
				if strings.Contains(adv, s) {
					t.Errorf("advice %q says %q, which does not bind", adv, s)
				}
			}
		})
	}
}

// TestTinyBatchOnAFullDevice: three runs of a byte, with a page less
// 512 B free. The whole batch is one granule but needs a page of its own,
// and one run at a time takes no less: the error says so, and what to
// change.
func TestTinyBatchOnAFullDevice(t *testing.T) {
	reqs := map[string]map[string]ArrayRequest{"c": {"x": req(Uint8, 0, 3)}}
	for name, tc := range map[string]struct {
		buffers int
		is      error
		says    []string
	}{
		"double buffered": {2, ErrRunTooLarge, []string{"one run needs 2 MiB (unchunkable 0 B + 2 × 512 B per run, with 2 MiB the allocator takes in whole device pages) but the budget is 1.9 MiB", "raise the budget by 512 B, use fewer buffers in flight"}},
		// One run at a time still takes a page.
		"single buffered": {1, ErrRunTooLarge, []string{"one run needs 2 MiB", "but the budget is 1.9 MiB", "raise the budget by 512 B"}},
	} {
		t.Run(name, func(t *testing.T) {
			b := budgetOf(2*MiB-512, pageCoster{512, 2 * MiB, MiB}, 512)
			_, err := planGroup(byClient(reqs), &b, PlanOptions{Granularity: 512, Buffers: tc.buffers})
			if !errors.Is(err, tc.is) {
				t.Fatalf("got %v, want %v", err, tc.is)
			}
			for _, s := range tc.says {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("%v does not say %q", err, s)
				}
			}
		})
	}
}

// TestWithCapBoundsThePlan: a cap given to the manager reaches the
// planner as the room it leaves: a batch larger than the cap is chunked
// to fit it, and the arrays the manager holds never pass it.
func TestWithCapBoundsThePlan(t *testing.T) {
	for _, kind := range []AllocatorKind{Pool, Direct, AsyncPool} {
		t.Run(kind.String(), func(t *testing.T) {
			m, _, _ := newManager(t, 64*MiB, WithAllocatorChoice(account.Choice{Kind: kind}), WithCap(8*MiB))
			c := register(t, m, ClientOptions{})
			if err := c.Queue(map[string]ArrayRequest{"x": req(Float32, 0, 5<<20)}); err != nil { // 20 MiB
				t.Fatal(err)
			}
			resp, err := c.Allocate(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if resp.Plan.Chunks < 3 || c.Held() > 8*MiB {
				t.Errorf("%d chunks, %s held; want at least 3 chunks within the cap of 8 MiB", resp.Plan.Chunks, units.Format(c.Held()))
			}
			if _, ok := m.Account().Allocator().(*alloc.Limit); !ok {
				t.Errorf("the allocator is a %T, not capped by a Limit", m.Account().Allocator())
			}
		})
	}
}

// BenchmarkPlanGroup is Allocate's planning of the 1,000 arrays of
// BenchmarkPlanGroup on a device whose page reserve binds: one Plan
// against the pool's stated cost finds the fewest chunks that fit.
func BenchmarkPlanGroup(b *testing.B) {
	reqs := map[string]map[string]ArrayRequest{}
	for c := range 10 {
		labels := map[string]ArrayRequest{}
		for l := range 100 {
			r := ArrayRequest{Shape: []int{1 + l%7, 3, 100_000}, DType: Float32, ChunkAxis: 2}
			if l%10 == 0 {
				r = ArrayRequest{Shape: []int{64, 1 + l}, DType: Float64, Unchunkable: true}
			}
			labels[fmt.Sprintf("a%d", l)] = r
		}
		reqs[fmt.Sprintf("c%d", c)] = labels
	}
	opts := PlanOptions{Granularity: 512, Buffers: 2}
	budget := func() groupBudget {
		return budgetOf(2*units.GiB, pageCoster{512, 2 * units.MiB, units.MiB}, 512)
	}
	gb := budget()
	clients := byClient(reqs)
	p, err := planGroup(clients, &gb, opts)
	if first, _ := Plan(reqs, 2*units.GiB, opts); err != nil || p.Chunks <= first.Chunks {
		b.Fatalf("plan: %d chunks (Plan alone %d), %v", p.Chunks, first.Chunks, err)
	}
	b.ReportAllocs()
	for b.Loop() {
		gb := budget()
		if _, err := planGroup(clients, &gb, opts); err != nil {
			b.Fatal(err)
		}
	}
}

// TestBudgetWrittenOnce: an Allocate that fails for want of memory
// writes its budget, and the cap that bounds it, the same way where it
// says what bounds it and where the plan says it is too small (once
// "budget 1.3 MiB … but the budget is 1.2 MiB" for 1.28 MiB).
func TestBudgetWrittenOnce(t *testing.T) {
	m, _, _ := newManager(t, 64*MiB, WithCap(1342177)) // 1.28 MiB
	c := register(t, m, ClientOptions{})
	must(t, c.Queue(map[string]ArrayRequest{"x": {Shape: []int{1 << 20}, DType: Float32, Unchunkable: true}}))
	_, err := c.Allocate(context.Background())
	if !errors.Is(err, ErrUnchunkable) {
		t.Fatalf("Allocate: %v; want ErrUnchunkable", err)
	}
	var figures []string
	for _, m := range regexp.MustCompile(`(?:budget (?:is )?|at most |\()([0-9.]+ [KMG]?i?B)(?: under| left|:|,)`).FindAllStringSubmatch(err.Error(), -1) {
		figures = append(figures, m[1])
	}
	if len(figures) < 2 {
		t.Fatalf("the error writes the budget %d times: %v", len(figures), err)
	}
	for _, f := range figures[1:] {
		if f != figures[0] {
			t.Errorf("the budget is written as %q and as %q: %v", figures[0], f, err)
		}
	}
}

// TestBudgetErrorBound: the error of a group that does not fit says, as
// a BudgetError, what bounded its budget.
func TestBudgetErrorBound(t *testing.T) {
	tests := map[string]struct {
		opts  []Option
		share float64
		want  BudgetBound
	}{
		"the device":         {nil, 0, BoundDevice},
		"the allocation cap": {[]Option{WithCap(8 * MiB)}, 0, BoundCap},
		"the members' caps":  {[]Option{WithLimitMode(Active)}, 0.1, BoundCaps},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			m, _, _ := newManager(t, 64*MiB, tc.opts...)
			c := register(t, m, ClientOptions{Proportion: tc.share})
			must(t, c.Queue(map[string]ArrayRequest{"x": {Shape: []int{32 << 20}, DType: Float32, Unchunkable: true}}))
			_, err := c.Allocate(context.Background())
			var be *BudgetError
			if !errors.As(err, &be) || be.Bound != tc.want || be.Group != "default" {
				t.Fatalf("Allocate: %v (%+v); want a BudgetError bound by %d", err, be, tc.want)
			}
		})
	}
}

// TestActiveOwnCaps: in the Active mode each requester's arrays fit its
// own cap (less what it holds besides the arrays being replaced), not
// only the group's sum of caps: the group takes the chunk count the
// most bound member needs, and a member whose arrays cannot fit its cap
// however chunked fails the allocation, named. In the Passive mode caps
// bound nothing (as cubie's).
func TestActiveOwnCaps(t *testing.T) {
	const runs = 1 << 20
	for name, tc := range map[string]struct {
		mode    LimitMode
		buffers int
		a, b    ArrayRequest // a's cap is 32 MiB; b's 32 MiB, or bCap bytes
		aHeld   int          // a holds this much under another label first
		bCap    uint64
		notary  float64 // a third member's proportion (0: none), which queues nothing
		chunked bool
		wantErr error
		names   string // the member the error names
	}{
		"a member over its cap is chunked to it": {mode: Active, a: req(Uint8, 0, runs, 40), b: fixed(Uint8, int(MiB)), chunked: true},
		"what it holds counts":                   {mode: Active, a: req(Uint8, 0, runs, 24), b: fixed(Uint8, int(MiB)), aHeld: 16 * int(MiB), chunked: true},
		"double buffered":                        {mode: Active, buffers: 2, a: req(Uint8, 0, runs, 40), b: req(Uint8, 0, runs, 8), chunked: true},
		"fits its cap: whole":                    {mode: Active, a: req(Uint8, 0, runs, 30), b: fixed(Uint8, int(MiB))},
		"unchunkable over its own cap": {mode: Active, a: fixed(Uint8, 40*int(MiB)), b: fixed(Uint8, int(MiB)),
			wantErr: ErrUnchunkable, names: "a#"},
		// b fits its 600 B whole (one 512 B block) but not in two
		// buffers once a's cap chunks the group (whose sum of caps, with
		// the notary's, would take a's 50 MB whole).
		"a member that fits whole but not in the group's buffers": {mode: Active, buffers: 2,
			a: req(Uint8, 0, 500, 100_000), b: req(Uint8, 0, 500), bCap: 600, notary: 0.4, wantErr: ErrRunTooLarge, names: "b#"},
		"passive: caps bound nothing": {mode: Passive, a: req(Uint8, 0, runs, 40), b: fixed(Uint8, int(MiB))},
	} {
		t.Run(name, func(t *testing.T) {
			m, _, lb := newManager(t, 64*MiB, WithLimitMode(tc.mode), WithAllocatorChoice(account.Choice{Kind: Pool}))
			pb := 0.5
			if tc.bCap > 0 {
				pb = float64(tc.bCap) / float64(64*MiB)
			}
			a := register(t, m, ClientOptions{Name: "a", Group: "g", Proportion: 0.5})
			b := register(t, m, ClientOptions{Name: "b", Group: "g", Proportion: pb})
			if tc.notary > 0 {
				register(t, m, ClientOptions{Name: "n", Group: "g", Proportion: tc.notary})
			}
			if tc.aHeld > 0 {
				holdBytes(t, a, tc.aHeld)
			}
			if err := b.Queue(map[string]ArrayRequest{"y": tc.b}); err != nil {
				t.Fatal(err)
			}
			if err := a.Queue(map[string]ArrayRequest{"z": tc.a}); err != nil {
				t.Fatal(err)
			}
			resp, err := a.Allocate(t.Context(), WithBuffers(max(tc.buffers, 1)))
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) || !strings.Contains(err.Error(), tc.names) || !strings.Contains(err.Error(), "own cap") {
					t.Fatalf("got %v, want %v naming %s and its own cap", err, tc.wantErr, tc.names)
				}
				if a.Held() != uint64(tc.aHeld) || b.Held() != 0 {
					t.Errorf("a refused allocation left a holding %d, b %d", a.Held(), b.Held())
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if chunked := resp.Plan.Chunks > 1; chunked != tc.chunked {
				t.Errorf("%d chunks; want chunked %v", resp.Plan.Chunks, tc.chunked)
			}
			for _, c := range []*Client{a, b} {
				if over := c.Held() > c.Cap(); over != (tc.mode == Passive && c == a) {
					t.Errorf("%v holds %d of its cap %d", c, c.Held(), c.Cap())
				}
			}
			if strings.Contains(lb.String(), "95%") {
				t.Errorf("the manager warned of its own plan: %s", lb)
			}
		})
	}
}

// TestOwnCapsSkipClosedRequesters: a requester closed while its group is
// planned has no room read for it; the plan goes on without bounding it
// (its arrays are freed at install), rather than failing the group.
func TestOwnCapsSkipClosedRequesters(t *testing.T) {
	open, closed := &Client{name: "open", id: 1}, &Client{name: "closed", id: 2}
	reqs := map[*Client]map[string]ArrayRequest{open: {"x": req(Uint8, 0, 1000)}, closed: {"y": req(Uint8, 0, 1000)}}
	b := &groupBudget{mode: Active, budget: 1 << 20, own: map[*Client]ownRoom{open: {cap: 1 << 20, room: 1 << 20}}}
	p, err := planGroupOnce(reqs, b.budget, PlanOptions{})
	if err != nil {
		t.Fatal(err)
	}
	got, err := withinOwnCaps(reqs, b, PlanOptions{}, p)
	if err != nil || got.Chunks != 1 {
		t.Errorf("%+v, %v; want the plan as it was", got, err)
	}
}

// TestPlannedArraysFitALimitOfTheBudget allocates what each random plan
// says — the unchunkable arrays once, the chunkable ones at the chunk
// length once per buffer — through an alloc.Limit capped at the budget,
// over each allocator the manager uses. Not one allocation may fail: the
// planner counts bytes as the allocator spends them.
func TestPlannedArraysFitALimitOfTheBudget(t *testing.T) {
	for name, mk := range map[string]func(device.Device) (alloc.Allocator, error){
		"pool":   func(d device.Device) (alloc.Allocator, error) { return alloc.NewPool(d, alloc.PoolConfig{}) },
		"direct": func(d device.Device) (alloc.Allocator, error) { return alloc.NewDirect(d), nil },
		"async":  func(d device.Device) (alloc.Allocator, error) { return alloc.NewAsyncPool(d, alloc.AsyncConfig{}) },
	} {
		t.Run(name, func(t *testing.T) {
			dev := newSim(t, 64*units.GiB, func(c *sim.Config) { c.AddressOnly = true; c.Granularity = 64 * units.KiB })
			s, err := dev.NewStream()
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			rng := rand.New(rand.NewPCG(3, 4))
			planned := 0
			for iter := 0; planned < 150 && iter < 5000; iter++ {
				data := make([]byte, 4*(1+rng.IntN(10)))
				for i := range data {
					data[i] = byte(rng.Uint32())
				}
				reqs := decodeRequests(data, 1+rng.IntN(1<<uint(rng.IntN(18))))
				up, err := mk(dev)
				if err != nil {
					t.Fatal(err)
				}
				g := granularityOf(up)
				k := 1 + rng.IntN(2)
				budget := uint64(rng.Float64() * 1.1 * float64(fullBytes(reqs, g)+1))
				if budget > 4*units.GiB {
					up.Close()
					continue
				}
				p, err := Plan(reqs, budget, PlanOptions{Granularity: g, Buffers: k})
				if err != nil {
					up.Close()
					continue
				}
				planned++
				lim := alloc.NewLimit(up, budget)
				var live []device.Ptr
				for c, ls := range reqs {
					for l, r := range ls {
						if r.Memory != Device {
							continue
						}
						n := 1
						if r.Chunkable() {
							n = p.Buffers
						}
						shape := p.ChunkedShapes[c][l]
						elems, _ := elements(shape)
						for range n {
							ptr, err := lim.Alloc(elems*r.DType.Size(), s)
							if err != nil {
								t.Fatalf("plan %+v under a limit of its budget %s: alloc %s/%s %v: %v",
									p, units.Format(budget), c, l, shape, err)
							}
							live = append(live, ptr)
						}
					}
				}
				// A Granular allocator spends exactly what the plan counts;
				// others (the async pool) no more.
				if _, gr := up.(alloc.Granular); (gr && lim.Used() != p.BytesPerChunk) || lim.Used() > p.BytesPerChunk {
					t.Errorf("the limit counts %d bytes in use, the plan %d", lim.Used(), p.BytesPerChunk)
				}
				for _, ptr := range live {
					if err := lim.Free(ptr, s); err != nil {
						t.Fatal(err)
					}
				}
				if err := lim.Close(); err != nil && !errors.Is(err, alloc.ErrClosed) {
					t.Fatal(err)
				}
			}
			if planned < 100 {
				t.Fatalf("only %d plans succeeded", planned)
			}
		})
	}
}

// cachedBehindKernel sets up group "a" holding nothing but a cache: its
// client allocated n bytes, started a kernel that runs until released,
// and freed the array, so the allocator caches it with a's stream still
// to reach the free.
func cachedBehindKernel(t *testing.T, n int) (*Manager, *sim.Device, func()) {
	m, dev, _ := newManager(t, 64*MiB, WithAllocatorChoice(account.Choice{Kind: Pool}))
	a := register(t, m, ClientOptions{Name: "a", Group: "a"})
	must(t, a.Queue(map[string]ArrayRequest{"x": {Shape: []int{n}, DType: Uint8, Unchunkable: true}}))
	if _, err := a.Allocate(context.Background()); err != nil {
		t.Fatal(err)
	}
	release := longKernel(t, dev, a)
	must(t, a.Free("x"))
	if cachedOf(m) == 0 {
		t.Fatal("the allocator caches nothing after the free")
	}
	return m, dev, release
}

// TestAllocateDoesNotTrimWhenThePlanFits: while another group's kernel
// runs and the allocator caches memory that kernel's stream has still to
// reach, an Allocate whose plan fits the free memory returns without
// waiting for that kernel (it once trimmed the cache at every budget
// read, and the trim waited).
func TestAllocateDoesNotTrimWhenThePlanFits(t *testing.T) {
	m, _, release := cachedBehindKernel(t, 24<<20)
	b := register(t, m, ClientOptions{Name: "b", Group: "b"})
	must(t, b.Queue(map[string]ArrayRequest{"y": {Shape: []int{1 << 20}, DType: Uint8, Unchunkable: true}}))
	err := within(t, "an Allocate that fits", release, func() error {
		_, err := b.Allocate(context.Background())
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestAllocateTrimWaitsNoLongerThanItsContext: an Allocate that needs the
// cache given back trims it, and the trim waits for the other group's
// kernel; with a deadline it fails at the deadline, wrapping
// context.DeadlineExceeded, with its queue as it was, and once the kernel
// ends the same Allocate succeeds.
func TestAllocateTrimWaitsNoLongerThanItsContext(t *testing.T) {
	m, _, release := cachedBehindKernel(t, 40<<20)
	b := register(t, m, ClientOptions{Name: "b", Group: "b"})
	queued := map[string]ArrayRequest{"y": {Shape: []int{40 << 20}, DType: Uint8, Unchunkable: true}}
	must(t, b.Queue(queued))
	err := within(t, "an Allocate with a 200 ms deadline", release, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		defer cancel()
		_, err := b.Allocate(ctx)
		return err
	})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Allocate: %v; want it to fail at its deadline", err)
	}
	if q := b.Queued(); len(q) != 1 {
		t.Errorf("queue after the failed Allocate: %v; want y still queued", q)
	}
	release()
	if _, err := b.Allocate(context.Background()); err != nil {
		t.Fatalf("Allocate once the kernel ended: %v", err)
	}
}

// blockOnMemInfo is a simulator whose MemInfo, once armed, blocks the
// first call until released, telling entered.
type blockOnMemInfo struct {
	*sim.Device
	armed   atomic.Bool
	entered chan struct{}
	release chan struct{}
}

func (b *blockOnMemInfo) MemInfo() (free, total uint64, err error) {
	if b.armed.CompareAndSwap(true, false) {
		close(b.entered)
		<-b.release
	}
	return b.Device.MemInfo()
}

// An array freed (Client.Free) while Allocate reads its budget is
// counted once: it was once counted both as an array being replaced and
// in the device's free memory, so the plan took one chunk that did not
// fit.
func TestFreeDuringBudgetIsCountedOnce(t *testing.T) {
	bt := &blockOnMemInfo{Device: newSim(t, 64*MiB), entered: make(chan struct{}), release: make(chan struct{})}
	m, err := New(bt, WithAllocatorChoice(account.Choice{Kind: Direct}))
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	c := register(t, m, ClientOptions{})
	if err := c.Queue(map[string]ArrayRequest{"x": req(Float32, 0, 8<<20)}); err != nil { // 32 MiB
		t.Fatal(err)
	}
	if _, err := c.Allocate(context.Background()); err != nil {
		t.Fatal(err)
	}
	// x again, 80 MiB: 64 MiB are free once the old x goes, so two chunks.
	if err := c.Queue(map[string]ArrayRequest{"x": req(Float32, 0, 20<<20)}); err != nil {
		t.Fatal(err)
	}
	bt.armed.Store(true)
	done := make(chan struct{})
	var resp *ArrayResponse
	go func() {
		defer close(done)
		resp, err = c.Allocate(context.Background())
	}()
	<-bt.entered
	if err := c.Free("x"); err != nil {
		t.Fatal(err)
	}
	close(bt.release)
	<-done
	if err != nil {
		t.Fatalf("Allocate: %v", err)
	}
	if resp.Plan.Chunks != 2 {
		t.Errorf("%d chunks of %d, want 2 of %d", resp.Plan.Chunks, resp.Plan.ChunkLength, 10<<20)
	}
}
