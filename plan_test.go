package vram

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/big"
	"math/rand/v2"
	"regexp"
	"strings"
	"testing"

	"github.com/vramkit/vram/alloc"
	"github.com/vramkit/vram/internal/units"
)

// req is shorthand for a device request.
func req(dt DType, axis int, shape ...int) ArrayRequest {
	return ArrayRequest{Shape: shape, DType: dt, ChunkAxis: axis}
}

func fixed(dt DType, shape ...int) ArrayRequest {
	return ArrayRequest{Shape: shape, DType: dt, Unchunkable: true}
}

func one(label string, r ArrayRequest) map[string]map[string]ArrayRequest {
	return map[string]map[string]ArrayRequest{"c": {label: r}}
}

func TestChunkable(t *testing.T) {
	for name, tc := range map[string]struct {
		r    ArrayRequest
		want bool
	}{
		"axis 0":                {req(Float64, 0, 10, 3), true},
		"last axis":             {req(Float64, 1, 3, 10), true},
		"flagged unchunkable":   {ArrayRequest{Shape: []int{10}, DType: Float64, Unchunkable: true}, false},
		"no such axis":          {req(Float64, 2, 10, 3), false},
		"axis of length 1":      {req(Float64, 0, 1, 30), false},
		"negative axis":         {req(Float64, -1, 10, 3), false},
		"length 2 is chunkable": {req(Int32, 0, 2), true},
	} {
		t.Run(name, func(t *testing.T) {
			if got := tc.r.Chunkable(); got != tc.want {
				t.Errorf("Chunkable(%+v) = %v, want %v", tc.r, got, tc.want)
			}
		})
	}
}

// TestPlanRules checks each rule of the planner on a hand-worked case.
// Sizes use granularity 512 (the default) unless the case says otherwise.
func TestPlanRules(t *testing.T) {
	type want struct {
		chunks, length, last, runs, buffers int
		u, perChunk                         uint64
		shapes                              map[string]map[string][]int
	}
	for name, tc := range map[string]struct {
		reqs   map[string]map[string]ArrayRequest
		budget uint64
		opts   PlanOptions
		want   want
	}{
		// 1000 runs × 8 B = 8000 B → 8192 B rounded.
		"fits exactly: one chunk of N": {
			reqs: one("x", req(Float64, 0, 1000)), budget: 8192,
			want: want{chunks: 1, length: 1000, last: 1000, runs: 1000, buffers: 1, perChunk: 8192},
		},
		"fits with room to spare": {
			reqs: one("x", req(Float64, 0, 1000)), budget: 1 << 30,
			want: want{chunks: 1, length: 1000, last: 1000, runs: 1000, buffers: 1, perChunk: 8192},
		},
		"fits: double buffering is not needed for one chunk": {
			reqs: one("x", req(Float64, 0, 1000)), budget: 8192, opts: PlanOptions{Buffers: 2},
			want: want{chunks: 1, length: 1000, last: 1000, runs: 1000, buffers: 1, perChunk: 8192},
		},
		// One byte short: Lmax = largest L with roundup(8L, 512) ≤ 8191 → 8L ≤ 7680 → 960;
		// chunks = ⌈1000/960⌉ = 2, length = 500 (balanced, not 960 + 40).
		"one byte short: two balanced chunks": {
			reqs: one("x", req(Float64, 0, 1000)), budget: 8191,
			want: want{chunks: 2, length: 500, last: 500, runs: 1000, buffers: 1, perChunk: 4096},
		},
		// Lmax = 4096/8 = 512 at 512 B granules → chunks 2, length 500.
		"half the memory": {
			reqs: one("x", req(Float64, 0, 1000)), budget: 4096,
			want: want{chunks: 2, length: 500, last: 500, runs: 1000, buffers: 1, perChunk: 4096},
		},
		"granularity 1: Lmax 4 of 10 runs": {
			reqs: one("x", req(Uint8, 0, 10)), budget: 4, opts: PlanOptions{Granularity: 1},
			want: want{chunks: 3, length: 4, last: 2, runs: 10, buffers: 1, perChunk: 4},
		},
		"granularity 1: Lmax 9 of 10 runs gives 5 + 5, not 9 + 1": {
			reqs: one("x", req(Uint8, 0, 10)), budget: 9, opts: PlanOptions{Granularity: 1},
			want: want{chunks: 2, length: 5, last: 5, runs: 10, buffers: 1, perChunk: 5},
		},
		// U = 100, C(L) = 4L (granularity 1), everything = 900; budget 600:
		// k=2: 100 + 8L ≤ 600 → L = 62 → chunks ⌈200/62⌉ = 4, length 50.
		"double buffering shares the budget": {
			reqs: map[string]map[string]ArrayRequest{"c": {
				"fixed": fixed(Uint8, 100), "x": req(Float32, 0, 200),
			}},
			budget: 600, opts: PlanOptions{Granularity: 1, Buffers: 2},
			want: want{chunks: 4, length: 50, last: 50, runs: 200, buffers: 2, u: 100, perChunk: 100 + 2*200},
		},
		"unchunkable arrays take their share first": {
			reqs: map[string]map[string]ArrayRequest{"c": {
				"fixed": fixed(Uint8, 100), "x": req(Float32, 0, 200),
			}},
			budget: 500, opts: PlanOptions{Granularity: 1},
			want: want{chunks: 2, length: 100, last: 100, runs: 200, buffers: 1, u: 100, perChunk: 500},
		},
		"chunk axis in the middle, shapes follow the chunk length": {
			reqs: map[string]map[string]ArrayRequest{
				"a": {"out": req(Float32, 2, 5, 2, 100), "p": req(Float32, 1, 4, 100)},
				"b": {"status": req(Int32, 0, 100), "k": fixed(Float64, 3, 3)},
			},
			// per run: 5·2·4 + 4·4 + 4 = 60 B; U = 72; budget 72 + 60·25 → 4 chunks of 25.
			budget: 72 + 60*25, opts: PlanOptions{Granularity: 1},
			want: want{chunks: 4, length: 25, last: 25, runs: 100, buffers: 1, u: 72, perChunk: 72 + 60*25,
				shapes: map[string]map[string][]int{
					"a": {"out": {5, 2, 25}, "p": {4, 25}},
					"b": {"status": {25}, "k": {3, 3}},
				}},
		},
		"N is the largest TotalRuns when nothing is chunkable": {
			reqs: map[string]map[string]ArrayRequest{"c": {
				"a": {Shape: []int{4}, DType: Float64, Unchunkable: true, TotalRuns: 7},
				"b": {Shape: []int{4}, DType: Float64, Unchunkable: true, TotalRuns: 30},
			}},
			budget: 1 << 20,
			want:   want{chunks: 1, length: 30, last: 30, runs: 30, buffers: 1, u: 1024, perChunk: 1024},
		},
		"TotalRuns of chunkable requests wins over unchunkable ones": {
			reqs: map[string]map[string]ArrayRequest{"c": {
				"a": {Shape: []int{4}, DType: Float64, Unchunkable: true, TotalRuns: 99},
				"b": {Shape: []int{12}, DType: Float64, TotalRuns: 12},
			}},
			budget: 1 << 20,
			want:   want{chunks: 1, length: 12, last: 12, runs: 12, buffers: 1, u: 512, perChunk: 1024},
		},
		"axis of length 1 counts as unchunkable": {
			reqs: map[string]map[string]ArrayRequest{"c": {
				"one": req(Float64, 0, 1, 64), "x": req(Float64, 0, 50),
			}},
			budget: 512 + 200, opts: PlanOptions{Granularity: 1},
			want: want{chunks: 2, length: 25, last: 25, runs: 50, buffers: 1, u: 512, perChunk: 512 + 200},
		},
		"host requests are chunked but do not spend the budget": {
			reqs: map[string]map[string]ArrayRequest{"c": {
				"x":    req(Float64, 0, 1000),
				"host": {Shape: []int{1000, 4}, DType: Float64, Memory: Pinned},
			}},
			budget: 4096,
			want: want{chunks: 2, length: 500, last: 500, runs: 1000, buffers: 1, perChunk: 4096,
				shapes: map[string]map[string][]int{"c": {"x": {500}, "host": {500, 4}}}},
		},
		"no requests: one empty chunk": {
			reqs: map[string]map[string]ArrayRequest{}, budget: 0,
			want: want{chunks: 1, length: 0, last: 0, runs: 0, buffers: 1},
		},
		"rounding: 100 B takes a 512 B granule": {
			reqs: one("x", fixed(Uint8, 100)), budget: 512,
			want: want{chunks: 1, length: 0, last: 0, runs: 0, buffers: 1, u: 512, perChunk: 512},
		},
	} {
		t.Run(name, func(t *testing.T) {
			p, err := Plan(tc.reqs, tc.budget, tc.opts)
			if err != nil {
				t.Fatalf("Plan: %v", err)
			}
			w := tc.want
			if p.Chunks != w.chunks || p.ChunkLength != w.length || p.LastChunkLength != w.last ||
				p.TotalRuns != w.runs || p.Buffers != w.buffers {
				t.Errorf("chunks/length/last/runs/buffers = %d/%d/%d/%d/%d, want %d/%d/%d/%d/%d",
					p.Chunks, p.ChunkLength, p.LastChunkLength, p.TotalRuns, p.Buffers,
					w.chunks, w.length, w.last, w.runs, w.buffers)
			}
			if p.UnchunkableBytes != w.u && w.u != 0 {
				t.Errorf("UnchunkableBytes = %d, want %d", p.UnchunkableBytes, w.u)
			}
			if w.perChunk != 0 && p.BytesPerChunk != w.perChunk {
				t.Errorf("BytesPerChunk = %d, want %d", p.BytesPerChunk, w.perChunk)
			}
			if p.BytesPerChunk > tc.budget {
				t.Errorf("BytesPerChunk %d over budget %d", p.BytesPerChunk, tc.budget)
			}
			for c, labels := range w.shapes {
				for l, s := range labels {
					if got := p.ChunkedShapes[c][l]; fmt.Sprint(got) != fmt.Sprint(s) {
						t.Errorf("shape %s/%s = %v, want %v", c, l, got, s)
					}
				}
			}
			checkPlan(t, tc.reqs, tc.budget, tc.opts, p, nil)
		})
	}
}

