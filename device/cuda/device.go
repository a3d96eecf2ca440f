package cuda

// How the backend talks to the driver.
//
// Contexts. A Device uses its GPU's primary context (the one the CUDA
// runtime uses too), retained at Open and released at Close. CUDA makes a
// context current per OS thread, and goroutines move between threads, so
// every driver call runs as
//
//	runtime.LockOSThread(); cuCtxSetCurrent(ctx); <call>; runtime.UnlockOSThread()
//
// on the calling goroutine (enter/exit below). The alternative, one
// goroutine locked to one thread that runs every call sent to it, costs a
// channel hand-off and, when that thread is parked, a futex wake-up: several
// microseconds per call, which is more than cuMemAllocAsync's own hit path
// and would serialize blocking calls (a stream synchronize would stall every
// other goroutine's allocations). cuCtxSetCurrent on a thread that already
// has the context is a store to thread-local state: tens of nanoseconds.
// Pool hits above this layer never reach it.
//
// Resets. All Devices opened on one ordinal share a primary record
// holding the context handle and a generation number. Every driver call
// holds the record's lock for reading; Reset holds it for writing, resets
// the primary context (cuDevicePrimaryCtxReset), re-activates it and bumps
// the generation. Streams, events and modules remember the generation they
// were made in and return device.ErrInvalidated when it has moved on;
// pointers made before are moved to a stale record (see spans.go).
//
// Concurrency. Device is safe for concurrent use: driver calls from
// different goroutines run in parallel (the driver is thread-safe); the
// Device's own records are guarded by d.mu, which is never held across a
// driver call that can block.

import (
	"errors"
	"fmt"
	"math"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/vramkit/vram/device"
	"github.com/vramkit/vram/internal/units"
)

func init() {
	device.Register("cuda", open)
	device.RegisterSpecReader("cuda", device.SpecReader{Check: checkSpec})
}

// checkSpec checks a spec's options, a device number, without opening
// the device (device.SpecReader.Check); a GPU's memory and page are its
// own.
func checkSpec(opts string) (device.SpecInfo, error) {
	_, err := parseOrdinal(opts)
	return device.SpecInfo{}, err
}

// Granularity is the unit Info reports for Malloc: current drivers back
// large allocations in 2 MiB pages.
const Granularity = 2 << 20

// primary is one GPU's primary context as this process uses it, shared by
// every Device opened on that ordinal.
type primary struct {
	ordinal int
	dev     int32 // CUdevice

	// mu is held for reading by every driver call made through a Device on
	// this ordinal, and for writing by Reset and Close.
	mu        sync.RWMutex
	ctx       uintptr       // CUcontext; protected by mu
	pool      uintptr       // the default CUmemoryPool, 0 if pools are unsupported; protected by mu
	threshold atomic.Uint64 // release threshold last set, re-applied after a reset
	gen       atomic.Uint64 // bumped (under mu) by every Reset
	sticky    atomic.Int32  // the sticky Result that broke the context, 0 if none; cleared by Reset

	refs     int                  // Devices open on it; protected by primariesMu
	devs     map[*Device]struct{} // the Devices open on it; protected by primariesMu
	ctxBytes uint64               // total − free right after the context was first made
}

var (
	primariesMu sync.Mutex
	primaries   = map[int]*primary{}
)

// Device is one CUDA GPU, driven through its primary context. It implements
// device.Device, device.AsyncAllocator, device.HostAllocator,
// device.ModuleLoader, device.StridedCopier and device.VirtualMemory. Safe
// for concurrent use.
type Device struct {
	lib   *lib
	p     *primary
	info  device.Info
	pools bool // the device supports cuMemAllocAsync
	// maxPitch is the largest pitch cuMemcpy2D accepts
	// (CU_DEVICE_ATTRIBUTE_MAX_PITCH); 2-D copies with a larger pitch are
	// done a row at a time.
	maxPitch uint64
	closed   atomic.Bool
	vm       vmInfo // virtual memory support, asked on first use (vmm.go)

	mu        sync.Mutex // protects the fields below
	seenGen   uint64     // the generation the records below describe
	defStr    *stream    // the default stream of generation seenGen
	live      spanSet    // device allocations and mapped host ranges, by device address
	stale     spanSet    // device ranges made before the last Reset
	freed     freedSet   // recent frees
	host      spanSet    // pinned host buffers, by host address (kind kindHost)
	hostFreed freedSet   // recent HostFrees
	hostBuf   map[uint64]*hostBuffer
	streams   map[*stream]struct{}
	events    map[*event]struct{}
	modules   map[*module]struct{}
	vmr       vmRecords // reservations, mappings and physical memory made (vmm.go)
}

