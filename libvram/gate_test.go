//go:build cgo

package main

// Gate figures of libvram (package internal/gate): heap allocations of an
// alloc/free pair through the C API.

import (
	"testing"

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
