// Command libvram is vram's memory manager as a C shared library, for
// programs that are not Go: PyTorch, CuPy and Numba in one Python process
// draw from one pool and one budget per device. Build it with a C
// compiler, named by its ABI version (SONAME libvram.so.N, N vram.h's
// VRAM_ABI_VERSION, which what links against it records):
//
//	scripts/build-libvram.sh DIR
//
// runs go build -buildmode=c-shared -ldflags=-extldflags=-Wl,-soname,libvram.so.N
// and builds, beside the library, the C++ allocation hooks of PyTorch and
// of CuPy's C allocator (torch/vram_torch.cc and cupy/vram_cupy.cc; they
// are not part of this package, so that the module builds with a C
// compiler alone).
//
// vram.h beside this file is the contract (status codes, the functions,
// each framework's hook); the Python package in python/vram is a ctypes
// layer over it. The rest of the module builds without cgo: this
// directory's Go files need it, and are left out of a CGO_ENABLED=0
// build.
//
// The files: vram.h (the contract), shim.c (the C entry points: the fork
// check and each thread's last error, before anything enters Go), main.go
// (the Go side of each entry point: C values to Go ones, errors to status
// codes), client.c and client.go (the same two sides for the client API,
// ABI 2), internal/capi (the managers, streams and books, the clients,
// responses and hook events, in plain Go), and torch/vram_torch.cc and
// cupy/vram_cupy.cc (PyTorch's and CuPy's allocation hooks, which throw
// what they cannot return).
//
// Safe in a foreign process: the Go runtime starts once, when the library
// is loaded, and is never unloaded (Go's linker marks a c-shared library
// -z nodelete, so dlclose leaves it loaded; the tests check the flag).
// Nothing here calls os/signal, so the runtime installs its handlers only
// for the synchronous signals, SIGPIPE and SIGURG (its preemption signal)
// and keeps the program's own (os/signal's "Non-Go programs that call Go
// code"; the runtime's sigInstallGoHandler for SIGURG). A forked child gets
// VRAM_EFORK from shim.c without entering Go. A call from C runs its Go
// code, and every driver call of it, on the calling thread, with the
// thread's context put back before it returns (internal/capi's package
// doc). A panic is recovered and returned as VRAM_EDEVICE rather than
// ending the program, and nothing is written to stdout or stderr (the
// manager's logger discards).
package main

/*
#include <stdlib.h>
#include "vram.h"
*/
import "C"

import (
	"encoding/json"
	"errors"
	"fmt"
	"unsafe"

	"github.com/vramkit/vram"
	"github.com/vramkit/vram/alloc"
	"github.com/vramkit/vram/broker"
	"github.com/vramkit/vram/device"
	"github.com/vramkit/vram/device/cuda"
	"github.com/vramkit/vram/libvram/internal/capi"
)

func main() {}

// reg holds the process's managers.
var reg capi.Registry

// vram.h's enum vram_source and capi's Sources agree: an index out of
// range, a compile error, if they do not.
var (
	_ = [1]struct{}{}[capi.NumSources-C.VRAM_SOURCES]
	_ = [1]struct{}{}[capi.SourceTorch-C.VRAM_SOURCE_TORCH]
	_ = [1]struct{}{}[capi.SourceCuPy-C.VRAM_SOURCE_CUPY]
	_ = [1]struct{}{}[capi.SourceNumba-C.VRAM_SOURCE_NUMBA]
)

// status is the vram.h status code for err.
func status(err error) C.int {
	if rc, ok := clientStatus(err); ok {
		return rc
	}
	switch {
	case err == nil:
		return C.VRAM_OK
	case errors.Is(err, device.ErrOutOfMemory):
		return C.VRAM_ENOMEM
	case errors.Is(err, capi.ErrNoManager), errors.Is(err, capi.ErrClosed):
		return C.VRAM_EHANDLE
	case errors.Is(err, capi.ErrBadPointer), errors.Is(err, alloc.ErrUnknownPointer):
		return C.VRAM_EPTR
	case errors.Is(err, capi.ErrBusy):
		return C.VRAM_EBUSY
	case errors.Is(err, device.ErrNoDevice), errors.Is(err, broker.ErrUnavailable), errors.Is(err, broker.ErrNotFound), errors.Is(err, vram.ErrNoBroker):
		return C.VRAM_ENODEV
	case errors.Is(err, device.ErrBadSpec), errors.Is(err, device.ErrInvalidValue), errors.Is(err, vram.ErrAllocConf),
		errors.Is(err, broker.ErrInvalid), errors.Is(err, broker.ErrProportion):
		return C.VRAM_EINVAL
	case errors.Is(err, cuda.ErrForeignContext):
		return C.VRAM_EDEVICE
	}
	return C.VRAM_EDEVICE
}

// fail hands err's message to C (shim.c frees it) and returns its status.
func fail(errOut **C.char, err error) C.int {
	*errOut = C.CString(err.Error())
	return status(err)
}