var (
	_ device.Device         = (*Device)(nil)
	_ device.AsyncAllocator = (*Device)(nil)
	_ device.HostAllocator  = (*Device)(nil)
	_ device.ModuleLoader   = (*Device)(nil)
	_ device.StridedCopier  = (*Device)(nil)
	_ device.Generational   = (*Device)(nil)
)

// parseOrdinal reads the part of a spec after "cuda:".
func parseOrdinal(opts string) (int, error) {
	opts = strings.TrimSpace(opts)
	if opts == "" {
		return 0, nil
	}
	n, err := strconv.Atoi(opts)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("cuda device %s: want a device number such as cuda:0: %w", device.QuoteSpec(opts), device.ErrBadSpec)
	}
	return n, nil
}

func open(opts string) (device.Device, error) {
	n, err := parseOrdinal(opts)
	if err != nil {
		return nil, err
	}
	d, err := Open(n)
	if err != nil {
		return nil, err
	}
	return d, nil
}

// Open opens CUDA device ordinal (0 is the first GPU the driver lists,
// after CUDA_VISIBLE_DEVICES). It loads libcuda.so.1 on first use. When the
// backend cannot be used here the error wraps device.ErrNoDevice and says
// why: the library did not load (with the loader's message), a symbol is
// missing, cuInit failed, or there is no device ordinal.
func Open(ordinal int) (*Device, error) {
	if ordinal < 0 {
		return nil, fmt.Errorf("cuda device %d: want a device number >= 0: %w", ordinal, device.ErrBadSpec)
	}
	l, err := load()
	if err != nil {
		return nil, fmt.Errorf("cuda: %w: %w", device.ErrNoDevice, err)
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if r := l.cuInit(); r != Success {
		return nil, fmt.Errorf("cuda: %w: cuInit failed (%s loaded): %w", device.ErrNoDevice, l.path, r)
	}
	// Open makes the primary context current to describe the device; the
	// thread gets back what it had (foreign.go says why that matters).
	var prev uintptr
	if l.ctxGetCurrent(&prev) == Success {
		defer l.ctxSetCurrent(prev)
	}
	var count int32
	if r := l.deviceGetCount(&count); r != Success {
		return nil, fmt.Errorf("cuda: %w: cuDeviceGetCount: %w", device.ErrNoDevice, r)
	}
	if ordinal >= int(count) {
		vis := ""
		if v, ok := os.LookupEnv("CUDA_VISIBLE_DEVICES"); ok {
			vis = fmt.Sprintf(" (CUDA_VISIBLE_DEVICES=%q)", v)
		}
		return nil, fmt.Errorf("cuda: %w: no device %d of %d%s", device.ErrNoDevice, ordinal, count, vis)
	}
	var dev int32
	if r := l.deviceGet(&dev, ordinal); r != Success {
		return nil, fmt.Errorf("cuda: %w: cuDeviceGet(%d): %w", device.ErrNoDevice, ordinal, r)
	}
	p, err := acquirePrimary(l, ordinal, dev)
	if err != nil {
		return nil, err
	}
	d := &Device{
		lib:     l,
		p:       p,
		hostBuf: map[uint64]*hostBuffer{},
		streams: map[*stream]struct{}{},
		events:  map[*event]struct{}{},
		modules: map[*module]struct{}{},
	}
	// A Reset through another Device may be replacing the context: read it,
	// the pool and the generation under the lock Reset takes.
	p.mu.RLock()
	d.seenGen = p.gen.Load()
	d.defStr = &stream{d: d, h: cuDefaultLegacyStream, isDefault: true, gen: d.seenGen}
	if r := l.ctxSetCurrent(p.ctx); r != Success {
		err = fmt.Errorf("cuda: %w: cuCtxSetCurrent(device %d): %w", device.ErrNoDevice, ordinal, r)
	} else {
		err = d.describe()
	}
	p.mu.RUnlock()
	if err != nil {
		releasePrimary(l, p, nil)
		return nil, err
	}
	primariesMu.Lock()
	p.devs[d] = struct{}{}
	primariesMu.Unlock()
	return d, nil
}

// acquirePrimary retains the primary context of dev and returns its shared
// record, making the record (and measuring the context's own memory) when
// this is the first Device on the ordinal. The caller's thread is locked.
func acquirePrimary(l *lib, ordinal int, dev int32) (*primary, error) {
	primariesMu.Lock()
	defer primariesMu.Unlock()
	var ctx uintptr
	if r := l.primaryCtxRetain(&ctx, dev); r != Success {
		return nil, fmt.Errorf("cuda: %w: cuDevicePrimaryCtxRetain(device %d): %w", device.ErrNoDevice, ordinal, r)
	}
	if r := l.ctxSetCurrent(ctx); r != Success {
		l.primaryCtxRelease(dev)
		return nil, fmt.Errorf("cuda: %w: cuCtxSetCurrent(device %d): %w", device.ErrNoDevice, ordinal, r)
	}
	if p, ok := primaries[ordinal]; ok {
		p.refs++
		return p, nil
	}
	p := &primary{ordinal: ordinal, dev: dev, ctx: ctx, refs: 1, devs: map[*Device]struct{}{}}
	ctxOwners.Store(ctx, p)
	var free, total uint64
	if r := l.memGetInfo(&free, &total); r == Success && total >= free {
		p.ctxBytes = total - free
	}
	var ok int32
	if r := l.deviceGetAttribute(&ok, cuDevAttrMemoryPoolsSupported, dev); r == Success && ok != 0 {
		var pool uintptr
		if r := l.deviceGetDefaultMemPool(&pool, dev); r == Success {
			p.pool = pool
		}
	}
	primaries[ordinal] = p
	return p, nil
}

// releasePrimary drops one Device's hold (d, or nil while opening) on p
// and on the driver's primary context; the last one forgets the record.
func releasePrimary(l *lib, p *primary, d *Device) error {
	primariesMu.Lock()
	defer primariesMu.Unlock()
	delete(p.devs, d)
	p.refs--
	if p.refs == 0 {
		delete(primaries, p.ordinal)
		ctxOwners.CompareAndDelete(p.ctx, p)
	}
	if r := l.primaryCtxRelease(p.dev); r != Success {
		return fmt.Errorf("cuda: cuDevicePrimaryCtxRelease: %w", r)
	}
	return nil
}

// describe fills d.info. The caller's thread is locked with the context
// current.
func (d *Device) describe() error {
	l, dev := d.lib, d.p.dev
	name := make([]byte, 256)
	if r := l.deviceGetName(name, dev); r != Success {
		return fmt.Errorf("cuda: cuDeviceGetName: %w", r)
	}
	id, err := deviceID(l, dev)
	if err != nil {
		return err
	}
	var major, minor, version, pitch int32
	l.deviceGetAttribute(&major, cuDevAttrComputeCapabilityMajor, dev)
	l.deviceGetAttribute(&minor, cuDevAttrComputeCapabilityMinor, dev)
	d.maxPitch = math.MaxInt32 // what current GPUs report
	if r := l.deviceGetAttribute(&pitch, cuDevAttrMaxPitch, dev); r == Success && pitch > 0 {
		d.maxPitch = uint64(pitch)
	}
	l.driverGetVersion(&version)
	var free, total uint64
	if r := l.memGetInfo(&free, &total); r != Success {
		return fmt.Errorf("cuda: cuMemGetInfo: %w", r)
	}
	d.pools = d.p.pool != 0
	d.info = device.Info{
		Backend:           "cuda",
		Name:              string(name[:clen(name)]),
		Ordinal:           d.p.ordinal,
		TotalBytes:        total,
		ContextBytes:      d.p.ctxBytes,
		Granularity:       Granularity,
		Driver:            fmt.Sprintf("CUDA driver %d.%d (%s)", version/1000, version%1000/10, l.path),
		ComputeCapability: fmt.Sprintf("%d.%d", major, minor),
		Backed:            true,
		ID:                id,
	}
	return nil
}

// deviceID is the device's UUID as nvidia-smi -L and CUDA_VISIBLE_DEVICES
// write it. cuDeviceGetUuid_v2, where the driver has it, names a MIG
// slice by its own UUID, which differs from the whole GPU's (what the
// pre-13 cuDeviceGetUuid returns): then the ID is MIG-…, else GPU-….
func deviceID(l *lib, dev int32) (string, error) {
	var gpu, own [16]byte
	if r := l.deviceGetUuid(&gpu, dev); r != Success {
		return "", fmt.Errorf("cuda: cuDeviceGetUuid: %w", r)
	}
	r, ok := l.deviceGetUuidV2(&own, dev)
	if r != Success {
		return "", fmt.Errorf("cuda: cuDeviceGetUuid_v2: %w", r)
	}
	if !ok || own == gpu {
		return uuidString("GPU", gpu), nil
	}
	return uuidString("MIG", own), nil
}

// uuidString writes a UUID as nvidia-smi -L does:
// PREFIX-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx.
func uuidString(prefix string, u [16]byte) string {
	return fmt.Sprintf("%s-%x-%x-%x-%x-%x", prefix, u[0:4], u[4:6], u[6:8], u[8:10], u[10:16])
}

// Info describes the device. ContextBytes is an estimate: device memory in
// use (total − free) right after this process first made the primary
// context, before it allocated anything; it also counts memory other
// processes, or other users of the primary context in this process, held
// at that moment.
func (d *Device) Info() device.Info { return d.info }

// enter makes a driver call possible: the device is open, the primary
// record is read-locked and the context is current on this goroutine's
// locked thread. Every successful enter is paired with exit.
func (d *Device) enter() error {
	if d.closed.Load() {
		return fmt.Errorf("cuda device %d: %w", d.p.ordinal, device.ErrClosed)
	}
	d.p.mu.RLock()
	if d.closed.Load() {
		d.p.mu.RUnlock()
		return fmt.Errorf("cuda device %d: %w", d.p.ordinal, device.ErrClosed)
	}
	if code := d.p.sticky.Load(); code != 0 {
		d.p.mu.RUnlock()
		return fmt.Errorf("cuda device %d: an earlier %w left the context unusable; Reset the device", d.p.ordinal, Result(code))
	}
	runtime.LockOSThread()
	if r := d.lib.ctxSetCurrent(d.p.ctx); r != Success {
		d.exit()
		return fmt.Errorf("cuda device %d: cuCtxSetCurrent: %w", d.p.ordinal, r)
	}
	return nil
}

// Err reports whether the device's context is broken: nil, or an error
// wrapping ErrNeedsReset and the sticky Result that broke it (for example
// CUDA_ERROR_ILLEGAL_ADDRESS from a kernel that touched memory it does not
// own). Until Reset every call on the device returns that error.
func (d *Device) Err() error {
	if code := d.p.sticky.Load(); code != 0 {
		return fmt.Errorf("cuda device %d: %w", d.p.ordinal, Result(code))
	}
	return nil
}

func (d *Device) exit() {
	runtime.UnlockOSThread()
	d.p.mu.RUnlock()
}

// syncGenLocked brings d's records up to date with the primary record's
// generation: after a Reset (by this Device or another on the same ordinal)
// every recorded allocation becomes stale and the default stream is a new
// one. Requires d.mu.
func (d *Device) syncGenLocked() {
	g := d.p.gen.Load()
	if g == d.seenGen {
		return
	}
	d.seenGen = g
	d.defStr = &stream{d: d, h: cuDefaultLegacyStream, isDefault: true, gen: g}
	d.stale.moveAll(&d.live)
	d.stale.moveAll(&d.vmr.res)
	d.vmr.forget()
	d.freed.clear()
	for _, hb := range d.hostBuf {
		hb.stale = true
	}
	clear(d.streams)
	clear(d.events)
	clear(d.modules)
}

// current reports whether a handle made in generation gen is still valid.
// Requires p.mu (read).
func (d *Device) current(gen uint64) bool { return gen == d.p.gen.Load() }

// MemInfo reports free and total device memory (cuMemGetInfo).
func (d *Device) MemInfo() (free, total uint64, err error) {
	if err := d.enter(); err != nil {
		return 0, 0, err
	}
	defer d.exit()
	if r := d.lib.memGetInfo(&free, &total); r != Success {
		return 0, 0, fmt.Errorf("cuda: cuMemGetInfo: %w", r)
	}
	return free, total, nil
}

// oomError explains a failed allocation with the device's figures. The
// caller holds enter.
func (d *Device) oomError(op string, n uint64, r Result) error {
	var free, total uint64
	if d.lib.memGetInfo(&free, &total) == Success {
		return fmt.Errorf("cuda: %s %s: device has %s free of %s; free or trim cached memory, or ask for less: %w",
			op, units.Format(n), units.Format(free), units.Format(total), r)
	}
	return fmt.Errorf("cuda: %s %s: %w", op, units.Format(n), r)
}

// Malloc allocates n bytes with cuMemAlloc.
func (d *Device) Malloc(n uint64) (device.Ptr, error) {
	if n == 0 {
		return 0, fmt.Errorf("cuda: Malloc of 0 bytes: %w", device.ErrInvalidValue)
	}
	if n > d.info.TotalBytes {
		return 0, fmt.Errorf("cuda: Malloc %s: more than the device's total memory %s: %w",
			units.Format(n), units.Format(d.info.TotalBytes), device.ErrOutOfMemory)
	}
	if err := d.enter(); err != nil {
		return 0, err
	}
	defer d.exit()
	p, r := d.allocFresh(n,
		func(p *uint64) Result { return d.lib.memAlloc(p, n) },
		func(p uint64) Result { return d.lib.memFree(p) })
	if r != Success {
		if r == ErrorOutOfMemory {
			return 0, d.oomError("Malloc", n, r)
		}
		return 0, fmt.Errorf("cuda: Malloc %s: %w", units.Format(n), r)
	}
	d.record(span{base: p, size: n, kind: kindMalloc})
	return device.Ptr(p), nil
}

// staleAvoidance is how many address ranges, at most, Malloc and
// MallocAsync pass over to avoid memory handed out before the last Reset.
const staleAvoidance = 8

// allocFresh runs alloc until the driver hands out n bytes at an address
// that no pointer from before the last Reset covers, so that such a
// pointer keeps failing with device.ErrInvalidated rather than silently
// reaching the new allocation (a driver may well give a new context the
// addresses of the old one). Ranges passed over — at most staleAvoidance —
// are given back with release once the search ends. When memory runs out
// while ranges are held, they are given back and one last try takes
// whatever address comes (its stale records are then forgotten). Requires
// enter.
func (d *Device) allocFresh(n uint64, alloc func(*uint64) Result, release func(uint64) Result) (uint64, Result) {
	var held []uint64
	defer func() {
		for _, h := range held {
			release(h)
		}
	}()
	for {
		var p uint64
		r := alloc(&p)
		if r != Success {
			if r != ErrorOutOfMemory || len(held) == 0 {
				return 0, r
			}
			for _, h := range held {
				release(h)
			}
			held = nil
			r = alloc(&p)
			return p, r
		}
		if len(held) == staleAvoidance || !d.overlapsStale(p, n) {
			return p, Success
		}
		held = append(held, p)
	}
}

// overlapsStale reports whether [p, p+n) overlaps memory handed out before
// the last Reset.
func (d *Device) overlapsStale(p, n uint64) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.syncGenLocked()
	i := d.stale.search(p + n - 1) // spans starting at or below the last byte
	return i > 0 && d.stale.s[i-1].end() > p
}

