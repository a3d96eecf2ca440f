package alloc_test

// Tests of Pool's growth policy, its giving back before a new peak, and
// AllocExact (pool_grow.go).

import (
	"io"
	"testing"

	"github.com/vramkit/vram/alloc"
	"github.com/vramkit/vram/device/sim"
	"github.com/vramkit/vram/internal/units"
)

func TestPoolGrowthPolicy(t *testing.T) {
	tests := map[string]struct {
		before  []uint64 // allocations made first (kept live)
		n       uint64
		segSize uint64 // size of the segment the allocation makes
		small   bool
	}{
		"small request: one 2 MiB page":          {n: 4 * kib, segSize: 2 * mib, small: true},
		"1 MiB is still small":                   {n: mib, segSize: 2 * mib, small: true},
		"medium request: a shared 20 MiB":        {n: 3 * mib, segSize: 20 * mib},
		"large request: its own segment":         {n: 12 * mib, segSize: 12 * mib},
		"large, rounded to the device's 2 MiB":   {n: 100*mib + 1, segSize: 102 * mib},
		"large but rounding would waste 1/7":     {n: 10*mib + 512*kib, segSize: 20 * mib},
		"medium grows with the pool (1/4)":       {before: []uint64{400 * mib}, n: 3 * mib, segSize: 100 * mib},
		"medium growth is capped (256 MiB)":      {before: []uint64{2000 * mib}, n: 3 * mib, segSize: 256 * mib},
		"small grows with its class, to 1/32":    {before: []uint64{640 * mib, mib, mib, mib, mib, mib, mib, mib, mib}, n: mib, segSize: 8 * mib, small: true},
		"small doubling stops at 1/32 of pool":   {before: []uint64{32 * mib, mib, mib, mib, mib, mib, mib, mib, mib}, n: mib, segSize: 2 * mib, small: true},
		"medium segment fits a large-ish medium": {n: 9 * mib, segSize: 20 * mib},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			e := newPoolEnv(t, addressOnlySim(8*units.GiB), alloc.PoolConfig{})
			s := e.dev.DefaultStream()
			for _, n := range tc.before {
				e.alloc(t, n, s)
			}
			before := e.p.Segments()
			p := e.alloc(t, tc.n, s)
			after := e.p.Segments()
			if len(after) != len(before)+1 {
				t.Fatalf("Alloc(%d) made %d segments, want 1", tc.n, len(after)-len(before))
			}
			for _, seg := range after {
				if uint64(p) >= seg.Base && uint64(p) < seg.Base+seg.Size {
					if seg.Size != tc.segSize || seg.Small != tc.small {
						t.Errorf("segment of %s (small %v), want %s (small %v)",
							units.Format(seg.Size), seg.Small, units.Format(tc.segSize), tc.small)
					}
				}
			}
			e.check(t)
		})
	}
}

func TestPoolGivesBackBeforeANewPeak(t *testing.T) {
	tests := map[string]struct {
		cfg               alloc.PoolConfig
		first, second     uint64
		peak, deviceFrees uint64
		hit               bool
	}{
		"freed segment given back for a larger one": {
			first: 100 * mib, second: 120 * mib, peak: 120 * mib, deviceFrees: 1,
		},
		"KeepCache piles the new segment on top": {
			cfg: alloc.PoolConfig{KeepCache: true}, first: 100 * mib, second: 120 * mib, peak: 220 * mib,
		},
		"a smaller request reuses the cached segment": {
			first: 120 * mib, second: 100 * mib, peak: 120 * mib, hit: true,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			e := newPoolEnv(t, addressOnlySim(units.GiB), tc.cfg)
			s := e.dev.DefaultStream()
			e.release(t, e.alloc(t, tc.first, s), s)
			e.alloc(t, tc.second, s)
			st := e.check(t)
			if st.PeakReserved != tc.peak || st.DeviceFrees != tc.deviceFrees || (st.CacheHits == 1) != tc.hit {
				t.Errorf("stats %+v: want peak reserved %s, %d device frees, cache hit %v",
					st, units.Format(tc.peak), tc.deviceFrees, tc.hit)
			}
		})
	}
}

// AllocExact grows by the request rounded to the device's page (a small
// request by one SmallSegment), where Alloc would grow a larger shared
// segment; a cached block that fits is still reused.
func TestPoolAllocExact(t *testing.T) {
	tests := map[string]struct {
		before  []uint64 // Alloc'd first (kept live)
		n       uint64
		segSize uint64 // size of the segment AllocExact makes; 0 for a hit
	}{
		"medium: its own pages, not a shared 20 MiB": {n: 3 * mib, segSize: 4 * mib},
		"medium in a big pool: not a quarter of it":  {before: []uint64{400 * mib}, n: 3 * mib, segSize: 4 * mib},
		"large with a wasteful rounding":             {n: 10*mib + 512*kib, segSize: 12 * mib},
		"small: one 2 MiB page, not a grown class":   {before: []uint64{640 * mib, mib, mib, mib, mib, mib, mib, mib, mib}, n: mib, segSize: 2 * mib},
		"a cached block that fits is used":           {before: []uint64{3 * mib}, n: 3 * mib},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			e := newPoolEnv(t, addressOnlySim(8*units.GiB), alloc.PoolConfig{})
			s := e.dev.DefaultStream()
			for _, n := range tc.before {
				e.alloc(t, n, s)
			}
			before := e.p.Segments()
			p, err := e.p.AllocExact(tc.n, s)
			if err != nil {
				t.Fatalf("AllocExact(%d): %v", tc.n, err)
			}
			after := e.p.Segments()
			if tc.segSize == 0 {
				if len(after) != len(before) {
					t.Errorf("AllocExact made %d segments; want a hit in the cached one", len(after)-len(before))
				}
				e.check(t)
				return
			}
			if len(after) != len(before)+1 {
				t.Fatalf("AllocExact(%d) made %d segments, want 1", tc.n, len(after)-len(before))
			}
			for _, seg := range after {
				if uint64(p) >= seg.Base && uint64(p) < seg.Base+seg.Size && seg.Size != tc.segSize {
					t.Errorf("segment of %s, want %s", units.Format(seg.Size), units.Format(tc.segSize))
				}
			}
			e.check(t)
		})
	}
}

// The adaptors pass AllocExact on to a Pool beneath them.
func TestAdaptorsForwardAllocExact(t *testing.T) {
	for name, wrap := range map[string]func(alloc.Allocator) alloc.Allocator{
		"Limit": func(a alloc.Allocator) alloc.Allocator { return alloc.NewLimit(a, 64*mib) },
		"Trace": func(a alloc.Allocator) alloc.Allocator { return alloc.NewTrace(a, io.Discard) },
	} {
		t.Run(name, func(t *testing.T) {
			dev := openSimT(t, sim.Config{TotalBytes: units.GiB, AddressOnly: true, NoContext: true})
			p, err := alloc.NewPool(dev, alloc.PoolConfig{})
			if err != nil {
				t.Fatal(err)
			}
			a := wrap(p)
			defer a.Close()
			s := dev.DefaultStream()
			ptr, err := alloc.AllocExact(a, 3*mib, s)
			if err != nil {
				t.Fatal(err)
			}
			if st := p.Stats(); st.Reserved != 4*mib {
				t.Errorf("the pool reserved %s for 3 MiB through %s; want the 4 MiB of AllocExact", units.Format(st.Reserved), name)
			}
			if err := a.Free(ptr, s); err != nil {
				t.Fatal(err)
			}
		})
	}
}
