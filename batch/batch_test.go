package batch_test

import (
	"context"
	"errors"
	"fmt"
	"github.com/vramkit/vram"
	"github.com/vramkit/vram/batch"
	"runtime"
	"strings"
	"testing"
	"time"

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
				in, table, out := f.hosts(t, mem)
				arrays := []batch.Array{batch.In(f.sr, "in", in), batch.In(f.sr, "table", table), batch.Out(f.wr, "out", out)}
				if side == "functions" {
					arrays[0] = batch.InFunc(f.sr, "in", 1, func(sp vram.Span, st *vram.HostArray) error {
						return st.CopyChunkFrom(in, sp)
					})
					arrays[2] = batch.OutFunc(f.wr, "out", 1, func(sp vram.Span, st *vram.HostArray) error {
						return st.CopyChunkTo(out, sp)
					})
				}
				var seen []int
				rep, err := batch.Run(context.Background(), f.solver, batch.Batch{Arrays: arrays, Buffers: buffers, Compute: f.compute,
					Progress: func(p batch.Progress) { seen = append(seen, p.Chunk) }})
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
					if _, err := batch.Run(context.Background(), f.solver, batch.Batch{Arrays: arrays, Buffers: buffers, Compute: f.compute}); err != nil {
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

// TestRunCancel cancels a batch halfway, between chunks or while a
// chunk is being enqueued, and checks that it stops there with an error
// wrapping context.Canceled, that the chunks it reports done are back on
// the host, and that nothing is left: device memory, pinned buffers,
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
			in, table, out := f.hosts(t, vram.Pageable) // staged: pinned buffers to leak
			n := f.sr.Chunks
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			if tc.where == "start" {
				cancel()
			}
			compute := func(ctx context.Context, ch *batch.Chunk) error {
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
			rep, err := batch.Run(ctx, f.solver, batch.Batch{
				Arrays:  []batch.Array{batch.In(f.sr, "in", in), batch.In(f.sr, "table", table), batch.Out(f.wr, "out", out)},
				Buffers: tc.buffers, Compute: compute,
				Progress: func(p batch.Progress) {
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

// TestRunErrors gives Run batches it cannot run: each is
// refused with ErrBatch and a message naming what to change, and leaves
// nothing behind (newSim checks the device at the end).
func TestRunErrors(t *testing.T) {
	f := newBatchFixture(t, 200_000, 2)
	in, table, out := f.hosts(t, vram.Pinned)
	short, err := f.m.NewHostArray([]int{2, 100}, vram.Float32, vram.Pinned, nil)
	must(t, err)
	defer short.Free()
	other, err := f.m.Register(vram.ClientOptions{Name: "other", Group: "elsewhere"})
	must(t, err)
	ok := []batch.Array{batch.In(f.sr, "in", in), batch.In(f.sr, "table", table), batch.Out(f.wr, "out", out)}
	tests := map[string]struct {
		c    *vram.Client
		b    batch.Batch
		want string
	}{
		"no compute":     {f.solver, batch.Batch{Arrays: ok}, "needs a Compute step"},
		"no arrays":      {f.solver, batch.Batch{Compute: f.compute}, "at least one array"},
		"unknown label":  {f.solver, batch.Batch{Arrays: []batch.Array{batch.In(f.sr, "nope", in)}, Compute: f.compute}, `no device array "nope"; its labels are in, table`},
		"four buffers":   {f.solver, batch.Batch{Arrays: ok, Buffers: 4, Compute: f.compute}, "4 buffers in flight: want 1 to 3"},
		"more than made": {f.solver, batch.Batch{Arrays: ok, Buffers: 3, Compute: f.compute}, "allocated with 2; allocate with WithBuffers(3)"},
		"wrong host":     {f.solver, batch.Batch{Arrays: []batch.Array{batch.In(f.sr, "in", short)}, Compute: f.compute}, "want the same shape but for the chunk axis"},
		"other group":    {other, batch.Batch{Arrays: ok, Compute: f.compute}, `not the batch's "elsewhere"`},
		"bad axis": {f.solver, batch.Batch{Arrays: []batch.Array{batch.InFunc(f.sr, "in", 0, func(vram.Span, *vram.HostArray) error { return nil })}, Compute: f.compute},
			"axis 0 of its shape"},
		"other's label":   {f.solver, batch.Batch{Arrays: []batch.Array{batch.Out(f.sr, "out", out)}, Compute: f.compute}, `"out" is writer#2's: pass writer#2's ArrayResponse, which its OnAllocated hook receives`},
		"nil response":    {f.solver, batch.Batch{Arrays: []batch.Array{batch.In(nil, "in", in)}, Compute: f.compute}, "nil response"},
		"nil host and fn": {f.solver, batch.Batch{Arrays: []batch.Array{batch.In(f.sr, "in", nil)}, Compute: f.compute}, "no host array and no function"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			before := f.leaks(t)
			_, err := batch.Run(context.Background(), tc.c, tc.b)
			if !errors.Is(err, batch.ErrBatch) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want ErrBatch saying %q", err, tc.want)
			}
			if after := f.leaks(t); after != before {
				t.Errorf("device before: %v; after: %v", before, after)
			}
		})
	}
}

// TestRunStepErrors makes a step of the second chunk fail and checks
// that the error names the chunk from 1 and the step, and that what was
// enqueued has finished and been freed.
func TestRunStepErrors(t *testing.T) {
	boom := errors.New("boom")
	tests := map[string]struct {
		compute func(f *batchFixture) func(context.Context, *batch.Chunk) error
		fill    bool
		want    string
	}{
		"compute": {compute: func(f *batchFixture) func(context.Context, *batch.Chunk) error {
			return func(ctx context.Context, ch *batch.Chunk) error {
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
				in, table, out := f.hosts(t, vram.Pinned)
				arrays := []batch.Array{batch.In(f.sr, "in", in), batch.In(f.sr, "table", table), batch.Out(f.wr, "out", out)}
				compute := f.compute
				if tc.compute != nil {
					compute = tc.compute(f)
				}
				if tc.fill {
					arrays[0] = batch.InFunc(f.sr, "in", 1, func(sp vram.Span, st *vram.HostArray) error {
						if sp.Start > 0 {
							return boom
						}
						return nil
					})
				}
				before := f.leaks(t)
				rep, err := batch.Run(context.Background(), f.solver, batch.Batch{Arrays: arrays, Buffers: buffers, Compute: compute})
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

// TestChunkArray: Chunk.Array reaches a response no Array names (a
// client holding scratch arrays only), whose client the batch marks busy
// like the others, and Launch refuses a nil array (a label Array did not
// find) naming the argument.
func TestChunkArray(t *testing.T) {
	f := newBatchFixture(t, 200_000, 2)
	in, table, _ := f.hosts(t, vram.Pinned)
	scratchOnly := []batch.Array{batch.In(f.sr, "in", in), batch.In(f.sr, "table", table)} // the writer's out is scratch
	var seen []*vram.DeviceArray
	writerIdle := false
	rep, err := batch.Run(context.Background(), f.solver, batch.Batch{Arrays: scratchOnly,
		Compute: func(ctx context.Context, ch *batch.Chunk) error {
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
	_, err = batch.Run(context.Background(), f.solver, batch.Batch{Arrays: scratchOnly,
		Compute: func(_ context.Context, ch *batch.Chunk) error {
			return ch.Launch(f.k, ch.Array(f.sr, "in"), ch.Array(f.wr, "nope"), uint32(ch.ChunkLength), ch.Array(f.sr, "table"))
		}})
	if !errors.Is(err, kernel.ErrArgs) || !strings.Contains(err.Error(), "argument 1 is a nil *DeviceArray") {
		t.Errorf("launch with a nil array: %v, want kernel.ErrArgs naming argument 1", err)
	}
}

// TestRunMarksWork: while a batch runs, its clients are busy and
// never evicted; once it returns they are idle.
func TestRunMarksWork(t *testing.T) {
	f := newBatchFixture(t, 200_000, 2)
	in, table, out := f.hosts(t, vram.Pinned)
	busy := map[string]bool{}
	_, err := batch.Run(t.Context(), f.solver, batch.Batch{
		Arrays:  []batch.Array{batch.In(f.sr, "in", in), batch.In(f.sr, "table", table), batch.Out(f.wr, "out", out)},
		Buffers: 2,
		Compute: func(ctx context.Context, ch *batch.Chunk) error {
			for _, c := range []*vram.Client{f.solver, f.writer} {
				if idle, err := c.Idle(); err != nil || idle {
					busy[c.Name()] = false
				} else if _, seen := busy[c.Name()]; !seen {
					busy[c.Name()] = true
				}
			}
			return f.compute(ctx, ch)
		},
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
