package vram

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/vramkit/vram/device"
	"github.com/vramkit/vram/device/sim"
	"github.com/vramkit/vram/kernel"
)

// batchFixture is a group of two clients, a solver with inputs "in"
// [2, runs] float32 chunked along axis 1 and an unchunkable "table"
// [4] float32, and a writer with output "out" [2, runs]; planned on a
// device small enough for several chunks.
type batchFixture struct {
	m              *Manager
	dev            *sim.Device
	solver, writer *Client
	sr, wr         *ArrayResponse
	runs           int
	k              *kernel.Kernel
}

// newBatchFixture allocates the fixture's arrays with buffers in flight.
func newBatchFixture(t *testing.T, runs, buffers int, mod ...func(*sim.Config)) *batchFixture {
	t.Helper()
	dev := newSim(t, 1<<20, append([]func(*sim.Config){func(c *sim.Config) { c.Granularity = 4 << 10 }}, mod...)...)
	m, err := New(dev, WithAllocator(Pool))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	f := &batchFixture{m: m, dev: dev, runs: runs}
	f.solver, err = m.Register(ClientOptions{Name: "solver", Group: "g", Proportion: 0.5, OnAllocated: func(r *ArrayResponse) { f.sr = r }})
	if err != nil {
		t.Fatal(err)
	}
	f.writer, err = m.Register(ClientOptions{Name: "writer", Group: "g", Proportion: 0.3, OnAllocated: func(r *ArrayResponse) { f.wr = r }})
	if err != nil {
		t.Fatal(err)
	}
	must(t, f.solver.Queue(map[string]ArrayRequest{
		"in":    {Shape: []int{2, runs}, DType: Float32, ChunkAxis: 1},
		"table": {Shape: []int{4}, DType: Float32, Unchunkable: true},
	}))
	must(t, f.writer.Queue(map[string]ArrayRequest{"out": {Shape: []int{2, runs}, DType: Float32, ChunkAxis: 1}}))
	if _, err := f.solver.Allocate(context.Background(), WithBuffers(buffers)); err != nil {
		t.Fatal(err)
	}
	// out[r][i] = in[r][i]·table[0] + table[1] over the chunk's runs; the
	// arrays' rows are ChunkLength apart (argument 2).
	f.k, err = kernel.New("scale", "", func(a kernel.Args, lo, hi int) error {
		in, out, tab, ld := a.Float32s(0), a.Float32s(1), a.Float32s(3), int(a.Uint32(2))
		for i := lo; i < hi; i++ {
			for r := range 2 {
				out[r*ld+i] = in[r*ld+i]*tab[0] + tab[1]
			}
		}
		return nil
	}, 0)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// leaks is what is live on the device, the manager's pinned pool and
// staging pool trimmed first (they keep freed buffers for the next batch;
// a staging buffer still in use is not trimmed, and shows).
// Events are left out: the pool keeps one per stream it has seen.
func (f *batchFixture) leaks(t *testing.T) string {
	t.Helper()
	if err := f.m.host.pinned.Trim(); err != nil {
		t.Fatal(err)
	}
	if err := f.m.Host().Staging().Trim(); err != nil {
		t.Fatal(err)
	}
	r := f.dev.Leaks()
	r.Events = 0
	return r.String()
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// compute launches the fixture's kernel over chunk ch.
func (f *batchFixture) compute(_ context.Context, ch *Chunk) error {
	return ch.Launch(f.k, ch.Array(f.sr, "in"), ch.Array(f.wr, "out"), uint32(ch.ChunkLength), ch.Array(f.sr, "table"))
}

// hosts makes the full-length host arrays, in filled with its index.
func (f *batchFixture) hosts(t *testing.T, mem MemoryType) (in, table, out *HostArray) {
	t.Helper()
	var err error
	vals := make([]float32, 2*f.runs)
	for i := range vals {
		vals[i] = float32(i % 4096)
	}
	in, err = f.m.NewHostArray([]int{2, f.runs}, Float32, mem, vals)
	must(t, err)
	table, err = f.m.NewHostArray([]int{4}, Float32, mem, []float32{3, 1, 0, 0})
	must(t, err)
	out, err = f.m.NewHostArray([]int{2, f.runs}, Float32, mem, nil)
	must(t, err)
	t.Cleanup(func() { in.Free(); table.Free(); out.Free() })
	return in, table, out
}

// checkOut counts the wrong results among the first runs runs of out.
func (f *batchFixture) checkOut(out []float32, runs int) int {
	bad := 0
	for r := range 2 {
		for i := range runs {
			k := r*f.runs + i
			if out[k] != float32(k%4096)*3+1 {
				bad++
			}
		}
	}
	return bad
}

// TestRunBatch runs the fixture with 1, 2 and 3 buffers, host arrays
// pinned (copied directly) and pageable (staged), and with fill and
// drain functions, and checks every result and the report.
func TestRunBatch(t *testing.T) {
	const runs = 200_000 // 3.2 MB of chunked arrays on 1 MiB: several chunks
	for _, buffers := range []int{1, 2, 3} {
		for _, side := range []string{"pinned", "pageable", "functions"} {
			t.Run(fmt.Sprintf("%d buffers, %s", buffers, side), func(t *testing.T) {
				f := newBatchFixture(t, runs, buffers)
				mem := Pinned
				if side == "pageable" {
					mem = Pageable
				}
				in, table, out := f.hosts(t, mem)
				arrays := []BatchArray{In(f.sr, "in", in), In(f.sr, "table", table), Out(f.wr, "out", out)}
				if side == "functions" {
					arrays[0] = InFunc(f.sr, "in", 1, func(sp Span, st *HostArray) error {
						return hostChunkCopy(st, in, sp, true)
					})
					arrays[2] = OutFunc(f.wr, "out", 1, func(sp Span, st *HostArray) error {
						return hostChunkCopy(st, out, sp, false)
					})
				}
				var seen []int
				rep, err := RunBatch(context.Background(), f.solver, Batch{Arrays: arrays, Buffers: buffers, Compute: f.compute,
					Progress: func(p Progress) { seen = append(seen, p.Chunk) }})
				if err != nil {
					t.Fatal(err)
				}
				n := f.sr.Chunks
				if n < 4 || rep.Chunks != n || rep.ChunksDone != n || rep.Buffers != buffers || len(seen) != n || seen[n-1] != n {
					t.Fatalf("report %+v, progress %v: want %d (≥ 4) chunks done with %d buffers, each reported", rep, seen, n, buffers)
				}
				if bad := f.checkOut(out.Float32s(), runs); bad != 0 {
					t.Fatalf("%d wrong results", bad)
				}
				wantIn, wantOut := uint64(2*runs*4+16), uint64(2*runs*4)
				if rep.BytesIn != wantIn || rep.BytesOut != wantOut {
					t.Errorf("bytes in %d, out %d; want %d and %d", rep.BytesIn, rep.BytesOut, wantIn, wantOut)
				}
				if wantStaged := map[string]int{"pinned": 0, "pageable": 2, "functions": 2}[side]; rep.Staged != wantStaged {
					t.Errorf("%d arrays staged, want %d", rep.Staged, wantStaged)
				}
				if rep.Copy <= 0 || rep.Compute <= 0 || rep.ExposedCopy < 0 || rep.ExposedCopy > rep.Copy {
					t.Errorf("times: copy %v, compute %v, exposed %v: want positive, exposed within copy", rep.Copy, rep.Compute, rep.ExposedCopy)
				}
				// Events: a second run leaves as many as the first (the
				// batch closes its own; the pinned pool keeps one a stream).
				var events []int
				for range 3 {
					if _, err := RunBatch(context.Background(), f.solver, Batch{Arrays: arrays, Buffers: buffers, Compute: f.compute}); err != nil {
						t.Fatal(err)
					}
					events = append(events, f.dev.Leaks().Events)
				}
				t.Logf("events %v", events)
				if events[2] != events[1] {
					t.Errorf("events open after each of three more batches: %v; want them to stop growing", events)
				}
				if buffers == 1 && rep.ExposedCopy != rep.Copy {
					t.Errorf("one buffer: exposed %v, want all of the copy time %v (nothing overlaps)", rep.ExposedCopy, rep.Copy)
				}
			})
		}
	}
}

// TestRunBatchCancel cancels a batch halfway, between chunks or while a
// chunk is being enqueued, and checks that it stops there with an error
// wrapping context.Canceled, that the chunks it reports done are back on
// the host, and that nothing is left: device memory, pinned buffers,
// streams, events and goroutines are as they were before it started.
func TestRunBatchCancel(t *testing.T) {
	tests := map[string]struct {
		buffers int
		where   string // "progress": as chunk n/2 is back; "compute": during chunk n/2's compute; "start": before the batch
	}{
		"1 buffer, between chunks":    {1, "progress"},
		"2 buffers, between chunks":   {2, "progress"},
		"3 buffers, between chunks":   {3, "progress"},
		"1 buffer, within a chunk":    {1, "compute"},
		"2 buffers, within a chunk":   {2, "compute"},
		"2 buffers, before the first": {2, "start"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			f := newBatchFixture(t, 200_000, tc.buffers)
			in, table, out := f.hosts(t, Pageable) // staged: pinned buffers to leak
			n := f.sr.Chunks
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			if tc.where == "start" {
				cancel()
			}
			compute := func(ctx context.Context, ch *Chunk) error {
				if tc.where == "compute" && ch.Index == n/2 {
					cancel()
				}
				return f.compute(ctx, ch)
			}
			// The simulator starts a stream's goroutine with its first
			// work: start the group's, which outlives the batch, first.
			s, err := f.solver.Stream()
			must(t, err)
			must(t, f.dev.LaunchFunc(s, 1, func(device.View, int, int) error { return nil }))
			must(t, f.solver.Sync(context.Background()))
			before, goroutines := f.leaks(t), runtime.NumGoroutine()
			rep, err := RunBatch(ctx, f.solver, Batch{
				Arrays:  []BatchArray{In(f.sr, "in", in), In(f.sr, "table", table), Out(f.wr, "out", out)},
				Buffers: tc.buffers, Compute: compute,
				Progress: func(p Progress) {
					if tc.where == "progress" && p.Chunk == n/2 {
						cancel()
					}
				},
			})
			if !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "chunks finished") {
				t.Fatalf("error %v, want one wrapping context.Canceled that says how many chunks finished", err)
			}
			lo, hi := n/2, n/2+tc.buffers
			if tc.where == "start" {
				lo, hi = 0, 0
			}
			if rep.ChunksDone < lo || rep.ChunksDone > hi || rep.ChunksDone >= n {
				t.Fatalf("%d of %d chunks done, want %d to %d", rep.ChunksDone, n, lo, min(hi, n-1))
			}
			if bad := f.checkOut(out.Float32s(), rep.ChunksDone*f.sr.ChunkLength); bad != 0 {
				t.Errorf("%d wrong results in the %d chunks reported done", bad, rep.ChunksDone)
			}
			if after := f.leaks(t); after != before {
				t.Errorf("device before the batch: %v; after: %v", before, after)
			}
			deadline := time.Now().Add(2 * time.Second)
			for runtime.NumGoroutine() > goroutines && time.Now().Before(deadline) {
				time.Sleep(5 * time.Millisecond)
			}
			if g := runtime.NumGoroutine(); g > goroutines {
				t.Errorf("%d goroutines after the batch, %d before", g, goroutines)
			}
		})
	}
}

