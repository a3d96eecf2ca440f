// Package devicetest is the conformance suite of package device: one
// Run(t, open) holding every semantic test a backend must pass, so that
// the simulator (vram/device/sim) and the CUDA backend are held to the
// same contract.
//
// It owns the tests of behaviour any device shows through the interfaces
// of package device: memory accounting, copies, stream ordering and
// asynchrony, events across streams, the stream-ordered pool's reuse
// rules and release threshold, the memory checker's errors (each misuse
// one distinct sentinel), Reset, Close and bad inputs, and 2-D copies.
// Optional abilities (device.AsyncAllocator, HostAllocator, FuncLauncher,
// StridedCopier, VirtualMemory) are tested only when the device has them, and tests that
// need bytes skip on a device that is not backed; each skip says why.
//
// Its files follow the abilities: memory.go (info, accounting, Malloc,
// copies), streams.go (ordering, asynchrony, events, sticky errors),
// kernels.go, asyncpool.go, hostmem.go, memcheck.go, strided.go, vmm.go,
// reset.go, badinputs.go and lifecycle.go (Close, concurrency); Run and
// the helpers are in devicetest.go and helpers.go.
//
// It does not own anything backend-specific: the simulator's exact
// granularity rules, fault injection and address-only mode are tested in
// vram/device/sim itself. It imports nothing but package device and the
// standard library.
//
// Use it from a backend's tests:
//
//	func TestConformance(t *testing.T) {
//		devicetest.Run(t, func(t *testing.T) device.Device {
//			d, err := sim.New(sim.Config{TotalBytes: 256 << 20})
//			if err != nil {
//				t.Fatal(err)
//			}
//			return d
//		})
//	}
//
// open is called once per subtest and must return a fresh device (or a
// fresh context on the same hardware); the suite closes it. Subtests run
// one after another.
package devicetest
