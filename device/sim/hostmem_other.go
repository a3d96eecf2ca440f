//go:build !linux

package sim

// hostBufMap allocates a pinned host buffer's n bytes on the Go heap
// (hosts other than Linux): the collector frees them once HostFree has
// let them go.
func hostBufMap(n uint64) ([]byte, error) { return make([]byte, n), nil }

// hostBufUnmap lets mem go to the garbage collector.
func hostBufUnmap(mem []byte) {}
