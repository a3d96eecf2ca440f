//go:build !linux

package meminfo

// sysinfo is unknown here.
func sysinfo() (ram, swap uint64, ok bool) { return 0, 0, false }

// HostAvailable is unknown here: ok is false.
func HostAvailable() (uint64, bool) { return 0, false }
