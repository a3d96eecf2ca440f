package sim

// Emulated kernel time: Config.KernelTime makes every kernel launch take
// at least n × KernelTime of stream time for n indices, as a device whose
// kernels are slower than the host's Go code would. The kernel's blocks
// run first (the results are real); the stream's goroutine then sleeps
// out what is left, so an emulated kernel holds no CPU: several simulated
// devices, or a device's copies and kernels, overlap in time on a host of
// few cores as they would on GPUs.

import (
	"fmt"
	"time"

	"github.com/vramkit/vram/device"
)

// parseKernelTime reads the kerneltime=DURATION option (per index).
func parseKernelTime(v string) (time.Duration, error) {
	d, err := time.ParseDuration(v)
	if err != nil { // its error quotes v whole; the caller quotes it clipped
		return 0, fmt.Errorf("want a duration per index such as 2us")
	}
	if d < 0 {
		return 0, fmt.Errorf("want a duration >= 0")
	}
	return d, nil
}

// timedKernel runs kernel, a launch over n indices, and with
// Config.KernelTime set returns no sooner than n × KernelTime after it
// started.
func (d *Device) timedKernel(n int, kernel func() error) error {
	per := d.cfg.KernelTime
	if per <= 0 {
		return kernel()
	}
	end := time.Now().Add(time.Duration(n) * per)
	err := kernel()
	waitUntil(end)
	return err
}

// checkKernelTime refuses a negative Config.KernelTime.
func (c Config) checkKernelTime() error {
	if c.KernelTime < 0 {
		return fmt.Errorf("sim: kernel time %v per index: want >= 0: %w", c.KernelTime, device.ErrInvalidValue)
	}
	return nil
}
