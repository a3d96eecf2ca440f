//go:build !(linux || darwin)

package vram

import (
	"fmt"
	"os"
	"runtime"
)

func mapFile(f *os.File, n int64, writable bool) ([]byte, error) {
	return nil, fmt.Errorf("map %s: memory-mapped files are not supported on %s: %w", f.Name(), runtime.GOOS, ErrNotSupported)
}

func unmapFile([]byte) error { return nil }

const fileRungSupported = false
