package batch_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/vramkit/vram"
	"github.com/vramkit/vram/account"
	"github.com/vramkit/vram/batch"
	"github.com/vramkit/vram/device/sim"
	"github.com/vramkit/vram/internal/simtest"
	"github.com/vramkit/vram/kernel"
)

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// batchFixture is a batch of a group of two clients: a solver with the
// input "in" [2, runs] float32 chunked along axis 1 and the unchunkable
// input "table" [4] float32, and a writer with the output "out"
// [2, runs] (or, with scratchOut, the same array as a scratch array);
// allocated on a device small enough for several chunks.
type batchFixture struct {
	m              *vram.Manager
	dev            *sim.Device
	solver, writer *vram.Client
	b              *batch.Batch
	in, table, out *batch.Array
	runs           int
	k              *kernel.Kernel
	scratch        bool // out is a scratch array
}

// fixtureOpts vary a fixture: the manager's host memory, the simulator,
// the writer's array as scratch.
type fixtureOpts struct {
	host       vram.HostOptions
	sim        []func(*sim.Config)
	scratchOut bool
}

// newBatchFixture allocates the fixture's arrays with buffers in flight.
func newBatchFixture(t *testing.T, runs, buffers int, mod ...func(*sim.Config)) *batchFixture {
	t.Helper()
	return newFixture(t, runs, buffers, fixtureOpts{sim: mod})
}

func newFixture(t *testing.T, runs, buffers int, o fixtureOpts) *batchFixture {
	t.Helper()
	dev := simtest.New(t, 1<<20, append([]func(*sim.Config){func(c *sim.Config) { c.Granularity = 4 << 10 }}, o.sim...)...)
	m, err := vram.New(dev, vram.WithAllocatorChoice(account.Choice{Kind: vram.Pool}), vram.WithHostOptions(o.host))
	must(t, err)
	t.Cleanup(func() { m.Close() })
	f := &batchFixture{m: m, dev: dev, runs: runs, b: batch.New(), scratch: o.scratchOut}
	f.solver, err = m.Register(vram.ClientOptions{Name: "solver", Group: "g", Proportion: 0.5})
	must(t, err)
	f.writer, err = m.Register(vram.ClientOptions{Name: "writer", Group: "g", Proportion: 0.3})
	must(t, err)
	f.in = f.b.In(f.solver, "in", vram.ArrayRequest{Shape: []int{2, runs}, DType: vram.Float32, ChunkAxis: 1})
	f.table = f.b.In(f.solver, "table", vram.ArrayRequest{Shape: []int{4}, DType: vram.Float32, Unchunkable: true})
	outReq := vram.ArrayRequest{Shape: []int{2, runs}, DType: vram.Float32, ChunkAxis: 1}
	if o.scratchOut {
		f.out = f.b.Scratch(f.writer, "out", outReq)
	} else {
		f.out = f.b.Out(f.writer, "out", outReq)
	}
	must(t, f.b.Allocate(context.Background(), vram.WithBuffers(buffers)))
	t.Cleanup(func() { f.b.Close() })
	// out[r][i] = in[r][i]·table[0] + table[1] over the chunk's runs; the
	// arrays' rows are their views' shape[1] apart.
	f.k, err = kernel.New("scale", "", func(a kernel.Args, lo, hi int) error {
		in, out, tab, ld := a.Float32s(0), a.Float32s(1), a.Float32s(2), a.Shape(0)[1]
		for i := lo; i < hi; i++ {
			for r := range 2 {
				out[r*ld+i] = in[r*ld+i]*tab[0] + tab[1]
			}
		}
		return nil
	}, 0)
	must(t, err)
	return f
}

// plan is the fixture's plan.
func (f *batchFixture) plan() vram.ChunkPlan { return f.b.Plan() }

// leaks is what is live on the device, the manager's staging pool
// trimmed first (it keeps idle buffers for the next batch; a staging
// buffer still in use is not trimmed, and shows). The pinned pool's cache
// is counted: a batch makes no pinned host array, so it does not change.
// Events are left out: the pool keeps one per stream it has seen.
func (f *batchFixture) leaks(t *testing.T) string {
	t.Helper()
	must(t, f.m.Host().Staging().Trim())
	r := f.dev.Leaks()
	r.Events = 0
	return r.String()
}

// compute launches the fixture's kernel over chunk ch, after checking
// the chunk's figures against its arrays: ChunkLength is their stride.
func (f *batchFixture) compute(_ context.Context, ch *batch.Chunk) error {
	if d := ch.Array(f.in); ch.ChunkLength != d.Dim(1) || ch.Len > ch.ChunkLength || ch.Len < 1 {
		return fmt.Errorf("chunk %d: %d runs, chunk length %d; its array %v", ch.Index, ch.Len, ch.ChunkLength, d)
	}
	return ch.Launch(f.k, f.in, f.out, f.table)
}

// hosts makes the full-length host arrays of mem, in filled with its
// index, and gives them to the batch.
func (f *batchFixture) hosts(t *testing.T, mem vram.MemoryType) (in, table, out *vram.HostArray) {
	t.Helper()
	var err error
	vals := make([]float32, 2*f.runs)
	for i := range vals {
		vals[i] = float32(i % 4096)
	}
	in, err = f.m.NewHostArray([]int{2, f.runs}, vram.Float32, mem, vals)
	must(t, err)
	table, err = f.m.NewHostArray([]int{4}, vram.Float32, mem, []float32{3, 1, 0, 0})
	must(t, err)
	out, err = f.m.NewHostArray([]int{2, f.runs}, vram.Float32, mem, nil)
	must(t, err)
	t.Cleanup(func() { in.Free(); table.Free(); out.Free() })
	f.use(t, in, table, out)
	return in, table, out
}

// use gives the batch these host arrays (out nil, or a scratch out: none
// for the output).
func (f *batchFixture) use(t *testing.T, in, table, out *vram.HostArray) {
	t.Helper()
	must(t, f.in.Use(batch.Host(in)))
	must(t, f.table.Use(batch.Host(table)))
	if out != nil && !f.scratch {
		must(t, f.out.Use(batch.Host(out)))
	}
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
