package vram_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/vramkit/vram"
	"github.com/vramkit/vram/account"
	"github.com/vramkit/vram/device/sim"
)

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
