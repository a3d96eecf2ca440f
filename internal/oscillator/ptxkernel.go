package oscillator

import (
	"fmt"

	"github.com/vramkit/vram/device"
	"github.com/vramkit/vram/kernel"
)

// BlockSize is the PTX kernel's threads per block.
const BlockSize = 128

// NewPortable returns the kernel as one portable value: the PTX for
// devices that load PTX, the Go form for devices that run Go kernels,
// both under the entry name "oscillate". Launch it over a chunk's N runs
// with the arguments of Args in the PTX entry's order:
//
//	init, params, out, status (arrays), N, LD (uint32), Dt (float32), Steps, Every (uint32)
//
// Close it to unload the PTX modules it loaded.
func NewPortable() *kernel.Kernel {
	k, err := kernel.New(Entry, PTX, goForm, BlockSize)
	if err != nil {
		panic(err) // the arguments are constants
	}
	return k
}

// array is a raw device array of a launch.
type array struct {
	p device.Ptr
	n uint64
}

func (a array) Ptr() device.Ptr { return a.p }
func (a array) Bytes() uint64   { return a.n }

// launchArgs is a as the portable kernel's arguments.
func (a Args) launchArgs() []any {
	ld, samples := int(a.LD), Samples(a.Steps, a.Every)
	return []any{
		array{a.Init, InitBytes(ld)}, array{a.Params, ParamsBytes(ld)},
		array{a.Out, OutBytes(ld, samples)}, array{a.Status, StatusBytes(ld)},
		a.N, a.LD, a.Dt, a.Steps, a.Every,
	}
}

// formKernel is the portable kernel held to one form on one device.
type formKernel struct {
	k    *kernel.Kernel
	kind string // "go" or "ptx"
	fl   device.FuncLauncher
	ml   device.ModuleLoader
}

// NewGo returns the Go form of the kernel on dev.
func NewGo(dev device.FuncLauncher) Kernel {
	return &formKernel{k: NewPortable(), kind: "go", fl: dev}
}

// NewPTX loads the PTX on dev and finds its entry. Close the kernel to
// unload the module.
func NewPTX(dev device.ModuleLoader) (Kernel, error) {
	k := NewPortable()
	if err := k.LoadOn(dev); err != nil {
		return nil, fmt.Errorf("oscillator: %w", err)
	}
	return &formKernel{k: k, kind: "ptx", ml: dev}, nil
}

func (f *formKernel) Kind() string { return f.kind }

// Close unloads the module, if any.
func (f *formKernel) Close() error { return f.k.Close() }

// Launch enqueues the kernel over a.N runs on s: on the PTX form a 1-D
// grid of BlockSize threads per block.
func (f *formKernel) Launch(s device.Stream, a Args) error {
	if err := a.Check(); err != nil {
		return err
	}
	if f.kind == "ptx" {
		return f.k.LaunchPTX(f.ml, s, int(a.N), a.launchArgs()...)
	}
	return f.k.LaunchGo(f.fl, s, int(a.N), a.launchArgs()...)
}
