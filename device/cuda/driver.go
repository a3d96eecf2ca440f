// Raw CUDA driver bindings: the library loader, the symbol table and one thin
// Go function per driver entry point. Nothing here knows about vram's
// Device; it only turns Go values into C arguments and CUresults back, and
// every result passes through lib.call, the one place where a result that
// breaks the context is noted (see call).
//
// The library is opened and called by openLib and lib.call (dl_linux.go,
// through purego, no cgo; dl_other.go elsewhere, where they fail). Every
// driver function used here takes only integer and pointer arguments. Pointers
// to Go memory are converted to uintptr inside the argument list of lib.call,
// which is marked //go:uintptrescapes, so the compiler moves what they point
// to onto the heap and keeps it alive until the C function returns (the rule
// unsafe.Pointer's documentation gives for syscall-like functions).

package cuda

import (
	"errors"
	"strings"
	"sync"
	"unsafe"
)

// Constants from cuda.h.
const (
	cuStreamNonBlocking   = 0x1 // CU_STREAM_NON_BLOCKING
	cuEventDisableTiming  = 0x2 // CU_EVENT_DISABLE_TIMING
	cuMemHostRegPortable  = 0x1 // CU_MEMHOSTREGISTER_PORTABLE
	cuMemHostRegDeviceMap = 0x2 // CU_MEMHOSTREGISTER_DEVICEMAP

	// CUmemorytype, for CUDA_MEMCPY2D
	cuMemoryTypeHost   = 0x1 // CU_MEMORYTYPE_HOST
	cuMemoryTypeDevice = 0x2 // CU_MEMORYTYPE_DEVICE

	// CUdevice_attribute
	cuDevAttrMaxPitch               = 11
	cuDevAttrComputeCapabilityMajor = 75
	cuDevAttrComputeCapabilityMinor = 76
	cuDevAttrMemoryPoolsSupported   = 115

	// CUmemPool_attribute (each value is a cuuint64_t)
	cuMemPoolAttrReleaseThreshold   = 4
	cuMemPoolAttrReservedMemCurrent = 5
	cuMemPoolAttrUsedMemCurrent     = 7

	// CUjit_option
	cuJITInfoLogBuffer                   = 3
	cuJITInfoLogBufferSizeBytes          = 4
	cuJITErrorLogBuffer                  = 5
	cuJITErrorLogBufferSizeBytes         = 6
	cuDefaultLegacyStream        uintptr = 0 // the NULL stream: legacy default stream
)

// Symbol indices into lib.fn; symbolNames holds the exported names, using
// the _v2 entry points cuda.h maps the plain names to.
const (
	symInit = iota
	symDriverGetVersion
	symGetErrorName
	symGetErrorString
	symDeviceGetCount
	symDeviceGet
	symDeviceGetName
	symDeviceGetUuid
	symDeviceGetAttribute
	symDevicePrimaryCtxRetain
	symDevicePrimaryCtxRelease
	symDevicePrimaryCtxReset
	symDeviceGetDefaultMemPool
	symCtxSetCurrent
	symCtxGetCurrent
	symCtxGetDevice
	symCtxSynchronize
	symMemGetInfo
	symMemAlloc
	symMemFree
	symMemAllocAsync
	symMemFreeAsync
	symMemPoolSetAttribute
	symMemPoolGetAttribute
	symMemPoolTrimTo
	symMemHostRegister
	symMemHostUnregister
	symMemHostGetDevicePointer
	symMemcpyHtoDAsync
	symMemcpyDtoHAsync
	symMemcpyDtoDAsync
	symMemcpy2DAsync
	symMemsetD8Async
	symStreamCreate
	symStreamQuery
	symStreamSynchronize
	symStreamDestroy
	symStreamWaitEvent
	symEventCreate
	symEventRecord
	symEventQuery
	symEventSynchronize
	symEventDestroy
	symModuleLoadDataEx
	symModuleGetFunction
	symModuleUnload
	symLaunchKernel
	symDeviceGetUuidV2 // optional: CUDA 11.4 and newer
	// virtual memory management (vmm.go)
	symMemAddressReserve
	symMemAddressFree
	symMemCreate
	symMemRelease
	symMemMap
	symMemUnmap
	symMemSetAccess
	symMemGetAllocationGranularity
	numSyms
)