// TestRunBatchErrors gives RunBatch batches it cannot run: each is
// refused with ErrBatch and a message naming what to change, and leaves
// nothing behind (newSim checks the device at the end).
func TestRunBatchErrors(t *testing.T) {
	f := newBatchFixture(t, 200_000, 2)
	in, table, out := f.hosts(t, Pinned)
	short, err := f.m.NewHostArray([]int{2, 100}, Float32, Pinned, nil)
	must(t, err)
	defer short.Free()
	other, err := f.m.Register(ClientOptions{Name: "other", Group: "elsewhere"})
	must(t, err)
	ok := []BatchArray{In(f.sr, "in", in), In(f.sr, "table", table), Out(f.wr, "out", out)}
	tests := map[string]struct {
		c    *Client
		b    Batch
		want string
	}{
		"no compute":     {f.solver, Batch{Arrays: ok}, "needs a Compute step"},
		"no arrays":      {f.solver, Batch{Compute: f.compute}, "at least one array"},
		"unknown label":  {f.solver, Batch{Arrays: []BatchArray{In(f.sr, "nope", in)}, Compute: f.compute}, `no device array "nope"; its labels are in, table`},
		"four buffers":   {f.solver, Batch{Arrays: ok, Buffers: 4, Compute: f.compute}, "4 buffers in flight: want 1 to 3"},
		"more than made": {f.solver, Batch{Arrays: ok, Buffers: 3, Compute: f.compute}, "allocated with 2; allocate with WithBuffers(3)"},
		"wrong host":     {f.solver, Batch{Arrays: []BatchArray{In(f.sr, "in", short)}, Compute: f.compute}, "want the same shape but for the chunk axis"},
		"other group":    {other, Batch{Arrays: ok, Compute: f.compute}, `not the batch's "elsewhere"`},
		"bad axis": {f.solver, Batch{Arrays: []BatchArray{InFunc(f.sr, "in", 0, func(Span, *HostArray) error { return nil })}, Compute: f.compute},
			"axis 0 of its shape"},
		"other's label":   {f.solver, Batch{Arrays: []BatchArray{Out(f.sr, "out", out)}, Compute: f.compute}, `"out" is writer#2's: pass writer#2's ArrayResponse, which its OnAllocated hook receives`},
		"nil response":    {f.solver, Batch{Arrays: []BatchArray{In(nil, "in", in)}, Compute: f.compute}, "nil response"},
		"nil host and fn": {f.solver, Batch{Arrays: []BatchArray{In(f.sr, "in", nil)}, Compute: f.compute}, "no host array and no function"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			before := f.leaks(t)
			_, err := RunBatch(context.Background(), tc.c, tc.b)
			if !errors.Is(err, ErrBatch) || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "<nil>") {
				t.Errorf("error %v, want ErrBatch saying %q (and no nil error)", err, tc.want)
			}
			if after := f.leaks(t); after != before {
				t.Errorf("device before: %v; after: %v", before, after)
			}
		})
	}
}

