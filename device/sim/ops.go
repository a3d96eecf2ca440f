package sim

// Copies, memsets, Go kernels and pinned host memory. (2-D copies are in
// strided.go.)
//
// Copies and memsets check their pointers when they are called (the
// memory checker) and then enqueue a closure holding the checked slices;
// the stream's goroutine does the copy later. Host buffers are read or
// written when the stream gets there, not when the call returns, so a
// caller that reuses a buffer before synchronizing sees the bug.
//
// A copy or memset of 0 bytes enqueues nothing, but its device pointers
// are checked all the same (a freed, stale or foreign pointer is a bug
// even when no byte moves): each must lie in a live allocation or point
// just past its end. A nil device pointer with 0 bytes is allowed and
// does nothing, as CUDA allows 0-byte copies.
//
// A kernel (LaunchFunc) is enqueued as one operation; when the stream
// reaches it, [0, n) is cut into up to 4×KernelWorkers blocks that
// KernelWorkers goroutines take in turn. Each goroutine has its own View,
// which checks every Bytes call against the allocations live at that
// moment and caches the last allocation it resolved.

import (
	"errors"
	"fmt"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/vramkit/vram/device"
	"github.com/vramkit/vram/internal/safecopy"
	"github.com/vramkit/vram/internal/units"
)

// prepare runs the checks every stream operation shares: an open device,
// fault injection, a usable stream and a backed device.
func (d *Device) prepare(op string, kind Op, s device.Stream) (*stream, error) {
	st, err := d.streamOf(s, op)
	if err != nil {
		return nil, err
	}
	if err := d.needBacked(op); err != nil {
		return nil, err
	}
	if err := d.faults.check(kind, op, 0); err != nil {
		return nil, err
	}
	return st, nil
}

// needBacked refuses op on an address-only device.
func (d *Device) needBacked(op string) error {
	if d.cfg.AddressOnly {
		return fmt.Errorf("%v: %s: the device is address-only (backed=false) and holds no bytes; "+
			"use a backed simulator for copies and kernels: %w", d, op, device.ErrNotSupported)
	}
	return nil
}

// transfer runs move, the host's work of moving n bytes, and with
// Config.CopyBandwidth set returns once n bytes would have crossed a link
// that fast, counted from when it started: the copy takes the longer of
// the link's time and the host's memcpy, not their sum, as a DMA engine's
// copy takes the link's time alone.
func (d *Device) transfer(n uint64, move func()) {
	bw := d.cfg.CopyBandwidth
	if bw == 0 {
		move()
		return
	}
	end := time.Now().Add(time.Duration(float64(n) / float64(bw) * float64(time.Second)))
	move()
	waitUntil(end)
}

// spinBelow is the longest wait that waitUntil spins through instead of
// sleeping. A sleeping goroutine needs a free P to wake, and while a
// kernel's workers hold every P that comes only when the scheduler
// preempts one (every 10 ms or so): each short copy would take 10–20 ms
// instead of its fraction of a millisecond.
const spinBelow = 2 * time.Millisecond

// waitUntil returns at t (or at once if t has passed): by sleeping, or for
// the last spinBelow by spinning.
func waitUntil(t time.Time) {
	left := time.Until(t)
	if left >= spinBelow {
		time.Sleep(left)
		return
	}
	for left > 0 {
		left = time.Until(t)
	}
}

func (d *Device) copyFailed(op string, n uint64, s *stream) error {
	return fmt.Errorf("%v: %s of %s on %v: injected fault: %w (%w)", d, op, units.Format(n), s, device.ErrCopyFailed, ErrInjected)
}

// enqueueCopy enqueues a checked copy of src into dst.
func (d *Device) enqueueCopy(op string, st *stream, dst, src []byte) error {
	n := uint64(len(src))
	fail := d.faults.copyFault()
	return st.enqueue(op, func() error {
		if fail {
			return d.copyFailed(op, n, st)
		}
		var err error
		d.transfer(n, func() { err = safecopy.Copy(dst, src) })
		return d.hostFaulted(op, n, st, err)
	})
}

// hostFaulted is the error of a copy whose host memory faulted (err from
// package safecopy), or nil: a memory-mapped file that shrank, or whose
// disk filled, fails the copy instead of ending the process.
func (d *Device) hostFaulted(op string, n uint64, s *stream, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("%v: %s of %s on %v: the host memory %w: %w", d, op, units.Format(n), s, err, device.ErrCopyFailed)
}

