//go:build !linux

package sim

// vmHostMap allocates n bytes on the Go heap (the host's lazy commit keeps
// untouched pages free where it has one).
func vmHostMap(n uint64) ([]byte, error) { return make([]byte, n), nil }

// vmHostUnmap lets b go to the garbage collector.
func vmHostUnmap(b []byte) {}

// vmHostDrop zeroes b, as unmapping does on Linux.
func vmHostDrop(b []byte) { clear(b) }
