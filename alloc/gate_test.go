package alloc_test

// Gate figures of package alloc (package internal/gate): heap allocations
// per Alloc+Free pair on each allocator's hit path, the path every
// framework allocation takes once the cache is warm.

import (
	"fmt"
	"testing"

	"github.com/vramkit/vram/alloc"
	"github.com/vramkit/vram/device"
	"github.com/vramkit/vram/device/sim"
	"github.com/vramkit/vram/internal/gate"
	"github.com/vramkit/vram/internal/units"
)

// TestGateHitPaths: every allocator of the registry, Limit over Pool (a
// capped manager's allocator) and PinnedPool, each with a pair of a size
// it holds free after a warm-up pair, at 4 KiB (a small block) and
// 64 MiB (a large one).
func TestGateHitPaths(t *testing.T) {
	var figs []gate.Figure
	for _, n := range []uint64{4 * units.KiB, 64 * units.MiB} {
		for _, e := range alloc.Allocators() {
			dev := openSimT(t, sim.Config{TotalBytes: units.GiB, AddressOnly: true})
			a, err := e.New(dev, alloc.Configs{})
			if err != nil {
				t.Fatal(err)
			}
			figs = append(figs, hitFigure(t, e.Name, a, n, dev.DefaultStream()))
		}
		dev := openSimT(t, sim.Config{TotalBytes: units.GiB, AddressOnly: true})
		p, err := alloc.NewPool(dev, alloc.PoolConfig{})
		if err != nil {
			t.Fatal(err)
		}
		figs = append(figs, hitFigure(t, "limit over pool", alloc.NewLimit(p, units.GiB/2), n, dev.DefaultStream()))
		dev = openSimT(t, sim.Config{TotalBytes: units.GiB})
		pp, err := alloc.NewPinnedPool(dev)
		if err != nil {
			t.Fatal(err)
		}
		s := dev.DefaultStream()
		pinnedPair := func() {
			b, err := pp.Alloc(n, s)
			if err == nil {
				err = pp.Free(b, s)
			}
			if err != nil {
				t.Fatal(err)
			}
		}
		pinnedPair()
		figs = append(figs, pairFigure("pinned", n, testing.AllocsPerRun(100, pinnedPair)))
		if err := pp.Close(); err != nil {
			t.Fatal(err)
		}
	}
	gate.Record(t, figs...)
}

// hitFigure measures a's pair of n bytes on s after a warm-up pair, and
// closes a.
func hitFigure(t *testing.T, name string, a alloc.Allocator, n uint64, s device.Stream) gate.Figure {
	t.Helper()
	pair := func() {
		p, err := a.Alloc(n, s)
		if err == nil {
			err = a.Free(p, s)
		}
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
	}
	pair()
	f := pairFigure(name, n, testing.AllocsPerRun(100, pair))
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	return f
}

func pairFigure(name string, n uint64, allocs float64) gate.Figure {
	return gate.Figure{Name: fmt.Sprintf("heap/alloc/%s: alloc+free %s", name, units.Format(n)),
		Value: allocs, Unit: "allocs/op", Better: gate.Lower}
}