// CopyHtoD copies src to dst on s. src is read when the stream reaches the
// copy: keep it unchanged until the stream is synchronized past it. An
// empty src copies nothing; dst is still checked unless it is nil (see
// the file comment).
func (d *Device) CopyHtoD(dst device.Ptr, src []byte, s device.Stream) error {
	const op = "copy host to device"
	st, err := d.prepare(op, OpCopy, s)
	if err != nil {
		return err
	}
	if len(src) == 0 {
		return d.checkEmpty(op, dst)
	}
	buf, err := d.checkAccess(op, dst, uint64(len(src)))
	if err != nil {
		return err
	}
	return d.enqueueCopy(op, st, buf, src)
}

// CopyDtoH copies len(dst) bytes at src into dst on s. dst is written when
// the stream reaches the copy: read it after synchronizing.
func (d *Device) CopyDtoH(dst []byte, src device.Ptr, s device.Stream) error {
	const op = "copy device to host"
	st, err := d.prepare(op, OpCopy, s)
	if err != nil {
		return err
	}
	if len(dst) == 0 {
		return d.checkEmpty(op, src)
	}
	buf, err := d.checkAccess(op, src, uint64(len(dst)))
	if err != nil {
		return err
	}
	return d.enqueueCopy(op, st, dst, buf)
}

// CopyDtoD copies n bytes from src to dst on s.
func (d *Device) CopyDtoD(dst, src device.Ptr, n uint64, s device.Stream) error {
	const op = "copy device to device"
	st, err := d.prepare(op, OpCopy, s)
	if err != nil {
		return err
	}
	if n == 0 {
		if err := d.checkEmpty(op+" (destination)", dst); err != nil {
			return err
		}
		return d.checkEmpty(op+" (source)", src)
	}
	to, err := d.checkAccess(op+" (destination)", dst, n)
	if err != nil {
		return err
	}
	from, err := d.checkAccess(op+" (source)", src, n)
	if err != nil {
		return err
	}
	return d.enqueueCopy(op, st, to, from)
}

// Memset sets n bytes at dst to value on s.
func (d *Device) Memset(dst device.Ptr, value byte, n uint64, s device.Stream) error {
	const op = "memset"
	st, err := d.prepare(op, OpMemset, s)
	if err != nil {
		return err
	}
	if n == 0 {
		return d.checkEmpty(op, dst)
	}
	buf, err := d.checkAccess(op, dst, n)
	if err != nil {
		return err
	}
	return st.enqueue(op, func() error {
		d.transfer(n, func() {
			if value == 0 {
				clear(buf)
				return
			}
			for i := range buf {
				buf[i] = value
			}
		})
		return nil
	})
}

// LaunchFunc enqueues fn on s over [0, n): when the stream reaches it, fn
// is called with disjoint [lo, hi) blocks covering [0, n) from up to
// Config.KernelWorkers goroutines at once. The launch's error (the first
// error a block returned, or a block's panic) is sticky on s.
func (d *Device) LaunchFunc(s device.Stream, n int, fn func(mem device.View, lo, hi int) error) error {
	const op = "launch kernel"
	st, err := d.prepare(op, OpLaunch, s)
	if err != nil {
		return err
	}
	if n <= 0 {
		return fmt.Errorf("%v: %s over %d indices: the range must be > 0: %w", d, op, n, device.ErrInvalidValue)
	}
	if fn == nil {
		return fmt.Errorf("%v: %s: nil kernel function: %w", d, op, device.ErrInvalidValue)
	}
	gen := d.gen.Load()
	stamp := d.stamp.Add(1)
	return st.enqueue(op, func() error {
		return d.timedKernel(n, func() error { return d.runKernel(st, gen, stamp, n, fn) })
	})
}

// runKernel runs a kernel's blocks in parallel.
func (d *Device) runKernel(st *stream, gen, stamp uint64, n int, fn func(device.View, int, int) error) error {
	workers := d.cfg.KernelWorkers
	blocks := min(n, 4*workers)
	per := (n + blocks - 1) / blocks
	blocks = (n + per - 1) / per
	var (
		next    atomic.Int64
		failed  atomic.Bool
		errOnce sync.Once
		first   error
		wg      sync.WaitGroup
	)
	work := func() {
		v := &view{d: d, gen: gen, stamp: stamp}
		for !failed.Load() {
			b := int(next.Add(1) - 1)
			if b >= blocks {
				return
			}
			lo := b * per
			hi := min(lo+per, n)
			if err := callBlock(fn, v, lo, hi); err != nil {
				failed.Store(true)
				errOnce.Do(func() {
					first = fmt.Errorf("%v: kernel on %v, block [%d, %d): %w", d, st, lo, hi, err)
				})
			}
		}
	}
	g := min(workers, blocks)
	wg.Add(g - 1)
	for range g - 1 {
		go func() {
			defer wg.Done()
			work()
		}()
	}
	work()
	wg.Wait()
	return first
}