// TestRunBatchStepErrors makes a step of the second chunk fail and checks
// that the error names the chunk from 1 and the step, and that what was
// enqueued has finished and been freed.
func TestRunBatchStepErrors(t *testing.T) {
	boom := errors.New("boom")
	tests := map[string]struct {
		compute func(f *batchFixture) func(context.Context, *Chunk) error
		fill    bool
		want    string
	}{
		"compute": {compute: func(f *batchFixture) func(context.Context, *Chunk) error {
			return func(ctx context.Context, ch *Chunk) error {
				if ch.Index == 1 {
					return fmt.Errorf("launch the kernel: %w", boom)
				}
				return f.compute(ctx, ch)
			}
		}, want: "chunk 2 of %d: launch the kernel: boom"},
		"fill": {fill: true, want: `chunk 2 of %d: fill "in" of solver`},
	}
	for name, tc := range tests {
		for _, buffers := range []int{1, 2} {
			t.Run(fmt.Sprintf("%s, %d buffers", name, buffers), func(t *testing.T) {
				f := newBatchFixture(t, 200_000, buffers)
				in, table, out := f.hosts(t, Pinned)
				arrays := []BatchArray{In(f.sr, "in", in), In(f.sr, "table", table), Out(f.wr, "out", out)}
				compute := f.compute
				if tc.compute != nil {
					compute = tc.compute(f)
				}
				if tc.fill {
					arrays[0] = InFunc(f.sr, "in", 1, func(sp Span, st *HostArray) error {
						if sp.Start > 0 {
							return boom
						}
						return nil
					})
				}
				before := f.leaks(t)
				rep, err := RunBatch(context.Background(), f.solver, Batch{Arrays: arrays, Buffers: buffers, Compute: compute})
				want := fmt.Sprintf(tc.want, f.sr.Chunks)
				if !errors.Is(err, boom) || !strings.Contains(err.Error(), want) {
					t.Errorf("error %v, want one wrapping boom containing %q", err, want)
				}
				if rep.ChunksDone > 1 {
					t.Errorf("%d chunks done; the second failed", rep.ChunksDone)
				}
				if after := f.leaks(t); after != before {
					t.Errorf("device before: %v; after: %v", before, after)
				}
			})
		}
	}
}

