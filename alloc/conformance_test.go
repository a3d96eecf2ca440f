package alloc_test

import (
	"errors"
	"io"
	"math"
	"testing"

	"github.com/vramkit/vram/alloc"
	"github.com/vramkit/vram/alloc/alloctest"
	"github.com/vramkit/vram/device"
	"github.com/vramkit/vram/device/sim"
	"github.com/vramkit/vram/internal/units"
)

// newAsyncT makes an AsyncPool or stops the test.
func newAsyncT(t *testing.T, dev device.Device, cfg alloc.AsyncConfig) *alloc.AsyncPool {
	t.Helper()
	a, err := alloc.NewAsyncPool(dev, cfg)
	if err != nil {
		t.Fatalf("NewAsyncPool: %v", err)
	}
	return a
}

// newPoolT makes a Pool with the zero config or stops the test.
func newPoolT(t *testing.T, dev device.Device) *alloc.Pool {
	t.Helper()
	p, err := alloc.NewPool(dev, alloc.PoolConfig{})
	if err != nil {
		t.Fatalf("NewPool: %v", err)
	}
	return p
}

// factories are every allocator and adaptor of the package, as the
// conformance suite and the fuzz targets make them.
var factories = map[string]alloctest.Factory{
	"Direct": func(t *testing.T, dev device.Device) alloc.Allocator {
		return alloc.NewDirect(dev)
	},
	"AsyncPool": func(t *testing.T, dev device.Device) alloc.Allocator {
		return newAsyncT(t, dev, alloc.AsyncConfig{})
	},
	"AsyncPool/ReleaseAtSync": func(t *testing.T, dev device.Device) alloc.Allocator {
		return newAsyncT(t, dev, alloc.AsyncConfig{ReleaseAtSync: true})
	},
	"Pool": func(t *testing.T, dev device.Device) alloc.Allocator {
		return newPoolT(t, dev)
	},
	"Limit(Direct)": func(t *testing.T, dev device.Device) alloc.Allocator {
		return alloc.NewLimit(alloc.NewDirect(dev), 1<<40)
	},
	"Limit(AsyncPool)": func(t *testing.T, dev device.Device) alloc.Allocator {
		return alloc.NewLimit(newAsyncT(t, dev, alloc.AsyncConfig{}), 1<<40)
	},
	"Limit(Pool)": func(t *testing.T, dev device.Device) alloc.Allocator {
		return alloc.NewLimit(newPoolT(t, dev), 1<<40)
	},
	"Trace(Direct)": func(t *testing.T, dev device.Device) alloc.Allocator {
		return alloc.NewTrace(alloc.NewDirect(dev), io.Discard)
	},
	"Trace(AsyncPool)": func(t *testing.T, dev device.Device) alloc.Allocator {
		return alloc.NewTrace(newAsyncT(t, dev, alloc.AsyncConfig{}), io.Discard)
	},
	"Trace(Pool)": func(t *testing.T, dev device.Device) alloc.Allocator {
		return alloc.NewTrace(newPoolT(t, dev), io.Discard)
	},
	"Trace(Limit(Pool))": func(t *testing.T, dev device.Device) alloc.Allocator {
		return alloc.NewTrace(alloc.NewLimit(newPoolT(t, dev), 1<<40), io.Discard)
	},
}

// TestConformance runs the conformance suite on every allocator and
// adaptor.
func TestConformance(t *testing.T) {
	for name, f := range factories {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			alloctest.Run(t, f)
		})
	}
}

// TestHugeRequests: a request near 2^64 bytes, whose rounding to any
// granularity would wrap around, fails cleanly on every allocator and
// adaptor: an error wrapping device.ErrOutOfMemory, one OOM counted,
// nothing allocated, and the allocator still usable.
func TestHugeRequests(t *testing.T) {
	sizes := []uint64{math.MaxUint64, math.MaxUint64 - 511, math.MaxUint64 - 2*units.MiB + 2, 1 << 63}
	for name, f := range factories {
		t.Run(name, func(t *testing.T) {
			dev := openSimT(t, sim.Config{TotalBytes: 256 * units.MiB, AddressOnly: true, NoContext: true})
			a := f(t, dev)
			defer a.Close()
			s := dev.DefaultStream()
			free0, _, _ := dev.MemInfo()
			for _, n := range sizes {
				before := a.Stats()
				p, err := a.Alloc(n, s)
				if !errors.Is(err, device.ErrOutOfMemory) {
					t.Fatalf("Alloc(%#x) = %v, %v; want an error wrapping device.ErrOutOfMemory", n, p, err)
				}
				after := a.Stats()
				if after.OOMs != before.OOMs+1 {
					t.Errorf("Alloc(%#x): OOMs %d → %d, want one more", n, before.OOMs, after.OOMs)
				}
				after.OOMs, after.Retries = before.OOMs, before.Retries
				if after != before {
					t.Errorf("Alloc(%#x) changed Stats: %+v → %+v", n, before, after)
				}
				if free, _, _ := dev.MemInfo(); free != free0 {
					t.Errorf("Alloc(%#x): device free memory %d → %d", n, free0, free)
				}
			}
			p, err := a.Alloc(units.MiB, s)
			if err != nil {
				t.Fatalf("Alloc(1 MiB) after the huge requests: %v", err)
			}
			if err := a.Free(p, s); err != nil {
				t.Fatal(err)
			}
		})
	}
}
