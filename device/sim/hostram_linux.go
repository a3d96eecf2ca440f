//go:build linux

package sim

import "syscall"

// hostRAM is the host's physical memory in bytes, or 0 when unknown.
func hostRAM() uint64 {
	var si syscall.Sysinfo_t
	if syscall.Sysinfo(&si) != nil {
		return 0
	}
	return uint64(si.Totalram) * max(uint64(si.Unit), 1)
}
