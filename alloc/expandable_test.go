package alloc_test

import (
	"io"
	"testing"

	"github.com/vramkit/vram/alloc"
	"github.com/vramkit/vram/alloc/alloctest"
	"github.com/vramkit/vram/device"
)

// newExpandableT makes an Expandable or stops the test.
func newExpandableT(t *testing.T, dev device.Device, cfg alloc.ExpandableConfig) *alloc.Expandable {
	t.Helper()
	e, err := alloc.NewExpandable(dev, cfg)
	if err != nil {
		t.Fatalf("NewExpandable: %v", err)
	}
	return e
}

// The conformance suite, the huge-request test and every adaptor run on
// Expandable as on Pool.
func init() {
	factories["Expandable"] = func(t *testing.T, dev device.Device) alloc.Allocator {
		return newExpandableT(t, dev, alloc.ExpandableConfig{})
	}
	factories["Expandable/KeepMapped"] = func(t *testing.T, dev device.Device) alloc.Allocator {
		return newExpandableT(t, dev, alloc.ExpandableConfig{KeepMapped: true})
	}
	factories["Limit(Expandable)"] = func(t *testing.T, dev device.Device) alloc.Allocator {
		return alloc.NewLimit(newExpandableT(t, dev, alloc.ExpandableConfig{}), 1<<40)
	}
	factories["Trace(Expandable)"] = func(t *testing.T, dev device.Device) alloc.Allocator {
		return alloc.NewTrace(newExpandableT(t, dev, alloc.ExpandableConfig{}), io.Discard)
	}
}

func FuzzExpandable(f *testing.F) {
	fuzzAllocator(f, func(t *testing.T, dev device.Device) alloc.Allocator {
		return newExpandableT(t, dev, alloc.ExpandableConfig{})
	})
}

var _ = alloctest.Run
