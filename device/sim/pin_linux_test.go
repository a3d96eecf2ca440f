package sim_test

import (
	"syscall"
	"testing"
	"unsafe"

	"github.com/vramkit/vram/device"
	"github.com/vramkit/vram/device/sim"
)

// Pinned memory is resident when HostAlloc returns (mincore says so of
// every page), as cuMemHostAlloc's is: copies into it take no page faults.
func TestHostAllocIsResident(t *testing.T) {
	d := newSim(t, sim.Config{TotalBytes: 64 * MiB})
	for name, mapped := range map[string]bool{"unmapped": false, "mapped": true} {
		t.Run(name, func(t *testing.T) {
			const n = 48 * MiB
			b := get[device.HostBuffer](t)(d.HostAlloc(n, mapped))
			defer func() { check(t, d.HostFree(b)) }()
			page := uintptr(syscall.Getpagesize())
			lo := uintptr(unsafe.Pointer(&b.Data[0])) &^ (page - 1)
			hi := uintptr(unsafe.Pointer(&b.Data[n-1])) + 1
			vec := make([]byte, (hi-lo+page-1)/page)
			if _, _, e := syscall.Syscall(syscall.SYS_MINCORE, lo, hi-lo, uintptr(unsafe.Pointer(&vec[0]))); e != 0 {
				t.Skipf("mincore: %v", e)
			}
			out := 0
			for _, v := range vec {
				if v&1 == 0 {
					out++
				}
			}
			if out > 0 {
				t.Errorf("%d of the %d pages of a %d MiB pinned buffer are not resident", out, len(vec), n/MiB)
			}
		})
	}
}