var symbolNames = [numSyms]string{
	symInit:                    "cuInit",
	symDriverGetVersion:        "cuDriverGetVersion",
	symGetErrorName:            "cuGetErrorName",
	symGetErrorString:          "cuGetErrorString",
	symDeviceGetCount:          "cuDeviceGetCount",
	symDeviceGet:               "cuDeviceGet",
	symDeviceGetName:           "cuDeviceGetName",
	symDeviceGetUuid:           "cuDeviceGetUuid",
	symDeviceGetAttribute:      "cuDeviceGetAttribute",
	symDevicePrimaryCtxRetain:  "cuDevicePrimaryCtxRetain",
	symDevicePrimaryCtxRelease: "cuDevicePrimaryCtxRelease_v2",
	symDevicePrimaryCtxReset:   "cuDevicePrimaryCtxReset_v2",
	symDeviceGetDefaultMemPool: "cuDeviceGetDefaultMemPool",
	symCtxSetCurrent:           "cuCtxSetCurrent",
	symCtxGetCurrent:           "cuCtxGetCurrent",
	symCtxGetDevice:            "cuCtxGetDevice",
	symCtxSynchronize:          "cuCtxSynchronize",
	symMemGetInfo:              "cuMemGetInfo_v2",
	symMemAlloc:                "cuMemAlloc_v2",
	symMemFree:                 "cuMemFree_v2",
	symMemAllocAsync:           "cuMemAllocAsync",
	symMemFreeAsync:            "cuMemFreeAsync",
	symMemPoolSetAttribute:     "cuMemPoolSetAttribute",
	symMemPoolGetAttribute:     "cuMemPoolGetAttribute",
	symMemPoolTrimTo:           "cuMemPoolTrimTo",
	symMemHostRegister:         "cuMemHostRegister_v2",
	symMemHostUnregister:       "cuMemHostUnregister",
	symMemHostGetDevicePointer: "cuMemHostGetDevicePointer_v2",
	symMemcpyHtoDAsync:         "cuMemcpyHtoDAsync_v2",
	symMemcpyDtoHAsync:         "cuMemcpyDtoHAsync_v2",
	symMemcpyDtoDAsync:         "cuMemcpyDtoDAsync_v2",
	symMemcpy2DAsync:           "cuMemcpy2DAsync_v2",
	symMemsetD8Async:           "cuMemsetD8Async",
	symStreamCreate:            "cuStreamCreate",
	symStreamQuery:             "cuStreamQuery",
	symStreamSynchronize:       "cuStreamSynchronize",
	symStreamDestroy:           "cuStreamDestroy_v2",
	symStreamWaitEvent:         "cuStreamWaitEvent",
	symEventCreate:             "cuEventCreate",
	symEventRecord:             "cuEventRecord",
	symEventQuery:              "cuEventQuery",
	symEventSynchronize:        "cuEventSynchronize",
	symEventDestroy:            "cuEventDestroy_v2",
	symModuleLoadDataEx:        "cuModuleLoadDataEx",
	symModuleGetFunction:       "cuModuleGetFunction",
	symModuleUnload:            "cuModuleUnload",
	symLaunchKernel:            "cuLaunchKernel",
	symDeviceGetUuidV2:         "cuDeviceGetUuid_v2",

	symMemAddressReserve: "cuMemAddressReserve", symMemAddressFree: "cuMemAddressFree",
	symMemCreate: "cuMemCreate", symMemRelease: "cuMemRelease", symMemMap: "cuMemMap", symMemUnmap: "cuMemUnmap",
	symMemSetAccess: "cuMemSetAccess", symMemGetAllocationGranularity: "cuMemGetAllocationGranularity",
}

// optionalSyms are looked up but may be missing (lib.fn holds 0): each
// wrapper says what it does without one.
var optionalSyms = [numSyms]bool{symDeviceGetUuidV2: true}

// libraryNames are tried in order: the versioned name the driver installs,
// then the development symlink.
var libraryNames = []string{"libcuda.so.1", "libcuda.so"}

// lib is a loaded driver library with every symbol resolved. It is never
// unloaded; one lib serves the whole process. Safe for concurrent use.
type lib struct {
	path string
	fn   [numSyms]uintptr
}

var (
	loadMu  sync.Mutex // protects loaded
	loaded  *lib
	errLoad = errors.New("cannot load the CUDA driver library")
)

// load opens the driver library (once per process, on first success) and
// resolves every symbol. Its error names each library it tried with the
// loader's message, or the symbol that is missing.
func load() (*lib, error) {
	loadMu.Lock()
	defer loadMu.Unlock()
	if loaded != nil {
		return loaded, nil
	}
	l, err := openLib(libraryNames)
	if err != nil {
		return nil, err
	}
	loaded = l
	setDescriber(l.describe)
	return l, nil
}

