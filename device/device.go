package device

import (
	"errors"
	"fmt"
)

// Ptr is a device address. It is never dereferenced on the host; the zero
// Ptr is never a valid allocation.
type Ptr uint64

// String writes the address in hex, as drivers and RMM's logs do.
func (p Ptr) String() string { return fmt.Sprintf("0x%x", uint64(p)) }

// Add returns p advanced by off bytes.
func (p Ptr) Add(off uint64) Ptr { return p + Ptr(off) }

// Sentinel errors shared by every backend. Backends wrap them with the
// operation and the figures that explain them; test with errors.Is.
var (
	// ErrOutOfMemory: the device (or its stream-ordered pool) could not
	// satisfy an allocation.
	ErrOutOfMemory = errors.New("out of device memory")
	// ErrNoDevice: the backend cannot be used here (no driver, no GPU,
	// no such ordinal). The wrapping error says which.
	ErrNoDevice = errors.New("no device")
	// ErrInvalidated: a pointer, stream or event made before a Reset.
	ErrInvalidated = errors.New("invalidated by a device reset")
	// ErrInvalidPointer: an address that was never allocated on this
	// device, or that belongs to another device.
	ErrInvalidPointer = errors.New("invalid device pointer")
	// ErrOutOfBounds: a copy, memset or kernel access past the end of
	// its allocation.
	ErrOutOfBounds = errors.New("access out of bounds")
	// ErrUseAfterFree: an access through a pointer that has been freed.
	ErrUseAfterFree = errors.New("use after free")
	// ErrDoubleFree: a pointer freed twice.
	ErrDoubleFree = errors.New("double free")
	// ErrNotSupported: the backend or its mode lacks the ability asked for.
	ErrNotSupported = errors.New("not supported")
	// ErrClosed: the device, stream or event has been closed.
	ErrClosed = errors.New("closed")
	// ErrInvalidValue: an argument out of range (a zero size, a nil stream).
	ErrInvalidValue = errors.New("invalid value")
	// ErrCopyFailed: a transfer failed (an injected fault on the simulator,
	// a driver transfer error on CUDA).
	ErrCopyFailed = errors.New("copy failed")
	// ErrBadSpec: a device spec string that Open cannot read.
	ErrBadSpec = errors.New("bad device spec")
)

// Info describes a device. Sizes are in bytes.
type Info struct {
	Backend      string // "sim" or "cuda"
	Name         string // e.g. "NVIDIA H200" or "vram simulator"
	Ordinal      int    // device index within its backend
	TotalBytes   uint64 // total device memory, as MemInfo reports it
	ContextBytes uint64 // memory the context itself takes from TotalBytes
	// Granularity is the unit in which Malloc reserves device memory
	// (2 MiB on current drivers for large allocations).
	Granularity uint64
	// Driver describes the driver or simulator version.
	Driver string
	// ComputeCapability is "major.minor" on CUDA, "" on the simulator.
	ComputeCapability string
	// Backed is false on an address-only simulator, whose memory holds no
	// bytes (copies and kernels return ErrNotSupported).
	Backed bool
	// ID names the physical device the same way in every process of the
	// host that opens it, whatever its ordinal there (CUDA_VISIBLE_DEVICES
	// renumbers GPUs per process): "GPU-" and the UUID on CUDA, as
	// nvidia-smi prints it; "sim:shared=NAME" (with ",dir=PATH" when the
	// ledger's directory was chosen) for a shared simulator. "" for a
	// device no other process sees (a private simulator). The node broker
	// finds a process's device by it.
	ID string
}

