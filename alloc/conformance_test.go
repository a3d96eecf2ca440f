package alloc_test

import (
	"io"
	"testing"

	"github.com/vramkit/vram/alloc"
	"github.com/vramkit/vram/alloc/alloctest"
	"github.com/vramkit/vram/device"
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
