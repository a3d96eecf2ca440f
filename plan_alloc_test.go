package vram

import (
	"errors"
	"math/rand/v2"
	"testing"

	"github.com/vramkit/vram/alloc"
	"github.com/vramkit/vram/device"
	"github.com/vramkit/vram/device/sim"
	"github.com/vramkit/vram/internal/units"
)

// TestPlannedArraysFitALimitOfTheBudget allocates what each random plan
// says — the unchunkable arrays once, the chunkable ones at the chunk
// length once per buffer — through an alloc.Limit capped at the budget,
// over each allocator the manager uses. Not one allocation may fail: the
// planner counts bytes as the allocator spends them.
func TestPlannedArraysFitALimitOfTheBudget(t *testing.T) {
	for name, mk := range map[string]func(device.Device) (alloc.Allocator, error){
		"pool":   func(d device.Device) (alloc.Allocator, error) { return alloc.NewPool(d, alloc.PoolConfig{}) },
		"direct": func(d device.Device) (alloc.Allocator, error) { return alloc.NewDirect(d), nil },
		"async":  func(d device.Device) (alloc.Allocator, error) { return alloc.NewAsyncPool(d, alloc.AsyncConfig{}) },
	} {
		t.Run(name, func(t *testing.T) {
			dev := newSim(t, 64*units.GiB, func(c *sim.Config) { c.AddressOnly = true; c.Granularity = 64 * units.KiB })
			s, err := dev.NewStream()
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			rng := rand.New(rand.NewPCG(3, 4))
			planned := 0
			for iter := 0; planned < 150 && iter < 5000; iter++ {
				data := make([]byte, 4*(1+rng.IntN(10)))
				for i := range data {
					data[i] = byte(rng.Uint32())
				}
				reqs := decodeRequests(data, 1+rng.IntN(1<<uint(rng.IntN(18))))
				up, err := mk(dev)
				if err != nil {
					t.Fatal(err)
				}
				g := granularityOf(up)
				k := 1 + rng.IntN(2)
				budget := uint64(rng.Float64() * 1.1 * float64(fullBytes(reqs, g)+1))
				if budget > 4*units.GiB {
					up.Close()
					continue
				}
				p, err := Plan(reqs, budget, PlanOptions{Granularity: g, Buffers: k})
				if err != nil {
					up.Close()
					continue
				}
				planned++
				lim := alloc.NewLimit(up, budget)
				var live []device.Ptr
				for c, ls := range reqs {
					for l, r := range ls {
						if r.Memory != Device {
							continue
						}
						n := 1
						if r.Chunkable() {
							n = p.Buffers
						}
						shape := p.ChunkedShapes[c][l]
						elems, _ := elements(shape)
						for range n {
							ptr, err := lim.Alloc(elems*r.DType.Size(), s)
							if err != nil {
								t.Fatalf("plan %+v under a limit of its budget %s: alloc %s/%s %v: %v",
									p, units.Format(budget), c, l, shape, err)
							}
							live = append(live, ptr)
						}
					}
				}
				// A Granular allocator spends exactly what the plan counts;
				// others (the async pool) no more.
				if _, gr := up.(alloc.Granular); (gr && lim.Used() != p.BytesPerChunk) || lim.Used() > p.BytesPerChunk {
					t.Errorf("the limit counts %d bytes in use, the plan %d", lim.Used(), p.BytesPerChunk)
				}
				for _, ptr := range live {
					if err := lim.Free(ptr, s); err != nil {
						t.Fatal(err)
					}
				}
				if err := lim.Close(); err != nil && !errors.Is(err, alloc.ErrClosed) {
					t.Fatal(err)
				}
			}
			if planned < 100 {
				t.Fatalf("only %d plans succeeded", planned)
			}
		})
	}
}
