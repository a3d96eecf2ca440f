package meminfo

// RAM is the host's physical memory in bytes, or 0 when unknown.
func RAM() uint64 {
	ram, _, _ := sysinfo()
	return ram
}

// RAMAndSwap is the host's memory and swap in bytes, or 0 when unknown.
// Linux refuses (by default) to commit a single mapping larger than this,
// which the Go runtime reports as a fatal error.
func RAMAndSwap() uint64 {
	ram, swap, _ := sysinfo()
	return ram + swap
}