// call runs the driver function fn and notes its result: every driver
// call of the package goes through here, so no path can forget a result
// that breaks the context. A sticky result (Result.Sticky: a kernel
// exception or a launch timeout, which the driver returns from every
// later call in the context) is recorded on the primary record whose
// context is current on the calling thread (every Device call makes its
// context current first), and every later call through any Device of that
// GPU is refused with it until Reset (Device.enter).
//
//go:uintptrescapes
func (l *lib) call(fn int, args ...uintptr) Result {
	r := l.raw(fn, args...)
	if r != Success && r.Sticky() {
		var ctx uintptr
		if l.raw(symCtxGetCurrent, uintptr(unsafe.Pointer(&ctx))) == Success {
			if p, ok := ctxOwners.Load(ctx); ok {
				p.(*primary).sticky.CompareAndSwap(0, int32(r))
			}
		}
	}
	return r
}

// ctxOwners maps a primary context's handle (a CUcontext) to its primary
// record, for call. Entries are added when a record is made and removed
// when the last Device on it closes.
var ctxOwners sync.Map

// cString reads a NUL-terminated C string the driver owns.
func cString(p unsafe.Pointer) string {
	if p == nil {
		return ""
	}
	n := 0
	for *(*byte)(unsafe.Add(p, n)) != 0 {
		n++
	}
	return string(unsafe.Slice((*byte)(p), n))
}

// describe is the driver's name and description of r.
func (l *lib) describe(r Result) (name, desc string, ok bool) {
	var pn, pd unsafe.Pointer
	if l.call(symGetErrorName, uintptr(r), uintptr(unsafe.Pointer(&pn))) != Success {
		return "", "", false
	}
	if l.call(symGetErrorString, uintptr(r), uintptr(unsafe.Pointer(&pd))) != Success {
		return cString(pn), "", true
	}
	return cString(pn), cString(pd), true
}

// Thin wrappers, one per entry point, in cuda.h's argument order.

func (l *lib) cuInit() Result { return l.call(symInit, 0) }

func (l *lib) driverGetVersion(v *int32) Result {
	return l.call(symDriverGetVersion, uintptr(unsafe.Pointer(v)))
}

func (l *lib) deviceGetCount(n *int32) Result {
	return l.call(symDeviceGetCount, uintptr(unsafe.Pointer(n)))
}

func (l *lib) deviceGet(dev *int32, ordinal int) Result {
	return l.call(symDeviceGet, uintptr(unsafe.Pointer(dev)), uintptr(ordinal))
}

func (l *lib) deviceGetName(buf []byte, dev int32) Result {
	return l.call(symDeviceGetName, uintptr(unsafe.Pointer(&buf[0])), uintptr(len(buf)), uintptr(dev))
}

// deviceGetUuid reads the device's 16-byte UUID (a CUuuid) with the
// pre-13 entry point, which on a MIG slice names the whole GPU.
func (l *lib) deviceGetUuid(uuid *[16]byte, dev int32) Result {
	return l.call(symDeviceGetUuid, uintptr(unsafe.Pointer(&uuid[0])), uintptr(dev))
}

// deviceGetUuidV2 reads the UUID with cuDeviceGetUuid_v2 (CUDA 11.4),
// which on a MIG slice names the slice (what CUDA_VISIBLE_DEVICES and
// nvidia-smi -L call it); false when the driver lacks it.
func (l *lib) deviceGetUuidV2(uuid *[16]byte, dev int32) (Result, bool) {
	if l.fn[symDeviceGetUuidV2] == 0 {
		return Success, false
	}
	return l.call(symDeviceGetUuidV2, uintptr(unsafe.Pointer(&uuid[0])), uintptr(dev)), true
}

func (l *lib) deviceGetAttribute(v *int32, attr int, dev int32) Result {
	return l.call(symDeviceGetAttribute, uintptr(unsafe.Pointer(v)), uintptr(attr), uintptr(dev))
}

func (l *lib) primaryCtxRetain(ctx *uintptr, dev int32) Result {
	return l.call(symDevicePrimaryCtxRetain, uintptr(unsafe.Pointer(ctx)), uintptr(dev))
}

func (l *lib) primaryCtxRelease(dev int32) Result {
	return l.call(symDevicePrimaryCtxRelease, uintptr(dev))
}

func (l *lib) primaryCtxReset(dev int32) Result {
	return l.call(symDevicePrimaryCtxReset, uintptr(dev))
}

func (l *lib) deviceGetDefaultMemPool(pool *uintptr, dev int32) Result {
	return l.call(symDeviceGetDefaultMemPool, uintptr(unsafe.Pointer(pool)), uintptr(dev))
}

