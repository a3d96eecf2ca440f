package cuda

// Stream-ordered allocation, pinned host memory and copies.
//
// Pinned host memory is mapped by this package (an anonymous private
// mapping) and then pinned with cuMemHostRegister, rather than taken from
// cuMemHostAlloc: memory from cuMemHostAlloc belongs to the context and is
// unmapped by a context reset, so a HostBuffer.Data slice a program still
// holds would fault on its next use. A registered mapping outlives the
// reset (it is merely no longer pinned) and is unmapped by HostFree or
// Close. Both kinds are page-locked memory the copy engines reach by DMA at
// the same speed.
//
// Copies. CopyHtoD and CopyDtoH are cuMemcpyHtoDAsync / cuMemcpyDtoHAsync
// on the stream. When the host slice lies inside a pinned buffer of this
// Device the copy is truly asynchronous and the caller must keep the
// memory alive and untouched until the stream is synchronized past it (the
// device package's stream contract). Any other host memory — ordinary Go
// memory — is copied and then the stream is synchronized before the call
// returns, so the driver never holds on to memory the Go collector owns
// (for pageable memory the driver stages or, on systems with HMM/ATS, may
// read it in place; synchronizing makes both safe).

import (
	"fmt"
	"runtime"
	"unsafe"

	"github.com/vramkit/vram/device"
	"github.com/vramkit/vram/internal/units"
)

// hostBuffer is one pinned host buffer. Guarded by Device.mu.
type hostBuffer struct {
	mem    []byte // the whole mapping (page-rounded)
	n      uint64 // bytes asked for
	dptr   uint64 // device address when mapped, else 0
	stale  bool   // no longer registered (a Reset happened)
	mapped bool
}

func (h *hostBuffer) addr() uintptr { return uintptr(unsafe.Pointer(unsafe.SliceData(h.mem))) }

// streamOf checks that s is a live stream of d and returns it. Requires
// p.mu (read).
func (d *Device) streamOf(op string, s device.Stream) (*stream, error) {
	st, ok := s.(*stream)
	if !ok || st == nil {
		if s == nil {
			return nil, fmt.Errorf("cuda: %s on a nil stream: %w", op, device.ErrInvalidValue)
		}
		return nil, fmt.Errorf("cuda: %s on a %T, not a stream of this cuda device: %w", op, s, device.ErrInvalidValue)
	}
	if st.d != d {
		return nil, fmt.Errorf("cuda: %s on a stream of another device: %w", op, device.ErrInvalidValue)
	}
	if st.closed.Load() {
		return nil, fmt.Errorf("cuda: %s on stream %#x: %w", op, st.h, device.ErrClosed)
	}
	if !d.current(st.gen) {
		return nil, fmt.Errorf("cuda: %s on stream %#x made before a device reset: %w", op, st.h, device.ErrInvalidated)
	}
	return st, nil
}

// MallocAsync allocates n bytes from the device's default memory pool,
// ordered on s (cuMemAllocAsync).
func (d *Device) MallocAsync(n uint64, s device.Stream) (device.Ptr, error) {
	if n == 0 {
		return 0, fmt.Errorf("cuda: MallocAsync of 0 bytes: %w", device.ErrInvalidValue)
	}
	if n > d.info.TotalBytes {
		return 0, fmt.Errorf("cuda: MallocAsync %s: more than the device's total memory %s: %w",
			units.Format(n), units.Format(d.info.TotalBytes), device.ErrOutOfMemory)
	}
	if err := d.enter(); err != nil {
		return 0, err
	}
	defer d.exit()
	if !d.pools {
		return 0, fmt.Errorf("cuda: MallocAsync: device %d (%s) has no stream-ordered memory pool: %w",
			d.p.ordinal, d.info.Name, device.ErrNotSupported)
	}
	st, err := d.streamOf("MallocAsync", s)
	if err != nil {
		return 0, err
	}
	p, r := d.allocFresh(n,
		func(p *uint64) Result { return d.lib.memAllocAsync(p, n, st.h) },
		func(p uint64) Result { return d.lib.memFreeAsync(p, st.h) })
	if r != Success {
		if r == ErrorOutOfMemory {
			return 0, d.oomError("MallocAsync", n, r)
		}
		return 0, fmt.Errorf("cuda: MallocAsync %s: %w", units.Format(n), r)
	}
	d.record(span{base: p, size: n, kind: kindAsync})
	return device.Ptr(p), nil
}

