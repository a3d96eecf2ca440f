package vram_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"

	"github.com/vramkit/vram"
	"github.com/vramkit/vram/account"
	"github.com/vramkit/vram/device/sim"
)

// The quickstart: two components of a batch job register in one stream
// group, the solver asks for its arrays, the batch does not fit and is
// chunked, and each chunk is copied in and out through host arrays.
func Example() {
	// A simulated GPU with 16 MiB, so that this runs anywhere; a real
	// program uses vram.Default(), which finds the GPU.
	dev, _ := sim.New(sim.Config{TotalBytes: 16 << 20, NoContext: true})
	defer dev.Close()
	m, _ := vram.New(dev)
	defer m.Close()
	ctx := context.Background() // the calls that may wait take it

	// Components that work on the same runs join one group: they share a
	// stream and are planned together.
	solver, _ := m.Register(vram.ClientOptions{Name: "solver", Group: "batch"})
	defer solver.Close()
	output, _ := m.Register(vram.ClientOptions{Name: "output", Group: "batch",
		OnAllocated: func(r *vram.ArrayResponse) {
			// A notary: told how the batch is chunked, given no arrays.
			fmt.Printf("output: %d chunks of %d runs, %d arrays\n", r.Plan.Chunks, r.Plan.ChunkLength, len(r.Arrays()))
		}})
	defer output.Close()

	// One million runs: 24 MB of per-run state and parameters, chunked
	// along axis 1, and a small table every run reads.
	const runs = 1_000_000
	err := solver.Queue(map[string]vram.ArrayRequest{
		"state":  {Shape: []int{2, runs}, DType: vram.Float32, ChunkAxis: 1},
		"params": {Shape: []int{4, runs}, DType: vram.Float32, ChunkAxis: 1},
		"table":  {Shape: []int{1024}, DType: vram.Float64, Unchunkable: true},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	resp, err := solver.Allocate(ctx)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Printf("solver: %d chunks of %d runs; state %v, table %v\n",
		resp.Plan.Chunks, resp.Plan.ChunkLength, resp.Arrays()["state"].Shape(), resp.Arrays()["table"].Shape())

	// Full-length host arrays; the device holds one chunk at a time.
	in, _ := m.NewHostArray([]int{2, runs}, vram.Float32, vram.Pinned, nil)
	defer in.Free()
	for i := range in.Float32s() {
		in.Float32s()[i] = float32(i % 1000)
	}
	out, _ := m.NewHostArray([]int{2, runs}, vram.Float32, vram.Pageable, nil)
	for i := range resp.Plan.Chunks {
		sp, err := resp.Span(i, 1) // the runs of chunk i along axis 1
		if err != nil {
			fmt.Println(err)
			return
		}
		if err := solver.ToDeviceChunk(ctx, resp.Arrays()["state"], in, sp); err != nil {
			fmt.Println(err)
			return
		}
		// ... kernels run here on solver.Stream() over sp.Len runs ...
		if err := solver.FromDeviceChunk(ctx, out, resp.Arrays()["state"], sp); err != nil {
			fmt.Println(err)
			return
		}
	}
	if err := solver.Sync(ctx); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("every run came back:", slices.Equal(in.Float32s(), out.Float32s()))
	// Output:
	// output: 2 chunks of 500000 runs, 0 arrays
	// solver: 2 chunks of 500000 runs; state [2 500000], table [1024]
	// every run came back: true
}

// Plan is a pure function: the same request set and budget always give
// the same chunks. It is what Allocate and `vram plan` use.
func ExamplePlan() {
	requests := map[string]map[string]vram.ArrayRequest{
		"solver": {
			"state":  {Shape: []int{2, 10_000}, DType: vram.Float64, ChunkAxis: 1},
			"consts": {Shape: []int{100}, DType: vram.Float64, Unchunkable: true},
		},
		"output": {
			"samples": {Shape: []int{50, 2, 10_000}, DType: vram.Float32, ChunkAxis: 2},
		},
	}
	p, err := vram.Plan(requests, 1<<20, vram.PlanOptions{}) // a 1 MiB budget
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Printf("%d chunks of %d runs (last %d), %d of %d bytes\n",
		p.Chunks, p.ChunkLength, p.LastChunkLength, p.BytesPerChunk, p.Budget)
	fmt.Println(p.ChunkedShapes["output"]["samples"], p.ChunkedShapes["solver"]["consts"])

	// Double buffering halves what each chunk may take.
	p2, _ := vram.Plan(requests, 1<<20, vram.PlanOptions{Buffers: 2})
	fmt.Println(p2.Chunks, "chunks when double buffered")

	// Too small for even one run.
	_, err = vram.Plan(requests, 1000, vram.PlanOptions{})
	fmt.Println(errors.Is(err, vram.ErrUnchunkable), err)
	// Output:
	// 4 chunks of 2500 runs (last 2500), 1041920 of 1048576 bytes
	// [50 2 2500] [100]
	// 8 chunks when double buffered
	// true unchunkable arrays need 1 KiB but the budget is 1000 B, leaving no room for any run (one run of the chunked arrays needs 1 KiB more, 2 KiB in all); make the large fixed inputs chunkable, shrink them, or raise the budget by 1.1 KiB: does not fit and cannot be chunked
}

// Manual proportions and the auto pool.
func ExampleManager_Register() {
	dev, _ := sim.New(sim.Config{TotalBytes: 1 << 30, NoContext: true})
	defer dev.Close()
	m, _ := vram.New(dev)
	defer m.Close()

	a, _ := m.Register(vram.ClientOptions{Name: "a"})                  // auto
	b, _ := m.Register(vram.ClientOptions{Name: "b"})                  // auto
	c, _ := m.Register(vram.ClientOptions{Name: "c", Proportion: 0.5}) // manual
	fmt.Printf("a %.2f, b %.2f, c %.2f; a may use %d MiB\n", a.Proportion(), b.Proportion(), c.Proportion(), a.Cap()>>20)

	// The auto pool keeps at least MinAutoPool (5%) while it has clients.
	_, err := m.Register(vram.ClientOptions{Name: "d", Proportion: 0.48})
	fmt.Println(errors.Is(err, vram.ErrProportion))

	_ = c.Close() // the auto pool is rebalanced
	fmt.Printf("a %.2f, b %.2f\n", a.Proportion(), b.Proportion())
	// Output:
	// a 0.25, b 0.25, c 0.50; a may use 256 MiB
	// true
	// a 0.50, b 0.50
}

// Two groups share a 64 MiB device. The cache is idle, so the solver's
// group, which does not fit beside it, evicts it; the cache's hook is
// told why, and it asks again once the solver is done. Marking work
// (BeginWork … End) keeps a client from being evicted while the GPU uses
// its arrays.
func ExampleClient_BeginWork() {
	dev, _ := sim.New(sim.Config{TotalBytes: 64 << 20, NoContext: true})
	defer dev.Close()
	m, _ := vram.New(dev, vram.WithAllocatorChoice(account.Choice{Kind: vram.Direct}))
	defer m.Close()
	ctx := context.Background()

	cache, _ := m.Register(vram.ClientOptions{Name: "cache", Group: "cache",
		OnInvalidate: func(reason error) {
			fmt.Println("cache invalidated; evicted:", errors.Is(reason, vram.ErrEvicted))
		}})
	defer cache.Close()
	table := map[string]vram.ArrayRequest{"table": {Shape: []int{40 << 20}, DType: vram.Uint8, Unchunkable: true}}
	_ = cache.Queue(table)
	_, _ = cache.Allocate(ctx)

	solver, _ := m.Register(vram.ClientOptions{Name: "solver", Group: "solve"})
	defer solver.Close()
	_ = solver.Queue(map[string]vram.ArrayRequest{"state": {Shape: []int{40 << 20}, DType: vram.Uint8, Unchunkable: true}})
	resp, err := solver.Allocate(ctx)
	if err != nil {
		fmt.Println(err)
		return
	}
	w, _ := solver.BeginWork() // the solver is busy from here …
	// … enqueue copies and kernels on solver.Stream() …
	_ = w.End() // … until the GPU has done what was enqueued before End

	_, err = cache.BeginWork()
	fmt.Println("cache may work:", err == nil, "evicted:", cache.Evicted())

	_ = solver.Free("state") // the solver is done with its array
	fmt.Println("solver's array freed:", resp.Arrays()["state"].Freed())
	_ = cache.Queue(table)
	if _, err := cache.Allocate(ctx); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("cache allocated again; evicted:", cache.Evicted())
	// Output:
	// cache invalidated; evicted: true
	// cache may work: false evicted: true
	// solver's array freed: true
	// cache allocated again; evicted: false
}

// The host ladder under small limits: a small array is pinned, a larger
// one pageable, and one past the host limit spills to a memory-mapped
// .npy file, kept here and mapped again.
func ExampleHostMemory_Alloc() {
	spill, _ := os.MkdirTemp("", "spill")
	defer os.RemoveAll(spill)
	dev, _ := sim.New(sim.Config{TotalBytes: 16 << 20, NoContext: true})
	defer dev.Close()
	m, _ := vram.New(dev, vram.WithHostOptions(vram.HostOptions{
		PinnedLimit: 1 << 20, // 1 MiB pinned at most
		Limit:       4 << 20, // 4 MiB of host RAM at most
		SpillDir:    spill,
	}))
	defer m.Close()
	for _, n := range []int{1 << 16, 1 << 18, 1 << 20} { // float64s: 512 KiB, 2 MiB, 8 MiB
		h, err := m.Host().Alloc([]int{n}, vram.Float64, vram.HostArrayOptions{Keep: true, Name: "x"})
		if err != nil {
			fmt.Println(err)
			return
		}
		fmt.Println(h.Bytes()>>10, "KiB:", h.Placement().Rung)
		if p := h.Placement(); p.Rung == vram.RungFile {
			h.Float64s()[n-1] = 42
			h.Free() // kept: the file stays
			again, _ := m.Host().Open(p.Path, false)
			fmt.Println("reopened:", again.Shape(), again.Float64s()[n-1])
			again.Free()
			continue
		}
		defer h.Free()
	}
	// Output:
	// 512 KiB: pinned
	// 2048 KiB: pageable
	// 8192 KiB: file
	// reopened: [1048576] 42
}

// Open opens a device and a manager of it in one call, and Close closes
// both; "" opens the GPU, or the simulator on a machine without one.
func ExampleOpen() {
	m, err := vram.Open("sim:vram=1GiB,context=0")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer m.Close() // the manager, then the device
	c, err := m.Register(vram.ClientOptions{Name: "solver", Proportion: 0.5})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Printf("%s on %s may use %d MiB\n", c, m.Device().Info().Backend, c.Cap()>>20)
	// Output:
	// solver#1 on sim may use 512 MiB
}
