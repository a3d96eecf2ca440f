package sim

import (
	"runtime"

	"github.com/vramkit/vram/device"
)

// CopiesOverlapKernels reports whether the simulator's copies and
// kernels run at once at full speed (device.Overlapper): a copy is a
// memcpy on its stream's goroutine and a kernel's blocks run on
// KernelWorkers goroutines, all on the host's cores, so they do only
// when part of either is emulated time slept out (CopyBandwidth,
// KernelTime) or the kernels leave a core free.
func (d *Device) CopiesOverlapKernels() bool {
	c := d.cfg
	return c.CopyBandwidth > 0 || c.KernelTime > 0 || c.KernelWorkers < runtime.GOMAXPROCS(0)
}

var _ device.Overlapper = (*Device)(nil)
