package batch_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/vramkit/vram"
	"github.com/vramkit/vram/batch"
	"github.com/vramkit/vram/device/sim"
	"github.com/vramkit/vram/internal/simtest"
	"github.com/vramkit/vram/kernel"
)

// TestInOut: an array copied in and out at the same runs of one host
// array (x ← 2x + k[0] over the chunk's runs, k unchunkable and in-out
// too: k ← k + 1 once, on the device, in the first chunk), with 1, 2 and 3
// buffers, pinned (copied directly) and pageable (staged both ways): every
// run is updated once, the counts of bytes and staged arrays name the
// array once per direction and once per array.
func TestInOut(t *testing.T) {
	const runs = 400_000 // 1.6 MB of x on 1 MiB: several chunks
	tests := map[string]struct {
		mem    vram.MemoryType
		staged int
	}{
		"pinned":   {vram.Pinned, 0},
		"pageable": {vram.Pageable, 1},
	}
	for name, tc := range tests {
		for _, buffers := range []int{1, 2, 3} {
			t.Run(fmt.Sprintf("%s, %d buffers", name, buffers), func(t *testing.T) {
				dev := simtest.New(t, 1<<20, func(c *sim.Config) { c.Granularity = 4 << 10 })
				m, err := vram.New(dev, vram.WithAllocator(vram.Pool))
				must(t, err)
				t.Cleanup(func() { m.Close() })
				c, err := m.Register(vram.ClientOptions{Name: "solver", Group: "g"})
				must(t, err)
				vals := make([]float32, runs)
				for i := range vals {
					vals[i] = float32(i % 1000)
				}
				hx, err := m.NewHostArray([]int{runs}, vram.Float32, tc.mem, vals)
				must(t, err)
				hk, err := m.NewHostArray([]int{1}, vram.Float32, tc.mem, []float32{5})
				must(t, err)
				t.Cleanup(func() { hx.Free(); hk.Free() })
				b := batch.New()
				x := b.InOut(c, "x", vram.ArrayRequest{Shape: []int{runs}, DType: vram.Float32}, batch.Host(hx))
				k := b.InOut(c, "k", vram.ArrayRequest{Shape: []int{1}, DType: vram.Float32, Unchunkable: true}, batch.Host(hk))
				must(t, b.Allocate(context.Background(), vram.WithBuffers(buffers)))
				t.Cleanup(func() { b.Close() })
				step, err := kernel.New("step", "", func(a kernel.Args, lo, hi int) error {
					x, k := a.Float32s(0), a.Float32s(1)
					for i := lo; i < hi; i++ {
						x[i] = 2*x[i] + k[0]
					}
					return nil
				}, 0)
				must(t, err)
				bump, err := kernel.New("bump", "", func(a kernel.Args, lo, hi int) error {
					if lo == 0 { // the launch's runs may come in parts: run 0's part bumps
						a.Float32s(0)[0]++
					}
					return nil
				}, 0)
				must(t, err)
				first0 := 0 // chunk 0's runs: k is 5 for them, 6 after
				rep, err := b.Run(context.Background(), batch.Options{Buffers: buffers}, func(_ context.Context, ch *batch.Chunk) error {
					if err := ch.Launch(step, x, k); err != nil {
						return err
					}
					if ch.Index == 0 {
						first0 = ch.Len
						return ch.Launch(bump, k)
					}
					return nil
				})
				must(t, err)
				if rep.Chunks < 2 || rep.Staged != tc.staged {
					t.Fatalf("%d chunks, %d staged: want several, %d staged", rep.Chunks, rep.Staged, tc.staged)
				}
				bad, first := 0, -1
				got := hx.Float32s()
				for i, v := range vals {
					want := 2*v + 5
					if i >= first0 { // after chunk 0 bumped k
						want = 2*v + 6
					}
					if got[i] != want {
						if bad++; first < 0 {
							first = i
						}
					}
				}
				if bad > 0 {
					t.Errorf("%d of %d runs wrong, the first run %d: %v", bad, runs, first, got[first])
				}
				if kk := hk.Float32s()[0]; kk != 6 {
					t.Errorf("k = %v after the batch; want 6, copied out once at the end", kk)
				}
				if rep.BytesIn != uint64(4*runs+4) || rep.BytesOut != uint64(4*runs+4) {
					t.Errorf("bytes in %d, out %d; want %d each way", rep.BytesIn, rep.BytesOut, 4*runs+4)
				}
			})
		}
	}
}

// TestInOutRefusesFunctions: an in-out array is copied from and into one
// host array, so a fill or drain function is refused.
func TestInOutRefusesFunctions(t *testing.T) {
	f := newBatchFixture(t, 1000, 1)
	b := batch.New()
	a := b.InOut(f.solver, "x", vram.ArrayRequest{Shape: []int{8}, DType: vram.Float32})
	for name, s := range map[string]batch.Side{
		"fill":  batch.Fill(func(vram.Span, *vram.HostArray) error { return nil }),
		"drain": batch.Drain(func(vram.Span, *vram.HostArray) error { return nil }),
	} {
		if err := a.Use(s); err == nil {
			t.Errorf("an in-out array took a %s function", name)
		}
	}
}
