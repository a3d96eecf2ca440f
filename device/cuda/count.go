package cuda

import (
	"fmt"
	"runtime"

	"github.com/vramkit/vram/device"
)

func init() { device.RegisterCounter("cuda", Count) }

// Count is the number of CUDA devices the driver lists (after
// CUDA_VISIBLE_DEVICES). Where the backend cannot be used the error wraps
// device.ErrNoDevice and says why.
func Count() (int, error) {
	l, err := load()
	if err != nil {
		return 0, fmt.Errorf("cuda: %w: %w", device.ErrNoDevice, err)
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if r := l.cuInit(); r != Success {
		return 0, fmt.Errorf("cuda: %w: cuInit failed (%s loaded): %w", device.ErrNoDevice, l.path, r)
	}
	var n int32
	if r := l.deviceGetCount(&n); r != Success {
		return 0, fmt.Errorf("cuda: %w: cuDeviceGetCount: %w", device.ErrNoDevice, r)
	}
	return int(n), nil
}
