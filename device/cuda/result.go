package cuda

import (
	"errors"
	"fmt"
	"sync"

	"github.com/vramkit/vram/device"
)

// Result is a CUresult: the status code every CUDA driver call returns.
// A non-zero Result is an error whose text is the driver's own name and
// description of the code (cuGetErrorName, cuGetErrorString) when the
// driver library is loaded, else the name from a built-in table.
//
// Under errors.Is a Result matches the device package's sentinels where
// one fits: CUDA_ERROR_OUT_OF_MEMORY matches device.ErrOutOfMemory,
// CUDA_ERROR_INVALID_VALUE matches device.ErrInvalidValue, and so on (see
// Is). Result values are immutable and safe for concurrent use.
type Result int32

// The CUresult codes this package names or maps. The list follows cuda.h;
// codes missing here still print the driver's name when it is loaded.
const (
	Success                        Result = 0
	ErrorInvalidValue              Result = 1
	ErrorOutOfMemory               Result = 2
	ErrorNotInitialized            Result = 3
	ErrorDeinitialized             Result = 4
	ErrorStubLibrary               Result = 34
	ErrorDeviceUnavailable         Result = 46
	ErrorNoDevice                  Result = 100
	ErrorInvalidDevice             Result = 101
	ErrorDeviceNotLicensed         Result = 102
	ErrorInvalidImage              Result = 200
	ErrorInvalidContext            Result = 201
	ErrorNoBinaryForGPU            Result = 209
	ErrorInvalidPTX                Result = 218
	ErrorUnsupportedPTXVersion     Result = 222
	ErrorJITCompilerNotFound       Result = 221
	ErrorInvalidSource             Result = 300
	ErrorSharedObjectSymbolMissing Result = 302
	ErrorOperatingSystem           Result = 304
	ErrorInvalidHandle             Result = 400
	ErrorIllegalState              Result = 401
	ErrorNotFound                  Result = 500
	ErrorNotReady                  Result = 600
	ErrorIllegalAddress            Result = 700
	ErrorLaunchOutOfResources      Result = 701
	ErrorLaunchTimeout             Result = 702
	ErrorContextIsDestroyed        Result = 709
	ErrorAssert                    Result = 710
	ErrorHostMemoryAlreadyReg      Result = 712
	ErrorHostMemoryNotRegistered   Result = 713
	ErrorHardwareStackError        Result = 714
	ErrorIllegalInstruction        Result = 715
	ErrorMisalignedAddress         Result = 716
	ErrorInvalidAddressSpace       Result = 717
	ErrorInvalidPC                 Result = 718
	ErrorLaunchFailed              Result = 719
	ErrorNotPermitted              Result = 800
	ErrorNotSupported              Result = 801
	ErrorSystemNotReady            Result = 802
	ErrorSystemDriverMismatch      Result = 803
	ErrorUnknown                   Result = 999
)