// FreeAsync returns p to the pool once the work enqueued on s so far has
// finished (cuMemFreeAsync). p may come from MallocAsync or Malloc.
//
// cuMemFreeAsync is documented for stream-ordered memory only (its
// reference, and cudaFreeAsync's in the runtime API: "Frees memory with
// stream ordered semantics. Inserts a free operation into hStream";
// cuMemAllocAsync's pool reuses what it frees); nothing in the
// documentation found allows it for memory from cuMemAlloc. A Malloc'd p is therefore freed with cuMemFree after
// cuStreamSynchronize(s): the same order, paid for by waiting here.
func (d *Device) FreeAsync(p device.Ptr, s device.Stream) error {
	if err := d.enter(); err != nil {
		return err
	}
	defer d.exit()
	st, err := d.streamOf("FreeAsync", s)
	if err != nil {
		return err
	}
	d.mu.Lock()
	sp, err := d.takeLocked("FreeAsync", p, kindAsync, kindMalloc)
	d.mu.Unlock()
	if err != nil {
		return err
	}
	var r Result
	if sp.kind == kindMalloc {
		if r = d.lib.streamSynchronize(st.h); r == Success {
			r = d.lib.memFree(uint64(p))
		}
	} else {
		r = d.lib.memFreeAsync(uint64(p), st.h)
	}
	if r != Success {
		d.record(sp)
		return fmt.Errorf("cuda: FreeAsync(%v): %w", p, r)
	}
	d.mu.Lock()
	d.freed.add(sp)
	d.mu.Unlock()
	return nil
}

// pool returns the default pool or explains its absence. Requires enter.
func (d *Device) pool(op string) (uintptr, error) {
	if !d.pools || d.p.pool == 0 {
		return 0, fmt.Errorf("cuda: %s: device %d (%s) has no stream-ordered memory pool: %w",
			op, d.p.ordinal, d.info.Name, device.ErrNotSupported)
	}
	return d.p.pool, nil
}

// SetReleaseThreshold sets CU_MEMPOOL_ATTR_RELEASE_THRESHOLD on the
// device's default pool: the bytes of freed memory it keeps reserved at a
// synchronization point. The setting is shared by every user of the pool
// in the process and survives Reset.
func (d *Device) SetReleaseThreshold(bytes uint64) error {
	if err := d.enter(); err != nil {
		return err
	}
	defer d.exit()
	pool, err := d.pool("SetReleaseThreshold")
	if err != nil {
		return err
	}
	v := bytes
	if r := d.lib.memPoolSetAttribute(pool, cuMemPoolAttrReleaseThreshold, &v); r != Success {
		return fmt.Errorf("cuda: SetReleaseThreshold(%s): %w", units.Format(bytes), r)
	}
	d.p.threshold.Store(bytes)
	return nil
}

// TrimPool releases reserved, unused pool memory until at most keep bytes
// stay reserved (cuMemPoolTrimTo).
func (d *Device) TrimPool(keep uint64) error {
	if err := d.enter(); err != nil {
		return err
	}
	defer d.exit()
	pool, err := d.pool("TrimPool")
	if err != nil {
		return err
	}
	if r := d.lib.memPoolTrimTo(pool, keep); r != Success {
		return fmt.Errorf("cuda: TrimPool(%s): %w", units.Format(keep), r)
	}
	return nil
}