// Device is one GPU (or simulated GPU) and its context.
//
// A Device is safe for concurrent use. After Close every method returns
// ErrClosed; after Reset every Ptr, Stream and Event made before it is
// invalid and using one returns ErrInvalidated.
type Device interface {
	// Info describes the device.
	Info() Info
	// MemInfo reports free and total device memory as the driver does.
	MemInfo() (free, total uint64, err error)

	// Malloc allocates n > 0 bytes synchronously.
	Malloc(n uint64) (Ptr, error)
	// Free releases a Malloc'd pointer synchronously (it waits for work
	// that may use it, as cuMemFree does).
	Free(p Ptr) error

	// DefaultStream is the device's legacy default stream.
	DefaultStream() Stream
	// NewStream makes a stream that does not synchronize with the default
	// stream. Close it when done.
	NewStream() (Stream, error)
	// NewEvent makes an event with timing disabled. Close it when done.
	NewEvent() (Event, error)

	// CopyHtoD copies len(src) bytes from host to dst, ordered on s.
	CopyHtoD(dst Ptr, src []byte, s Stream) error
	// CopyDtoH copies len(dst) bytes from src to the host, ordered on s.
	CopyDtoH(dst []byte, src Ptr, s Stream) error
	// CopyDtoD copies n bytes between device addresses, ordered on s.
	CopyDtoD(dst, src Ptr, n uint64, s Stream) error
	// Memset sets n bytes at dst to value, ordered on s.
	Memset(dst Ptr, value byte, n uint64, s Stream) error

	// Synchronize waits for all work on all streams of the device.
	Synchronize() error
	// Reset destroys the context's state: all memory, streams and events
	// made before it become invalid. The device stays open.
	Reset() error
	// Close releases everything. Using the device afterwards returns
	// ErrClosed.
	Close() error
}

// Stream is an ordered queue of device work. Safe for concurrent use.
type Stream interface {
	// Synchronize waits until all work enqueued so far has finished and
	// returns the first error any of it raised.
	Synchronize() error
	// Query reports whether all work enqueued so far has finished.
	Query() (done bool, err error)
	// Handle is the backend's handle (CUstream on CUDA, a stream number on
	// the simulator); 0 is the default stream. Used in logs and traces.
	Handle() uintptr
	// Close waits for the stream's work and releases it. Closing the
	// default stream is a no-op.
	Close() error
}

// Event marks a point in a stream's work. Safe for concurrent use.
type Event interface {
	// Record captures the work enqueued on s so far.
	Record(s Stream) error
	// Wait makes work enqueued on s after this call wait until the
	// captured work has finished. It does not block the host.
	Wait(s Stream) error
	// Synchronize blocks the host until the captured work has finished.
	// An event never recorded is complete.
	Synchronize() error
	// Query reports whether the captured work has finished.
	Query() (done bool, err error)
	// Close releases the event.
	Close() error
}

// AsyncAllocator is a device with a stream-ordered memory pool
// (cuMemAllocAsync). A block freed on stream S is reusable at once by
// allocations ordered on S, and by allocations on other streams only after
// S's work up to the free has finished. Found by type assertion.
type AsyncAllocator interface {
	// MallocAsync allocates n > 0 bytes, usable by work ordered on s
	// after this call.
	MallocAsync(n uint64, s Stream) (Ptr, error)
	// FreeAsync frees p once the work enqueued on s so far has finished.
	FreeAsync(p Ptr, s Stream) error
	// SetReleaseThreshold sets how many bytes of freed memory the pool
	// keeps reserved when a synchronization point releases memory
	// (CU_MEMPOOL_ATTR_RELEASE_THRESHOLD). 0 releases all of it.
	SetReleaseThreshold(bytes uint64) error
	// TrimPool releases reserved but unused pool memory until at most
	// keep bytes stay reserved (cuMemPoolTrimTo).
	TrimPool(keep uint64) error
	// PoolUsage reports the pool's bytes reserved from the device and
	// bytes in use by live allocations.
	PoolUsage() (reserved, used uint64, err error)
}

// PoolSegment is one reservation of a stream-ordered pool: Size bytes at
// Addr.
type PoolSegment struct {
	Addr Ptr
	Size uint64
}

// PoolSegmenter is an AsyncAllocator that lists its pool's reservations,
// by address: what the driver's pool holds, which CUDA does not show but
// the simulator does (a recorder of its history, trace.RecordReplay,
// reads them). Found by type assertion.
type PoolSegmenter interface {
	PoolSegments() []PoolSegment
}

// HostBuffer is page-locked (pinned) host memory. Data is the host view;
// DevicePtr is its device address when the buffer was mapped, else 0.
type HostBuffer struct {
	Data      []byte
	DevicePtr Ptr
}