// guard turns a panic into VRAM_EDEVICE: a bug here must not end the
// program that called in. Deferred by every export.
func guard(rc *C.int, errOut **C.char) {
	if r := recover(); r != nil {
		if *errOut != nil {
			C.free(unsafe.Pointer(*errOut))
		}
		*rc = fail(errOut, fmt.Errorf("vram: internal error, please report it: %v", r))
	}
}

// text hands s to C as a malloc'd string (shim.c copies and frees it).
func text(out **C.char, s string) C.int {
	*out = C.CString(s)
	return C.VRAM_OK
}

//export vramgo_open
func vramgo_open(spec *C.char, capBytes C.uint64_t, out *C.int64_t, errOut **C.char) (rc C.int) {
	defer guard(&rc, errOut)
	m, err := reg.Open(capi.Options{Spec: C.GoString(spec), Cap: uint64(capBytes)})
	if err != nil {
		return fail(errOut, err)
	}
	*out = C.int64_t(m.Handle())
	return C.VRAM_OK
}

//export vramgo_open_lease
func vramgo_open_lease(spec, socket, name *C.char, proportion C.double, capBytes C.uint64_t, out *C.int64_t, errOut **C.char) (rc C.int) {
	defer guard(&rc, errOut)
	sock := C.GoString(socket)
	if sock == "" {
		sock = broker.DefaultSocket()
	}
	noteBrokerSocket(sock)
	m, err := reg.Open(capi.Options{Spec: C.GoString(spec), Broker: sock,
		Lease: vram.LeaseOptions{Name: C.GoString(name), Proportion: float64(proportion), Cap: uint64(capBytes)}})
	if err != nil {
		return fail(errOut, err)
	}
	*out = C.int64_t(m.Handle())
	return C.VRAM_OK
}

//export vramgo_close
func vramgo_close(h C.int64_t, errOut **C.char) (rc C.int) {
	defer guard(&rc, errOut)
	if err := clients.CloseManager(&reg, int64(h)); err != nil {
		return fail(errOut, err)
	}
	return C.VRAM_OK
}

//export vramgo_manager_for_device
func vramgo_manager_for_device(dev C.int, out *C.int64_t, errOut **C.char) (rc C.int) {
	defer guard(&rc, errOut)
	m, err := reg.ForDevice(int(dev))
	if err != nil {
		return fail(errOut, err)
	}
	*out = C.int64_t(m.Handle())
	return C.VRAM_OK
}

//export vramgo_alloc
func vramgo_alloc(h C.int64_t, src C.int, size C.size_t, stream C.uintptr_t, out *C.uintptr_t, errOut **C.char) (rc C.int) {
	defer guard(&rc, errOut)
	s, err := capi.ParseSource(int(src))
	if err != nil {
		return fail(errOut, err)
	}
	m, err := reg.Get(int64(h))
	if err != nil {
		return fail(errOut, err)
	}
	p, err := m.Alloc(s, uint64(size), uintptr(stream))
	if err != nil {
		return fail(errOut, err)
	}
	*out = C.uintptr_t(p)
	return C.VRAM_OK
}

//export vramgo_free
func vramgo_free(h C.int64_t, p C.uintptr_t, size C.size_t, stream C.uintptr_t, errOut **C.char) (rc C.int) {
	defer guard(&rc, errOut)
	m, err := reg.Get(int64(h))
	if err != nil {
		return fail(errOut, err)
	}
	if err := m.Free(device.Ptr(p), uint64(size), uintptr(stream)); err != nil {
		return fail(errOut, err)
	}
	return C.VRAM_OK
}

//export vramgo_trim
func vramgo_trim(h C.int64_t, errOut **C.char) (rc C.int) {
	defer guard(&rc, errOut)
	m, err := reg.Get(int64(h))
	if err == nil {
		err = m.Trim()
	}
	if err != nil {
		return fail(errOut, err)
	}
	return C.VRAM_OK
}

