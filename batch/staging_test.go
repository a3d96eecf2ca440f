package batch_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/vramkit/vram"
	"github.com/vramkit/vram/batch"
)

// TestRunHostCap runs the fixture with its host arrays chosen by the
// ladder under a host limit that holds one staging buffer per staged
// array but not two chunks' worth: the arrays spill to files, the batch
// stages them through the pool (with fewer slots, or shorter chunks),
// stays within the limit, and every result is right.
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
			if rep.ChunksDone != rep.Chunks || rep.Runs != runs || rep.Staged != 2 {
				t.Errorf("report %+v: want every chunk and run, 2 staged", rep)
			}
			if bad := f.checkOut(out.Float32s(), runs); bad != 0 {
				t.Fatalf("%d wrong results", bad)
			}
			if s := f.m.Host().Stats(); s.RAM() > s.Limit {
				t.Errorf("host stats %+v: over the limit", s)
			}
			if st := f.m.Host().Staging().Stats(); st.Buffers < 2 || st.InUse != 0 {
				t.Errorf("staging pool %+v: want every buffer back, one per staged array at least", st)
			}
		})
	}
}

// TestRunStagingShort checks that a pool with room for three
// chunk-sized staging buffers (two for the input, one for the output; two
// buffers in flight with the host one chunk ahead want more) runs the
// batch correctly within the host limit, with the buffers and the host's
// lead fitted to what the pool gave.
func TestRunStagingShort(t *testing.T) {
	const runs = 200_000
	p := probeStaging(t, runs, 2, vram.Pageable)
	f := newFixture(t, runs, 2, fixtureOpts{host: vram.HostOptions{Limit: p.ram + p.chunk + p.chunk/2}})
	_, _, out := f.hosts(t, vram.Pageable)
	rep, err := f.b.Run(context.Background(), batch.Options{Buffers: 2}, f.compute)
	if err != nil {
		t.Fatal(err)
	}
	if rep.ChunksDone != rep.Chunks || rep.Runs != runs || rep.Buffers < 1 || rep.Lag > 1 {
		t.Errorf("report %+v: want every chunk and run, the buffers and lead the staging left", rep)
	}
	if s := f.m.Host().Stats(); s.RAM() > s.Limit {
		t.Errorf("host stats %+v: over the limit", s)
	}
	if bad := f.checkOut(out.Float32s(), runs); bad != 0 {
		t.Fatalf("%d wrong results", bad)
	}
}

// TestRunStagingShrinks gives the pool host limits under one chunk's
// staging buffers: the chunks shrink until they fit, and every result is
// right; under one run's staging the batch is refused at once with an
// error that matches ErrOutOfMemory, names the staged arrays, a run's
// bytes and the room, and does not speak of device memory.
func TestRunStagingShrinks(t *testing.T) {
	const runs = 200_000
	p := probeStaging(t, runs, 1, vram.Pageable)
	tests := map[string]struct {
		limit  uint64
		refuse bool
	}{
		"half the input's chunk": {limit: p.ram + p.in/2},
		"a tenth of a chunk":     {limit: p.ram + p.chunk/10},
		"under one run":          {limit: p.ram + 8, refuse: true},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			f := newFixture(t, runs, 1, fixtureOpts{host: vram.HostOptions{Limit: tc.limit}})
			_, _, out := f.hosts(t, vram.Pageable)
			rep, err := f.b.Run(context.Background(), batch.Options{Buffers: 1}, f.compute)
			if tc.refuse {
				if !errors.Is(err, vram.ErrOutOfMemory) {
					t.Fatalf("error %v, want one wrapping ErrOutOfMemory", err)
				}
				msg := err.Error()
				for _, want := range []string{`"in" of`, `"out" of`, "one run", "room", "host limit"} {
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
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if rep.ChunkLength >= f.plan().ChunkLength || rep.ChunksDone != rep.Chunks || rep.Runs != runs {
				t.Errorf("report %+v: want every run, in chunks shorter than the plan's %d", rep, f.plan().ChunkLength)
			}
			if len(rep.Recuts) == 0 || rep.Recuts[0].From != f.plan().ChunkLength || rep.Recuts[0].To >= rep.Recuts[0].From || !strings.Contains(rep.Recuts[0].Why, "staging") {
				t.Errorf("re-cuts %+v: want the first from the plan's length to a shorter one, for the staging", rep.Recuts)
			}
			if s := f.m.Host().Stats(); s.RAM() > s.Limit {
				t.Errorf("host stats %+v: over the limit", s)
			}
			if bad := f.checkOut(out.Float32s(), runs); bad != 0 {
				t.Fatalf("%d wrong results", bad)
			}
		})
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
