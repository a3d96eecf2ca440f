// Package alloctest is the conformance suite for vram's allocators: one
// Run(t, factory) that holds any alloc.Allocator (an allocator or an
// adaptor over one) to the Allocator contract on the simulator, and Ops,
// which runs a byte string as a sequence of calls for fuzz targets.
//
// It owns the tests of the contract, not the allocators: each allocator's
// own tests (growth policy, rounding, thresholds) live beside it in
// package alloc. Every device it makes is a fresh simulated one
// (vram/device/sim), closed when the test ends.
package alloctest