// record notes a new allocation. Requires p.mu (read).
func (d *Device) record(sp span) {
	d.mu.Lock()
	d.syncGenLocked()
	d.live.insert(sp)
	d.stale.removeOverlapping(sp.base, sp.size)
	d.freed.forget(sp.base, sp.size)
	d.mu.Unlock()
}

// takeLocked removes the allocation starting at p from the live record for
// a free, or explains why p cannot be freed. Requires d.mu and p.mu (read).
func (d *Device) takeLocked(op string, p device.Ptr, kinds ...spanKind) (span, error) {
	d.syncGenLocked()
	sp, ok := d.live.get(uint64(p))
	if !ok {
		if in, ok := d.live.containing(uint64(p)); ok {
			return span{}, fmt.Errorf("cuda: %s(%v): address is %s into the %s allocation at %v, not its start: %w",
				op, p, units.Format(uint64(p)-in.base), in.kind, device.Ptr(in.base), device.ErrInvalidPointer)
		}
		return span{}, d.badPointerLocked(op, p, true)
	}
	for _, k := range kinds {
		if sp.kind == k {
			d.live.remove(sp.base)
			return sp, nil
		}
	}
	return span{}, fmt.Errorf("cuda: %s(%v): the address is a %s, which %s does not free: %w",
		op, p, sp.kind, op, device.ErrInvalidPointer)
}

