//go:build linux

package vram

import (
	"syscall"

	"github.com/vramkit/vram/internal/meminfo"
)

// hostRAM is the host's physical memory in bytes, or 0 when unknown.
func hostRAM() uint64 {
	var si syscall.Sysinfo_t
	if err := syscall.Sysinfo(&si); err != nil {
		return 0
	}
	return uint64(si.Totalram) * max(uint64(si.Unit), 1)
}

// ramAvailable is Linux's estimate of the memory available to start new
// programs without swapping (MemAvailable), or ok false when unknown.
func ramAvailable() (uint64, bool) { return meminfo.ReadAvailable(meminfo.Path) }
