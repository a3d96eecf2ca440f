package alloc_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/vramkit/vram/alloc"
	"github.com/vramkit/vram/device"
	"github.com/vramkit/vram/device/sim"
	"github.com/vramkit/vram/internal/units"
)

// TestLimitRefusesOverCap checks the refusal: both sentinels, the figures,
// an OOM counted, the upstream untouched.
func TestLimitRefusesOverCap(t *testing.T) {
	dev := openSimT(t, sim.Config{TotalBytes: units.GiB, AddressOnly: true})
	up := alloc.NewDirect(dev)
	l := alloc.NewLimit(up, 8*units.MiB)
	defer l.Close()
	s := dev.DefaultStream()
	p, err := l.Alloc(6*units.MiB, s)
	if err != nil {
		t.Fatal(err)
	}
	upBefore := up.Stats()
	_, err = l.Alloc(3*units.MiB, s)
	if !errors.Is(err, alloc.ErrLimit) || !errors.Is(err, device.ErrOutOfMemory) {
		t.Fatalf("over-cap Alloc: err = %v, want one wrapping alloc.ErrLimit and device.ErrOutOfMemory", err)
	}
	for _, want := range []string{"3 MiB (4 MiB as the upstream spends it)", "6 MiB in use", "cap of 8 MiB", "by 2 MiB"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	if upAfter := up.Stats(); upAfter != upBefore {
		t.Errorf("a refused Alloc reached the upstream: %+v → %+v", upBefore, upAfter)
	}
	if st := l.Stats(); st.OOMs != 1 {
		t.Errorf("Limit Stats.OOMs = %d, want 1", st.OOMs)
	}
	if l.Used() != 6*units.MiB {
		t.Errorf("Used() = %s, want 6 MiB", units.Format(l.Used()))
	}
	if err := l.Free(p, s); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Alloc(8*units.MiB, s); err != nil {
		t.Errorf("Alloc of the whole cap after freeing: %v", err)
	}
}

// TestLimitIgnoresCachedBytes: a pool's cache does not count against the
// cap, so freeing and allocating again at the cap keeps working (CuPy's
// set_limit counts the cache and refuses here).
func TestLimitIgnoresCachedBytes(t *testing.T) {
	ups := map[string]func(dev device.Device) (alloc.Allocator, error){
		"Pool": func(dev device.Device) (alloc.Allocator, error) { return alloc.NewPool(dev, alloc.PoolConfig{}) },
		"AsyncPool": func(dev device.Device) (alloc.Allocator, error) {
			return alloc.NewAsyncPool(dev, alloc.AsyncConfig{})
		},
	}
	for name, newUp := range ups {
		t.Run(name, func(t *testing.T) {
			dev := openSimT(t, sim.Config{TotalBytes: units.GiB, AddressOnly: true})
			up, err := newUp(dev)
			if err != nil {
				t.Fatal(err)
			}
			l := alloc.NewLimit(up, 4*units.MiB)
			defer l.Close()
			s := dev.DefaultStream()
			sizes := []uint64{3 * units.MiB, units.MiB, 2 * units.MiB, 4 * units.MiB, 512 * units.KiB}
			for round := range 5 {
				for _, n := range sizes {
					p, err := l.Alloc(n, s)
					if err != nil {
						t.Fatalf("round %d: Alloc(%s) with %s cached upstream: %v",
							round, units.Format(n), units.Format(l.Stats().Cached()), err)
					}
					if err := l.Free(p, s); err != nil {
						t.Fatal(err)
					}
				}
			}
			if st := l.Stats(); st.OOMs != 0 || st.Cached() == 0 {
				t.Errorf("want no refusals and something cached upstream: %+v", st)
			}
		})
	}
}

// TestLimitChargesUpstreamGranularity: blocks count as the upstream
// spends them.
func TestLimitChargesUpstreamGranularity(t *testing.T) {
	tests := map[string]struct {
		up      func(dev device.Device) alloc.Allocator
		n       uint64
		fits    int // allocations of n that fit under a 4 MiB cap
		charged uint64
	}{
		"Direct at 2 MiB": {up: func(dev device.Device) alloc.Allocator { return alloc.NewDirect(dev) }, n: 1, fits: 2, charged: 2 * units.MiB},
		"Pool at 512 B": {up: func(dev device.Device) alloc.Allocator {
			p, err := alloc.NewPool(dev, alloc.PoolConfig{})
			if err != nil {
				panic(err)
			}
			return p
		}, n: 1000, fits: 4096, charged: 1024},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			dev := openSimT(t, sim.Config{TotalBytes: units.GiB, AddressOnly: true})
			l := alloc.NewLimit(tc.up(dev), 4*units.MiB)
			defer l.Close()
			s := dev.DefaultStream()
			for i := range tc.fits {
				if _, err := l.Alloc(tc.n, s); err != nil {
					t.Fatalf("Alloc #%d of %d bytes: %v", i+1, tc.n, err)
				}
			}
			if l.Used() != uint64(tc.fits)*tc.charged {
				t.Errorf("Used() = %d, want %d", l.Used(), uint64(tc.fits)*tc.charged)
			}
			if _, err := l.Alloc(tc.n, s); !errors.Is(err, alloc.ErrLimit) {
				t.Errorf("Alloc past the cap: err = %v, want alloc.ErrLimit", err)
			}
		})
	}
}

func TestLimitUpstream(t *testing.T) {
	dev := openSimT(t, sim.Config{TotalBytes: 64 * units.MiB, AddressOnly: true})
	d := alloc.NewDirect(dev)
	l := alloc.NewLimit(d, units.MiB)
	defer l.Close()
	var a alloc.Adaptor = l
	if a.Upstream() != alloc.Allocator(d) || l.Cap() != units.MiB {
		t.Errorf("Upstream() = %v, Cap() = %d", a.Upstream(), l.Cap())
	}
}
