//go:build !linux

package vram

// hostRAM is the host's physical memory, here unknown (0).
func hostRAM() uint64 { return 0 }

// ramAvailable is unknown here: the ladder then bounds host memory by
// HostOptions.Limit alone.
func ramAvailable() (uint64, bool) { return 0, false }