// resultNames is the fallback table used when the driver cannot name a
// code itself (no library loaded, or a code it does not know).
var resultNames = map[Result]string{
	Success:                        "CUDA_SUCCESS",
	ErrorInvalidValue:              "CUDA_ERROR_INVALID_VALUE",
	ErrorOutOfMemory:               "CUDA_ERROR_OUT_OF_MEMORY",
	ErrorNotInitialized:            "CUDA_ERROR_NOT_INITIALIZED",
	ErrorDeinitialized:             "CUDA_ERROR_DEINITIALIZED",
	ErrorStubLibrary:               "CUDA_ERROR_STUB_LIBRARY",
	ErrorDeviceUnavailable:         "CUDA_ERROR_DEVICE_UNAVAILABLE",
	ErrorNoDevice:                  "CUDA_ERROR_NO_DEVICE",
	ErrorInvalidDevice:             "CUDA_ERROR_INVALID_DEVICE",
	ErrorDeviceNotLicensed:         "CUDA_ERROR_DEVICE_NOT_LICENSED",
	ErrorInvalidImage:              "CUDA_ERROR_INVALID_IMAGE",
	ErrorInvalidContext:            "CUDA_ERROR_INVALID_CONTEXT",
	ErrorNoBinaryForGPU:            "CUDA_ERROR_NO_BINARY_FOR_GPU",
	ErrorInvalidPTX:                "CUDA_ERROR_INVALID_PTX",
	ErrorJITCompilerNotFound:       "CUDA_ERROR_JIT_COMPILER_NOT_FOUND",
	ErrorUnsupportedPTXVersion:     "CUDA_ERROR_UNSUPPORTED_PTX_VERSION",
	ErrorInvalidSource:             "CUDA_ERROR_INVALID_SOURCE",
	ErrorSharedObjectSymbolMissing: "CUDA_ERROR_SHARED_OBJECT_SYMBOL_NOT_FOUND",
	ErrorOperatingSystem:           "CUDA_ERROR_OPERATING_SYSTEM",
	ErrorInvalidHandle:             "CUDA_ERROR_INVALID_HANDLE",
	ErrorIllegalState:              "CUDA_ERROR_ILLEGAL_STATE",
	ErrorNotFound:                  "CUDA_ERROR_NOT_FOUND",
	ErrorNotReady:                  "CUDA_ERROR_NOT_READY",
	ErrorIllegalAddress:            "CUDA_ERROR_ILLEGAL_ADDRESS",
	ErrorLaunchOutOfResources:      "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES",
	ErrorLaunchTimeout:             "CUDA_ERROR_LAUNCH_TIMEOUT",
	ErrorContextIsDestroyed:        "CUDA_ERROR_CONTEXT_IS_DESTROYED",
	ErrorAssert:                    "CUDA_ERROR_ASSERT",
	ErrorHostMemoryAlreadyReg:      "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED",
	ErrorHostMemoryNotRegistered:   "CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED",
	ErrorHardwareStackError:        "CUDA_ERROR_HARDWARE_STACK_ERROR",
	ErrorIllegalInstruction:        "CUDA_ERROR_ILLEGAL_INSTRUCTION",
	ErrorMisalignedAddress:         "CUDA_ERROR_MISALIGNED_ADDRESS",
	ErrorInvalidAddressSpace:       "CUDA_ERROR_INVALID_ADDRESS_SPACE",
	ErrorInvalidPC:                 "CUDA_ERROR_INVALID_PC",
	ErrorLaunchFailed:              "CUDA_ERROR_LAUNCH_FAILED",
	ErrorNotPermitted:              "CUDA_ERROR_NOT_PERMITTED",
	ErrorNotSupported:              "CUDA_ERROR_NOT_SUPPORTED",
	ErrorSystemNotReady:            "CUDA_ERROR_SYSTEM_NOT_READY",
	ErrorSystemDriverMismatch:      "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH",
	ErrorUnknown:                   "CUDA_ERROR_UNKNOWN",
}

// describer names codes through the loaded driver. It is set once the
// library has loaded (see load) and read by Result.Error.
var (
	describerMu sync.RWMutex
	describer   func(Result) (name, desc string, ok bool)
	descCache   sync.Map // Result -> string (the full Error text)
)

func setDescriber(f func(Result) (string, string, bool)) {
	describerMu.Lock()
	describer = f
	describerMu.Unlock()
	descCache.Clear()
}

// Name is the code's symbolic name, e.g. "CUDA_ERROR_OUT_OF_MEMORY".
func (r Result) Name() string {
	describerMu.RLock()
	f := describer
	describerMu.RUnlock()
	if f != nil {
		if name, _, ok := f(r); ok && name != "" {
			return name
		}
	}
	if n, ok := resultNames[r]; ok {
		return n
	}
	return fmt.Sprintf("CUresult(%d)", int32(r))
}

// Error returns "NAME (code): description", the description being the
// driver's when it is loaded.
func (r Result) Error() string {
	if s, ok := descCache.Load(r); ok {
		return s.(string)
	}
	describerMu.RLock()
	f := describer
	describerMu.RUnlock()
	var s string
	if f != nil {
		if name, desc, ok := f(r); ok && name != "" {
			s = fmt.Sprintf("%s (%d): %s", name, int32(r), desc)
		}
	}
	if s == "" {
		s = fmt.Sprintf("%s (%d)", r.Name(), int32(r))
		if f == nil {
			// Only cache driver-made text: the driver may load later.
			return s + r.stickyNote()
		}
	}
	s += r.stickyNote()
	descCache.Store(r, s)
	return s
}

