//go:build !(linux || darwin)

package mapfile

import (
	"errors"
	"fmt"
	"os"
	"runtime"
)

// Map fails here with an error wrapping errors.ErrUnsupported.
func Map(f *os.File, n int64, writable bool) ([]byte, error) {
	return nil, fmt.Errorf("map %s: memory-mapped files are not supported on %s: %w", f.Name(), runtime.GOOS, errors.ErrUnsupported)
}

// Unmap does nothing here.
func Unmap([]byte) error { return nil }

// Supported says whether Map can map files here.
const Supported = false
