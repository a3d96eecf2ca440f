package oscillator

import (
	"errors"
	"fmt"

	"github.com/vramkit/vram/device"
)

// BlockSize is the PTX kernel's threads per block.
const BlockSize = 128

// ptxKernel is the kernel as PTX, for devices that load modules.
type ptxKernel struct {
	mod device.Module
	fn  device.Function
}

// NewPTX loads PTX on dev and finds its entry. Close the kernel to unload
// the module.
func NewPTX(dev device.ModuleLoader) (Kernel, error) {
	mod, err := dev.LoadPTX(PTX)
	if err != nil {
		return nil, fmt.Errorf("oscillator: load PTX: %w", err)
	}
	fn, err := mod.Function(Entry)
	if err != nil {
		return nil, errors.Join(fmt.Errorf("oscillator: %w", err), mod.Close())
	}
	return &ptxKernel{mod: mod, fn: fn}, nil
}

func (*ptxKernel) Kind() string { return "ptx" }

// Close unloads the module.
func (k *ptxKernel) Close() error { return k.mod.Close() }

// Launch enqueues the kernel over a.N runs on s: a 1-D grid of BlockSize
// threads per block, the arguments in the PTX entry's order.
func (k *ptxKernel) Launch(s device.Stream, a Args) error {
	if err := a.Check(); err != nil {
		return err
	}
	grid := (a.N-1)/BlockSize + 1 // a.N > 0 (Check); a.N + BlockSize − 1 could overflow
	return k.fn.Launch(s, device.Dim3{X: grid, Y: 1, Z: 1}, device.Dim3{X: BlockSize, Y: 1, Z: 1}, 0,
		a.Init, a.Params, a.Out, a.Status, a.N, a.LD, a.Dt, a.Steps, a.Every)
}