func TestPlanErrors(t *testing.T) {
	for name, tc := range map[string]struct {
		reqs    map[string]map[string]ArrayRequest
		budget  uint64
		opts    PlanOptions
		is      error
		mention []string // figures and names the message must carry
		never   []string // advice it must not give
	}{
		"nothing chunkable": {
			reqs: one("x", fixed(Float64, 1024)), budget: 4096,
			is: ErrUnchunkable, mention: []string{"8 KiB", "4 KiB", "none of them can be chunked"},
		},
		"unchunkable bytes fill the budget exactly": {
			reqs:   map[string]map[string]ArrayRequest{"c": {"k": fixed(Uint8, 4096), "x": req(Float64, 0, 100)}},
			budget: 4096, is: ErrUnchunkable, mention: []string{"unchunkable arrays need 4 KiB", "budget is 4 KiB"},
		},
		"unchunkable bytes over the budget": {
			reqs:   map[string]map[string]ArrayRequest{"c": {"k": fixed(Uint8, 5000), "x": req(Float64, 0, 100)}},
			budget: 4096, is: ErrUnchunkable, mention: []string{"5 KiB", "4 KiB"},
		},
		"one run does not fit": {
			reqs:   map[string]map[string]ArrayRequest{"c": {"k": fixed(Uint8, 100), "x": req(Float64, 1, 64, 100)}},
			budget: 600, opts: PlanOptions{Granularity: 1},
			is: ErrRunTooLarge, mention: []string{"one run needs 612 B", "100 B", "1 × 512 B", "budget is 600 B", "raise the budget by 12 B"},
		},
		// Past the whole device (DeviceBytes), no budget helps: the hint
		// says to shrink, by how much, and nothing of the caller's.
		// 1024 × 8 B = 8 KiB against a device of 6000 B: 2,192 B more →
		// 2.2 KiB rounded up; 6000 B → 5.8 KiB rounded down.
		"nothing chunkable, past the device": {
			reqs: one("x", fixed(Float64, 1024)), budget: 4096, opts: PlanOptions{DeviceBytes: 6000, more: func() string { return "free memory" }},
			is: ErrUnchunkable, mention: []string{"or shrink them: that is 2.2 KiB more than the device's 5.8 KiB in all"},
			never: []string{"raise the budget", "free memory"},
		},
		// 5000 B → 5,120 B + one run's 512 B = 5,632 B: 1,536 B past 4 KiB.
		"fixed inputs past the device": {
			reqs:   map[string]map[string]ArrayRequest{"c": {"k": fixed(Uint8, 5000), "x": req(Float64, 0, 100)}},
			budget: 4096, opts: PlanOptions{DeviceBytes: 4096},
			is: ErrUnchunkable, mention: []string{"make the large fixed inputs chunkable or shrink them: that is 1.5 KiB more than the device's 4 KiB in all"},
			never: []string{"raise the budget"},
		},
		"one run past the device": {
			reqs:   map[string]map[string]ArrayRequest{"c": {"k": fixed(Uint8, 100), "x": req(Float64, 1, 64, 100)}},
			budget: 600, opts: PlanOptions{Granularity: 1, DeviceBytes: 600},
			is: ErrRunTooLarge, mention: []string{"make more of the fixed arrays chunkable or make the per-run arrays smaller: that is 12 B more than the device's 600 B in all"},
			never: []string{"raise the budget"},
		},
		"one run within the device": {
			reqs:   map[string]map[string]ArrayRequest{"c": {"k": fixed(Uint8, 100), "x": req(Float64, 1, 64, 100)}},
			budget: 600, opts: PlanOptions{Granularity: 1, DeviceBytes: 1 << 30},
			is: ErrRunTooLarge, mention: []string{"raise the budget by 12 B"},
		},
		"one run fits single but not double buffered": {
			reqs:   map[string]map[string]ArrayRequest{"c": {"x": req(Float64, 1, 64, 100)}},
			budget: 1000, opts: PlanOptions{Granularity: 1, Buffers: 2},
			is: ErrRunTooLarge, mention: []string{"one run needs 1 KiB", "2 × 512 B", "fewer buffers"},
		},
		"chunkable requests disagree on runs": {
			reqs: map[string]map[string]ArrayRequest{
				"a": {"x": req(Float64, 0, 100)},
				"b": {"y": req(Float64, 0, 200), "z": req(Float64, 1, 3, 200)},
			},
			budget: 1 << 20, is: ErrRunsMismatch, mention: []string{"100 runs: a/x", "200 runs: b/y, b/z"},
		},
		"invalid request": {
			reqs: one("x", req(Float64, 0, 0, 4)), budget: 1 << 20,
			is: ErrInvalidRequest, mention: []string{"c/x", "dimension 0 is 0"},
		},
		"managed memory": {
			reqs:   one("x", ArrayRequest{Shape: []int{4}, DType: Float64, Memory: Managed}),
			budget: 1 << 20, is: ErrNotSupported, mention: []string{"managed"},
		},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := Plan(tc.reqs, tc.budget, tc.opts)
			if !errors.Is(err, tc.is) {
				t.Fatalf("Plan error = %v, want %v", err, tc.is)
			}
			for _, s := range tc.mention {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error %q does not mention %q", err, s)
				}
			}
			for _, s := range tc.never {
				if strings.Contains(err.Error(), s) {
					t.Errorf("error %q says %q", err, s)
				}
			}
			var pe *PlanError
			if errors.Is(tc.is, ErrUnchunkable) || errors.Is(tc.is, ErrRunTooLarge) {
				if !errors.As(err, &pe) || pe.Budget != tc.budget || pe.Need <= tc.budget {
					t.Errorf("want a *PlanError with Budget %d and Need above it, got %#v", tc.budget, pe)
				}
			}
			checkPlan(t, tc.reqs, tc.budget, tc.opts, ChunkPlan{}, err)
		})
	}
}