// PoolUsage reports the default pool's reserved and used bytes
// (CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, CU_MEMPOOL_ATTR_USED_MEM_CURRENT).
func (d *Device) PoolUsage() (reserved, used uint64, err error) {
	if err := d.enter(); err != nil {
		return 0, 0, err
	}
	defer d.exit()
	pool, err := d.pool("PoolUsage")
	if err != nil {
		return 0, 0, err
	}
	if r := d.lib.memPoolGetAttribute(pool, cuMemPoolAttrReservedMemCurrent, &reserved); r != Success {
		return 0, 0, fmt.Errorf("cuda: PoolUsage: reserved: %w", r)
	}
	if r := d.lib.memPoolGetAttribute(pool, cuMemPoolAttrUsedMemCurrent, &used); r != Success {
		return 0, 0, fmt.Errorf("cuda: PoolUsage: used: %w", r)
	}
	return reserved, used, nil
}

// HostAlloc allocates n bytes of pinned host memory; mapped also gives it
// a device address (cuMemHostRegister with CU_MEMHOSTREGISTER_DEVICEMAP,
// then cuMemHostGetDevicePointer). The memory starts zeroed.
func (d *Device) HostAlloc(n uint64, mapped bool) (device.HostBuffer, error) {
	if n == 0 {
		return device.HostBuffer{}, fmt.Errorf("cuda: HostAlloc of 0 bytes: %w", device.ErrInvalidValue)
	}
	if err := d.enter(); err != nil {
		return device.HostBuffer{}, err
	}
	defer d.exit()
	mem, err := mapHost(n)
	if err != nil {
		return device.HostBuffer{}, fmt.Errorf("cuda: HostAlloc %s: %w: %w", units.Format(n), device.ErrOutOfMemory, err)
	}
	hb := &hostBuffer{mem: mem, n: n, mapped: mapped}
	flags := uint32(cuMemHostRegPortable)
	if mapped {
		flags |= cuMemHostRegDeviceMap
	}
	if r := d.lib.memHostRegister(hb.addr(), uint64(len(mem)), flags); r != Success {
		unmapHost(mem)
		if pinRefused(r) {
			return device.HostBuffer{}, fmt.Errorf("cuda: HostAlloc %s: the system refused to pin the memory "+
				"(locked-memory limit, ulimit -l, or pinned memory exhausted); free pinned buffers or ask for less: %w: %w",
				units.Format(n), device.ErrOutOfMemory, r)
		}
		return device.HostBuffer{}, fmt.Errorf("cuda: HostAlloc %s: cuMemHostRegister: %w", units.Format(n), r)
	}
	if mapped {
		if r := d.lib.memHostGetDevicePointer(&hb.dptr, hb.addr()); r != Success {
			d.lib.memHostUnregister(hb.addr())
			unmapHost(mem)
			return device.HostBuffer{}, fmt.Errorf("cuda: HostAlloc %s: cuMemHostGetDevicePointer: %w", units.Format(n), r)
		}
	}
	base := uint64(hb.addr())
	d.mu.Lock()
	d.syncGenLocked()
	d.hostBuf[base] = hb
	d.host.insert(span{base: base, size: n, kind: kindHost})
	d.hostFreed.forget(base, uint64(len(mem)))
	d.mu.Unlock()
	if mapped {
		d.record(span{base: hb.dptr, size: n, kind: kindMapped})
	}
	return device.HostBuffer{Data: mem[:n:n], DevicePtr: device.Ptr(hb.dptr)}, nil
}

