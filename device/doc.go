// Package device is vram's only door to hardware.
//
// It owns the small set of interfaces every backend implements — Device,
// Stream and Event — the device address type Ptr, the optional abilities a
// backend may add (stream-ordered allocation, pinned host memory, kernel
// launch, virtual memory management, calls from a foreign program's threads
// and streams), the sentinel errors every backend returns, and the two
// doors to a device: Open, which turns a spec string such as
// "sim:vram=8GiB" or "cuda:0" into a Device, and OpenSpec, which opens a
// spec read once. A program that takes a spec from its user reads it once
// with ParseSpec (ReadSpecs for a list: "all", "sim:count=4",
// "cuda:0;cuda:1"): the Spec's backend checks its options and says what
// they give (SpecInfo) without opening anything, WithTotal sizes a
// simulator in bytes, and OpenSpec opens it and says why "auto" fell back
// to the simulator. (OpenAll, which opens a list's devices, is deprecated:
// ReadSpecs and OpenSpec do it.)
//
// It does not own pools, clients, budgets or chunking: those live above it
// in vram/alloc and vram. Nothing else in the project talks to a GPU.
//
// Backends live in sub-packages and register themselves with Register
// (and RegisterSpecReader, RegisterCounter) when imported: vram/device/sim (a faithful simulator, the default when there
// is no GPU) and vram/device/cuda (the CUDA driver API, loaded at run time).
// Importing the root package github.com/vramkit/vram links both.
//
// # Stream contract
//
// Work enqueued on one Stream runs in the order it was enqueued and,
// in general, after the enqueuing call has returned. Work on different
// streams is unordered unless an Event orders it: Event.Record(s1) followed
// by Event.Wait(s2) makes everything enqueued on s2 afterwards wait for
// everything enqueued on s1 before the record. Memory used by work on one
// stream and then by work on another is undefined unless the two streams
// were ordered that way or synchronized from the host. Host buffers passed
// to asynchronous copies must stay alive and unchanged (for CopyHtoD) or
// unread (for CopyDtoH) until the stream has been synchronized past the
// copy; a backend may complete a copy from ordinary (pageable) Go memory
// before returning.
//
// Errors raised by asynchronous work are sticky on the stream that ran it
// and are returned by that stream's next Synchronize (and by
// Device.Synchronize), as the CUDA driver reports them.
package device
