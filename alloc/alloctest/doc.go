// Package alloctest is the conformance suite for vram's allocators: Run(t,
// factory) holds any alloc.Allocator (an allocator or an adaptor over one)
// to the Allocator contract on fresh simulated devices; RunOn(t, open,
// factory) does the same on devices the caller opens — a real GPU through
// the CUDA backend — with sizes taken from the device; RunPinned holds a
// pinned host-buffer pool (alloc.PinnedPool) to its own contract; and Ops
// runs a byte string as a sequence of calls for fuzz targets, on a
// StreamRules device that can hold streams busy, so that the stream rules
// are fuzzed too (StreamRules also serves fuzz targets of their own).
//
// It owns the tests of the contract, not the allocators: each allocator's
// own tests (growth policy, rounding, thresholds) live beside it in
// package alloc. Every device it makes or is given is closed when its test
// ends, but for a StreamRules device, which its caller closes. Its helpers are not safe for concurrent use except where a test
// runs goroutines on purpose (Concurrent).
package alloctest