func TestOverlap(t *testing.T) {
	t0 := time.Unix(0, 0)
	iv := func(a, b int) interval {
		return interval{t0.Add(time.Duration(a) * time.Millisecond), t0.Add(time.Duration(b) * time.Millisecond)}
	}
	tests := map[string]struct {
		a, b []interval
		want time.Duration
	}{
		"none":       {[]interval{iv(0, 1)}, []interval{iv(2, 3)}, 0},
		"inside":     {[]interval{iv(0, 10)}, []interval{iv(2, 3), iv(5, 7)}, 3 * time.Millisecond},
		"staggered":  {[]interval{iv(0, 4), iv(6, 10)}, []interval{iv(3, 7)}, 2 * time.Millisecond},
		"empty":      {nil, []interval{iv(0, 1)}, 0},
		"same":       {[]interval{iv(1, 2), iv(3, 4)}, []interval{iv(1, 2), iv(3, 4)}, 2 * time.Millisecond},
		"touching":   {[]interval{iv(0, 2)}, []interval{iv(2, 4)}, 0},
		"b contains": {[]interval{iv(2, 3), iv(4, 5)}, []interval{iv(0, 10)}, 2 * time.Millisecond},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if got := overlap(tc.a, tc.b); got != tc.want {
				t.Errorf("overlap = %v, want %v", got, tc.want)
			}
		})
	}
}

