//go:build !linux

package meminfo

// sysinfo is unknown here.
func sysinfo() (ram, swap uint64, ok bool) { return 0, 0, false }