func TestPlanIsPureAndJSON(t *testing.T) {
	reqs := map[string]map[string]ArrayRequest{
		"a": {"x": req(Float32, 2, 3, 2, 1000), "k": fixed(Float64, 10)},
		"b": {"s": req(Int32, 0, 1000)},
	}
	p1, err := Plan(reqs, 20000, PlanOptions{})
	if err != nil {
		t.Fatal(err)
	}
	p2, _ := Plan(reqs, 20000, PlanOptions{})
	j1, _ := json.Marshal(p1)
	j2, _ := json.Marshal(p2)
	if string(j1) != string(j2) {
		t.Errorf("two plans of the same input differ:\n%s\n%s", j1, j2)
	}
	if reqs["a"]["x"].Shape[2] != 1000 {
		t.Errorf("Plan changed its input: %v", reqs["a"]["x"].Shape)
	}
	var back ChunkPlan
	if err := json.Unmarshal(j1, &back); err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{`"chunks":`, `"chunk_length":`, `"total_runs":`, `"chunked_shapes":{"a":{`, `"bytes_per_chunk":`} {
		if !strings.Contains(string(j1), key) {
			t.Errorf("JSON %s lacks %s", j1, key)
		}
	}
	if back.Chunks != p1.Chunks || back.ChunkedShapes["a"]["x"][2] != p1.ChunkLength {
		t.Errorf("JSON round trip: %+v, want %+v", back, p1)
	}
	for i := range p1.Chunks {
		start, n, err := p1.Chunk(i)
		if err != nil || start != i*p1.ChunkLength || n < 1 || start+n > p1.TotalRuns {
			t.Errorf("Chunk(%d) = %d, %d, %v", i, start, n, err)
		}
		if sp, err := p1.Span(i, 2); err != nil || sp.Axis != 2 || sp.Start != start || sp.Len != n {
			t.Errorf("Span(%d, 2) = %+v, %v", i, sp, err)
		}
	}
	// A plan with nothing chunkable has one chunk and no runs: its span
	// would copy nothing, so it is an error too.
	whole, err := Plan(map[string]map[string]ArrayRequest{"c": {"t": {Shape: []int{10}, DType: Float32, Unchunkable: true}}}, MiB, PlanOptions{})
	if err != nil || whole.Chunks != 1 || whole.TotalRuns != 0 {
		t.Fatalf("plan of an unchunkable request: %+v, %v; want 1 chunk of no runs", whole, err)
	}
	if sp, err := whole.Span(0, 0); !errors.Is(err, ErrChunkRange) || !strings.Contains(err.Error(), "ToDevice") {
		t.Errorf("Span(0, 0) of a plan with no runs = %+v, %v; want ErrChunkRange saying to copy whole arrays", sp, err)
	}
	for _, i := range []int{-1, p1.Chunks} {
		if s, n, err := p1.Chunk(i); !errors.Is(err, ErrChunkRange) {
			t.Errorf("Chunk(%d) of %d = %d, %d, %v; want ErrChunkRange", i, p1.Chunks, s, n, err)
		}
		if sp, err := p1.Span(i, 2); !errors.Is(err, ErrChunkRange) {
			t.Errorf("Span(%d, 2) of %d = %+v, %v; want ErrChunkRange", i, p1.Chunks, sp, err)
		}
	}
}

// refBytes is bytes(r, L) computed independently, in big integers.
func refBytes(r ArrayRequest, length int, g uint64) *big.Int {
	n := big.NewInt(int64(r.DType.Size()))
	for i, d := range r.Shape {
		if i == r.ChunkAxis && refChunkable(r) {
			d = length
		}
		n.Mul(n, big.NewInt(int64(d)))
	}
	gg := new(big.Int).SetUint64(g)
	n.Add(n, new(big.Int).Sub(gg, big.NewInt(1)))
	n.Div(n, gg)
	return n.Mul(n, gg)
}

func refChunkable(r ArrayRequest) bool {
	return !r.Unchunkable && r.ChunkAxis >= 0 && r.ChunkAxis < len(r.Shape) && r.Shape[r.ChunkAxis] > 1
}

