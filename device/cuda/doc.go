// Package cuda is vram's CUDA backend: device.Device on a real NVIDIA GPU
// through the CUDA driver API.
//
// The driver library (libcuda.so.1, installed with the NVIDIA driver; then
// libcuda.so) is loaded at run time with github.com/ebitengine/purego, so
// no CUDA toolkit is needed to build and the package builds with
// CGO_ENABLED=0. Nothing happens at import time but registering the
// backend "cuda" with device.Register: device.Open("cuda"), ("cuda:N") or
// Open(N) loads the library, resolves every symbol it needs (the _v2 entry
// points where they exist), calls cuInit and retains the device's primary
// context. Where that fails — no library, a symbol missing, cuInit failed,
// no device N — the error wraps device.ErrNoDevice and says which, and
// device.Open("auto") falls back to the simulator with that reason.
//
// A Device implements device.Device, device.AsyncAllocator (the device's
// default memory pool: cuMemAllocAsync, release threshold, trim, usage),
// device.HostAllocator (pinned, optionally mapped, host memory),
// device.ModuleLoader (PTX compiled by the driver's JIT, launched with
// cuLaunchKernel) and device.StridedCopier (pitched 2-D copies in one
// cuMemcpy2DAsync). Driver status codes are Result values, errors whose
// text is the driver's name and description and which match the device
// package's sentinels under errors.Is (CUDA_ERROR_OUT_OF_MEMORY is
// device.ErrOutOfMemory).
//
// The package keeps its own record of the allocations it made, so that a
// bad pointer — freed, from before a Reset, another device's, or a range
// past an allocation's end — is refused with the device package's error
// before the driver can fault on it. It does not own pools, budgets or
// chunking (package alloc and the manager above it do), and it does not
// run Go kernels: device.FuncLauncher is the simulator's.
//
// The files: driver.go holds the raw symbols, constants and one thin
// wrapper per driver entry point; dl_linux.go loads the library; result.go
// is Result; device.go, memory.go, copy2d.go, stream.go and module.go are
// the Device above them; spans.go and args.go are the allocation records and kernel
// argument packing.
package cuda
