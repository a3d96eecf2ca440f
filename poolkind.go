package vram

import (
	"errors"

	"github.com/vramkit/vram/alloc"
	"github.com/vramkit/vram/device"
)

// newPoolKind makes the allocator of the Pool kind on dev: alloc.Expandable
// where the device manages virtual memory (device.VirtualMemory) and cfg
// asks for nothing only alloc.Pool does (its zero value), else alloc.Pool.
// On the shared PyTorch traces and perturbed copies of them, Expandable
// holds within 1.3% of the live bytes where Pool holds up to 1.4×
// (BENCHMARKS.md, "Expandable segments").
func newPoolKind(dev device.Device, cfg alloc.PoolConfig) (alloc.Allocator, error) {
	if _, ok := dev.(device.VirtualMemory); ok && cfg == (alloc.PoolConfig{}) {
		e, err := alloc.NewExpandable(dev, alloc.ExpandableConfig{})
		if err == nil {
			return e, nil
		}
		if !errors.Is(err, device.ErrNotSupported) {
			return nil, err
		}
	}
	return alloc.NewPool(dev, cfg)
}
