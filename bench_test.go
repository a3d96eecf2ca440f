package vram

import (
	"context"
	"fmt"
	"testing"

	"github.com/vramkit/vram/account"
	"github.com/vramkit/vram/device/sim"
	"github.com/vramkit/vram/internal/units"
)

// BenchmarkRegisterClose measures one Register and one Close with n
// clients already registered (a third of them manual, in 8 groups).
// Everything is O(1) in n: the cost should stay flat from 10 to 100,000.
func BenchmarkRegisterClose(b *testing.B) {
	for _, n := range []int{10, 100, 1000, 10_000, 100_000} {
		b.Run(fmt.Sprintf("clients=%d", n), func(b *testing.B) {
			dev, err := sim.New(sim.Config{TotalBytes: units.GiB, AddressOnly: true})
			if err != nil {
				b.Fatal(err)
			}
			defer dev.Close()
			m, err := New(dev, WithAllocatorChoice(account.Choice{Kind: Direct}))
			if err != nil {
				b.Fatal(err)
			}
			defer m.Close()
			for i := range n {
				p := 0.0
				if i%3 == 0 {
					p = 1e-7
				}
				if _, err := m.Register(ClientOptions{Proportion: p, Group: fmt.Sprintf("g%d", i%8)}); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				p := 0.0
				if i%3 == 0 {
					p = 1e-7
				}
				c, err := m.Register(ClientOptions{Proportion: p, Group: "g3"})
				if err != nil {
					b.Fatal(err)
				}
				if err := c.Close(); err != nil {
					b.Fatal(err)
				}
				i++
			}
		})
	}
}

// BenchmarkPlan plans 1,000 arrays (10 clients × 100 labels, a tenth
// unchunkable) under a budget that forces chunking.
func BenchmarkPlan(b *testing.B) {
	reqs := map[string]map[string]ArrayRequest{}
	for c := range 10 {
		labels := map[string]ArrayRequest{}
		for l := range 100 {
			r := ArrayRequest{Shape: []int{1 + l%7, 3, 100_000}, DType: Float32, ChunkAxis: 2}
			if l%10 == 0 {
				r = ArrayRequest{Shape: []int{64, 1 + l}, DType: Float64, Unchunkable: true}
			}
			labels[fmt.Sprintf("a%d", l)] = r
		}
		reqs[fmt.Sprintf("c%d", c)] = labels
	}
	budget := uint64(2 * units.GiB)
	p, err := Plan(reqs, budget, PlanOptions{Buffers: 2})
	if err != nil || p.Chunks < 2 {
		b.Fatalf("plan: %+v, %v", p, err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Plan(reqs, budget, PlanOptions{Buffers: 2}); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkPlanGroup is Allocate's planning of the 1,000 arrays of
// BenchmarkPlanGroup on a device whose page reserve binds: one Plan
// against the pool's stated cost finds the fewest chunks that fit.
func BenchmarkPlanGroup(b *testing.B) {
	reqs := map[string]map[string]ArrayRequest{}
	for c := range 10 {
		labels := map[string]ArrayRequest{}
		for l := range 100 {
			r := ArrayRequest{Shape: []int{1 + l%7, 3, 100_000}, DType: Float32, ChunkAxis: 2}
			if l%10 == 0 {
				r = ArrayRequest{Shape: []int{64, 1 + l}, DType: Float64, Unchunkable: true}
			}
			labels[fmt.Sprintf("a%d", l)] = r
		}
		reqs[fmt.Sprintf("c%d", c)] = labels
	}
	opts := PlanOptions{Granularity: 512, Buffers: 2}
	budget := func() groupBudget {
		return budgetOf(2*units.GiB, pageCoster{512, 2 * units.MiB, units.MiB}, 512)
	}
	gb := budget()
	clients := byClient(reqs)
	p, err := planGroup(clients, &gb, opts)
	if first, _ := Plan(reqs, 2*units.GiB, opts); err != nil || p.Chunks <= first.Chunks {
		b.Fatalf("plan: %d chunks (Plan alone %d), %v", p.Chunks, first.Chunks, err)
	}
	b.ReportAllocs()
	for b.Loop() {
		gb := budget()
		if _, err := planGroup(clients, &gb, opts); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkAllocate queues and allocates 8 arrays for one client
// and frees them again, through the Pool allocator.
func BenchmarkAllocate(b *testing.B) {
	dev, err := sim.New(sim.Config{TotalBytes: units.GiB, AddressOnly: true})
	if err != nil {
		b.Fatal(err)
	}
	defer dev.Close()
	m, err := New(dev)
	if err != nil {
		b.Fatal(err)
	}
	defer m.Close()
	c, _ := m.Register(ClientOptions{})
	reqs := map[string]ArrayRequest{}
	for l := range 8 {
		reqs[fmt.Sprintf("a%d", l)] = ArrayRequest{Shape: []int{4, 10_000}, DType: Float32, ChunkAxis: 1}
	}
	b.ReportAllocs()
	for b.Loop() {
		if err := c.Queue(reqs); err != nil {
			b.Fatal(err)
		}
		if _, err := c.Allocate(context.Background()); err != nil {
			b.Fatal(err)
		}
		if err := m.FreeAll(); err != nil {
			b.Fatal(err)
		}
	}
}
