package batch_test

import (
	"context"
	"testing"

	"github.com/vramkit/vram"
	"github.com/vramkit/vram/batch"
	"github.com/vramkit/vram/device/sim"
	"github.com/vramkit/vram/kernel"
)

// newSim makes a simulated device of total bytes with no context and
// closes it when the test ends, failing the test if anything is left on
// it (memory, pinned buffers, streams).
func newSim(t testing.TB, total uint64, mod ...func(*sim.Config)) *sim.Device {
	t.Helper()
	cfg := sim.Config{TotalBytes: total, NoContext: true}
	for _, f := range mod {
		f(&cfg)
	}
	dev, err := sim.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if r := dev.Leaks(); !r.Empty() {
			t.Errorf("device left with: %s", r)
		}
		if err := dev.Close(); err != nil {
			t.Errorf("close device: %v", err)
		}
	})
	return dev
}

// batchFixture is a group of two clients, a solver with inputs "in"
// [2, runs] float32 chunked along axis 1 and an unchunkable "table"
// [4] float32, and a writer with output "out" [2, runs]; planned on a
// device small enough for several chunks.
type batchFixture struct {
	m              *vram.Manager
	dev            *sim.Device
	solver, writer *vram.Client
	sr, wr         *vram.ArrayResponse
	runs           int
	k              *kernel.Kernel
	in, out        *vram.HostArray // the last hosts made
}

// newBatchFixture allocates the fixture's arrays with buffers in flight.
func newBatchFixture(t *testing.T, runs, buffers int, mod ...func(*sim.Config)) *batchFixture {
	t.Helper()
	return newHostFixture(t, runs, buffers, vram.HostOptions{}, mod...)
}

// newHostFixture is newBatchFixture with the manager's host memory
// configured by host.
func newHostFixture(t *testing.T, runs, buffers int, host vram.HostOptions, mod ...func(*sim.Config)) *batchFixture {
	t.Helper()
	dev := newSim(t, 1<<20, append([]func(*sim.Config){func(c *sim.Config) { c.Granularity = 4 << 10 }}, mod...)...)
	m, err := vram.New(dev, vram.WithAllocator(vram.Pool), vram.WithHostOptions(host))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	f := &batchFixture{m: m, dev: dev, runs: runs}
	f.solver, err = m.Register(vram.ClientOptions{Name: "solver", Group: "g", Proportion: 0.5, OnAllocated: func(r *vram.ArrayResponse) { f.sr = r }})
	if err != nil {
		t.Fatal(err)
	}
	f.writer, err = m.Register(vram.ClientOptions{Name: "writer", Group: "g", Proportion: 0.3, OnAllocated: func(r *vram.ArrayResponse) { f.wr = r }})
	if err != nil {
		t.Fatal(err)
	}
	must(t, f.solver.Queue(map[string]vram.ArrayRequest{
		"in":    {Shape: []int{2, runs}, DType: vram.Float32, ChunkAxis: 1},
		"table": {Shape: []int{4}, DType: vram.Float32, Unchunkable: true},
	}))
	must(t, f.writer.Queue(map[string]vram.ArrayRequest{"out": {Shape: []int{2, runs}, DType: vram.Float32, ChunkAxis: 1}}))
	if _, err := f.solver.Allocate(context.Background(), vram.WithBuffers(buffers)); err != nil {
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

// leaks is what is live on the device, the manager's staging pool
// trimmed first (it keeps idle buffers for the next batch; a staging
// buffer still in use is not trimmed, and shows). The pinned pool's cache
// is counted: a batch makes no pinned host array, so it does not change.
// Events are left out: the pool keeps one per stream it has seen.
func (f *batchFixture) leaks(t *testing.T) string {
	t.Helper()
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
func (f *batchFixture) compute(_ context.Context, ch *batch.Chunk) error {
	return ch.Launch(f.k, ch.Array(f.sr, "in"), ch.Array(f.wr, "out"), uint32(ch.ChunkLength), ch.Array(f.sr, "table"))
}

// hosts makes the full-length host arrays, in filled with its index.
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
	f.in, f.out = in, out
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
