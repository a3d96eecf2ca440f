//go:build linux

package sim_test

import (
	"errors"
	"fmt"
	"os"

	"github.com/vramkit/vram/device"
	"github.com/vramkit/vram/device/sim"
)

// Two clients of one shared device. Here both are in one process; two
// processes opening the same spec see the same.
func ExampleDevice_SharedUsage() {
	dir, _ := os.MkdirTemp("", "vram-example")
	defer os.RemoveAll(dir)
	spec := "sim:shared=jobs,vram=1GiB,context=32MiB,backed=false,dir=" + dir
	a, _ := device.Open(spec)
	b, _ := device.Open(spec)
	defer a.Close()
	defer b.Close()

	p, _ := a.Malloc(600 << 20)
	free, _, _ := b.MemInfo()
	fmt.Printf("b sees %d MiB free\n", free>>20) // 1024 − 2 × 32 − 600
	_, err := b.Malloc(600 << 20)
	fmt.Println("b's 600 MiB out of memory:", errors.Is(err, device.ErrOutOfMemory))

	u, _ := b.(*sim.Device).SharedUsage()
	for _, c := range u.Clients {
		fmt.Printf("slot %d: %d MiB (context %d MiB), this one: %v\n", c.Slot, c.Used>>20, c.Context>>20, c.Self)
	}
	a.Free(p)
	// Output:
	// b sees 360 MiB free
	// b's 600 MiB out of memory: true
	// slot 0: 632 MiB (context 32 MiB), this one: false
	// slot 1: 32 MiB (context 32 MiB), this one: true
}
