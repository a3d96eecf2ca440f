//go:build !linux

package vram

// hostMemory is the host's memory and swap in bytes, or 0 when unknown,
// as here: pageable arrays are then bounded by the Go runtime's limit
// alone.
func hostMemory() uint64 { return 0 }
