package vram

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/vramkit/vram/internal/units"
)

// TestRunBatchHostCap runs the fixture with its host arrays chosen by the
// ladder under a host limit that holds one staging buffer per staged
// array but not two chunks' worth: the arrays spill to files, the batch
// stages them through the pool with the host no chunk ahead, and every
// result is right.
func TestRunBatchHostCap(t *testing.T) {
	const runs = 200_000
	for _, buffers := range []int{1, 2} {
		t.Run(fmt.Sprintf("%d buffers", buffers), func(t *testing.T) {
			f := newBatchFixture(t, runs, buffers)
			chunk := f.sr.Arrays["in"].Bytes() + f.wr.Arrays["out"].Bytes() // one chunk's staging
			f.m.host.lim.limit = chunk + chunk/2
			f.m.host.lim.spill = t.TempDir()
			mk := func(shape []int, like any) *HostArray {
				h, err := f.m.Host().Alloc(shape, Float32, HostArrayOptions{Like: like})
				must(t, err)
				t.Cleanup(func() { h.Free() })
				return h
			}
			vals := make([]float32, 2*runs)
			for i := range vals {
				vals[i] = float32(i % 4096)
			}
			in, table, out := mk([]int{2, runs}, vals), mk([]int{4}, []float32{3, 1, 0, 0}), mk([]int{2, runs}, nil)
			if in.Placement().Rung != RungFile || out.Placement().Rung != RungFile {
				t.Fatalf("in on %v, out on %v: want both spilled to files", in.Placement(), out.Placement())
			}
			rep, err := RunBatch(context.Background(), f.solver, Batch{
				Arrays:  []BatchArray{In(f.sr, "in", in), In(f.sr, "table", table), Out(f.wr, "out", out)},
				Compute: f.compute,
			})
			if err != nil {
				t.Fatal(err)
			}
			if rep.ChunksDone != f.sr.Chunks || rep.Staged != 2 || rep.Lag != 0 || rep.Buffers != 1 {
				t.Errorf("report %+v: want all %d chunks, 2 staged, lag 0, 1 buffer", rep, f.sr.Chunks)
			}
			if bad := f.checkOut(out.Float32s(), runs); bad != 0 {
				t.Fatalf("%d wrong results", bad)
			}
			if s := f.m.Host().Stats(); s.RAM() > s.Limit {
				t.Errorf("host stats %+v: over the limit", s)
			}
			if st := f.m.Host().Staging().Stats(); st.Buffers != 2 || st.InUse != 0 {
				t.Errorf("staging pool %+v: want the 2 buffers back", st)
			}
		})
	}
}

// TestRunBatchStagingShort checks that a pool with room for three
// chunk-sized staging buffers (two for the input, one for the output; two
// buffers in flight with the host one chunk ahead want three and two)
// keeps both buffers in flight with the host no chunk ahead, and the
// batch correct.
func TestRunBatchStagingShort(t *testing.T) {
	const runs = 200_000
	f := newBatchFixture(t, runs, 2)
	chunk := f.sr.Arrays["in"].Bytes() + f.wr.Arrays["out"].Bytes()
	in, table, out := f.hosts(t, Pageable)
	s := f.m.Host().Stats()
	f.m.host.lim.limit = s.RAM() + chunk + chunk/2
	rep, err := RunBatch(context.Background(), f.solver, Batch{
		Arrays:  []BatchArray{In(f.sr, "in", in), In(f.sr, "table", table), Out(f.wr, "out", out)},
		Compute: f.compute,
	})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Lag != 0 || rep.Buffers != 2 || rep.ChunksDone != f.sr.Chunks {
		t.Errorf("report %+v: want every chunk, lag 0 with 2 buffers", rep)
	}
	if bad := f.checkOut(out.Float32s(), runs); bad != 0 {
		t.Fatalf("%d wrong results", bad)
	}
}

// TestRunBatchStagingTooSmall gives the pool a host limit under one
// chunk's staging buffers: the batch is refused at once with an error
// that matches ErrOutOfMemory, names the staged arrays, their chunk
// sizes and the host limit, and does not speak of device memory.
func TestRunBatchStagingTooSmall(t *testing.T) {
	const runs = 200_000
	f := newBatchFixture(t, runs, 1)
	in, table, out := f.hosts(t, Pageable)
	f.m.host.lim.limit = f.m.Host().Stats().RAM() + f.sr.Arrays["in"].Bytes()/2
	rep, err := RunBatch(context.Background(), f.solver, Batch{
		Arrays:  []BatchArray{In(f.sr, "in", in), In(f.sr, "table", table), Out(f.wr, "out", out)},
		Compute: f.compute,
	})
	if !errors.Is(err, ErrOutOfMemory) {
		t.Fatalf("error %v, want one wrapping ErrOutOfMemory", err)
	}
	msg := err.Error()
	for _, want := range []string{`"in" of`, `"out" of`, "a chunk", "host", units.Format(f.m.Host().Stats().Limit)} {
		if !strings.Contains(msg, want) {
			t.Errorf("error %q does not say %q", msg, want)
		}
	}
	if strings.Contains(msg, "device memory") || strings.Contains(msg, "0: none") {
		t.Errorf("error %q speaks of device memory or an unset limit", msg)
	}
	if rep.ChunksDone != 0 {
		t.Errorf("%d chunks done, want none", rep.ChunksDone)
	}
}
