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
// cuLaunchKernel), device.StridedCopier (pitched 2-D copies in one
// cuMemcpy2DAsync), device.VirtualMemory (cuMemAddressReserve,
// cuMemCreate, cuMemMap, cuMemSetAccess, …: what alloc.Expandable grows
// by) and device.ForeignCaller (a program's own CUstreams borrowed, and
// the calling thread's current context put back after each call, for
// vram's C library under PyTorch, CuPy and Numba). Driver status codes are Result values, errors whose
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
// Rules from the driver's documentation that the backend keeps (each cited
// where it is kept):
//
//   - Free of MallocAsync memory synchronizes the context before
//     cuMemFree, which does no implicit synchronization for stream-ordered
//     memory; FreeAsync of Malloc memory waits on its stream and uses
//     cuMemFree, as cuMemFreeAsync is documented for stream-ordered memory
//     only.
//   - Memory handed to the driver holds no Go pointers: kernel parameters
//     are pinned (runtime.Pinner) and passed as an array of uintptr, and
//     the 2-D copy descriptor names host memory by uintptr, pinned for the
//     call.
//   - A kernel exception (CUDA_ERROR_ILLEGAL_ADDRESS and the other codes
//     Result.Sticky lists, CUDA_ERROR_LAUNCH_TIMEOUT among them) breaks the
//     context, and the driver returns it from every later call: the error
//     says so and matches ErrNeedsReset, Device.Err reports it, and every
//     later call on any Device of that GPU is refused with it until Reset.
//     Every driver call goes through lib.call, which notes such a result
//     wherever it appears. The driver itself promises recovery only by
//     restarting the process.
//   - A context reset keeps the context's handle but leaves it inactive
//     until it is retained again (Reset does). The reference says a reset
//     destroys all allocations; it is silent on the stream-ordered pool's
//     reserved memory and on virtual memory, so Reset frees those itself
//     first, and refuses every handle from before it with
//     device.ErrInvalidated.
//   - cuMemAddressReserve's default alignment is the driver's; reservations
//     ask for the granularity. The reference does not say that the driver
//     refuses freeing a reservation with mappings or mapping over a
//     mapping: the Device refuses both from its own records.
//   - The UUID is cuDeviceGetUuid_v2's where the driver has it, which names
//     a MIG slice by its own UUID (Info.ID is then MIG-…).
//   - A pinning the system refuses is device.ErrOutOfMemory whether
//     cuMemHostRegister says OUT_OF_MEMORY, OPERATING_SYSTEM or
//     INVALID_VALUE (see pinRefused). Reset unregisters the pinned buffers
//     of every Device on the GPU first.
//   - The dynamic loader runs on one locked thread, so a failed load keeps
//     dlerror's reason.
//
// Conformance on a real driver. The suite in package devicetest is exact
// on the simulator; on CUDA some of its assertions are tolerant, because a
// real driver moves free memory for reasons of its own: it loads internal
// modules lazily (on the first memset, copy or launch of a kind), gives
// streams, events and the memory pool resources of their own, and re-makes
// its own allocations after a context reset.
//
//	exact everywhere:
//	  what is allocated, freed, copied and read back; every error and
//	  sentinel; stream, event and pool ordering; MemInfo's total;
//	  Info.Granularity; the pool's reserved and used bytes (PoolUsage),
//	  which count only this process's pool
//	exact on the simulator, within 16 MiB on CUDA (cudaMemSlack):
//	  Accounting: each Malloc's drop in free memory (between n and the
//	    size rounded to the granularity plus one granule), the sum of the
//	    drops, free memory back where it started after the frees and after
//	    MallocAsync/FreeAsync, a synchronize and a trim
//	  AsyncPool: the drop at least the pool's reserve; free memory back
//	    after the pool released everything
//	  HostMemory: pinned host memory takes no device memory
//	  Reset: free memory back where it started
//	  BadInputs: a failed call, or a refused MallocAsync while another
//	    device's stream is open, leaves free memory unchanged
//	  Concurrency: free memory back where it started
//	  this package's TestAllocatorsOnCUDA and TestDriverOutOfMemory: free
//	    memory back where it was after a warm-up (exact on the stand-in
//	    driver); the allocator's and the driver pool's own figures are
//	    exact everywhere
//	exact on the simulator, by what the driver takes on CUDA:
//	  alloctest on CUDA leaves out the memory a driver takes for each
//	  stream a test makes, and warms up (a memset and copies) before it
//	  measures
//
// scripts/gpu-check.sh packs the suites and the rest into one archive and
// runs them on a GPU in one call; run --sim does the same here against the
// stand-in driver, which is as strict as the reference allows a driver to
// be (testdata/fakecuda.c lists its rules; fakerules_linux_test.go holds
// one test for each).
//
// The files: driver.go holds the raw symbols, constants and one thin
// wrapper per driver entry point; dl_linux.go loads the library; result.go
// is Result; device.go, memory.go, copy2d.go, stream.go, module.go and
// vmm.go are the Device above them; foreign.go serves calls from other
// programs' threads; spans.go and args.go are the allocation records
// and kernel argument packing; testdata/fakecuda.c is the stand-in driver
// the tests run against where there is no GPU.
package cuda