// pinRefused reports whether cuMemHostRegister's r means that the system
// would not pin more memory, which HostAlloc reports as
// device.ErrOutOfMemory (the pinned pool's out-of-memory path relies on
// it). The driver API reference for cuMemHostRegister_v2 (cuda-python's
// copy) describes it as page-locking the range and warns that
// "page-locking excessive amounts of memory may degrade system
// performance"; it ties CUDA_ERROR_NOT_PERMITTED and _NOT_SUPPORTED to the
// IOMEMORY flag, and nothing found there promises CUDA_ERROR_OUT_OF_MEMORY
// when the operating system refuses. A refusal has been seen as
// CUDA_ERROR_OPERATING_SYSTEM (304, the OS call failed) and as
// CUDA_ERROR_INVALID_VALUE (1). HostAlloc passes a page-aligned mapping of
// its own and fixed, supported flags (PORTABLE, DEVICEMAP), so
// INVALID_VALUE there cannot mean a bad argument. Other codes
// (_HOST_MEMORY_ALREADY_REGISTERED, _NOT_PERMITTED, _NOT_SUPPORTED, which
// the documentation ties to flags HostAlloc does not use) stay themselves.
func pinRefused(r Result) bool {
	return r == ErrorOutOfMemory || r == ErrorOperatingSystem || r == ErrorInvalidValue
}

// HostFree unpins and unmaps a buffer from HostAlloc. A buffer made before
// a Reset lost its pinning with the reset: HostFree unmaps its memory and
// returns an error wrapping device.ErrInvalidated, as for any handle from
// before a reset.
func (d *Device) HostFree(b device.HostBuffer) error {
	if len(b.Data) == 0 {
		return fmt.Errorf("cuda: HostFree of an empty buffer: %w", device.ErrInvalidPointer)
	}
	if err := d.enter(); err != nil {
		return err
	}
	defer d.exit()
	base := uint64(uintptr(unsafe.Pointer(unsafe.SliceData(b.Data))))
	d.mu.Lock()
	d.syncGenLocked()
	hb, ok := d.hostBuf[base]
	if !ok {
		_, freed := d.hostFreed.containing(base)
		d.mu.Unlock()
		if freed {
			return fmt.Errorf("cuda: HostFree(%#x): already freed: %w", base, device.ErrDoubleFree)
		}
		return fmt.Errorf("cuda: HostFree(%#x): not a buffer HostAlloc returned on cuda device %d: %w", base, d.p.ordinal, device.ErrInvalidPointer)
	}
	if uint64(len(b.Data)) != hb.n || uint64(b.DevicePtr) != hb.dptr {
		d.mu.Unlock()
		return fmt.Errorf("cuda: HostFree(%#x): the buffer has %d bytes at device address %v, not %d at %v: %w",
			base, hb.n, device.Ptr(hb.dptr), len(b.Data), b.DevicePtr, device.ErrInvalidPointer)
	}
	delete(d.hostBuf, base)
	d.host.remove(base)
	d.hostFreed.add(span{base: base, size: hb.n, kind: kindHost})
	if hb.mapped && !hb.stale {
		d.live.remove(hb.dptr)
	}
	d.mu.Unlock()
	if !hb.stale {
		if r := d.lib.memHostUnregister(hb.addr()); r != Success {
			d.mu.Lock()
			d.hostBuf[base] = hb
			d.host.insert(span{base: base, size: hb.n, kind: kindHost})
			if hb.mapped {
				d.live.insert(span{base: hb.dptr, size: hb.n, kind: kindMapped})
			}
			d.mu.Unlock()
			return fmt.Errorf("cuda: HostFree(%#x): cuMemHostUnregister: %w", base, r)
		}
	}
	runtime.KeepAlive(b.Data)
	if err := unmapHost(hb.mem); err != nil {
		return fmt.Errorf("cuda: HostFree(%#x): %w", base, err)
	}
	if hb.stale {
		return fmt.Errorf("cuda: HostFree(%#x): the buffer was allocated before a device reset (its memory is now unmapped): %w",
			base, device.ErrInvalidated)
	}
	return nil
}

// pinnedLocked reports whether host lies inside a pinned buffer of d that
// is still registered. Requires d.mu.
func (d *Device) pinnedLocked(host []byte) bool {
	a := uint64(uintptr(unsafe.Pointer(unsafe.SliceData(host))))
	sp, ok := d.host.containing(a)
	if !ok || uint64(len(host)) > sp.end()-a {
		return false
	}
	hb := d.hostBuf[sp.base]
	return hb != nil && !hb.stale
}

