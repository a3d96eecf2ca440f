package batch_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/vramkit/vram"
	"github.com/vramkit/vram/batch"
	"github.com/vramkit/vram/device"
	"github.com/vramkit/vram/kernel"
)

// TestRun runs the fixture with 1, 2 and 3 buffers, host arrays
// pinned (copied directly) and pageable (staged), and with fill and
// drain functions, and checks every result and the report.
func TestRun(t *testing.T) {
	const runs = 200_000 // 3.2 MB of chunked arrays on 1 MiB: several chunks
	for _, buffers := range []int{1, 2, 3} {
		for _, side := range []string{"pinned", "pageable", "functions"} {
			t.Run(fmt.Sprintf("%d buffers, %s", buffers, side), func(t *testing.T) {
				f := newBatchFixture(t, runs, buffers)
				mem := vram.Pinned
				if side == "pageable" {
					mem = vram.Pageable
				}
				in, _, out := f.hosts(t, mem)
				if side == "functions" {
					must(t, f.in.Use(batch.Fill(func(sp vram.Span, st *vram.HostArray) error { return st.CopyChunkFrom(in, sp) })))
					must(t, f.out.Use(batch.Drain(func(sp vram.Span, st *vram.HostArray) error { return st.CopyChunkTo(out, sp) })))
				}
				var seen []int
				rep, err := f.b.Run(context.Background(), batch.Options{Buffers: buffers,
					Progress: func(p batch.Progress) { seen = append(seen, p.Chunk) }}, f.compute)
				if err != nil {
					t.Fatal(err)
				}
				n := f.plan().Chunks
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
				if rep.DeviceIdle < 0 || rep.DeviceIdle > rep.Wall || rep.Compute+rep.ExposedCopy+rep.DeviceIdle < rep.Wall {
					t.Errorf("device idle %v of %v (compute %v, exposed copy %v): want it within the wall, the three its whole", rep.DeviceIdle, rep.Wall, rep.Compute, rep.ExposedCopy)
				}
				if rep.Copy <= 0 || rep.Compute <= 0 || rep.ExposedCopy < 0 || rep.ExposedCopy > rep.Copy {
					t.Errorf("times: copy %v, compute %v, exposed %v: want positive, exposed within copy", rep.Copy, rep.Compute, rep.ExposedCopy)
				}
				// Events: a second run leaves as many as the first (the
				// batch closes its own; the pinned pool keeps one a stream).
				var events []int
				for range 3 {
					if _, err := f.b.Run(context.Background(), batch.Options{Buffers: buffers}, f.compute); err != nil {
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

// TestRunMaxChunkLength cuts a batch allocated whole into chunks, and a
// chunked one into shorter chunks than its arrays: every result right,
// the chunks as cut.
func TestRunMaxChunkLength(t *testing.T) {
	tests := map[string]struct {
		runs, max int
	}{
		"whole, cut in 7":   {runs: 7_000, max: 1_000},
		"chunked, shorter":  {runs: 200_000, max: 10_000},
		"longer than whole": {runs: 7_000, max: 1 << 30},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			f := newBatchFixture(t, tc.runs, 2)
			_, _, out := f.hosts(t, vram.Pageable)
			rep, err := f.b.Run(context.Background(), batch.Options{MaxChunkLength: tc.max}, f.compute)
			if err != nil {
				t.Fatal(err)
			}
			length := min(tc.max, f.plan().ChunkLength)
			if f.plan().TotalRuns == 0 {
				length = min(tc.max, tc.runs)
			}
			if want := (tc.runs + length - 1) / length; rep.Chunks != want || rep.ChunksDone != want {
				t.Errorf("report %+v: want %d chunks of %d", rep, want, length)
			}
			if bad := f.checkOut(out.Float32s(), tc.runs); bad != 0 {
				t.Fatalf("%d wrong results", bad)
			}
		})
	}
}

// TestMakeHosts: host arrays made from the batch's requests (no shape
// given twice), on the manager's ladder, freed by Close; a side given
// meanwhile is left alone.
func TestMakeHosts(t *testing.T) {
	f := newBatchFixture(t, 200_000, 2)
	table, err := f.m.NewHostArray([]int{4}, vram.Float32, vram.Pinned, []float32{3, 1, 0, 0})
	must(t, err)
	defer table.Free()
	must(t, f.table.Use(batch.Host(table)))
	must(t, f.b.MakeHosts())
	in, out := f.in.Host(), f.out.Host()
	if in == nil || out == nil || f.table.Host() != table || in.Dim(1) != 200_000 || in.DType() != vram.Float32 || in.Placement().Rung == vram.RungAuto {
		t.Fatalf("hosts in %v, out %v, table %v: want the requests' shapes on a rung, the table as given", in, out, f.table.Host())
	}
	for i := range in.Float32s() {
		in.Float32s()[i] = float32(i % 4096)
	}
	if _, err := f.b.Run(context.Background(), batch.Options{}, f.compute); err != nil {
		t.Fatal(err)
	}
	if bad := f.checkOut(out.Float32s(), f.runs); bad != 0 {
		t.Fatalf("%d wrong results", bad)
	}
	must(t, f.b.MakeHosts()) // again: nothing to make
	if f.in.Host() != in {
		t.Error("a second MakeHosts replaced a host array")
	}
	must(t, f.b.Close())
	if !in.Freed() || !out.Freed() || table.Freed() || len(f.solver.Arrays()) != 0 || len(f.writer.Arrays()) != 0 {
		t.Errorf("after Close: in freed %v, out %v, table %v, solver holds %v, writer %v; want the made hosts and every device array freed, the table kept",
			in.Freed(), out.Freed(), table.Freed(), f.solver.Arrays(), f.writer.Arrays())
	}
	must(t, f.b.Close())
}

// TestRunCancel cancels a batch halfway, between chunks (as a chunk is
// back on the host: the compute of a later chunk waits for it, so that
// the cancel cannot come after the last chunk) or while a chunk is being
// enqueued, and checks that it stops there with an error wrapping
// context.Canceled, that the chunks it reports done are back on the
// host, and that nothing is left: device memory, pinned buffers,
// streams, events and goroutines are as they were before it started.
func TestRunCancel(t *testing.T) {
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
			_, _, out := f.hosts(t, vram.Pageable) // staged: pinned buffers to leak
			n := f.plan().Chunks
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			if tc.where == "start" {
				cancel()
			}
			// Chunk at is back on the host (its progress) before the
			// chunk lag+1 after it is computed.
			lag := max(1, tc.buffers-1)
			at := min(n/2, n-lag-2)
			waitAt := at + lag + 1
			if tc.where == "progress" && at < 0 {
				t.Fatalf("%d chunks: too few for a cancel between chunks", n)
			}
			compute := func(ctx context.Context, ch *batch.Chunk) error {
				if tc.where == "compute" && ch.Index == n/2 {
					cancel()
				}
				if tc.where == "progress" && ch.Index == waitAt {
					select {
					case <-ctx.Done():
					case <-time.After(10 * time.Second):
						t.Errorf("chunk %d computed before chunk %d was back on the host", waitAt, at)
					}
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
			rep, err := f.b.Run(ctx, batch.Options{Buffers: tc.buffers, Progress: func(p batch.Progress) {
				if tc.where == "progress" && p.Chunk == at+1 {
					cancel()
				}
			}}, compute)
			if !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "chunks finished") {
				t.Fatalf("error %v, want one wrapping context.Canceled that says how many chunks finished", err)
			}
			lo, hi := n/2, waitAt
			switch tc.where {
			case "start":
				lo, hi = 0, 0
			case "progress":
				lo = at + 1
			}
			if rep.ChunksDone < lo || rep.ChunksDone > hi || rep.Runs >= f.runs {
				t.Fatalf("%d chunks (%d runs of %d) done, want %d to %d, not every run", rep.ChunksDone, rep.Runs, f.runs, lo, hi)
			}
			if bad := f.checkOut(out.Float32s(), rep.Runs); bad != 0 {
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

// TestRunErrors gives batches that cannot be allocated or run: each is
// refused with ErrBatch and a message naming what to change, and leaves
// nothing behind (the fixture's device is checked at the end, and here
// before and after each case).
func TestRunErrors(t *testing.T) {
	f := newBatchFixture(t, 200_000, 2)
	in, table, out := f.hosts(t, vram.Pinned)
	short, err := f.m.NewHostArray([]int{2, 100}, vram.Float32, vram.Pinned, nil)
	must(t, err)
	defer short.Free()
	other, err := f.m.Register(vram.ClientOptions{Name: "other", Group: "elsewhere"})
	must(t, err)
	m2 := newBatchFixture(t, 100, 1).solver // a client of another manager
	req := vram.ArrayRequest{Shape: []int{2, 200_000}, DType: vram.Float32, ChunkAxis: 1}
	fill := batch.Fill(func(vram.Span, *vram.HostArray) error { return nil })
	drain := batch.Drain(func(vram.Span, *vram.HostArray) error { return nil })
	allocate := func(declare func(b *batch.Batch)) error {
		b := batch.New()
		declare(b)
		defer b.Close()
		return b.Allocate(context.Background())
	}
	run := func(o batch.Options, c batch.Compute, sides ...batch.Side) error {
		defer f.use(t, in, table, out)
		for i, s := range sides {
			if err := []*batch.Array{f.in, f.table, f.out}[i].Use(s); err != nil {
				return err
			}
		}
		_, err := f.b.Run(context.Background(), o, c)
		return err
	}
	tests := map[string]struct {
		err  func() error
		want string
	}{
		"no arrays": {func() error { return batch.New().Allocate(context.Background()) }, "no arrays; declare them"},
		"not allocated": {func() error {
			b := batch.New()
			b.In(f.solver, "x", req)
			_, err := b.Run(context.Background(), batch.Options{}, f.compute)
			return err
		}, "not allocated"},
		"nil client":  {func() error { return allocate(func(b *batch.Batch) { b.In(nil, "x", req) }) }, "a nil client"},
		"empty label": {func() error { return allocate(func(b *batch.Batch) { b.Out(f.writer, "", req) }) }, "an empty label"},
		"axis past the shape": {func() error {
			return allocate(func(b *batch.Batch) {
				b.In(f.solver, "x", vram.ArrayRequest{Shape: []int{2, 100}, DType: vram.Float32, ChunkAxis: 2})
			})
		}, `input "x" of solver#1: set ChunkAxis to its run axis, 0 to 1, or Unchunkable: chunk axis 2 is past shape [2 100]`},
		"twice": {func() error {
			return allocate(func(b *batch.Batch) { b.In(f.solver, "x", req); b.Out(f.solver, "x", req) })
		}, `"x" of solver#1 declared twice`},
		"two managers": {func() error { return allocate(func(b *batch.Batch) { b.In(f.solver, "x", req); b.In(m2, "y", req) }) }, "another manager's client"},
		"two groups": {func() error {
			return allocate(func(b *batch.Batch) { b.In(f.solver, "x", req); b.Out(other, "y", req) })
		}, "share one group"},
		"two sides":       {func() error { return allocate(func(b *batch.Batch) { b.In(f.solver, "x", req, fill, fill) }) }, "2 host sides"},
		"drain an input":  {func() error { return allocate(func(b *batch.Batch) { b.In(f.solver, "x", req, drain) }) }, "input \"x\": a Drain"},
		"fill an output":  {func() error { return allocate(func(b *batch.Batch) { b.Out(f.solver, "x", req, fill) }) }, "output \"x\": a Fill"},
		"side on scratch": {func() error { return batch.New().Scratch(f.writer, "s", req).Use(fill) }, "scratch array \"s\": a host side"},
		"no compute":      {func() error { return run(batch.Options{}, nil) }, "no compute step"},
		"four buffers":    {func() error { return run(batch.Options{Buffers: 4}, f.compute) }, "4 buffers in flight: want 1 to 3"},
		"negative cap":    {func() error { return run(batch.Options{MaxChunkLength: -1}, f.compute) }, "MaxChunkLength -1"},
		"no host side":    {func() error { return run(batch.Options{}, f.compute, batch.Side{}) }, `input "in" of solver#1 has no host side`},
		"wrong host":      {func() error { return run(batch.Options{}, f.compute, batch.Host(short)) }, "does not match its request float32[2 200000]"},
		"fill a whole":    {func() error { return run(batch.Options{}, f.compute, batch.Host(in), fill) }, `"table" of solver#1 is unchunkable`},
		"freed host": {func() error {
			h, err := f.m.NewHostArray([]int{2, 200_000}, vram.Float32, vram.Pageable, nil)
			must(t, err)
			must(t, h.Free())
			return run(batch.Options{}, f.compute, batch.Host(h))
		}, "was freed"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			before := f.leaks(t)
			err := tc.err()
			if !errors.Is(err, batch.ErrBatch) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want ErrBatch saying %q", err, tc.want)
			}
			if after := f.leaks(t); after != before {
				t.Errorf("device before: %v; after: %v", before, after)
			}
		})
	}
}

// TestAllocateRestoresQueues: a batch whose Allocate fails leaves its
// clients' queues as they were.
func TestAllocateRestoresQueues(t *testing.T) {
	f := newBatchFixture(t, 1000, 1)
	mine := map[string]vram.ArrayRequest{"keep": {Shape: []int{8}, DType: vram.Int32}}
	must(t, f.solver.Queue(mine))
	b := batch.New()
	b.In(f.solver, "x", vram.ArrayRequest{Shape: []int{2, 1000}, DType: vram.Float32, ChunkAxis: 1})
	b.Out(f.writer, "y", vram.ArrayRequest{Shape: []int{2, 999}, DType: vram.Float32, ChunkAxis: 1}) // runs disagree
	if err := b.Allocate(context.Background()); !errors.Is(err, vram.ErrRunsMismatch) {
		t.Fatalf("error %v, want ErrRunsMismatch", err)
	}
	if q := f.solver.Queued(); len(q) != 1 || q["keep"].DType != vram.Int32 || len(f.writer.Queued()) != 0 {
		t.Errorf("queues after the failure: solver %v, writer %v; want the solver's own back and the writer's empty", q, f.writer.Queued())
	}
}

// TestRunStepErrors makes a step of the second chunk fail and checks
// that the error names the chunk from 1 and the step, and that what was
// enqueued has finished and been freed.
func TestRunStepErrors(t *testing.T) {
	boom := errors.New("boom")
	tests := map[string]struct {
		fill bool
		want string
	}{
		"compute": {want: "chunk 2 of %d: launch the kernel: boom"},
		"fill":    {fill: true, want: `chunk 2 of %d: fill "in" of solver`},
	}
	for name, tc := range tests {
		for _, buffers := range []int{1, 2} {
			t.Run(fmt.Sprintf("%s, %d buffers", name, buffers), func(t *testing.T) {
				f := newBatchFixture(t, 200_000, buffers)
				f.hosts(t, vram.Pinned)
				compute := f.compute
				if tc.fill {
					must(t, f.in.Use(batch.Fill(func(sp vram.Span, st *vram.HostArray) error {
						if sp.Start > 0 {
							return boom
						}
						return nil
					})))
				} else {
					compute = func(ctx context.Context, ch *batch.Chunk) error {
						if ch.Index == 1 {
							return fmt.Errorf("launch the kernel: %w", boom)
						}
						return f.compute(ctx, ch)
					}
				}
				before := f.leaks(t)
				rep, err := f.b.Run(context.Background(), batch.Options{Buffers: buffers}, compute)
				want := fmt.Sprintf(tc.want, f.plan().Chunks)
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
	iv := func(a, b int) [2]time.Time {
		return [2]time.Time{t0.Add(time.Duration(a) * time.Millisecond), t0.Add(time.Duration(b) * time.Millisecond)}
	}
	tests := map[string]struct {
		a, b [][2]time.Time
		want time.Duration
	}{
		"none":       {[][2]time.Time{iv(0, 1)}, [][2]time.Time{iv(2, 3)}, 0},
		"inside":     {[][2]time.Time{iv(0, 10)}, [][2]time.Time{iv(2, 3), iv(5, 7)}, 3 * time.Millisecond},
		"staggered":  {[][2]time.Time{iv(0, 4), iv(6, 10)}, [][2]time.Time{iv(3, 7)}, 2 * time.Millisecond},
		"empty":      {nil, [][2]time.Time{iv(0, 1)}, 0},
		"same":       {[][2]time.Time{iv(1, 2), iv(3, 4)}, [][2]time.Time{iv(1, 2), iv(3, 4)}, 2 * time.Millisecond},
		"touching":   {[][2]time.Time{iv(0, 2)}, [][2]time.Time{iv(2, 4)}, 0},
		"b contains": {[][2]time.Time{iv(2, 3), iv(4, 5)}, [][2]time.Time{iv(0, 10)}, 2 * time.Millisecond},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if got := batch.Overlap(tc.a, tc.b); got != tc.want {
				t.Errorf("overlap = %v, want %v", got, tc.want)
			}
		})
	}
}

// TestChunkArray: a scratch array is the compute step's in each chunk's
// buffer, its client marked busy like the others; Launch takes the
// batch's arrays and refuses another batch's, naming the argument.
func TestChunkArray(t *testing.T) {
	f := newFixture(t, 200_000, 2, fixtureOpts{scratchOut: true})
	f.hosts(t, vram.Pinned)
	var seen []*vram.DeviceArray
	writerIdle := false
	// Two buffers, as allocated (a chosen count could re-cut the chunks).
	rep, err := f.b.Run(context.Background(), batch.Options{Buffers: 2}, func(ctx context.Context, ch *batch.Chunk) error {
		seen = append(seen, ch.Array(f.out))
		if idle, err := f.writer.Idle(); err != nil || idle {
			writerIdle = true // evictable while its scratch array is in use
		}
		return f.compute(ctx, ch)
	})
	if writerIdle {
		t.Error("the writer, whose scratch array the batch uses, was idle during it")
	}
	if err != nil || rep.ChunksDone != f.plan().Chunks || rep.BytesOut != 0 {
		t.Fatalf("batch with the writer's array as scratch: %v, %d of %d chunks, %d bytes out", err, rep.ChunksDone, f.plan().Chunks, rep.BytesOut)
	}
	for i, d := range seen {
		if want := f.out.Device(i % 2); d != want || d == nil {
			t.Errorf("chunk %d: Array(out) = %v, want buffer %d's %v", i, d, i%2, want)
		}
	}
	g := newBatchFixture(t, 200_000, 2)
	_, err = f.b.Run(context.Background(), batch.Options{}, func(_ context.Context, ch *batch.Chunk) error {
		return ch.Launch(f.k, f.in, g.out, f.table)
	})
	if !errors.Is(err, kernel.ErrArgs) || !strings.Contains(err.Error(), `argument 1 is "out" of writer`) {
		t.Errorf("launch with another batch's array: %v, want kernel.ErrArgs naming argument 1", err)
	}
}

// TestRunMarksWork: while a batch runs, its clients are busy and
// never evicted; once it returns they are idle.
func TestRunMarksWork(t *testing.T) {
	f := newBatchFixture(t, 200_000, 2)
	f.hosts(t, vram.Pinned)
	busy := map[string]bool{}
	_, err := f.b.Run(t.Context(), batch.Options{Buffers: 2}, func(ctx context.Context, ch *batch.Chunk) error {
		for _, c := range []*vram.Client{f.solver, f.writer} {
			if idle, err := c.Idle(); err != nil || idle {
				busy[c.Name()] = false
			} else if _, seen := busy[c.Name()]; !seen {
				busy[c.Name()] = true
			}
		}
		return f.compute(ctx, ch)
	})
	if err != nil {
		t.Fatal(err)
	}
	for n, b := range busy {
		if !b {
			t.Errorf("%s was idle during the batch", n)
		}
	}
	if len(busy) != 2 {
		t.Errorf("checked %d clients, want 2", len(busy))
	}
	for _, c := range []*vram.Client{f.solver, f.writer} {
		if idle, err := c.Idle(); err != nil || !idle {
			t.Errorf("%v after the batch: idle %v, %v", c, idle, err)
		}
	}
}
