//go:build linux

package cuda

import (
	"fmt"
	"os"
	"syscall"

	"github.com/vramkit/vram/internal/units"
)

// mapHost maps n bytes (rounded up to whole pages) of zeroed anonymous
// memory for pinning. It is not Go heap memory: the collector never sees
// or moves it.
func mapHost(n uint64) ([]byte, error) {
	size, ok := units.RoundUp(n, uint64(os.Getpagesize()))
	if !ok || size > uint64(^uint(0)>>1) {
		return nil, fmt.Errorf("host buffer of %d bytes is too large to map", n)
	}
	mem, err := syscall.Mmap(-1, 0, int(size), syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_PRIVATE|syscall.MAP_ANON)
	if err != nil {
		return nil, fmt.Errorf("mmap %d bytes: %w", size, err)
	}
	return mem, nil
}

func unmapHost(mem []byte) error {
	if err := syscall.Munmap(mem); err != nil {
		return fmt.Errorf("munmap: %w", err)
	}
	return nil
}