//export vramgo_trim_all
func vramgo_trim_all(errOut **C.char) (rc C.int) {
	defer guard(&rc, errOut)
	var errs []error
	for _, m := range reg.All() {
		if err := m.Trim(); err != nil && !errors.Is(err, capi.ErrClosed) {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fail(errOut, err)
	}
	return C.VRAM_OK
}

//export vramgo_reset_peaks
func vramgo_reset_peaks(h C.int64_t, errOut **C.char) (rc C.int) {
	defer guard(&rc, errOut)
	m, err := reg.Get(int64(h))
	if err == nil {
		err = m.ResetPeaks()
	}
	if err != nil {
		return fail(errOut, err)
	}
	return C.VRAM_OK
}

//export vramgo_stats
func vramgo_stats(h C.int64_t, out *C.struct_vram_stats, errOut **C.char) (rc C.int) {
	defer guard(&rc, errOut)
	st, err := stats(int64(h))
	if err != nil {
		return fail(errOut, err)
	}
	fillStats(out, st)
	return C.VRAM_OK
}

//export vramgo_stats_json
func vramgo_stats_json(h C.int64_t, out **C.char, errOut **C.char) (rc C.int) {
	defer guard(&rc, errOut)
	st, err := stats(int64(h))
	if err != nil {
		return fail(errOut, err)
	}
	b, err := json.Marshal(st)
	if err != nil {
		return fail(errOut, fmt.Errorf("vram: stats as JSON: %w", err))
	}
	return text(out, string(b))
}

//export vramgo_report
func vramgo_report(h C.int64_t, out **C.char, errOut **C.char) (rc C.int) {
	defer guard(&rc, errOut)
	return managerText(h, out, errOut, (*capi.Manager).Report)
}

//export vramgo_oom_report
func vramgo_oom_report(h C.int64_t, out **C.char, errOut **C.char) (rc C.int) {
	defer guard(&rc, errOut)
	return managerText(h, out, errOut, (*capi.Manager).OOMReport)
}

// managerText hands C the text f makes of manager h.
func managerText(h C.int64_t, out, errOut **C.char, f func(*capi.Manager) (string, error)) C.int {
	m, err := reg.Get(int64(h))
	if err != nil {
		return fail(errOut, err)
	}
	s, err := f(m)
	if err != nil {
		return fail(errOut, err)
	}
	return text(out, s)
}

//export vramgo_hook_alloc
func vramgo_hook_alloc(src, dev C.int, h C.int64_t, size C.size_t, stream C.uintptr_t, note C.int, out *C.uintptr_t, errOut **C.char) (rc C.int) {
	defer guard(&rc, errOut)
	s, err := capi.ParseSource(int(src))
	if err != nil {
		return fail(errOut, err)
	}
	m, err := hookManager(int(dev), int64(h))
	if err != nil {
		return fail(errOut, err)
	}
	p, err := m.Alloc(s, uint64(size), uintptr(stream))
	if err != nil {
		if note != 0 {
			m.NoteHookError(err)
		}
		return fail(errOut, err)
	}
	*out = C.uintptr_t(p)
	return C.VRAM_OK
}

//export vramgo_hook_free
func vramgo_hook_free(dev C.int, h C.int64_t, p C.uintptr_t, size C.size_t, stream C.uintptr_t, errOut **C.char) (rc C.int) {
	defer guard(&rc, errOut)
	m, err := hookManager(int(dev), int64(h))
	if err != nil {
		return fail(errOut, err)
	}
	if err := m.Free(device.Ptr(p), uint64(size), uintptr(stream)); err != nil {
		m.NoteHookError(err)
		return fail(errOut, err)
	}
	return C.VRAM_OK
}

// hookManager is the manager a hook allocates through: handle h when it
// is given (CuPy's param), else the one open on device dev.
func hookManager(dev int, h int64) (*capi.Manager, error) {
	if h == 0 {
		return reg.ForDevice(dev)
	}
	m, err := reg.Get(h)
	if err != nil {
		return nil, err
	}
	if m.Ordinal() != dev {
		return nil, fmt.Errorf("vram: manager %d is open on device %d, and the hook's caller asked for device %d: %w", h, m.Ordinal(), dev, device.ErrInvalidValue)
	}
	return m, nil
}

func stats(h int64) (capi.Stats, error) {
	m, err := reg.Get(h)
	if err != nil {
		return capi.Stats{}, err
	}
	return m.Stats()
}

// fillStats writes st into the C struct (whose size shim.c sets).
func fillStats(out *C.struct_vram_stats, st capi.Stats) {
	out.manager = C.int64_t(st.Handle)
	out.device = C.int32_t(st.Device)
	if st.Backend == "sim" {
		out.simulated = 1
	}
	for _, f := range []struct {
		dst *C.uint64_t
		v   uint64
	}{
		{&out.in_use, st.InUse}, {&out.peak_in_use, st.PeakInUse}, {&out.reserved, st.Reserved},
		{&out.peak_reserved, st.PeakReserved}, {&out.allocs, st.Allocs}, {&out.frees, st.Frees},
		{&out.cache_hits, st.CacheHits}, {&out.device_allocs, st.DeviceAllocs}, {&out.device_frees, st.DeviceFrees},
		{&out.retries, st.Retries}, {&out.ooms, st.OOMs}, {&out.cap, st.Cap}, {&out.cap_used, st.CapUsed},
		{&out.device_free, st.DeviceFree}, {&out.device_total, st.DeviceTotal}, {&out.hook_errors, st.HookErrors},
	} {
		*f.dst = C.uint64_t(f.v)
	}
	for i, sb := range st.Sources {
		o := &out.sources[i]
		o.in_use, o.peak_in_use = C.uint64_t(sb.InUse), C.uint64_t(sb.PeakInUse)
		o.allocs, o.frees, o.ooms = C.uint64_t(sb.Allocs), C.uint64_t(sb.Frees), C.uint64_t(sb.OOMs)
	}
}