func (l *lib) ctxSetCurrent(ctx uintptr) Result { return l.call(symCtxSetCurrent, ctx) }

func (l *lib) ctxGetCurrent(ctx *uintptr) Result {
	return l.call(symCtxGetCurrent, uintptr(unsafe.Pointer(ctx)))
}

func (l *lib) ctxGetDevice(dev *int32) Result {
	return l.call(symCtxGetDevice, uintptr(unsafe.Pointer(dev)))
}

func (l *lib) ctxSynchronize() Result { return l.call(symCtxSynchronize) }

func (l *lib) memGetInfo(free, total *uint64) Result {
	return l.call(symMemGetInfo, uintptr(unsafe.Pointer(free)), uintptr(unsafe.Pointer(total)))
}

func (l *lib) memAlloc(p *uint64, n uint64) Result {
	return l.call(symMemAlloc, uintptr(unsafe.Pointer(p)), uintptr(n))
}

func (l *lib) memFree(p uint64) Result { return l.call(symMemFree, uintptr(p)) }

func (l *lib) memAllocAsync(p *uint64, n uint64, s uintptr) Result {
	return l.call(symMemAllocAsync, uintptr(unsafe.Pointer(p)), uintptr(n), s)
}

func (l *lib) memFreeAsync(p uint64, s uintptr) Result {
	return l.call(symMemFreeAsync, uintptr(p), s)
}

func (l *lib) memPoolSetAttribute(pool uintptr, attr int, v *uint64) Result {
	return l.call(symMemPoolSetAttribute, pool, uintptr(attr), uintptr(unsafe.Pointer(v)))
}

func (l *lib) memPoolGetAttribute(pool uintptr, attr int, v *uint64) Result {
	return l.call(symMemPoolGetAttribute, pool, uintptr(attr), uintptr(unsafe.Pointer(v)))
}

func (l *lib) memPoolTrimTo(pool uintptr, keep uint64) Result {
	return l.call(symMemPoolTrimTo, pool, uintptr(keep))
}

// memHostRegister pins n bytes of host memory at p, which this package
// mapped itself (never Go heap memory).
func (l *lib) memHostRegister(p uintptr, n uint64, flags uint32) Result {
	return l.call(symMemHostRegister, p, uintptr(n), uintptr(flags))
}

func (l *lib) memHostUnregister(p uintptr) Result { return l.call(symMemHostUnregister, p) }

func (l *lib) memHostGetDevicePointer(d *uint64, p uintptr) Result {
	return l.call(symMemHostGetDevicePointer, uintptr(unsafe.Pointer(d)), p, 0)
}

// The copy wrappers take the host side as a slice so that the pointer is
// converted inside call's argument list and kept alive for the call.

func (l *lib) memcpyHtoDAsync(dst uint64, src []byte, s uintptr) Result {
	return l.call(symMemcpyHtoDAsync, uintptr(dst), uintptr(unsafe.Pointer(unsafe.SliceData(src))), uintptr(len(src)), s)
}

func (l *lib) memcpyDtoHAsync(dst []byte, src uint64, s uintptr) Result {
	return l.call(symMemcpyDtoHAsync, uintptr(unsafe.Pointer(unsafe.SliceData(dst))), uintptr(src), uintptr(len(dst)), s)
}

func (l *lib) memcpyDtoDAsync(dst, src, n uint64, s uintptr) Result {
	return l.call(symMemcpyDtoDAsync, uintptr(dst), uintptr(src), uintptr(n), s)
}

// memcpy2D is CUDA_MEMCPY2D (CUDA_MEMCPY2D_v2 in cuda.h, the layout that
// cuMemcpy2DAsync_v2 reads): every size_t field 64-bit, each CUmemorytype a
// 32-bit enum followed by 4 bytes of padding before the pointer after it.
// 128 bytes in all; TestMemcpy2DLayout checks the offsets, and the fake
// driver, compiled from a C declaration of the struct, reads it back.
//
// The struct is Go memory handed to the driver, so it holds no Go
// pointers: the host addresses are uintptr, and whoever fills them pins
// the memory they point to (runtime.Pinner; pinning memory this package
// mapped itself is a no-op) until the driver has read it.
// TestNoGoPointersToDriver checks the field types.
type memcpy2D struct {
	srcXInBytes   uint64
	srcY          uint64
	srcMemoryType uint32
	_             uint32
	srcHost       uintptr
	srcDevice     uint64
	srcArray      uintptr
	srcPitch      uint64

	dstXInBytes   uint64
	dstY          uint64
	dstMemoryType uint32
	_             uint32
	dstHost       uintptr
	dstDevice     uint64
	dstArray      uintptr
	dstPitch      uint64

	widthInBytes uint64
	height       uint64
}

