package vram_test

import (
	"fmt"
	"os"

	"github.com/vramkit/vram"
	"github.com/vramkit/vram/device/sim"
)

// The host ladder under small limits: a small array is pinned, a larger
// one pageable, and one past the host limit spills to a memory-mapped
// .npy file, kept here and mapped again.
func ExampleHostMemory_Alloc() {
	spill, _ := os.MkdirTemp("", "spill")
	defer os.RemoveAll(spill)
	dev, _ := sim.New(sim.Config{TotalBytes: 16 << 20, NoContext: true})
	defer dev.Close()
	m, _ := vram.New(dev, vram.WithHostOptions(vram.HostOptions{
		PinnedLimit: 1 << 20, // 1 MiB pinned at most
		Limit:       4 << 20, // 4 MiB of host RAM at most
		SpillDir:    spill,
	}))
	defer m.Close()
	for _, n := range []int{1 << 16, 1 << 18, 1 << 20} { // float64s: 512 KiB, 2 MiB, 8 MiB
		h, err := m.Host().Alloc([]int{n}, vram.Float64, vram.HostArrayOptions{Keep: true, Name: "x"})
		if err != nil {
			fmt.Println(err)
			return
		}
		fmt.Println(h.Bytes()>>10, "KiB:", h.Placement().Rung)
		if p := h.Placement(); p.Rung == vram.RungFile {
			h.Float64s()[n-1] = 42
			h.Free() // kept: the file stays
			again, _ := m.Host().Open(p.Path, false)
			fmt.Println("reopened:", again.Shape(), again.Float64s()[n-1])
			again.Free()
			continue
		}
		defer h.Free()
	}
	// Output:
	// 512 KiB: pinned
	// 2048 KiB: pageable
	// 8192 KiB: file
	// reopened: [1048576] 42
}
