//go:build linux

package sim

import "syscall"

// vmHostMap maps n bytes of anonymous host memory that takes no RAM until
// touched (MAP_NORESERVE), to back a reservation of virtual memory.
func vmHostMap(n uint64) ([]byte, error) {
	return syscall.Mmap(-1, 0, int(n), syscall.PROT_READ|syscall.PROT_WRITE,
		syscall.MAP_PRIVATE|syscall.MAP_ANON|syscall.MAP_NORESERVE)
}

// vmHostUnmap gives back memory from vmHostMap.
func vmHostUnmap(b []byte) { _ = syscall.Munmap(b) }

// vmHostDrop gives the RAM of b (page aligned) back to the host; it reads
// as zeros afterwards.
func vmHostDrop(b []byte) { _ = syscall.Madvise(b, syscall.MADV_DONTNEED) }
