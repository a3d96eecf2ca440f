package vram

import (
	"errors"
	"fmt"

	"github.com/vramkit/vram/alloc"
	"github.com/vramkit/vram/device"
)

// poolChoice is which allocator serves the Pool kind: where the device
// can (the zero value), or as WithExpandable says.
type poolChoice struct {
	set        bool // WithExpandable was given
	expandable bool
	ecfg       alloc.ExpandableConfig
}

// WithExpandable chooses the allocator of the Pool kind: on, alloc.Expandable
// with cfg (New fails with an error wrapping device.ErrNotSupported on a
// device without virtual memory); off, the segment alloc.Pool with the
// WithPoolConfig configuration. Without it the Pool kind is Expandable
// where the device manages virtual memory (device.VirtualMemory) and no
// PoolConfig was given, else Pool.
func WithExpandable(on bool, cfg alloc.ExpandableConfig) Option {
	return func(c *config) { c.pool = poolChoice{set: true, expandable: on, ecfg: cfg} }
}

// newPoolKind makes the allocator of the Pool kind on dev (see
// WithExpandable). Expandable is the default where the device can map
// pages because it holds fewer bytes beyond the live ones on every trace
// measured (BENCHMARKS.md, "Expandable segments").
func newPoolKind(dev device.Device, cfg alloc.PoolConfig, pc poolChoice) (alloc.Allocator, error) {
	if pc.set {
		if !pc.expandable {
			return alloc.NewPool(dev, cfg)
		}
		return alloc.NewExpandable(dev, pc.ecfg)
	}
	if _, ok := dev.(device.VirtualMemory); ok && cfg == (alloc.PoolConfig{}) {
		e, err := alloc.NewExpandable(dev, alloc.ExpandableConfig{})
		if err == nil {
			return e, nil
		}
		if !errors.Is(err, device.ErrNotSupported) {
			return nil, err
		}
	}
	p, err := alloc.NewPool(dev, cfg)
	if err != nil {
		return nil, fmt.Errorf("pool kind: %w", err)
	}
	return p, nil
}