// badPointerLocked explains why p is not a live allocation. Requires d.mu.
func (d *Device) badPointerLocked(op string, p device.Ptr, free bool) error {
	if sp, ok := d.stale.containing(uint64(p)); ok {
		return fmt.Errorf("cuda: %s(%v): the %s allocation of %s at %v was made before a device reset: %w",
			op, p, sp.kind, units.Format(sp.size), device.Ptr(sp.base), device.ErrInvalidated)
	}
	if sp, ok := d.freed.containing(uint64(p)); ok {
		if free && sp.base == uint64(p) {
			return fmt.Errorf("cuda: %s(%v): already freed: %w", op, p, device.ErrDoubleFree)
		}
		return fmt.Errorf("cuda: %s(%v): the %s allocation of %s at %v has been freed: %w",
			op, p, sp.kind, units.Format(sp.size), device.Ptr(sp.base), device.ErrUseAfterFree)
	}
	return fmt.Errorf("cuda: %s(%v): not an allocation of cuda device %d: %w", op, p, d.p.ordinal, device.ErrInvalidPointer)
}

// checkRangeLocked checks that [p, p+n) lies inside one live allocation.
// Requires d.mu and p.mu (read).
//
// A 0-byte range is what a 0-byte copy or memset checks, as the simulator
// does: at a nil pointer it is nothing to check; otherwise the pointer must
// lie inside a live allocation or exactly at its end.
func (d *Device) checkRangeLocked(op string, p device.Ptr, n uint64) error {
	d.syncGenLocked()
	a := uint64(p)
	if n == 0 {
		if p == 0 {
			return nil
		}
		if i := d.live.search(a); i > 0 && a == d.live.s[i-1].end() {
			return nil
		}
		n = 1 // inside a live allocation, or the error for a byte at p
	}
	if sp, ok := d.live.containing(a); ok {
		if n > sp.end()-a {
			return fmt.Errorf("cuda: %s of %s at %v runs %s past the end of the %s allocation of %s at %v: %w",
				op, units.Format(n), p, units.Format(n-(sp.end()-a)), sp.kind, units.Format(sp.size), device.Ptr(sp.base), device.ErrOutOfBounds)
		}
		return nil
	}
	if err := d.badPointerLocked(op, p, false); !errors.Is(err, device.ErrInvalidPointer) {
		return err
	}
	// An address just past the end of an allocation (within the driver's
	// 256-byte alignment) is an overrun of that allocation.
	if i := d.live.search(a); i > 0 {
		if sp := d.live.s[i-1]; a >= sp.end() && a-sp.end() < 256 {
			return fmt.Errorf("cuda: %s of %s at %v starts %s past the end of the %s allocation of %s at %v: %w",
				op, units.Format(n), p, units.Format(a-sp.end()), sp.kind, units.Format(sp.size), device.Ptr(sp.base), device.ErrOutOfBounds)
		}
	}
	return d.badPointerLocked(op, p, false)
}

