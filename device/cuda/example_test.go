package cuda_test

import (
	"errors"
	"fmt"

	"github.com/vramkit/vram/device"
	"github.com/vramkit/vram/device/cuda"
	"github.com/vramkit/vram/device/sim"
)

// Open fails with an error wrapping device.ErrNoDevice, saying why, where
// there is no driver or GPU; a program can then fall back to the simulator
// (device.Open("auto") does exactly this).
func ExampleOpen() {
	var dev device.Device
	d, err := cuda.Open(0)
	switch {
	case err == nil:
		dev = d
	case errors.Is(err, device.ErrNoDevice):
		dev, err = sim.New(sim.Config{})
	}
	if err != nil {
		fmt.Println(err)
		return
	}
	defer dev.Close()
	fmt.Println("device holds bytes:", dev.Info().Backed)
	// Output: device holds bytes: true
}

// Driver status codes are errors that match the device package's
// sentinels.
func ExampleResult() {
	err := fmt.Errorf("alloc 1 TiB: %w", cuda.ErrorOutOfMemory)
	fmt.Println(errors.Is(err, device.ErrOutOfMemory), cuda.ErrorOutOfMemory.Name())
	// Output: true CUDA_ERROR_OUT_OF_MEMORY
}