// checkPlan checks Plan's result (p, err) for reqs against the rules,
// computed again here from scratch.
func checkPlan(t *testing.T, reqs map[string]map[string]ArrayRequest, budget uint64, opts PlanOptions, p ChunkPlan, err error) {
	t.Helper()
	g := opts.Granularity
	if g == 0 {
		g = 512
	}
	k := max(opts.Buffers, 1)
	for c, ls := range reqs {
		for l, r := range ls {
			if verr := r.Validate(); verr != nil {
				if err == nil {
					t.Fatalf("request %s/%s is invalid (%v) but Plan accepted it", c, l, verr)
				}
				return
			}
		}
	}
	n, maxRuns, chunkDev, agree := -1, 0, 0, true
	for _, ls := range reqs {
		for _, r := range ls {
			if refChunkable(r) {
				runs := r.Shape[r.ChunkAxis]
				if n >= 0 && runs != n {
					agree = false
				}
				n = runs
				if r.Memory == Device {
					chunkDev++
				}
			} else {
				maxRuns = max(maxRuns, r.TotalRuns)
			}
		}
	}
	if !agree {
		if !errors.Is(err, ErrRunsMismatch) {
			t.Fatalf("runs disagree; want ErrRunsMismatch, got %v", err)
		}
		return
	}
	if n < 0 {
		n = maxRuns
	}
	cost := func(length int) (u, c *big.Int) {
		u, c = new(big.Int), new(big.Int)
		for _, ls := range reqs {
			for _, r := range ls {
				if r.Memory != Device {
					continue
				}
				if refChunkable(r) {
					c.Add(c, refBytes(r, length, g))
				} else {
					u.Add(u, refBytes(r, 0, g))
				}
			}
		}
		return u, c
	}
	fits := func(length, k int) bool {
		u, c := cost(length)
		c.Mul(c, big.NewInt(int64(k)))
		u.Add(u, c)
		// A sum of 2⁶⁴−1 bytes or more never fits (Plan's saturated
		// figures stand for any larger one).
		return u.Cmp(new(big.Int).SetUint64(budget)) <= 0 && u.Cmp(new(big.Int).SetUint64(math.MaxUint64)) < 0
	}
	B := new(big.Int).SetUint64(budget)
	u, _ := cost(1)
	switch {
	case fits(n, 1):
		if err != nil {
			t.Fatalf("everything fits but Plan failed: %v", err)
		}
		if p.Chunks != 1 || p.ChunkLength != n || p.Buffers != 1 {
			t.Fatalf("everything fits: want 1 chunk of %d, got %d of %d (buffers %d)", n, p.Chunks, p.ChunkLength, p.Buffers)
		}
	case chunkDev == 0 || u.Cmp(B) >= 0:
		if !errors.Is(err, ErrUnchunkable) {
			t.Fatalf("want ErrUnchunkable (chunkable %d, U %v, B %d), got %v", chunkDev, u, budget, err)
		}
		return
	case !fits(1, k):
		if !errors.Is(err, ErrRunTooLarge) {
			t.Fatalf("want ErrRunTooLarge, got %v", err)
		}
		return
	default:
		if err != nil {
			t.Fatalf("a plan exists but Plan failed: %v", err)
		}
		if uint64(p.Chunks)*uint64(p.ChunkLength) < uint64(n) {
			t.Fatalf("chunks × length = %d × %d < N = %d", p.Chunks, p.ChunkLength, n)
		}
		if !fits(p.ChunkLength, k) {
			t.Fatalf("plan of %d chunks of %d does not fit %d with %d buffers", p.Chunks, p.ChunkLength, budget, k)
		}
		if p.Chunks > 1 && uint64(p.Chunks-1)*uint64(p.ChunkLength) >= uint64(n) {
			t.Fatalf("last chunk is empty: %d chunks of %d for N = %d", p.Chunks, p.ChunkLength, n)
		}
		if p.ChunkLength != refCeil(n, p.Chunks) {
			t.Fatalf("chunk length %d is not balanced: ⌈%d/%d⌉ = %d", p.ChunkLength, n, p.Chunks, refCeil(n, p.Chunks))
		}
		// One chunk fewer never fits.
		if fewer := p.Chunks - 1; fewer == 1 {
			if fits(n, 1) {
				t.Fatalf("one chunk fits but the plan has %d", p.Chunks)
			}
		} else if fewer > 1 && fits(refCeil(n, fewer), k) {
			t.Fatalf("%d chunks of %d would fit, but the plan has %d", fewer, refCeil(n, fewer), p.Chunks)
		}
		if p.Buffers != k {
			t.Fatalf("buffers = %d, want %d", p.Buffers, k)
		}
	}
	// What the plan says it spends is what the rules count.
	uu, cc := cost(p.ChunkLength)
	want := new(big.Int).Add(uu, cc.Mul(cc, big.NewInt(int64(p.Buffers))))
	if want.Cmp(new(big.Int).SetUint64(p.BytesPerChunk)) != 0 {
		t.Fatalf("BytesPerChunk = %d, rules say %v", p.BytesPerChunk, want)
	}
	if p.BytesPerChunk > budget {
		t.Fatalf("BytesPerChunk %d over budget %d", p.BytesPerChunk, budget)
	}
	if p.TotalRuns != n {
		t.Fatalf("TotalRuns = %d, want %d", p.TotalRuns, n)
	}
	if p.LastChunkLength != n-(p.Chunks-1)*p.ChunkLength {
		t.Fatalf("LastChunkLength = %d for %d chunks of %d, N = %d", p.LastChunkLength, p.Chunks, p.ChunkLength, n)
	}
	for c, ls := range reqs {
		for l, r := range ls {
			got := p.ChunkedShapes[c][l]
			if len(got) != len(r.Shape) {
				t.Fatalf("shape %s/%s = %v for %v", c, l, got, r.Shape)
			}
			for i := range got {
				want := r.Shape[i]
				if refChunkable(r) && i == r.ChunkAxis {
					want = p.ChunkLength
				}
				if got[i] != want {
					t.Fatalf("shape %s/%s = %v, want axis %d = %d", c, l, got, i, want)
				}
			}
		}
	}
}

// refCeil is ⌈n/d⌉ computed in 128 bits, for n up to MaxInt64.
func refCeil(n, d int) int {
	q := new(big.Int).Add(big.NewInt(int64(n)), big.NewInt(int64(d-1)))
	return int(q.Quo(q, big.NewInt(int64(d))).Int64())
}

// decodeRequests turns bytes into a request set of up to 48 requests over
// three clients, every 4 bytes one request; runs is N. Dimensions other
// than the chunk axis are odd, 1..25; the two high bits of byte 1 and bit
// 6 of byte 0 set give a chunkable request N+1 runs, so that runs
// sometimes disagree.
func decodeRequests(data []byte, runs int) map[string]map[string]ArrayRequest {
	reqs := map[string]map[string]ArrayRequest{}
	for i := 0; i+4 <= len(data) && i < 48*4; i += 4 {
		b := data[i : i+4]
		client := fmt.Sprintf("c%d", b[0]%3)
		rank := int(b[0]>>2)%3 + 1
		axis := int(b[1]&0x7f) % (rank + 1) // rank: no such axis
		shape := make([]int, rank)
		for d := range shape {
			shape[d] = int(b[2]>>(2*d))%4*int(b[2]>>6+1)*2 + 1
		}
		r := ArrayRequest{
			DType:       DType(b[3]%8 + 1),
			Unchunkable: b[3]&0x80 != 0,
			Memory:      [4]MemoryType{Device, Device, Pinned, Mapped}[(b[3]>>4)&3],
			ChunkAxis:   axis,
		}
		if axis < rank {
			shape[axis] = runs
			if b[1]&0xc0 == 0xc0 && b[0]&0x40 != 0 {
				shape[axis] = runs + 1
			}
			if !r.Unchunkable {
				r.TotalRuns = shape[axis]
			}
		}
		if r.Unchunkable || axis == rank {
			r.TotalRuns = int(b[1]) * 3
		}
		r.Shape = shape
		if reqs[client] == nil {
			reqs[client] = map[string]ArrayRequest{}
		}
		reqs[client][fmt.Sprintf("l%d", i/4)] = r
	}
	return reqs
}