// Free releases a Malloc'd (or MallocAsync'd) pointer with cuMemFree once
// the device work that may use it has finished.
//
// cuMemFree waits for that work itself only for memory from cuMemAlloc.
// The driver API reference for cuMemFree_v2 (as NVIDIA's cuda-python
// bindings publish it, nvidia.github.io/cuda-python) says that it "will not perform any
// implicit synchronization when the pointer was allocated with
// cuMemAllocAsync or cuMemAllocFromPoolAsync. Callers must ensure that all
// accesses to these pointer have completed before invoking cuMemFree"; for
// all other pointers it "may perform implicit synchronization". So a
// MallocAsync pointer is freed after cuCtxSynchronize: synchronizing the
// legacy default stream would not do, as the streams this package makes are
// non-blocking and do not wait on it.
func (d *Device) Free(p device.Ptr) error {
	if err := d.enter(); err != nil {
		return err
	}
	defer d.exit()
	d.mu.Lock()
	sp, err := d.takeLocked("Free", p, kindMalloc, kindAsync)
	d.mu.Unlock()
	if err != nil {
		return err
	}
	if sp.kind == kindAsync {
		if r := d.lib.ctxSynchronize(); r != Success {
			d.record(sp)
			return fmt.Errorf("cuda: Free(%v): waiting for the device's work before freeing stream-ordered memory: %w", p, r)
		}
	}
	if r := d.lib.memFree(uint64(p)); r != Success {
		d.record(sp) // the free did not happen: the allocation stays live
		return fmt.Errorf("cuda: Free(%v): %w", p, r)
	}
	d.mu.Lock()
	d.freed.add(sp)
	d.mu.Unlock()
	return nil
}

