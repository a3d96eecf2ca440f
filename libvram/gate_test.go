//go:build cgo

package main

// Gate figures of libvram (package internal/gate): heap allocations of an
// alloc/free pair through the C API.

import (
	"testing"

	"github.com/vramkit/vram"
	"github.com/vramkit/vram/internal/gate"
	"github.com/vramkit/vram/libvram/internal/capi"
)

// TestGateCPair: a 1 MiB alloc/free pair through vram_alloc and vram_free
// on a manager opened without a lease, a cache hit, makes 2 heap
// allocations (the manager's bookkeeping of a call in progress); a
// context for a lease the manager does not have cost 4 more.
func TestGateCPair(t *testing.T) {
	m, err := reg.Open(capi.Options{Spec: "sim:vram=1GiB"})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := reg.Close(m.Handle()); err != nil {
			t.Error(err)
		}
	}()
	const pairs = 100
	run := func() {
		if err := cPairs(m.Handle(), 1<<20, pairs); err != nil {
			t.Fatal(err)
		}
	}
	run() // the stream key's stream and the cached block
	allocs := testing.AllocsPerRun(10, run) / pairs
	if allocs > 2 {
		t.Errorf("%.2f heap allocations per vram_alloc/vram_free pair; want at most 2", allocs)
	}
	gate.Record(t, gate.Figure{Name: "heap/libvram/vram_alloc+vram_free 1 MiB", Value: allocs, Unit: "allocs/op", Better: gate.Lower})
}

// TestGateClientPaths: the client API's hot paths through the C entry
// points: a queue, an allocation that replaces the arrays before, its
// event and the responses' release; the same in one vram_queue_allocate
// (described, the event taken), as Python's package calls it; and a
// 4 KiB copy in and out with a sync. Each figure is the Go heap
// allocations of one cycle (the manager's, the allocator's, the
// simulator's stream, the C layer's).
func TestGateClientPaths(t *testing.T) {
	m, err := reg.Open(capi.Options{Spec: "sim:vram=1GiB"})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := clients.CloseManager(&reg, m.Handle()); err != nil {
			t.Error(err)
		}
	}()
	c, err := clients.Register(m, capi.ClientOptions{Name: "gate", Group: "gate", Hooks: capi.HookAllocated})
	if err != nil {
		t.Fatal(err)
	}
	const cycles = 50
	alloc := func() {
		if err := cClientCycles(m.Handle(), c, cycles); err != nil {
			t.Fatal(err)
		}
	}
	alloc() // the group's stream, the pool's first blocks
	allocs := testing.AllocsPerRun(5, alloc) / cycles
	oneCall := func() {
		if err := cOneCallCycles(c, cycles); err != nil {
			t.Fatal(err)
		}
	}
	oneCall()
	oneCallAllocs := testing.AllocsPerRun(5, oneCall) / cycles
	if err := clients.Queue(c, map[string]vram.ArrayRequest{"x": {Shape: []int{1024}, DType: vram.Float32}}); err != nil {
		t.Fatal(err)
	}
	rh, err := clients.Allocate(c, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer clients.ReleaseResponse(rh)
	if ev := clients.Poll(m); ev.Response != 0 {
		defer clients.ReleaseResponse(ev.Response)
	}
	host, free := cFloats(1024)
	defer free()
	copies := func() {
		if err := cCopyCycles(c, rh, host, cycles); err != nil {
			t.Fatal(err)
		}
	}
	copies()
	copyAllocs := testing.AllocsPerRun(5, copies) / cycles
	t.Logf("%.1f heap allocations per queue+allocate+event+release, %.1f in one call, %.1f per 4 KiB round trip and sync",
		allocs, oneCallAllocs, copyAllocs)
	gate.Record(t,
		gate.Figure{Name: "heap/libvram/client: vram_queue+vram_allocate+vram_poll+release 4 KiB", Value: allocs, Unit: "allocs/op", Better: gate.Lower},
		// Slack 1 %: one allocation in some runs of 50 cycles (82.02–82.04
		// a cycle), while one more a cycle passes it.
		gate.Figure{Name: "heap/libvram/client: vram_queue_allocate+release 4 KiB", Value: oneCallAllocs, Unit: "allocs/op", Better: gate.Lower, Slack: 0.01},
		gate.Figure{Name: "heap/libvram/client: vram_to_device+vram_from_device+vram_sync 4 KiB", Value: copyAllocs, Unit: "allocs/op", Better: gate.Lower})
}
