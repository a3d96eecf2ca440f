package sim_test

import (
	"fmt"
	"testing"

	"github.com/vramkit/vram/device"
	"github.com/vramkit/vram/device/sim"
)

// BenchmarkHostAlloc pins a host buffer and frees it: what a staging
// buffer or a pinned host array costs on the simulator (its pages made
// resident, as pinning does; given back at the free).
func BenchmarkHostAlloc(b *testing.B) {
	for _, n := range []uint64{4 * MiB, 64 * MiB} {
		b.Run(fmt.Sprintf("size=%dMiB", n/MiB), func(b *testing.B) {
			d := newSim(b, sim.Config{TotalBytes: 64 * MiB})
			b.SetBytes(int64(n))
			for b.Loop() {
				hb := get[device.HostBuffer](b)(d.HostAlloc(n, false))
				check(b, d.HostFree(hb))
			}
		})
	}
}
