package capi

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"unsafe"

	"github.com/vramkit/vram"
)

// batchFixture is a batch of two clients of one group on a simulator of
// 4 MiB: x, an input of runs float32 (host memory of the test's, staged,
// or a pinned host array of the client API's), y, its output, and k, an
// unchunkable in-out array of one float32.
type batchFixture struct {
	cs      Clients
	r       Registry
	m       *Manager
	in, out int64
	xs, ys  []float32
	ks      []float32
	arrays  []BatchArray
}

const batchRuns = 600_000 // 2.4 MB each of x and y on 4 MiB: several chunks

func newBatchFixture(t *testing.T, pinned bool) *batchFixture {
	t.Helper()
	f := &batchFixture{}
	f.m = open(t, &f.r, "sim:vram=4MiB", 0)
	t.Cleanup(func() { f.cs.CloseManager(&f.r, f.m.Handle()) })
	f.in = register(t, &f.cs, f.m, ClientOptions{Name: "solver", Group: "g"})
	f.out = register(t, &f.cs, f.m, ClientOptions{Name: "saver", Group: "g"})
	f.xs, f.ys, f.ks = make([]float32, batchRuns), make([]float32, batchRuns), []float32{3}
	for i := range f.xs {
		f.xs[i] = float32(i % 977)
	}
	req := vram.ArrayRequest{Shape: []int{batchRuns}, DType: vram.Float32}
	x := BatchArray{Client: f.in, Label: "x", Dir: BatchIn, Request: req, Host: f32(f.xs, batchRuns)}
	if pinned {
		hh, addr, err := f.cs.HostArray(f.m, []int{batchRuns}, vram.Float32, vram.Pinned)
		must(t, err)
		copy(floats(addr, batchRuns), f.xs)
		x.Host, x.HostHandle = HostDesc{}, hh
	}
	f.arrays = []BatchArray{x,
		{Client: f.out, Label: "y", Dir: BatchOut, Request: req, Host: f32(f.ys, batchRuns)},
		{Client: f.in, Label: "k", Dir: BatchInOut, Request: vram.ArrayRequest{Shape: []int{1}, DType: vram.Float32, Unchunkable: true},
			Host: f32(f.ks, 1)},
		{Client: f.out, Label: "tmp", Dir: BatchScratch, Request: req}}
	return f
}

// floats is n float32s at p, an address the client API handed out (memory
// it keeps pinned).
func floats(p uintptr, n int) []float32 {
	return unsafe.Slice((*float32)(*(*unsafe.Pointer)(unsafe.Pointer(&p))), n)
}

// TestBatchPipeline runs the fixture with 1, 2 and 3 buffers, staged and
// pinned, kernels on the host: each chunk's "kernel" (y = k·x over the
// chunk's runs, on the simulated memory; k ← k+1 in chunk 0) checks the
// pipeline's order by what the memory holds, not by time:
//   - its input buffer holds the chunk's runs of x when it is handed over
//     (the copy in completed before the kernel reads);
//   - after every copy enqueued so far has completed (a sync of the
//     group's stream), it still does (no copy in overwrote a buffer whose
//     kernel had not finished);
//   - with two or more buffers, consecutive chunks use different ones.
//
// Every run of y comes back, and k is copied out once, at the end.
func TestBatchPipeline(t *testing.T) {
	for _, pinned := range []bool{false, true} {
		for _, buffers := range []int{1, 2, 3} {
			t.Run(fmt.Sprintf("buffers %d, pinned %v", buffers, pinned), func(t *testing.T) {
				f := newBatchFixture(t, pinned)
				xs := f.xs
				h, err := f.cs.StartBatch(f.m, f.arrays, BatchOptions{Buffers: buffers, HostKernels: true})
				must(t, err)
				pi, err := f.cs.BatchPlan(h)
				must(t, err)
				if pi.Plan.Chunks < 2 || pi.Plan.Buffers != buffers || pi.Client != f.in || pi.Arrays != 2 {
					t.Fatalf("the batch's plan: %+v; want chunks, %d buffers, the solver's 2 arrays", pi, buffers)
				}
				var lastX uint64
				chunks, k, first := 0, float32(3), 0
				for {
					ch, done, err := f.cs.NextChunk(h)
					must(t, err)
					if done {
						break
					}
					if ch.ChunkLength != pi.Plan.ChunkLength || ch.Chunks != pi.Plan.Chunks {
						t.Fatalf("chunk %d: %d of %d chunks of %d runs; the plan says %d of %d", ch.Index, ch.Index, ch.Chunks, ch.ChunkLength, pi.Plan.Chunks, pi.Plan.ChunkLength)
					}
					x, y, kk := ch.Arrays[0], ch.Arrays[1], ch.Arrays[2]
					if x.Label != "x" || y.Label != "y" || kk.Label != "k" || ch.Arrays[3].Label != "tmp" || ch.SimHost[0] == 0 {
						t.Fatalf("chunk %d: arrays %+v", ch.Index, ch.Arrays)
					}
					if buffers > 1 && ch.Index > 0 && x.DevicePtr == lastX && ch.Chunks > 1 {
						t.Errorf("chunk %d uses the buffer of chunk %d (%#x) with %d buffers", ch.Index, ch.Index-1, x.DevicePtr, buffers)
					}
					lastX = x.DevicePtr
					dx, dy, dk := floats(ch.SimHost[0], ch.Len), floats(ch.SimHost[1], ch.Len), floats(ch.SimHost[2], 1)
					check := func(when string) {
						for i, v := range dx {
							if v != xs[ch.Start+i] {
								t.Fatalf("chunk %d (runs %d..%d), %s: x[%d] = %v; want %v", ch.Index, ch.Start, ch.Start+ch.Len, when, i, v, xs[ch.Start+i])
							}
						}
					}
					check("handed over")
					if dk[0] != k {
						t.Fatalf("chunk %d: k = %v on the device; want %v", ch.Index, dk[0], k)
					}
					for i := range dy {
						dy[i] = dk[0] * dx[i]
					}
					if ch.Index == 0 {
						dk[0]++
						k, first = dk[0], ch.Len
					}
					must(t, f.cs.Do(f.in, "sync", syncClient))
					check("after the copies enqueued so far")
					chunks++
				}
				rep, err := f.cs.BatchReport(h)
				must(t, err)
				must(t, f.cs.CloseBatch(h))
				if chunks < 2 || rep.Chunks != chunks || rep.ChunksDone != chunks {
					t.Fatalf("%d chunks handed over, report %+v: want several, all done", chunks, rep)
				}
				for i, v := range f.ys {
					want := 4 * xs[i]
					if i < first {
						want = 3 * xs[i]
					}
					if v != want {
						t.Fatalf("y[%d] = %v; want %v", i, v, want)
					}
				}
				if f.ks[0] != 4 {
					t.Errorf("k = %v after the batch; want 4", f.ks[0])
				}
			})
		}
	}
}

