package alloc_test

import (
	"bytes"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/vramkit/vram/alloc"
	"github.com/vramkit/vram/device/sim"
)

func TestPageCost(t *testing.T) {
	for name, tc := range map[string]struct {
		sizes             []uint64
		gran, page, small uint64
		want              uint64
	}{
		"none":                      {nil, 512, 2 * mib, mib, 0},
		"rounds to pages itself":    {[]uint64{1, 2*mib + 1}, 2 * mib, 2 * mib, 0, 6 * mib},
		"large arrays own pages":    {[]uint64{3 * mib, 4 * mib}, 512, 2 * mib, mib, 8 * mib},
		"one small takes a page":    {[]uint64{100}, 512, 2 * mib, mib, 2 * mib},
		"small ones share pages":    {[]uint64{256 * kib, 256 * kib, 256 * kib, 256 * kib, 256 * kib, 256 * kib}, 512, 2 * mib, mib, 4 * mib}, // ⌊1.5 MiB / (2 MiB − 1 MiB)⌋ + 1 pages, not 6
		"near small, no saving":     {[]uint64{768 * kib, 768 * kib, 768 * kib, 768 * kib}, 512, 2 * mib, mib, 8 * mib},                       // ⌊3 MiB / 1 MiB⌋ + 1 = 4 pages
		"small above half a page":   {[]uint64{256 * kib, 256 * kib, 256 * kib}, 512, 2 * mib, 3 * mib / 2, 6 * mib},                          // no shared bound: a page each
		"many tiny in one page":     {[]uint64{512, 512, 512, 512, 512, 512}, 512, 2 * mib, mib, 2 * mib},
		"small and large":           {[]uint64{5 * mib, 512}, 512, 2 * mib, mib, 8 * mib},
		"saturates":                 {[]uint64{math.MaxUint64 - 10, 4 * mib}, 512, 2 * mib, mib, math.MaxUint64},
		"granularity 0 counts as 1": {[]uint64{3}, 0, 0, 0, 3},
	} {
		t.Run(name, func(t *testing.T) {
			if got := alloc.PageCost(tc.sizes, tc.gran, tc.page, tc.small); got != tc.want {
				t.Errorf("PageCost = %d, want %d", got, tc.want)
			}
		})
	}
}

// TestPageCostMonotone checks Coster's promise on PageCost: growing any
// one size never lowers the cost, also where a request grows past the
// small-request size and leaves the shared pages (a bound that used the
// largest small request present fell there).
func TestPageCostMonotone(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 11))
	configs := []struct{ gran, page, small uint64 }{
		{512, 2 * mib, mib}, {512, 2 * mib, 512 * kib}, {512, 2 * mib, 3 * mib / 2}, {512, 2 * mib, 0}, {2 * mib, 2 * mib, 0},
	}
	for _, c := range configs {
		for range 20000 {
			sizes := make([]uint64, 1+rng.IntN(6))
			for i := range sizes {
				sizes[i] = rng.Uint64N(3 * c.page)
			}
			before := alloc.PageCost(sizes, c.gran, c.page, c.small)
			i := rng.IntN(len(sizes))
			sizes[i] += 1 + rng.Uint64N(c.page)
			if after := alloc.PageCost(sizes, c.gran, c.page, c.small); after < before {
				t.Fatalf("gran %d page %d small %d: size %d grown to %d lowered the cost from %d to %d (sizes %v)",
					c.gran, c.page, c.small, i, sizes[i], before, after, sizes)
			}
		}
	}
}

// The cost an allocator states bounds what allocating the sizes with
// AllocExact takes from the device, and the adaptors forward it.
func TestCostBoundsWhatTheDeviceGives(t *testing.T) {
	sets := map[string][]uint64{
		"small":          {100, 4 * kib, 700 * kib, 900 * kib, 300 * kib, 1000 * kib},
		"large":          {3 * mib, 5*mib + 1, 2 * mib},
		"mixed":          {512, 3 * mib, 768 * kib, 768 * kib, 768 * kib, 10*mib + 7},
		"one whole page": {2 * mib},
		"under a page":   {1536 * kib, 1200 * kib, 700 * kib, 2*mib - 512, 4 * kib},
	}
	makers := map[string]func(*sim.Device) (alloc.Allocator, error){
		"pool":   func(d *sim.Device) (alloc.Allocator, error) { return alloc.NewPool(d, alloc.PoolConfig{}) },
		"async":  func(d *sim.Device) (alloc.Allocator, error) { return alloc.NewAsyncPool(d, alloc.AsyncConfig{}) },
		"direct": func(d *sim.Device) (alloc.Allocator, error) { return alloc.NewDirect(d), nil },
		"expandable": func(d *sim.Device) (alloc.Allocator, error) {
			return alloc.NewExpandable(d, alloc.ExpandableConfig{})
		},
		"limit over pool": func(d *sim.Device) (alloc.Allocator, error) {
			p, err := alloc.NewPool(d, alloc.PoolConfig{})
			return alloc.NewLimit(p, 1<<40), err
		},
		"trace over limit over direct": func(d *sim.Device) (alloc.Allocator, error) {
			return alloc.NewTrace(alloc.NewLimit(alloc.NewDirect(d), 1<<40), &bytes.Buffer{}), nil
		},
	}
	for an, mk := range makers {
		for sn, sizes := range sets {
			t.Run(an+"/"+sn, func(t *testing.T) {
				dev := openSimT(t, sim.Config{TotalBytes: 256 * mib, NoContext: true})
				a, err := mk(dev)
				if err != nil {
					t.Fatal(err)
				}
				defer a.Close()
				c, ok := a.(alloc.Coster)
				if !ok {
					t.Fatalf("%T is not a Coster", a)
				}
				cost, ok := c.Cost(sizes)
				if !ok {
					t.Fatal("Cost: cannot say")
				}
				free0, _, _ := dev.MemInfo()
				s := dev.DefaultStream()
				for _, n := range sizes {
					p, err := alloc.AllocExact(a, n, s)
					if err != nil {
						t.Fatal(err)
					}
					defer a.Free(p, s)
				}
				free1, _, _ := dev.MemInfo()
				if took := free0 - free1; took > cost {
					t.Errorf("allocating %v took %d bytes of the device; the allocator said at most %d", sizes, took, cost)
				}
			})
		}
	}
}

// A Limit's Room is its cap less its use, and no more than its
// upstream's; Trace forwards it; an allocator with no cap has all room.
func TestRoom(t *testing.T) {
	dev := openSimT(t, sim.Config{TotalBytes: 64 * mib, NoContext: true})
	inner := alloc.NewLimit(alloc.NewDirect(dev), 10*mib)
	outer := alloc.NewTrace(alloc.NewLimit(inner, 20*mib), &bytes.Buffer{})
	defer outer.Close()
	if r := inner.Upstream().(alloc.Coster).Room(); r != math.MaxUint64 {
		t.Errorf("Direct's room = %d, want MaxUint64", r)
	}
	p, err := outer.Alloc(3*mib, dev.DefaultStream())
	if err != nil {
		t.Fatal(err)
	}
	defer outer.Free(p, dev.DefaultStream())
	if r := outer.Room(); r != 6*mib {
		t.Errorf("room = %d, want 6 MiB (the inner cap of 10 MiB less 4 MiB charged in whole pages)", r)
	}
}