// TestChunkArray: Chunk.Array reaches a response no BatchArray names (a
// client holding scratch arrays only), whose client the batch marks busy
// like the others, and Launch refuses a nil array (a label Array did not
// find) naming the argument.
func TestChunkArray(t *testing.T) {
	f := newBatchFixture(t, 200_000, 2)
	in, table, _ := f.hosts(t, Pinned)
	scratchOnly := []BatchArray{In(f.sr, "in", in), In(f.sr, "table", table)} // the writer's out is scratch
	var seen []*DeviceArray
	writerIdle := false
	rep, err := RunBatch(context.Background(), f.solver, Batch{Arrays: scratchOnly,
		Compute: func(ctx context.Context, ch *Chunk) error {
			seen = append(seen, ch.Array(f.wr, "out"))
			if idle, err := f.writer.Idle(); err != nil || idle {
				writerIdle = true // evictable while its scratch array is in use
			}
			return f.compute(ctx, ch)
		}})
	if writerIdle {
		t.Error("the writer, whose scratch array the batch uses, was idle during it")
	}
	if err != nil || rep.ChunksDone != f.sr.Chunks {
		t.Fatalf("batch with the writer's array as scratch: %v, %d of %d chunks", err, rep.ChunksDone, f.sr.Chunks)
	}
	for i, d := range seen {
		if want := f.wr.Buffers[i%2].Device["out"]; d != want {
			t.Errorf("chunk %d: Array(writer, out) = %v, want buffer %d's %v", i, d, i%2, want)
		}
	}
	_, err = RunBatch(context.Background(), f.solver, Batch{Arrays: scratchOnly,
		Compute: func(_ context.Context, ch *Chunk) error {
			return ch.Launch(f.k, ch.Array(f.sr, "in"), ch.Array(f.wr, "nope"), uint32(ch.ChunkLength), ch.Array(f.sr, "table"))
		}})
	if !errors.Is(err, kernel.ErrArgs) || !strings.Contains(err.Error(), "argument 1 is a nil *DeviceArray") {
		t.Errorf("launch with a nil array: %v, want kernel.ErrArgs naming argument 1", err)
	}
}