// TestBatchCancel: a batch cancelled after its first chunk ends with an
// error wrapping context.Canceled, its arrays freed at close; so does one
// whose manager is closed while a chunk is handed over.
func TestBatchCancel(t *testing.T) {
	f := newBatchFixture(t, false)
	h, err := f.cs.StartBatch(f.m, f.arrays, BatchOptions{Buffers: 2, HostKernels: true})
	must(t, err)
	_, done, err := f.cs.NextChunk(h)
	must(t, err)
	if done {
		t.Fatal("no first chunk")
	}
	must(t, f.cs.CancelBatch(h))
	for !done {
		_, done, err = f.cs.NextChunk(h)
	}
	if !errors.Is(err, context.Canceled) {
		t.Errorf("a cancelled batch ends with %v; want context.Canceled", err)
	}
	must(t, f.cs.CloseBatch(h))
	if _, _, err := f.cs.NextChunk(h); !errors.Is(err, ErrNoManager) {
		t.Errorf("a closed batch's next chunk: %v", err)
	}
	held := int64(0)
	for _, c := range []int64{f.in, f.out} {
		info, err := f.cs.Info(c)
		must(t, err)
		held += int64(info.Held)
	}
	if held != 0 {
		t.Errorf("%d device bytes held after the batch was closed; want 0", held)
	}

	// A chunk handed over when the manager closes.
	h, err = f.cs.StartBatch(f.m, f.arrays, BatchOptions{Buffers: 2, HostKernels: true})
	must(t, err)
	_, _, err = f.cs.NextChunk(h)
	must(t, err)
	must(t, f.cs.CloseManager(&f.r, f.m.Handle()))
	if _, _, err := f.cs.NextChunk(h); !errors.Is(err, ErrNoManager) {
		t.Errorf("a batch of a closed manager: %v", err)
	}
}

// TestBatchRefusals: bad declarations start nothing and say what was
// wrong.
func TestBatchRefusals(t *testing.T) {
	f := newBatchFixture(t, false)
	other := register(t, &f.cs, f.m, ClientOptions{Name: "other", Group: "h"})
	bad := func(mod func([]BatchArray) []BatchArray) []BatchArray {
		return mod(append([]BatchArray(nil), f.arrays...))
	}
	tests := map[string][]BatchArray{
		"unknown client": bad(func(a []BatchArray) []BatchArray { a[0].Client = 999; return a }),
		"no host side":   bad(func(a []BatchArray) []BatchArray { a[1].Host = HostDesc{}; return a }),
		"scratch host":   bad(func(a []BatchArray) []BatchArray { a[3].Host = f32(f.ys, batchRuns); return a }),
		"direction":      bad(func(a []BatchArray) []BatchArray { a[1].Dir = 7; return a }),
		"host handle":    bad(func(a []BatchArray) []BatchArray { a[0].Host, a[0].HostHandle = HostDesc{}, 12345; return a }),
		"two groups":     bad(func(a []BatchArray) []BatchArray { a[1].Client = other; return a }),
		"shape":          bad(func(a []BatchArray) []BatchArray { a[1].Host = f32(f.ys, batchRuns/2); return a }),
		"nothing":        nil,
	}
	for name, arrays := range tests {
		t.Run(name, func(t *testing.T) {
			if h, err := f.cs.StartBatch(f.m, arrays, BatchOptions{}); err == nil {
				f.cs.CloseBatch(h)
				t.Fatal("started")
			} else {
				t.Log(err)
			}
		})
	}
}
