//go:build linux || darwin

package vram

import (
	"fmt"
	"os"
	"syscall"
)

// mapFile maps n bytes of f from offset 0, shared and, when writable,
// writable.
func mapFile(f *os.File, n int64, writable bool) ([]byte, error) {
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

func unmapFile(b []byte) error { return syscall.Munmap(b) }

const fileRungSupported = true
