//go:build !linux

// On systems other than Linux the backend builds but never opens: the CUDA
// driver it binds is libcuda.so.

package cuda

import (
	"fmt"
	"runtime"
)

func openLib(names []string) (*lib, error) {
	return nil, fmt.Errorf("%w: the cuda backend binds libcuda.so and is built for Linux only (this is %s/%s)",
		errLoad, runtime.GOOS, runtime.GOARCH)
}

// raw is never reached: no lib is ever made here.
//
//go:uintptrescapes
func (l *lib) raw(fn int, args ...uintptr) Result { return ErrorNotSupported }