// fullBytes is U + C(N) at granularity g (for picking budgets near it).
func fullBytes(reqs map[string]map[string]ArrayRequest, g uint64) uint64 {
	var total uint64
	for _, ls := range reqs {
		for _, r := range ls {
			if r.Memory == Device {
				total += refBytes(r, r.Runs(), g).Uint64()
			}
		}
	}
	return total
}

// TestPlanProperties checks the rules on thousands of random request
// sets and budgets: every plan fits its budget, chunks × length ≥ N, one
// chunk fewer never fits, chunks are balanced, and each error is the one
// the rules call for.
func TestPlanProperties(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	iters := 4000
	if testing.Short() {
		iters = 500
	}
	outcomes := map[string]int{}
	for range iters {
		data := make([]byte, 4*(1+rng.IntN(12)))
		for i := range data {
			data[i] = byte(rng.Uint32())
		}
		runs := 1 + rng.IntN(1<<uint(rng.IntN(21)))
		reqs := decodeRequests(data, runs)
		opts := PlanOptions{Granularity: []uint64{1, 256, 512, 4096}[rng.IntN(4)], Buffers: 1 + rng.IntN(2)}
		full := fullBytes(reqs, opts.Granularity)
		budget := uint64(rng.Float64() * 1.2 * float64(full+1))
		p, err := Plan(reqs, budget, opts)
		checkPlan(t, reqs, budget, opts, p, err)
		outcomes["hints checked"] += checkHints(t, reqs, budget, opts, err)
		switch {
		case err == nil && p.Chunks == 1:
			outcomes["one chunk"]++
		case err == nil:
			outcomes["chunked"]++
		case errors.Is(err, ErrUnchunkable):
			outcomes["unchunkable"]++
		case errors.Is(err, ErrRunTooLarge):
			outcomes["run too large"]++
		case errors.Is(err, ErrRunsMismatch):
			outcomes["runs mismatch"]++
		default:
			outcomes["other error"]++
		}
	}
	// The generator must reach every outcome, or the test proves little.
	for _, o := range []string{"one chunk", "chunked", "unchunkable", "run too large", "runs mismatch", "hints checked"} {
		if outcomes[o] == 0 {
			t.Errorf("no case ended %q: %v", o, outcomes)
		}
	}
	t.Logf("outcomes: %v", outcomes)
}

func FuzzPlan(f *testing.F) {
	f.Add([]byte{0, 0, 0, 0}, uint32(100), uint64(4096), uint8(0), uint8(9))
	f.Add([]byte{4, 1, 0x55, 2, 8, 2, 0xaa, 0x81, 1, 0, 3, 0x20}, uint32(1000), uint64(10000), uint8(1), uint8(0))
	f.Add([]byte{0x44, 0x82, 0xff, 0x07, 0x01, 0x02, 0x03, 0x04}, uint32(65535), uint64(1<<20), uint8(1), uint8(12))
	// Huge run counts (k's bits 3..6 set): once gave negative chunk
	// counts from an overflowing ⌈N/L⌉.
	f.Add([]byte{0, 0, 0, 0x01}, uint32(0), uint64(1<<20), uint8(1<<3), uint8(9))
	f.Add([]byte{0, 0, 0, 0x01, 4, 0, 0, 0x01}, uint32(7), uint64(math.MaxUint64), uint8(1<<3), uint8(0))
	f.Add([]byte{0, 0, 0, 0x01}, uint32(1), uint64(1<<40), uint8(5<<3|1), uint8(3))
	f.Fuzz(func(t *testing.T, data []byte, runs uint32, budget uint64, k, gexp uint8) {
		n := int(runs%(1<<22)) + 1
		if s := int(k>>3) & 0xf; s > 0 {
			n = math.MaxInt64>>(s-1) - int(runs) // up to MaxInt64 runs
		}
		reqs := decodeRequests(data, n)
		opts := PlanOptions{Granularity: 1 << (gexp % 14), Buffers: int(k%3) + 1}
		p, err := Plan(reqs, budget, opts)
		checkPlan(t, reqs, budget, opts, p, err)
		checkHints(t, reqs, budget, opts, err)
	})
}

var raiseBy = regexp.MustCompile(`raise the budget by ([0-9.]+ [KMGT]?i?B)`)

// checkHints checks that raising the budget by what a PlanError says is
// enough for Plan to succeed, and that the error's figures of what is
// needed and what there is never read the same. It returns the number of
// hints checked.
func checkHints(t *testing.T, reqs map[string]map[string]ArrayRequest, budget uint64, opts PlanOptions, err error) int {
	t.Helper()
	var pe *PlanError
	if !errors.As(err, &pe) {
		return 0
	}
	if bytesUp(pe.Need) == bytesDown(pe.Budget) {
		t.Errorf("%v: need %d and budget %d read the same", err, pe.Need, pe.Budget)
	}
	n := 0
	for _, m := range raiseBy.FindAllStringSubmatch(err.Error(), -1) {
		x, perr := units.ParseSize(m[1])
		if perr != nil {
			t.Fatalf("hint %q: %v", m[0], perr)
		}
		if x < pe.Need-min(pe.Need, pe.Budget) {
			t.Errorf("%v: %q is %d bytes, short of the %d missing", err, m[0], x, pe.Need-pe.Budget)
		}
		if budget > math.MaxUint64-x {
			continue // a saturated figure
		}
		if _, err2 := Plan(reqs, budget+x, opts); err2 != nil {
			t.Errorf("%v: following %q (budget %d + %d) still fails: %v", err, m[0], budget, x, err2)
		}
		n++
	}
	return n
}