// memcpy2DAsync enqueues the 2-D copy c describes on s. c is converted in
// call's argument list, so it stays alive until the driver has read it;
// the host memory it names must be pinned by the caller.
func (l *lib) memcpy2DAsync(c *memcpy2D, s uintptr) Result {
	return l.call(symMemcpy2DAsync, uintptr(unsafe.Pointer(c)), s)
}

func (l *lib) memsetD8Async(dst uint64, v byte, n uint64, s uintptr) Result {
	return l.call(symMemsetD8Async, uintptr(dst), uintptr(v), uintptr(n), s)
}

func (l *lib) streamCreate(s *uintptr, flags uint32) Result {
	return l.call(symStreamCreate, uintptr(unsafe.Pointer(s)), uintptr(flags))
}

func (l *lib) streamQuery(s uintptr) Result       { return l.call(symStreamQuery, s) }
func (l *lib) streamSynchronize(s uintptr) Result { return l.call(symStreamSynchronize, s) }
func (l *lib) streamDestroy(s uintptr) Result     { return l.call(symStreamDestroy, s) }

func (l *lib) streamWaitEvent(s, e uintptr) Result {
	return l.call(symStreamWaitEvent, s, e, 0)
}

func (l *lib) eventCreate(e *uintptr, flags uint32) Result {
	return l.call(symEventCreate, uintptr(unsafe.Pointer(e)), uintptr(flags))
}

func (l *lib) eventRecord(e, s uintptr) Result   { return l.call(symEventRecord, e, s) }
func (l *lib) eventQuery(e uintptr) Result       { return l.call(symEventQuery, e) }
func (l *lib) eventSynchronize(e uintptr) Result { return l.call(symEventSynchronize, e) }
func (l *lib) eventDestroy(e uintptr) Result     { return l.call(symEventDestroy, e) }
func (l *lib) moduleUnload(m uintptr) Result     { return l.call(symModuleUnload, m) }

// jitLog is the option block of one cuModuleLoadDataEx call: the option
// values and the two log buffers they point into, in one heap object that
// call keeps alive (its address is converted in call's argument list).
type jitLog struct {
	opts    [4]int32
	vals    [4]uintptr
	errLog  [8 << 10]byte
	infoLog [8 << 10]byte
}

// moduleLoadData compiles the NUL-terminated PTX image with the driver's JIT
// and returns the JIT's error log when it wrote one.
func (l *lib) moduleLoadData(m *uintptr, image []byte) (Result, string) {
	j := new(jitLog)
	j.opts = [4]int32{cuJITErrorLogBuffer, cuJITErrorLogBufferSizeBytes, cuJITInfoLogBuffer, cuJITInfoLogBufferSizeBytes}
	j.vals = [4]uintptr{
		uintptr(unsafe.Pointer(&j.errLog[0])), uintptr(len(j.errLog)),
		uintptr(unsafe.Pointer(&j.infoLog[0])), uintptr(len(j.infoLog)),
	}
	r := l.call(symModuleLoadDataEx, uintptr(unsafe.Pointer(m)), uintptr(unsafe.Pointer(unsafe.SliceData(image))),
		uintptr(len(j.opts)), uintptr(unsafe.Pointer(&j.opts[0])), uintptr(unsafe.Pointer(&j.vals[0])))
	return r, strings.TrimSpace(string(j.errLog[:clen(j.errLog[:])]))
}

func clen(b []byte) int {
	for i, c := range b {
		if c == 0 {
			return i
		}
	}
	return len(b)
}

func (l *lib) moduleGetFunction(f *uintptr, m uintptr, name []byte) Result {
	return l.call(symModuleGetFunction, uintptr(unsafe.Pointer(f)), m, uintptr(unsafe.Pointer(&name[0])))
}

// launchKernel enqueues f. params is the kernelParams array: one address
// per kernel parameter of that parameter's value, in memory the caller has
// pinned (see packArgs).
func (l *lib) launchKernel(f uintptr, grid, block [3]uint32, shared uint32, s uintptr, params []uintptr) Result {
	return l.call(symLaunchKernel, f,
		uintptr(grid[0]), uintptr(grid[1]), uintptr(grid[2]),
		uintptr(block[0]), uintptr(block[1]), uintptr(block[2]),
		uintptr(shared), s, uintptr(unsafe.Pointer(unsafe.SliceData(params))), 0)
}