// copyPrologue validates a copy's stream and device range and says whether
// the host side is pinned. Requires enter.
func (d *Device) copyPrologue(op string, s device.Stream, p device.Ptr, n uint64, host []byte) (*stream, bool, error) {
	st, err := d.streamOf(op, s)
	if err != nil {
		return nil, false, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.checkRangeLocked(op, p, n); err != nil {
		return nil, false, err
	}
	return st, host != nil && d.pinnedLocked(host), nil
}

// CopyHtoD copies src to dst, ordered on s (cuMemcpyHtoDAsync). See the
// file comment for when it returns before the copy is done.
func (d *Device) CopyHtoD(dst device.Ptr, src []byte, s device.Stream) error {
	if err := d.enter(); err != nil {
		return err
	}
	defer d.exit()
	n := uint64(len(src))
	st, pinned, err := d.copyPrologue("CopyHtoD", s, dst, n, src)
	if err != nil || n == 0 {
		return err
	}
	r := d.lib.memcpyHtoDAsync(uint64(dst), src, st.h)
	if r == Success && !pinned {
		r = d.lib.streamSynchronize(st.h)
	}
	runtime.KeepAlive(src)
	if r != Success {
		return fmt.Errorf("cuda: CopyHtoD %s to %v: %w: %w", units.Format(n), dst, device.ErrCopyFailed, r)
	}
	return nil
}

// CopyDtoH copies src to dst, ordered on s (cuMemcpyDtoHAsync). See the
// file comment for when it returns before the copy is done.
func (d *Device) CopyDtoH(dst []byte, src device.Ptr, s device.Stream) error {
	if err := d.enter(); err != nil {
		return err
	}
	defer d.exit()
	n := uint64(len(dst))
	st, pinned, err := d.copyPrologue("CopyDtoH", s, src, n, dst)
	if err != nil || n == 0 {
		return err
	}
	r := d.lib.memcpyDtoHAsync(dst, uint64(src), st.h)
	if r == Success && !pinned {
		r = d.lib.streamSynchronize(st.h)
	}
	runtime.KeepAlive(dst)
	if r != Success {
		return fmt.Errorf("cuda: CopyDtoH %s from %v: %w: %w", units.Format(n), src, device.ErrCopyFailed, r)
	}
	return nil
}

// CopyDtoD copies n bytes from src to dst, ordered on s
// (cuMemcpyDtoDAsync). It does not wait.
func (d *Device) CopyDtoD(dst, src device.Ptr, n uint64, s device.Stream) error {
	if err := d.enter(); err != nil {
		return err
	}
	defer d.exit()
	st, _, err := d.copyPrologue("CopyDtoD", s, dst, n, nil)
	if err != nil {
		return err
	}
	d.mu.Lock()
	err = d.checkRangeLocked("CopyDtoD", src, n)
	d.mu.Unlock()
	if err != nil || n == 0 {
		return err
	}
	if r := d.lib.memcpyDtoDAsync(uint64(dst), uint64(src), n, st.h); r != Success {
		return fmt.Errorf("cuda: CopyDtoD %s from %v to %v: %w: %w", units.Format(n), src, dst, device.ErrCopyFailed, r)
	}
	return nil
}

// Memset sets n bytes at dst to value, ordered on s (cuMemsetD8Async).
func (d *Device) Memset(dst device.Ptr, value byte, n uint64, s device.Stream) error {
	if err := d.enter(); err != nil {
		return err
	}
	defer d.exit()
	st, _, err := d.copyPrologue("Memset", s, dst, n, nil)
	if err != nil || n == 0 {
		return err
	}
	if r := d.lib.memsetD8Async(uint64(dst), value, n, st.h); r != Success {
		return fmt.Errorf("cuda: Memset %s at %v: %w", units.Format(n), dst, r)
	}
	return nil
}
