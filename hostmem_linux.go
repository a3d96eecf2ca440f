//go:build linux

package vram

import "syscall"

// hostMemory is the host's memory and swap in bytes, or 0 when it cannot
// be read. Linux refuses (by default) to commit a single mapping larger
// than this, which the Go runtime reports as a fatal error.
func hostMemory() uint64 {
	var si syscall.Sysinfo_t
	if err := syscall.Sysinfo(&si); err != nil {
		return 0
	}
	unit := uint64(si.Unit)
	if unit == 0 {
		unit = 1
	}
	return (uint64(si.Totalram) + uint64(si.Totalswap)) * unit
}