// Synchronize waits for all work on the device (cuCtxSynchronize) and
// returns the first asynchronous error the context has recorded.
func (d *Device) Synchronize() error {
	if err := d.enter(); err != nil {
		return err
	}
	defer d.exit()
	if r := d.lib.ctxSynchronize(); r != Success {
		return fmt.Errorf("cuda: synchronize device %d: %w", d.p.ordinal, r)
	}
	return nil
}

// Reset resets the primary context (cuDevicePrimaryCtxReset): all device
// memory, streams, events, modules and virtual memory made before it, by
// this Device or any other on the same GPU in this process, are given
// back, and using them returns device.ErrInvalidated. Pinned host buffers
// keep their host memory (it is this package's own mapping) but are no
// longer pinned or mapped; HostFree them as usual. DefaultStream then
// returns a new default stream (the old Stream value returns
// device.ErrInvalidated). Reset waits for driver calls in flight on the
// device to return. Allocations made after a Reset pass over address
// ranges handed out before it (up to staleAvoidance tries each; see
// allocFresh), so that an old pointer keeps failing with
// device.ErrInvalidated rather than reaching new memory.
//
// The driver reference says a reset destroys all allocations; it does not
// say what becomes of the stream-ordered pool's reserved memory (it has
// been seen to survive one) or of virtual memory (physical memory belongs
// to the device, not the context). So Reset gives those back itself
// first: stream-ordered allocations are freed and the pool trimmed to
// nothing, and every mapping, physical memory handle and reservation the
// Devices recorded is unmapped, released and freed (giveBackLocked). On a
// context a kernel fault broke those calls fail, and what they held is left
// to the driver.
func (d *Device) Reset() error {
	if d.closed.Load() {
		return fmt.Errorf("cuda device %d: %w", d.p.ordinal, device.ErrClosed)
	}
	p := d.p
	p.mu.Lock()
	defer p.mu.Unlock()
	if d.closed.Load() {
		return fmt.Errorf("cuda device %d: %w", d.p.ordinal, device.ErrClosed)
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	l := d.lib
	if r := l.ctxSetCurrent(p.ctx); r == Success {
		// A sticky error from earlier work is a reason to reset, not a
		// reason to fail: the synchronize only lets work finish.
		l.ctxSynchronize()
	}
	// Lock order: p.mu, then primariesMu, then each Device's mu.
	primariesMu.Lock()
	for od := range p.devs {
		od.giveBackLocked()
	}
	primariesMu.Unlock()
	if p.pool != 0 {
		l.memPoolTrimTo(p.pool, 0)
	}
	if r := l.primaryCtxReset(p.dev); r != Success {
		return fmt.Errorf("cuda: reset device %d: cuDevicePrimaryCtxReset: %w", p.ordinal, r)
	}
	// The generation moves on even if re-activating fails below: the old
	// handles are gone either way, and so is the context a sticky error
	// broke.
	p.gen.Add(1)
	p.sticky.Store(0)
	if err := p.reactivate(l); err != nil {
		return err
	}
	d.mu.Lock()
	d.syncGenLocked()
	d.mu.Unlock()
	return nil
}

// reactivate makes the primary context active again after a reset, which
// leaves it retained but inactive (the driver refuses calls in it with
// CUDA_ERROR_CONTEXT_IS_DESTROYED): retaining it again activates it (and
// says its handle), then the extra reference is dropped. The default pool
// gets back the release threshold last set. Requires p.mu (write), on a
// locked thread.
func (p *primary) reactivate(l *lib) error {
	var ctx uintptr
	if r := l.primaryCtxRetain(&ctx, p.dev); r != Success {
		return fmt.Errorf("cuda: reset device %d: re-activating the primary context: %w", p.ordinal, r)
	}
	l.primaryCtxRelease(p.dev)
	if ctx != p.ctx {
		ctxOwners.CompareAndDelete(p.ctx, p)
		ctxOwners.Store(ctx, p)
		p.ctx = ctx
	}
	if r := l.ctxSetCurrent(ctx); r != Success {
		return fmt.Errorf("cuda: reset device %d: cuCtxSetCurrent: %w", p.ordinal, r)
	}
	if p.pool == 0 {
		return nil
	}
	var pool uintptr
	if r := l.deviceGetDefaultMemPool(&pool, p.dev); r != Success {
		return fmt.Errorf("cuda: reset device %d: cuDeviceGetDefaultMemPool: %w", p.ordinal, r)
	}
	p.pool = pool
	if t := p.threshold.Load(); t != 0 {
		if r := l.memPoolSetAttribute(pool, cuMemPoolAttrReleaseThreshold, &t); r != Success {
			return fmt.Errorf("cuda: reset device %d: restoring the pool's release threshold: %w", p.ordinal, r)
		}
	}
	return nil
}

// giveBackLocked gives the driver back, before a context reset, what d
// holds that the reset is not documented to free: pinned host
// registrations (one left behind would make a later registration at a
// reused address fail with CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED),
// stream-ordered allocations (their memory would stay in the pool) and
// virtual memory. The records stay: the generation's move makes them
// stale. What fails is not reported: the reset goes ahead. Requires p.mu
// (write), with the context current on the locked thread.
func (d *Device) giveBackLocked() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.syncGenLocked()
	for _, hb := range d.hostBuf {
		if !hb.stale {
			d.lib.memHostUnregister(hb.addr())
			hb.stale = true
		}
	}
	for _, sp := range d.live.all() {
		if sp.kind == kindAsync {
			d.lib.memFree(sp.base)
		}
	}
	d.releaseVMLocked()
}

