package batch_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/vramkit/vram"
	"github.com/vramkit/vram/batch"
	"github.com/vramkit/vram/internal/units"
)

// TestRunHostCap runs the fixture with its host arrays chosen by the
// ladder under a host limit that holds one staging buffer per staged
// array but not two chunks' worth: the arrays spill to files, the batch
// stages them through the pool with the host no chunk ahead, and every
// result is right.
func TestRunHostCap(t *testing.T) {
	const runs = 200_000
	for _, buffers := range []int{1, 2} {
		t.Run(fmt.Sprintf("%d buffers", buffers), func(t *testing.T) {
			chunk := probeStaging(t, runs, buffers, vram.Pinned).chunk // one chunk's staging
			f := newFixture(t, runs, buffers, fixtureOpts{host: vram.HostOptions{Limit: chunk + chunk/2, SpillDir: t.TempDir()}})
			mk := func(shape []int, like any) *vram.HostArray {
				h, err := f.m.Host().Alloc(shape, vram.Float32, vram.HostArrayOptions{Like: like})
				must(t, err)
				t.Cleanup(func() { h.Free() })
				return h
			}
			vals := make([]float32, 2*runs)
			for i := range vals {
				vals[i] = float32(i % 4096)
			}
			in, table, out := mk([]int{2, runs}, vals), mk([]int{4}, []float32{3, 1, 0, 0}), mk([]int{2, runs}, nil)
			if in.Placement().Rung != vram.RungFile || out.Placement().Rung != vram.RungFile {
				t.Fatalf("in on %v, out on %v: want both spilled to files", in.Placement(), out.Placement())
			}
			f.use(t, in, table, out)
			rep, err := f.b.Run(context.Background(), batch.Options{}, f.compute)
			if err != nil {
				t.Fatal(err)
			}
			if rep.ChunksDone != f.plan().Chunks || rep.Staged != 2 || rep.Lag != 0 || rep.Buffers != 1 {
				t.Errorf("report %+v: want all %d chunks, 2 staged, lag 0, 1 buffer", rep, f.plan().Chunks)
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

// TestRunStagingShort checks that a pool with room for three
// chunk-sized staging buffers (two for the input, one for the output; two
// buffers in flight with the host one chunk ahead want three and two)
// keeps both buffers in flight with the host no chunk ahead, and the
// batch correct.
func TestRunStagingShort(t *testing.T) {
	const runs = 200_000
	p := probeStaging(t, runs, 2, vram.Pageable)
	f := newFixture(t, runs, 2, fixtureOpts{host: vram.HostOptions{Limit: p.ram + p.chunk + p.chunk/2}})
	_, _, out := f.hosts(t, vram.Pageable)
	rep, err := f.b.Run(context.Background(), batch.Options{}, f.compute)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Lag != 0 || rep.Buffers != 2 || rep.ChunksDone != f.plan().Chunks {
		t.Errorf("report %+v: want every chunk, lag 0 with 2 buffers", rep)
	}
	if bad := f.checkOut(out.Float32s(), runs); bad != 0 {
		t.Fatalf("%d wrong results", bad)
	}
}

// TestRunStagingTooSmall gives the pool a host limit under one
// chunk's staging buffers: the batch is refused at once with an error
// that matches ErrOutOfMemory, names the staged arrays, their chunk
// sizes and the host limit, and does not speak of device memory.
func TestRunStagingTooSmall(t *testing.T) {
	const runs = 200_000
	p := probeStaging(t, runs, 1, vram.Pageable)
	f := newFixture(t, runs, 1, fixtureOpts{host: vram.HostOptions{Limit: p.ram + p.in/2}})
	f.hosts(t, vram.Pageable)
	rep, err := f.b.Run(context.Background(), batch.Options{}, f.compute)
	if !errors.Is(err, vram.ErrOutOfMemory) {
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

// staging is what a fixture's batch stages: the bytes of one chunk of
// "in" and of "in" and "out" together, and the host RAM the fixture's
// host arrays of mem take.
type staging struct{ in, chunk, ram uint64 }

// probeStaging measures staging on a fixture of its own: the host limit
// a test sets comes from what the plan gives, before the fixture with
// the limit is made.
func probeStaging(t *testing.T, runs, buffers int, mem vram.MemoryType) staging {
	t.Helper()
	f := newBatchFixture(t, runs, buffers)
	f.hosts(t, mem)
	in := f.in.Device(0).Bytes()
	return staging{in: in, chunk: in + f.out.Device(0).Bytes(), ram: f.m.Host().Stats().RAM()}
}
