//go:build !linux

package sim

// hostRAM is the host's physical memory in bytes, or 0 when unknown, as
// here.
func hostRAM() uint64 { return 0 }