// TestPlanHintsAreEnough: a shortfall is rounded up, never to a figure
// that is not enough (1,048 bytes once read "1 KiB").
func TestPlanHintsAreEnough(t *testing.T) {
	for name, tc := range map[string]struct {
		reqs   map[string]map[string]ArrayRequest
		budget uint64
		opts   PlanOptions
		hint   string
	}{
		"1048 B short, unchunkable inputs": {
			reqs: map[string]map[string]ArrayRequest{
				"solver": {"state": req(Float64, 1, 2, 10_000), "consts": fixed(Float64, 100)},
				"output": {"samples": req(Float32, 2, 50, 2, 10_000)},
			},
			budget: 1000, hint: "raise the budget by 1.1 KiB",
		},
		"nothing chunkable, 1 MiB + 1 B short": {
			reqs: one("x", fixed(Uint8, int(MiB)+4097)), budget: 4096, opts: PlanOptions{Granularity: 1},
			hint: "raise the budget by 1.1 MiB",
		},
		"one run 1 B too large": {
			reqs: one("x", req(Uint8, 1, 3000, 10)), budget: 2999, opts: PlanOptions{Granularity: 1},
			hint: "raise the budget by 1 B",
		},
		"one run too large, double buffered": {
			reqs:   map[string]map[string]ArrayRequest{"c": {"k": fixed(Uint8, 100), "x": req(Uint8, 2, 3, 70_001, 5)}},
			budget: 400_000, opts: PlanOptions{Granularity: 1, Buffers: 2},
			hint: "raise the budget by 19.7 KiB", // 20,106 B
		},
		"no budget at all": {
			reqs: one("x", req(Float64, 0, 1000)), budget: 0,
			hint: "raise the budget by 512 B",
		},
		"whole units stay whole": {
			reqs: one("x", fixed(Uint8, 3*int(MiB))), budget: 1 * MiB, opts: PlanOptions{Granularity: 1},
			hint: "raise the budget by 2 MiB",
		},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := Plan(tc.reqs, tc.budget, tc.opts)
			if err == nil || !strings.Contains(err.Error(), tc.hint) {
				t.Fatalf("error %v; want it to say %q", err, tc.hint)
			}
			if checkHints(t, tc.reqs, tc.budget, tc.opts, err) == 0 {
				t.Fatal("no hint checked")
			}
		})
	}
}

func TestBytesRounded(t *testing.T) {
	for n, want := range map[uint64][2]string{
		0:                 {"0 B", "0 B"},
		1023:              {"1023 B", "1023 B"},
		1024:              {"1 KiB", "1 KiB"},
		1048:              {"1.1 KiB", "1 KiB"},
		1126:              {"1.1 KiB", "1 KiB"},
		1127:              {"1.2 KiB", "1.1 KiB"},
		MiB - 1:           {"1024 KiB", "1023.9 KiB"},
		3*MiB/2 + 1:       {"1.6 MiB", "1.5 MiB"},
		math.MaxUint64:    {"16777216 TiB", "16777215.9 TiB"},
		units.TiB * 5 / 2: {"2.5 TiB", "2.5 TiB"},
	} {
		if up, down := bytesUp(n), bytesDown(n); up != want[0] || down != want[1] {
			t.Errorf("%d: up %q down %q, want %q %q", n, up, down, want[0], want[1])
		}
		// Up is never less, down never more, than n.
		for _, c := range []struct {
			s    string
			ok   func(v uint64) bool
			what string
		}{{bytesUp(n), func(v uint64) bool { return v >= n || n > 1<<62 }, "up"}, {bytesDown(n), func(v uint64) bool { return v <= n }, "down"}} {
			if v, err := units.ParseSize(c.s); err == nil && !c.ok(v) {
				t.Errorf("%d %s: %q reads %d", n, c.what, c.s, v)
			}
		}
	}
}

func TestPlanSaturatesHugeRequests(t *testing.T) {
	huge := ArrayRequest{Shape: []int{1 << 30, 1 << 30}, DType: Complex128, ChunkAxis: 0}
	reqs := map[string]map[string]ArrayRequest{"c": {"a": huge, "b": huge, "c": huge, "d": huge}}
	_, err := Plan(reqs, math.MaxUint64-1, PlanOptions{Buffers: 2})
	// 2^64 bytes per array: each is 2^60 elements × 16 B = 2^64, which
	// overflows, so Validate refuses it.
	if !errors.Is(err, ErrInvalidRequest) {
		t.Fatalf("want ErrInvalidRequest for a 2^64-byte array, got %v", err)
	}
	big := ArrayRequest{Shape: []int{1 << 30, 1 << 29}, DType: Complex128, ChunkAxis: 0} // 2^63 B
	reqs = map[string]map[string]ArrayRequest{"c": {"a": big, "b": big, "c": big}}
	p, err := Plan(reqs, 1<<40, PlanOptions{Buffers: 2})
	checkPlan(t, reqs, 1<<40, PlanOptions{Buffers: 2}, p, err)
	if err != nil || p.Chunks < 2 {
		t.Fatalf("3 × 8 EiB in 1 TiB: got %+v, %v", p, err)
	}
	if p.BytesPerChunk > 1<<40 {
		t.Fatalf("plan spends %s of 1 TiB", units.Format(p.BytesPerChunk))
	}
}

// With nothing chunkable, the error names the largest fixed requests and
// why each cannot be chunked.
func TestPlanNamesUnchunkableRequests(t *testing.T) {
	reqs := map[string]map[string]ArrayRequest{"c": {
		"typo":   {Shape: []int{100, 1000}, DType: Float32, ChunkAxis: 5},
		"fixed":  {Shape: []int{1000}, DType: Float32, Unchunkable: true},
		"single": {Shape: []int{50, 1}, DType: Float32, ChunkAxis: 1},
	}}
	_, err := Plan(reqs, 1<<10, PlanOptions{})
	if !errors.Is(err, ErrUnchunkable) {
		t.Fatalf("Plan = %v, want ErrUnchunkable", err)
	}
	for _, want := range []string{
		"c/typo: 390.6 KiB, chunk axis 5, but its shape [100 1000] has 2 axes",
		"c/fixed: 3.9 KiB, marked unchunkable",
		"c/single: 200 B, its chunk axis 1 has length 1",
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}
}

