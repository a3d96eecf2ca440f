//go:build linux || darwin

package mapfile

import (
	"fmt"
	"os"
	"syscall"
)

// Map maps n bytes of f from offset 0, shared and, when writable,
// writable.
func Map(f *os.File, n int64, writable bool) ([]byte, error) {
	prot := syscall.PROT_READ
	if writable {
		prot |= syscall.PROT_WRITE
	}
	b, err := syscall.Mmap(int(f.Fd()), 0, int(n), prot, syscall.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("map %s (%d bytes): %w", f.Name(), n, err)
	}
	return b, nil
}

// Unmap unmaps b, a mapping Map made.
func Unmap(b []byte) error { return syscall.Munmap(b) }

// Supported says whether Map can map files here.
const Supported = true