// ErrNeedsReset is matched by a sticky Result (see Result.Sticky) and by
// the errors a Device returns after one: its context can do no more work
// until Device.Reset.
var ErrNeedsReset = errors.New("the CUDA context needs a reset")

// Sticky reports whether r is an error after which the context can do no
// more work: an exception raised by a kernel, or a kernel that ran past
// the watchdog (CUDA_ERROR_LAUNCH_TIMEOUT, 702, whose description in the
// same list ends with the sentence quoted below). The error list of the CUDA
// API reference (found as the runtime's cudaErrorMisalignedAddress 716,
// cudaErrorInvalidAddressSpace 717, cudaErrorInvalidPc 718 and
// cudaErrorLaunchFailure 719, which share the driver's numbers) describes
// each with "This leaves the process in an inconsistent state and any
// further CUDA work will return the same error. To continue using CUDA,
// the process must be terminated and relaunched." The same group of
// kernel exceptions — CUDA_ERROR_ILLEGAL_ADDRESS (700),
// _HARDWARE_STACK_ERROR (714), _ILLEGAL_INSTRUCTION (715) and _ASSERT
// (710) — is treated alike; for 700 the stored documentation pages found
// did not quote the sentence, so that one rests on the report and
// the driver's behaviour, which gpu-check can confirm.
// Device.Reset (cuDevicePrimaryCtxReset) is what this package can try; the
// driver promises recovery only from a new process.
func (r Result) Sticky() bool {
	switch r {
	case ErrorIllegalAddress, ErrorLaunchTimeout, ErrorAssert, ErrorHardwareStackError, ErrorIllegalInstruction,
		ErrorMisalignedAddress, ErrorInvalidAddressSpace, ErrorInvalidPC, ErrorLaunchFailed:
		return true
	}
	return false
}

func (r Result) stickyNote() string {
	if !r.Sticky() {
		return ""
	}
	return " (sticky: every later call on the context fails with it; Reset the device, or restart the process)"
}

// Is reports whether r matches one of the device package's sentinels:
//
//	CUDA_ERROR_OUT_OF_MEMORY                 device.ErrOutOfMemory
//	CUDA_ERROR_INVALID_VALUE                 device.ErrInvalidValue
//	CUDA_ERROR_NOT_SUPPORTED                 device.ErrNotSupported
//	CUDA_ERROR_NO_DEVICE, _INVALID_DEVICE,
//	  _NOT_INITIALIZED, _STUB_LIBRARY,
//	  _DEVICE_UNAVAILABLE, _SYSTEM_*         device.ErrNoDevice
//	CUDA_ERROR_CONTEXT_IS_DESTROYED,
//	  _INVALID_CONTEXT                       device.ErrInvalidated
//	CUDA_ERROR_ILLEGAL_ADDRESS               device.ErrInvalidPointer
//
// and every sticky code (see Sticky) matches ErrNeedsReset.
func (r Result) Is(target error) bool {
	switch target {
	case ErrNeedsReset:
		return r.Sticky()
	case device.ErrOutOfMemory:
		return r == ErrorOutOfMemory
	case device.ErrInvalidValue:
		return r == ErrorInvalidValue
	case device.ErrNotSupported:
		return r == ErrorNotSupported
	case device.ErrNoDevice:
		switch r {
		case ErrorNoDevice, ErrorInvalidDevice, ErrorNotInitialized, ErrorStubLibrary,
			ErrorDeviceUnavailable, ErrorSystemNotReady, ErrorSystemDriverMismatch,
			ErrorDeviceNotLicensed:
			return true
		}
	case device.ErrInvalidated:
		return r == ErrorContextIsDestroyed || r == ErrorInvalidContext
	case device.ErrInvalidPointer:
		return r == ErrorIllegalAddress
	}
	return false
}