// HostAllocator is a device that can allocate pinned host memory
// (cuMemHostAlloc). Found by type assertion.
type HostAllocator interface {
	// HostAlloc allocates n > 0 bytes of pinned host memory; mapped also
	// gives it a device address, so kernels can read it over the bus.
	HostAlloc(n uint64, mapped bool) (HostBuffer, error)
	// HostFree releases a buffer from HostAlloc.
	HostFree(b HostBuffer) error
}

// Dim3 is a launch grid or block size.
type Dim3 struct{ X, Y, Z uint32 }

// FuncLauncher is a device that runs kernels written as Go functions
// (the simulator). Found by type assertion.
type FuncLauncher interface {
	// LaunchFunc enqueues fn on s to run over the index range [0, n),
	// split into blocks that run in parallel over the host's cores: fn is
	// called with disjoint [lo, hi) ranges and a View of device memory.
	LaunchFunc(s Stream, n int, fn func(mem View, lo, hi int) error) error
}

// View gives a Go kernel access to device memory while it runs. The
// slices it returns must not be kept after the kernel returns.
type View interface {
	// Bytes returns the n bytes at p, checked like any other access.
	Bytes(p Ptr, n uint64) ([]byte, error)
}

// ModuleLoader is a device that loads PTX kernels (CUDA). Found by type
// assertion.
type ModuleLoader interface {
	// LoadPTX compiles PTX text with the driver (cuModuleLoadData).
	LoadPTX(ptx string) (Module, error)
}

// Module is a loaded kernel module.
type Module interface {
	// Function finds a kernel by its entry name.
	Function(name string) (Function, error)
	// Close unloads the module.
	Close() error
}

// Function is a kernel that can be launched.
type Function interface {
	// Launch enqueues the kernel on s. Each argument is a Ptr, int32,
	// uint32, int64, uint64, float32 or float64, passed by value.
	Launch(s Stream, grid, block Dim3, sharedMem uint32, args ...any) error
}

// StridedCopier is a device that copies a 2-D region — height rows of
// width bytes, rows pitch bytes apart on each side — in one operation
// (cuMemcpy2DAsync). The manager uses it to move one chunk of an array
// chunked along its last axis in a single copy instead of one per row.
// Found by type assertion. Ordering and host-buffer lifetime are as for
// CopyHtoD and CopyDtoH. A pitch smaller than width, or a host slice
// shorter than (height-1)*pitch + width, is ErrInvalidValue.
type StridedCopier interface {
	// CopyHtoD2D copies row r (r < height) from src[r*srcPitch:][:width]
	// to dst + r*dstPitch, ordered on s.
	CopyHtoD2D(dst Ptr, dstPitch uint64, src []byte, srcPitch, width, height uint64, s Stream) error
	// CopyDtoH2D copies row r from src + r*srcPitch to
	// dst[r*dstPitch:][:width], ordered on s.
	CopyDtoH2D(dst []byte, dstPitch uint64, src Ptr, srcPitch, width, height uint64, s Stream) error
}

// Overlapper is a device that says whether its copies and kernels run
// at once at full speed: a copy on one stream beside a kernel on
// another. A GPU's copy engines do; a device whose copies and kernels
// both run on the host's cores does not (they share them). Found by
// type assertion; a device without it is taken to overlap them, as a GPU
// does. A pipeline keeps a second chunk buffer in flight only where it
// buys something.
type Overlapper interface {
	CopiesOverlapKernels() bool
}

// SubAllocationChecker is a device that can check accesses against
// allocations an allocator makes inside its own device allocations (a
// pool's blocks), as compute-sanitizer does for pools that annotate their
// sub-allocations. Found by type assertion.
//
// Once any sub-allocation has been marked inside a device allocation,
// every access to that device allocation must lie wholly inside one live
// marked range, else it fails with ErrOutOfBounds (or ErrUseAfterFree
// when it falls in a range freed recently). Device allocations with no
// marks are checked as before. Freeing the device allocation drops its
// marks.
type SubAllocationChecker interface {
	// MarkAllocated marks [p, p+n), n > 0, lying inside one device
	// allocation and overlapping no live mark, as a live sub-allocation.
	MarkAllocated(p Ptr, n uint64) error
	// MarkFreed ends the live sub-allocation that starts at p.
	MarkFreed(p Ptr) error
}