// ErrKernelPanic is wrapped by the error of a kernel block that panicked.
var ErrKernelPanic = errors.New("kernel panicked")

func callBlock(fn func(device.View, int, int) error, v *view, lo, hi int) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%w: %v\n%s", ErrKernelPanic, r, debug.Stack())
		}
	}()
	return fn(v, lo, hi)
}

// view is one kernel goroutine's checked window on device memory.
type view struct {
	d     *Device
	gen   uint64
	stamp uint64
	// cache of the last allocation resolved
	lo, hi uint64
	data   []byte
}

// Bytes returns the n bytes at p, checked like any other access.
func (v *view) Bytes(p device.Ptr, n uint64) ([]byte, error) {
	d := v.d
	if d.gen.Load() != v.gen {
		return nil, fmt.Errorf("%v: kernel access at %v: the device was reset while the kernel ran: %w", d, p, device.ErrInvalidated)
	}
	a := uint64(p)
	if v.data != nil && a >= v.lo && a+n <= v.hi && a+n >= a {
		off := a - v.lo
		return v.data[off : off+n : off+n], nil
	}
	d.mu.RLock()
	defer d.mu.RUnlock()
	if d.gen.Load() != v.gen {
		return nil, fmt.Errorf("%v: kernel access at %v: the device was reset while the kernel ran: %w", d, p, device.ErrInvalidated)
	}
	data, base, err := d.resolveLocked("kernel access", p, n, v.stamp)
	if err != nil {
		return nil, err
	}
	v.lo, v.hi, v.data = base, base+uint64(len(data)), data
	off := a - base
	return data[off : off+n : off+n], nil
}

// HostAlloc allocates n > 0 bytes of pinned host memory. With mapped it
// also gets a device address (a granule-aligned range of the device's
// address space) through which copies and kernels reach the same bytes.
// Pinned memory takes nothing from the device's memory. The bytes are
// real host memory even on an address-only device, every page resident
// when HostAlloc returns, and off the Go heap (hostBufMap): HostFree
// gives them back to the host at once.
func (d *Device) HostAlloc(n uint64, mapped bool) (device.HostBuffer, error) {
	b, err := d.hostAlloc(n, mapped)
	if err == nil {
		pin(b.Data)
	}
	return b, err
}

// pin makes b resident, as pinning does: it writes one byte of every page
// (4 KiB apart reaches every page of any larger size too), so the page
// faults of first use are taken here, by the allocation, and not by the
// copies that use b, which a DMA engine makes without the host's CPU.
// Fresh mappings come from the OS untouched: a first copy into 200 MB of
// them took 4× as long as the next.
func pin(b []byte) {
	const page = 4096
	for i := 0; i < len(b); i += page {
		b[i] = 0
	}
}

// hostAlloc is HostAlloc but for pinning the pages, which it leaves to its
// caller, outside the device's lock.
func (d *Device) hostAlloc(n uint64, mapped bool) (device.HostBuffer, error) {
	if d.closed.Load() {
		return device.HostBuffer{}, d.errClosed("host alloc")
	}
	if n == 0 {
		return device.HostBuffer{}, fmt.Errorf("%v: host alloc of 0 bytes: the size must be > 0: %w", d, device.ErrInvalidValue)
	}
	if err := d.faults.check(OpAlloc, "host alloc", n); err != nil {
		return device.HostBuffer{}, err
	}
	span, ok := units.RoundUp(n, d.cfg.Granularity)
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed.Load() {
		return device.HostBuffer{}, d.errClosed("host alloc")
	}
	if !ok || n > d.cfg.PinnedLimit-d.pinnedBytes {
		return device.HostBuffer{}, fmt.Errorf("%v: host alloc %s: %s of the %s pinned-memory limit is in use (Config.PinnedLimit, spec pinned=): %w",
			d, units.Format(n), units.Format(d.pinnedBytes), units.Format(d.cfg.PinnedLimit), device.ErrOutOfMemory)
	}
	var va uint64
	if mapped {
		if va, ok = d.va.alloc(span); !ok {
			return device.HostBuffer{}, fmt.Errorf("%v: host alloc %s mapped: address space exhausted: %w", d, units.Format(n), device.ErrOutOfMemory)
		}
	}
	mem, err := hostBufMap(n)
	if err != nil {
		if mapped {
			d.va.release(va, span)
		}
		return device.HostBuffer{}, fmt.Errorf("%v: host alloc %s: the host refused the memory (%v): %w", d, units.Format(n), err, device.ErrOutOfMemory)
	}
	data := mem[:n:n]
	d.nextID++
	buf := device.HostBuffer{Data: data}
	if mapped {
		d.live.insert(va, 0, span, rec{kind: kMapped, size: n, id: d.nextID, mem: preset(data)})
		d.dropGhostsLocked(va, span)
		buf.DevicePtr = device.Ptr(va)
	}
	d.host[&data[0]] = hostRec{n: n, ptr: buf.DevicePtr, id: d.nextID, mem: mem}
	d.pinnedBytes += n
	d.pinnedPeak = max(d.pinnedPeak, d.pinnedBytes)
	delete(d.hostFreed, addrOf(&data[0]))
	return buf, nil
}

