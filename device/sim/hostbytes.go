package sim

// The host's view of simulated device memory, for programs whose kernels
// run on the host outside the simulator (Numba's CUDA simulator over
// vram's arrays, through libvram).

import (
	"fmt"

	"github.com/vramkit/vram/device"
)

// HostBytes returns the host bytes behind the n bytes of device memory at
// p, checked as a copy's access is (out of bounds, use after free, a
// pointer from before a Reset each fail with their error). They are the
// bytes copies and kernels use, made on this first access if need be; the
// caller orders its reads and writes with the device's work itself
// (synchronize the streams that use them first). The slice stays the
// allocation's while it is live: a Malloc's bytes are Go memory, kept
// until the free; a mapping of virtual memory's are a host mapping outside
// Go, which reads as zeros once unmapped and is gone (a fault) once its
// reservation is freed. Use them after the free and the behaviour is
// undefined, as on a GPU. An address-only device has no bytes: an error
// wrapping device.ErrNotSupported.
func (d *Device) HostBytes(p device.Ptr, n uint64) ([]byte, error) {
	if d.cfg.AddressOnly {
		return nil, fmt.Errorf("%v: host bytes at %v: the device keeps addresses only (backed=false): %w", d, p, device.ErrNotSupported)
	}
	if n == 0 {
		return nil, fmt.Errorf("%v: host bytes at %v: 0 bytes: %w", d, p, device.ErrInvalidValue)
	}
	return d.checkAccess("host bytes", p, n)
}