// Generational is a device that numbers its resets, so that code holding
// device memory across calls (an allocator's cache) can tell, without a
// driver call, that a Reset has destroyed it. Found by type assertion.
type Generational interface {
	// Generation changes at every Reset and at no other time (on CUDA,
	// at every reset of the primary context, by any Device of the
	// process on the same GPU). Memory, streams and events made while it
	// had an earlier value are invalid. It is an atomic load, cheap
	// enough for an allocator's hit path, and safe for concurrent use.
	Generation() uint64
}

// PhysMem is a handle to physical device memory made by
// VirtualMemory.CreatePhysical (CUmemGenericAllocationHandle on CUDA).
type PhysMem uint64

// VirtualMemory is a device that manages address space and physical memory
// apart (CUDA's virtual memory management: cuMemAddressReserve,
// cuMemCreate, cuMemMap, cuMemSetAccess, cuMemUnmap, cuMemRelease,
// cuMemAddressFree). An allocator reserves one large address range and maps
// physical pages into it as it grows, so its blocks stay contiguous while
// only the pages in use take device memory. Found by type assertion.
//
// Sizes and addresses are multiples of VMGranularity. Physical memory
// counts against MemInfo from CreatePhysical until it is both released and
// unmapped everywhere; reserved address space takes no memory. A mapping
// starts inaccessible: SetAccess must grant the device read and write
// access before any copy, memset or kernel touches it. Unmap does not wait
// for work in flight: work that may still use a range must have finished
// (synchronize its streams) before the range is unmapped; on CUDA such an
// access is undefined, on the simulator it fails as a use after free.
// A backend whose driver or GPU lacks the ability returns ErrNotSupported
// from every method but VMGranularity.
type VirtualMemory interface {
	// VMGranularity is the unit of physical memory, mappings and
	// reservations (cuMemGetAllocationGranularity, minimum), in bytes.
	VMGranularity() uint64
	// ReserveAddress reserves n bytes of address space with no memory
	// behind it, aligned to the granularity.
	ReserveAddress(n uint64) (Ptr, error)
	// FreeAddress gives back a whole range from ReserveAddress; nothing
	// may be mapped in it.
	FreeAddress(p Ptr, n uint64) error
	// CreatePhysical makes n bytes of physical memory on the device. A
	// lack of memory is ErrOutOfMemory.
	CreatePhysical(n uint64) (PhysMem, error)
	// ReleasePhysical lets a handle go; its memory returns to the device
	// once no mapping of it remains.
	ReleasePhysical(h PhysMem) error
	// Map maps the whole of h (n bytes, its size) at p, a range of a
	// reservation with nothing mapped.
	Map(p Ptr, n uint64, h PhysMem) error
	// Unmap removes the mapping of n bytes at p, exactly one earlier Map
	// (a mapping cannot be unmapped in part); the range stays reserved.
	Unmap(p Ptr, n uint64) error
	// SetAccess grants the device read and write access to [p, p+n),
	// which must be mapped.
	SetAccess(p Ptr, n uint64) error
}

// ForeignCaller is a device that serves calls from a program that drives
// the same GPU through bindings of its own (PyTorch, CuPy or Numba calling
// vram's C library from their allocator hooks). Found by type assertion.
type ForeignCaller interface {
	// BorrowStream wraps h, a stream handle the other program made (a
	// CUstream, the same value as its cudaStream_t; 0 is the legacy
	// default stream), as a Stream of this device. Work vram enqueues on
	// it (an event record after a free) is ordered with the program's
	// own. Close of a borrowed stream releases nothing: its maker owns it
	// and must keep it alive while vram may use it.
	BorrowStream(h uintptr) (Stream, error)
	// KeepThread reads the driver's per-thread state of the calling OS
	// thread (CUDA's current context) and returns a function that puts it
	// back, so that a program that called in finds its thread as it left
	// it. The caller's goroutine stays locked to its thread until restore
	// is called. It fails, with nothing to restore, when that state cannot
	// be shared with this device: a context current on the thread that is
	// of the same GPU but not the one the device uses.
	KeepThread() (restore func(), err error)
}