// An unchunkable request whose chunk axis has length 1 is one run, so the
// plan of a lone such request is one chunk of one run, not of none.
func TestPlanLengthOneAxisIsOneRun(t *testing.T) {
	p, err := Plan(map[string]map[string]ArrayRequest{"c": {
		"x": {Shape: []int{4, 1}, DType: Float32, ChunkAxis: 1},
	}}, 1<<20, PlanOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if p.TotalRuns != 1 || p.ChunkLength != 1 || p.Chunks != 1 {
		t.Errorf("plan = %d runs, %d chunks of %d; want 1 run, 1 chunk of 1", p.TotalRuns, p.Chunks, p.ChunkLength)
	}
}

// TestPlanHugeFigures: run counts near MaxInt64 and byte sums past 2⁶⁴
// are computed exactly or refused, never wrapped (a shape of MaxInt64
// uint8 once planned -8796093022207 chunks; a budget of 2⁶⁴−1 once took
// arrays of 1.5 × 2⁶⁴ bytes in one chunk).
func TestPlanHugeFigures(t *testing.T) {
	req := func(d DType, unchunkable bool, shape ...int) ArrayRequest {
		return ArrayRequest{Shape: shape, DType: d, Unchunkable: unchunkable}
	}
	for name, tc := range map[string]struct {
		reqs                 map[string]ArrayRequest
		budget               uint64
		chunks, length, last int
		err                  error
	}{
		"MaxInt64 runs, 1 MiB": {
			reqs:   map[string]ArrayRequest{"x": req(Uint8, false, math.MaxInt64)},
			budget: 1 << 20, chunks: 1 << 43, length: 1 << 20, last: 1<<20 - 1,
		},
		"MaxInt64 runs, two buffers' worth": {
			reqs:   map[string]ArrayRequest{"x": req(Uint8, false, math.MaxInt64)},
			budget: 1 << 62, chunks: 2, length: 1 << 62, last: 1<<62 - 1,
		},
		"unchunkable 1.5 × 2⁶⁴ bytes, budget 2⁶⁴−1": {
			reqs: map[string]ArrayRequest{
				"a": req(Float64, true, 1<<60), "b": req(Float64, true, 1<<60), "c": req(Float64, true, 1<<60),
			},
			budget: math.MaxUint64, err: ErrUnchunkable,
		},
		"chunkable 2⁶⁴ bytes, budget 2⁶⁴−1": {
			reqs:   map[string]ArrayRequest{"a": req(Float64, false, 1<<60), "b": req(Float64, false, 1<<60)},
			budget: math.MaxUint64, chunks: 2, length: 1 << 59, last: 1 << 59,
		},
	} {
		t.Run(name, func(t *testing.T) {
			reqs := map[string]map[string]ArrayRequest{"c": tc.reqs}
			p, err := Plan(reqs, tc.budget, PlanOptions{})
			if tc.err != nil {
				if !errors.Is(err, tc.err) {
					t.Fatalf("got %+v, %v; want %v", p, err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if p.Chunks != tc.chunks || p.ChunkLength != tc.length || p.LastChunkLength != tc.last {
				t.Fatalf("%d chunks of %d (last %d), want %d of %d (last %d)", p.Chunks, p.ChunkLength, p.LastChunkLength, tc.chunks, tc.length, tc.last)
			}
			checkPlan(t, reqs, tc.budget, PlanOptions{}, p, err)
		})
	}
}

// pageCost is a Cost as the Pool states it, for pages of page bytes.
func pageCost(g, page uint64) func([]uint64) uint64 {
	return func(sizes []uint64) uint64 { return alloc.PageCost(sizes, g, page, page/2) }
}

// checkCostPlan checks a plan made with opts.Cost against the rules with
// that cost: the plan's arrays cost at most the budget, one chunk fewer
// would not fit, the chunks are balanced, and the errors are the ones the
// cost calls for.
func checkCostPlan(t *testing.T, reqs map[string]map[string]ArrayRequest, budget uint64, opts PlanOptions, p ChunkPlan, err error) {
	t.Helper()
	var pe *PlanError
	if errors.As(err, &pe) {
		if pe.Need <= budget && pe.Need < math.MaxUint64 {
			t.Fatalf("%v: needs %d, within the budget %d", err, pe.Need, budget)
		}
		return
	}
	if err != nil {
		return // invalid requests or runs that disagree: checkPlan's business
	}
	if p.DeviceBytes > budget {
		t.Fatalf("plan costs %d, over the budget %d", p.DeviceBytes, budget)
	}
	n := p.TotalRuns
	if p.Chunks > 1 {
		if p.ChunkLength != refCeil(n, p.Chunks) {
			t.Fatalf("chunk length %d of %d chunks for %d runs is not balanced", p.ChunkLength, p.Chunks, n)
		}
		fewer := p.Chunks - 1
		if fewer == 1 {
			return // one chunk was tried first and did not fit
		}
		l := refCeil(n, fewer)
		var sizes []uint64
		for _, ls := range reqs {
			for _, r := range ls {
				if r.Memory != Device {
					continue
				}
				b := r.Bytes()
				if refChunkable(r) {
					for range p.Buffers {
						sizes = append(sizes, b/uint64(r.Shape[r.ChunkAxis])*uint64(l))
					}
					continue
				}
				sizes = append(sizes, b)
			}
		}
		if c := opts.Cost(sizes); c <= budget && c < math.MaxUint64 {
			t.Fatalf("%d chunks of %d would cost %d, within the budget %d, but the plan has %d", fewer, l, c, budget, p.Chunks)
		}
	}
}

// FuzzPlanCost plans with a page cost as the Pool states it.
func FuzzPlanCost(f *testing.F) {
	f.Add([]byte{0, 0, 0, 0}, uint32(100), uint64(4096), uint8(0), uint8(9))
	f.Add([]byte{4, 1, 0x55, 2, 8, 2, 0xaa, 0x81, 1, 0, 3, 0x20}, uint32(1000), uint64(10000), uint8(1), uint8(0))
	f.Add([]byte{0x44, 0x82, 0xff, 0x07, 0x01, 0x02, 0x03, 0x04}, uint32(65535), uint64(1<<20), uint8(1), uint8(12))
	f.Fuzz(func(t *testing.T, data []byte, runs uint32, budget uint64, k, gexp uint8) {
		reqs := decodeRequests(data, int(runs%(1<<22))+1)
		g := uint64(1) << (gexp % 14)
		opts := PlanOptions{Granularity: g, Buffers: int(k%3) + 1, Cost: pageCost(g, g<<(gexp>>4%8))}
		p, err := Plan(reqs, budget, opts)
		checkCostPlan(t, reqs, budget, opts, p, err)
	})
}

func TestPlanWithCost(t *testing.T) {
	reqs := map[string]map[string]ArrayRequest{"c": {
		"x": {Shape: []int{1000, 3000}, DType: Uint8, ChunkAxis: 0},     // 3000 B a run
		"k": {Shape: []int{700 << 10}, DType: Uint8, Unchunkable: true}, // 700 KiB, one page
	}}
	cost := pageCost(512, 2*MiB)
	for name, tc := range map[string]struct {
		budget uint64
		chunks int
		device uint64
		err    error
		says   string
	}{
		"one chunk":                            {budget: 6 * MiB, chunks: 1, device: 6 * MiB},
		"two chunks: the page rounding counts": {budget: 6*MiB - 1, chunks: 2, device: 4 * MiB},
		"unchunkable: pages named":             {budget: 2*MiB - 1, err: ErrUnchunkable, says: "1.4 MiB the allocator takes in whole device pages"},
	} {
		t.Run(name, func(t *testing.T) {
			p, err := Plan(reqs, tc.budget, PlanOptions{Cost: cost})
			if tc.err != nil {
				if !errors.Is(err, tc.err) || !strings.Contains(err.Error(), tc.says) {
					t.Fatalf("got %v, want %v saying %q", err, tc.err, tc.says)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if p.Chunks != tc.chunks || p.DeviceBytes != tc.device {
				t.Errorf("%d chunks costing %d, want %d costing %d", p.Chunks, p.DeviceBytes, tc.chunks, tc.device)
			}
			checkCostPlan(t, reqs, tc.budget, PlanOptions{Cost: cost}, p, err)
		})
	}
}

// TestPlanMaxChunkLength: a bound on the chunk length cuts the runs
// into chunks of at most that many, with the buffers in flight, even
// where they fit whole; the budget still binds where it is tighter; it
// cannot cut what is not chunkable. Random sets are checked against the
// fewest chunks found by trying every count.
func TestPlanMaxChunkLength(t *testing.T) {
	x := map[string]map[string]ArrayRequest{"c": {"x": req(Float32, 0, 1000)}} // 4000 B, 4 B a run
	for name, tc := range map[string]struct {
		reqs    map[string]map[string]ArrayRequest
		budget  uint64
		bound   int
		buffers int
		chunks  int
		length  int
		bufs    int
	}{
		"fits whole, bounded":      {x, 1 << 20, 300, 1, 4, 250, 1},
		"fits whole, bound 1000":   {x, 1 << 20, 1000, 1, 1, 1000, 1},
		"no bound":                 {x, 1 << 20, 0, 2, 1, 1000, 1},
		"bounded, two buffers":     {x, 1 << 20, 500, 2, 2, 500, 2},
		"the budget binds tighter": {x, 1024, 500, 1, 4, 250, 1}, // 1024 B: 256 runs a chunk at most
		"nothing chunkable":        {map[string]map[string]ArrayRequest{"c": {"k": fixed(Float32, 1000)}}, 1 << 20, 10, 1, 1, 0, 1},
	} {
		t.Run(name, func(t *testing.T) {
			p, err := Plan(tc.reqs, tc.budget, PlanOptions{MaxChunkLength: tc.bound, Buffers: tc.buffers})
			if err != nil || p.Chunks != tc.chunks || p.ChunkLength != tc.length || p.Buffers != tc.bufs {
				t.Errorf("%d chunks of %d, %d buffers (%v); want %d of %d, %d buffers", p.Chunks, p.ChunkLength, p.Buffers, err, tc.chunks, tc.length, tc.bufs)
			}
		})
	}
	rng := rand.New(rand.NewPCG(3, 4))
	for range 2000 {
		n := 1 + rng.IntN(200)
		per := []int{1 + rng.IntN(40), 1 + rng.IntN(40)}
		fixedB := rng.IntN(3000)
		reqs := map[string]map[string]ArrayRequest{"c": {
			"a": req(Uint8, 0, n, per[0]), "b": req(Uint8, 1, per[1], n),
		}}
		if fixedB > 0 {
			reqs["c"]["k"] = fixed(Uint8, fixedB)
		}
		budget, bound, k := uint64(rng.IntN(40000)), rng.IntN(n+5), 1+rng.IntN(2)
		fits := func(l, bufs int) bool {
			sum := roundUp(uint64(fixedB), 512) * uint64(min(fixedB, 1))
			for _, r := range per {
				sum += uint64(bufs) * roundUp(uint64(r*l), 512)
			}
			return sum <= budget
		}
		want := 0 // the fewest chunks whose length fits, under the bound
		for c := 1; c <= n && want == 0; c++ {
			l, bufs := ceilDiv(n, c), 1
			if c > 1 {
				bufs = k
			}
			if fits(l, bufs) && (bound == 0 || bound >= n || l <= bound) {
				want = c
			}
		}
		p, err := Plan(reqs, budget, PlanOptions{MaxChunkLength: bound, Buffers: k})
		switch {
		case want == 0 && err == nil:
			t.Fatalf("n %d, per run %v, fixed %d, budget %d, bound %d, k %d: planned %+v; nothing fits", n, per, fixedB, budget, bound, k, p)
		case want != 0 && (err != nil || p.Chunks != want):
			t.Fatalf("n %d, per run %v, fixed %d, budget %d, bound %d, k %d: %d chunks (%v); want %d", n, per, fixedB, budget, bound, k, p.Chunks, err, want)
		case err == nil && bound > 0 && bound < n && p.ChunkLength > bound:
			t.Fatalf("chunk length %d over the bound %d", p.ChunkLength, bound)
		}
	}
}

// TestPlanMoreHint: what the caller says would help besides
// (PlanOptions.more, Allocate's "to give the group more") ends the hint of
// every kind of PlanError as Plan makes it, so that nobody changes the
// error after it is returned; without it the hint is Plan's alone.
func TestPlanMoreHint(t *testing.T) {
	tests := map[string]struct {
		reqs   map[string]map[string]ArrayRequest
		budget uint64
		is     error
	}{
		"nothing chunkable": {map[string]map[string]ArrayRequest{"c": {"x": {Shape: []int{1000}, DType: Float64, Unchunkable: true}}}, 1000, ErrUnchunkable},
		"fixed fill it": {map[string]map[string]ArrayRequest{"c": {"x": {Shape: []int{1000}, DType: Float64, Unchunkable: true},
			"y": req(Float64, 0, 1000)}}, 8192, ErrUnchunkable},
		"one run too big": {map[string]map[string]ArrayRequest{"c": {"x": req(Float64, 1, 1000, 1000)}}, 4096, ErrRunTooLarge},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			calls := 0
			more := func() string { calls++; return "free something" }
			_, err := Plan(tc.reqs, tc.budget, PlanOptions{more: more})
			var pe *PlanError
			if !errors.As(err, &pe) || !errors.Is(err, tc.is) {
				t.Fatalf("Plan = %v; want a PlanError wrapping %v", err, tc.is)
			}
			if !strings.HasSuffix(pe.Hint, "; free something") || calls != 1 {
				t.Errorf("hint %q after %d calls; want it to end with the caller's, asked once", pe.Hint, calls)
			}
			_, err = Plan(tc.reqs, tc.budget, PlanOptions{})
			if !errors.As(err, &pe) || strings.Contains(pe.Hint, "free something") {
				t.Errorf("without more: %v", err)
			}
		})
	}
	if _, err := Plan(map[string]map[string]ArrayRequest{"c": {"x": req(Float64, 0, 10)}}, units.MiB,
		PlanOptions{more: func() string { t.Error("more asked of a plan that fits"); return "" }}); err != nil {
		t.Fatal(err)
	}
}

// BenchmarkPlan plans 1,000 arrays (10 clients × 100 labels, a tenth
// unchunkable) under a budget that forces chunking.
func BenchmarkPlan(b *testing.B) {
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
	budget := uint64(2 * units.GiB)
	p, err := Plan(reqs, budget, PlanOptions{Buffers: 2})
	if err != nil || p.Chunks < 2 {
		b.Fatalf("plan: %+v, %v", p, err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Plan(reqs, budget, PlanOptions{Buffers: 2}); err != nil {
			b.Fatal(err)
		}
	}
}