// PinnedBytes is the bytes of pinned host memory live now (HostAlloc'd
// and not freed, of this generation) and the most that were live at
// once since the device was made: what programs on it asked to pin.
func (d *Device) PinnedBytes() (live, peak uint64) {
	d.mu.RLock()
	defer d.mu.RUnlock()
	return d.pinnedBytes, d.pinnedPeak
}

func addrOf(p *byte) uintptr { return uintptr(unsafe.Pointer(p)) }

// HostFree releases a buffer from HostAlloc, unmapping its memory. Like
// cuMemFreeHost it first waits for all work enqueued on the device's
// streams. A buffer made before a Reset is unmapped too, and the error
// wraps device.ErrInvalidated.
func (d *Device) HostFree(b device.HostBuffer) error {
	if d.closed.Load() {
		return d.errClosed("host free")
	}
	if len(b.Data) == 0 {
		return fmt.Errorf("%v: host free of an empty buffer: %w", d, device.ErrInvalidPointer)
	}
	if err := d.faults.check(OpFree, "host free", 0); err != nil {
		return err
	}
	d.quiesce()
	mem, err := d.hostFree(b)
	if mem != nil {
		hostBufUnmap(mem) // outside the lock: unmapping takes a while
	}
	return err
}

// hostFree takes b off the device's books and returns its mapping, to
// be unmapped (nil when there is none to unmap).
func (d *Device) hostFree(b device.HostBuffer) ([]byte, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed.Load() {
		return nil, d.errClosed("host free")
	}
	key := &b.Data[0]
	h, ok := d.host[key]
	if !ok {
		if id, freed := d.hostFreed[addrOf(key)]; freed {
			return nil, fmt.Errorf("%v: host free of %s buffer #%d: already freed: %w", d, units.Format(uint64(len(b.Data))), id, device.ErrDoubleFree)
		}
		if mem, old := d.oldHost[addrOf(key)]; old {
			delete(d.oldHost, addrOf(key))
			return mem, fmt.Errorf("%v: host free: the buffer was allocated before a device reset: %w", d, device.ErrInvalidated)
		}
		return nil, fmt.Errorf("%v: host free of a %s buffer that HostAlloc did not return (or a slice of one): %w",
			d, units.Format(uint64(len(b.Data))), device.ErrInvalidPointer)
	}
	if h.ptr != b.DevicePtr {
		return nil, fmt.Errorf("%v: host free: buffer #%d has device address %v, not %v: %w", d, h.id, h.ptr, b.DevicePtr, device.ErrInvalidPointer)
	}
	delete(d.host, key)
	d.pinnedBytes -= h.n
	if h.ptr != 0 {
		a := uint64(h.ptr)
		nd := d.live.get(a, 0)
		span := nd.span
		d.live.remove(a, 0)
		d.va.release(a, span)
		d.addGhostLocked(a, ghost{size: h.n, id: h.id, kind: kMapped})
	}
	k := addrOf(key)
	d.hostFreed[k] = h.id
	d.hostFreedQ = append(d.hostFreedQ, k)
	if len(d.hostFreedQ) > 4096 {
		old := d.hostFreedQ[0]
		d.hostFreedQ = d.hostFreedQ[1:]
		delete(d.hostFreed, old)
	}
	return h.mem, nil
}
