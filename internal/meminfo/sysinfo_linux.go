//go:build linux

package meminfo

import "syscall"

// sysinfo is the host's physical memory and swap in bytes, from
// sysinfo(2), or ok false when it cannot be read.
func sysinfo() (ram, swap uint64, ok bool) {
	var si syscall.Sysinfo_t
	if err := syscall.Sysinfo(&si); err != nil {
		return 0, 0, false
	}
	unit := max(uint64(si.Unit), 1)
	return uint64(si.Totalram) * unit, uint64(si.Totalswap) * unit, true
}
