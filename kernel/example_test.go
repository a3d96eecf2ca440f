package kernel_test

import (
	"fmt"

	"github.com/vramkit/vram/device"
	"github.com/vramkit/vram/device/sim"
	"github.com/vramkit/vram/kernel"
)

// A kernel with a Go form runs on the simulator; the same value, given
// PTX, runs on a GPU.
func Example() {
	dev, _ := sim.New(sim.Config{TotalBytes: 16 << 20, NoContext: true})
	defer dev.Close()
	square, _ := kernel.New("square", "" /* PTX text for CUDA */, func(a kernel.Args, lo, hi int) error {
		x := a.Float64s(0)
		for i := lo; i < hi; i++ {
			x[i] *= x[i]
		}
		return nil
	}, 0)
	defer square.Close()

	const n = 4
	p, _ := dev.Malloc(8 * n)
	defer dev.Free(p)
	s := dev.DefaultStream()
	in := []byte{0, 0, 0, 0, 0, 0, 0, 0x40, 0, 0, 0, 0, 0, 0, 0x08, 0x40, 0, 0, 0, 0, 0, 0, 0xf0, 0x3f, 0, 0, 0, 0, 0, 0, 0, 0} // 2, 3, 1, 0 (little-endian)
	_ = dev.CopyHtoD(p, in, s)
	_ = square.Launch(dev, s, n, array{p, 8 * n})
	out := make([]byte, 8*n)
	_ = dev.CopyDtoH(out, p, s)
	_ = s.Synchronize()
	fmt.Println(square.Form(dev), out[6:8], out[14:16], out[22:24])
	// Output:
	// go [16 64] [34 64] [240 63]
}

type array struct {
	p device.Ptr
	n uint64
}

func (a array) Ptr() device.Ptr { return a.p }
func (a array) Bytes() uint64   { return a.n }
