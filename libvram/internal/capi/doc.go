// Package capi is the Go side of vram's C library (libvram, built with
// -buildmode=c-shared): the process's managers, found by handle and by
// device ordinal; the streams of the programs that call in (PyTorch, CuPy,
// Numba, C); and each of those frameworks' books. It is plain Go, with no
// cgo: libvram's exported functions turn C values into Go ones and call it,
// and its tests run without a C compiler.
//
// One budget per device. A Registry holds at most one Manager per device
// ordinal, so every framework of the process that allocates on a device
// goes through one device-memory account (package account): one
// allocator and one cap (an alloc.Limit that refuses an allocation before
// the device is asked), which a broker's lease drives when Open names a
// broker. The C library has no clients or groups: it holds an account,
// not a vram.Manager.
//
// Streams. An allocation names the stream it is ordered on by the handle
// its framework gives (a cudaStream_t, which is a CUstream). Where the
// device borrows foreign streams (device.ForeignCaller: CUDA) the handle
// is wrapped as a stream of the device, so the allocator's events order
// reuse after the framework's own work. On the simulator no other program
// enqueues work, so a handle is only a key: each distinct key gets a
// stream of its own (at most MaxStreamKeys of them), which keeps the
// allocator's per-stream rules in play. Handle 0 is the device's default
// stream (CUDA's legacy default stream). Unordered (the all-ones handle)
// is for hooks that name no stream (Numba's EMM, CuPy's C allocator): such
// an allocation is made on a stream of the Manager's own, on which nothing
// is ever freed, so it gets fresh memory or memory whose free's event has
// completed, safe on any stream; such a free is ordered on the default
// stream, which on CUDA follows all earlier work of every blocking stream
// (the legacy default stream's implicit synchronization). Work on a
// non-blocking stream that uses such memory must be synchronized before it
// is freed. An allocation on cudaStreamPerThread, one handle for each
// thread's own stream, is made the same way where streams are borrowed.
//
// Threads. On CUDA every call runs on the calling OS thread (a call into a
// c-shared library from C runs its Go code on the caller's thread) and
// puts back the context current on it before returning
// (device.ForeignCaller.KeepThread); no driver call is handed to another
// goroutine. The allocator may run fence work on the calling goroutine
// only (package alloc keeps its device calls on the caller's goroutine).
//
// Clients (clients.go, responses.go, groups.go): the manager's client API
// (vram.h's ABI 2): clients of a manager's vram.Manager, the responses of
// their allocations, work marks and host arrays, by handle; the hooks queue
// events that the program takes with Poll on a thread of its own, so no Go
// goroutine ever calls into C; memory whose address C keeps is pinned
// while the handle that gave it is held.
//
// What it does not own: the C types, status codes and the fork check
// (libvram), the allocator (alloc), the account (account), the report's
// form (vram.ManagerReport).
package capi
