// Package kernel holds portable kernels: one value that carries a kernel
// as PTX text, for devices that load PTX (CUDA, device.ModuleLoader), and
// as a Go function, for devices that run Go kernels (the simulator,
// device.FuncLauncher), under one name. A program written against a
// Kernel runs unchanged on the simulator and on a GPU.
//
// New checks that PTX, when given, declares ".entry NAME" for the
// kernel's name (a placeholder would run on the simulator and fail only
// on a GPU); compiling it is the driver's job, when it loads it.
//
// # Launch
//
// Launch(dev, s, n, args...) runs the kernel over the indices [0, n) on
// stream s. Each argument is a device array (anything with Ptr and Bytes,
// such as *vram.DeviceArray) or a scalar of type int32, uint32, int64,
// uint64, float32 or float64, in the order the PTX entry declares its
// parameters.
//
//   - On CUDA the PTX module is loaded on first use on each device (and
//     unloaded by Close); the kernel runs as a 1-D grid of Block threads
//     per block, ⌈n/Block⌉ blocks, each thread one index. Arrays pass as
//     their device addresses, scalars by value.
//   - On the simulator the Go function is called with disjoint [lo, hi)
//     ranges that together cover [0, n), in parallel over the host's
//     cores, and an Args that gives typed views of the arrays.
//
// # Typed views and byte order
//
// Args.Float32s(i), Float64s(i), Int32s(i), Uint32s(i), Int64s(i) and
// Bytes(i) view argument i's whole array in device memory, in the
// device's byte order, which is little-endian: the order of every GPU
// CUDA supports and of every host vram builds for (amd64, arm64; New
// refuses a big-endian host). An element k of a view is the same element
// k a PTX thread reads at ptr + k·size. Args.Shape(i) is the shape of an
// array that states one (Shaped; *vram.DeviceArray does), so a Go kernel
// over a 2-D array reads its row stride from the view; a PTX entry gets
// addresses only, and takes what it needs of a shape as scalars. Views
// must not be kept after the function returns. An array whose address is
// not aligned to the element's size cannot be viewed with that type, and
// an array that states its element type (Typed, as *vram.DeviceArray
// does) cannot be viewed as another: Float64s of a float32 array is an
// *ArgError, not its bytes read as float64s. Bytes views any array.
//
// An accessor given the wrong index or type panics with an *ArgError;
// Launch recovers it and returns it as the launch's error (it wraps
// ErrArgs), so a kernel need not check each access.
//
// The package knows nothing of chunks or pools: the caller (vram's batch
// pipeline, or a program of its own) says what n is and which arrays to
// pass.
package kernel