// Generation is the primary context's generation (device.Generational):
// it moves on at every Reset by any Device on the same GPU in this
// process.
func (d *Device) Generation() uint64 { return d.p.gen.Load() }

// Close releases everything the Device made that is still held — device
// memory, pinned host buffers (their Data must not be used afterwards),
// streams, events and modules — and its hold on the primary context. Using
// the Device afterwards returns device.ErrClosed. Close waits for driver
// calls in flight on the device to return. A second Close returns
// device.ErrClosed.
func (d *Device) Close() error {
	if !d.closed.CompareAndSwap(false, true) {
		return fmt.Errorf("cuda device %d: %w", d.p.ordinal, device.ErrClosed)
	}
	p, l := d.p, d.lib
	p.mu.Lock()
	defer p.mu.Unlock()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var prev uintptr
	if l.ctxGetCurrent(&prev) == Success {
		defer l.ctxSetCurrent(prev) // the thread gets back what it had
	}
	var errs []error
	note := func(what string, r Result) {
		if r != Success {
			errs = append(errs, fmt.Errorf("cuda: close device %d: %s: %w", p.ordinal, what, r))
		}
	}
	note("cuCtxSetCurrent", l.ctxSetCurrent(p.ctx))
	note("cuCtxSynchronize", l.ctxSynchronize())
	d.mu.Lock()
	d.syncGenLocked()
	for m := range d.modules {
		note("cuModuleUnload", l.moduleUnload(m.h))
	}
	for e := range d.events {
		note("cuEventDestroy", l.eventDestroy(e.h))
	}
	for s := range d.streams {
		note("cuStreamDestroy", l.streamDestroy(s.h))
	}
	for _, sp := range d.live.all() {
		if sp.kind == kindMalloc || sp.kind == kindAsync {
			note("cuMemFree", l.memFree(sp.base))
		}
	}
	errs = append(errs, d.releaseVMLocked()...)
	d.vmr.res.clear()
	d.vmr.forget()
	for _, hb := range d.hostBuf {
		if !hb.stale {
			note("cuMemHostUnregister", l.memHostUnregister(hb.addr()))
		}
		if err := unmapHost(hb.mem); err != nil {
			errs = append(errs, err)
		}
	}
	clear(d.hostBuf)
	d.host.clear()
	d.hostFreed.clear()
	d.live.clear()
	d.stale.clear()
	d.freed.clear()
	clear(d.modules)
	clear(d.events)
	clear(d.streams)
	d.mu.Unlock()
	if err := releasePrimary(l, p, d); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}
