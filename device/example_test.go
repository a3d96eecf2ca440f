package device_test

import (
	"fmt"

	"github.com/vramkit/vram/device"
)

// Optional abilities are found by type assertion. Here a 4×3 block is cut
// out of a host matrix with rows of 6 bytes and written, in one operation,
// into a device matrix with rows 8 bytes apart; then the whole device
// matrix is read back.
func ExampleStridedCopier() {
	dev, err := device.Open("sim:vram=64MiB")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer dev.Close()
	sc, ok := dev.(device.StridedCopier)
	if !ok {
		fmt.Println("no 2-D copies on", dev.Info().Backend)
		return
	}
	s := dev.DefaultStream()
	const devPitch, hostPitch = 8, 6
	p, _ := dev.Malloc(3 * devPitch)
	defer dev.Free(p)
	_ = dev.Memset(p, '.', 3*devPitch, s)
	host := []byte("abcdefghijklmnopqrstuvwx") // 4 rows of 6
	// Rows 1..3 of the host matrix, columns 2..5, to the device's columns 0..3.
	_ = sc.CopyHtoD2D(p, devPitch, host[1*hostPitch+2:], hostPitch, 4, 3, s)
	out := make([]byte, 3*devPitch)
	_ = dev.CopyDtoH(out, p, s)
	if err := s.Synchronize(); err != nil {
		fmt.Println(err)
		return
	}
	for r := range 3 {
		fmt.Println(string(out[r*devPitch : (r+1)*devPitch]))
	}
	// Output:
	// ijkl....
	// opqr....
	// uvwx....
}

// A spec from the command line is read once: its backend checks the
// options and says what they give before anything opens, and a size the
// program took in bytes (a --vram flag) sizes the device as bytes.
func ExampleParseSpec() {
	spec, err := device.ParseSpec("sim:granularity=64KiB,backed=false")
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(spec.Backend(), spec.Info().Granularity, spec.Sizable())
	sized, err := spec.WithTotal(32 << 20)
	if err != nil {
		fmt.Println(err)
		return
	}
	dev, _, err := device.OpenSpec(sized)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer dev.Close()
	fmt.Println(sized, dev.Info().TotalBytes, sized.SizedBy(dev.Info()))
	_, err = device.ParseSpec("sim:colour=red")
	fmt.Println(err != nil)
	// Output:
	// sim 65536 true
	// sim:granularity=64KiB,backed=false 33554432 true
	// true
}
