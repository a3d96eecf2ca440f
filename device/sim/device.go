package sim

// The device: memory accounting and the address index; the memory checker
// is memcheck.go.
//
// Accounting. MemInfo reports total = Config.TotalBytes and
//
//	free = total − context − Σ Malloc sizes rounded up to the granularity
//	             − bytes the async pool holds reserved
//
// Pinned host memory (mapped or not) takes nothing from the device.
//
// Index. Every allocation that has a device address — a Malloc, a mapped
// host buffer, a segment of the async pool — is a node of d.live, a treap
// keyed by start address whose span is the reserved length; a floor query
// finds the allocation an interior pointer falls in. Freed allocations
// leave a ghost in d.ghosts (memcheck.go). Addresses from earlier
// generations (before a Reset) and from other devices are recognised by
// region (see vaspace.go).

import (
	"fmt"
	"math"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/vramkit/vram/device"
	"github.com/vramkit/vram/internal/units"
)

var deviceIDs atomic.Uint64

var (
	_ device.Device         = (*Device)(nil)
	_ device.AsyncAllocator = (*Device)(nil)
	_ device.HostAllocator  = (*Device)(nil)
	_ device.FuncLauncher   = (*Device)(nil)
	_ device.StridedCopier  = (*Device)(nil)

	_ device.SubAllocationChecker = (*Device)(nil)
	_ device.Generational         = (*Device)(nil)
)

type recKind uint8

const (
	kMalloc recKind = iota + 1
	kMapped
	kSegment
	kPoolBlock // ghosts only
	kMarked    // a sub-allocation marked with MarkAllocated (marks.go)
	kVMMap     // a mapping of physical memory into a reservation (vmm.go)
)

func (k recKind) String() string {
	switch k {
	case kMalloc:
		return "Malloc"
	case kMapped:
		return "mapped host memory"
	case kSegment:
		return "async pool segment"
	case kPoolBlock:
		return "MallocAsync"
	case kMarked:
		return "marked block"
	case kVMMap:
		return "mapped virtual memory"
	}
	return "?"
}

// rec is a live allocation with a device address.
type rec struct {
	kind recKind
	size uint64   // requested bytes (segments: their size)
	id   uint64   // allocation number, counted from 1 per device
	mem  *backing // the bytes (nil when address-only)
	seg  *segment // kSegment
	// marks are the sub-allocations marked inside a Malloc (marks.go);
	// nil until the first MarkAllocated, so unmarked allocations cost
	// nothing.
	marks *marks
	vm    *vmMap // kVMMap
}

// backing holds an allocation's bytes, made on first access: memory that
// is allocated but never read or written costs no host memory, and Malloc
// stays cheap for allocations of any size. The bytes made count against
// Config.BackingLimit (Device.backed) until the allocation is freed.
// Safe for concurrent use: bytes runs under d.mu held for reading, the
// holder is reset or recycled only under d.mu held for writing.
type backing struct {
	made    atomic.Bool // b is set
	mu      sync.Mutex  // serializes making b
	n       uint64
	b       []byte
	counted bool // b counts against Device.backed
}

// bytes returns the allocation's bytes, making them on first access; nil
// on a nil backing. Past Config.BackingLimit it returns an error wrapping
// device.ErrOutOfMemory. Call with d.mu held (for reading at least).
func (m *backing) bytes(d *Device, op string) ([]byte, error) {
	if m == nil {
		return nil, nil
	}
	if m.made.Load() {
		return m.b, nil
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.made.Load() {
		return m.b, nil
	}
	lim := d.cfg.BackingLimit
	for {
		used := d.backed.Load()
		if m.n > lim || used > lim-m.n {
			return nil, fmt.Errorf("%v: %s: the allocation's %s of bytes are made on first access, and the host memory "+
				"backing device memory would pass its limit (%s in use of %s; Config.BackingLimit, spec backing=): "+
				"use a smaller granularity, backed=false for accounting only, or raise the limit: %w",
				d, op, units.Format(m.n), units.Format(used), units.Format(lim), device.ErrOutOfMemory)
		}
		if d.backed.CompareAndSwap(used, used+m.n) {
			break
		}
	}
	m.b = make([]byte, m.n)
	m.counted = true
	m.made.Store(true)
	return m.b, nil
}

// releaseLocked lets the bytes go and takes them off Device.backed. Call
// with d.mu held for writing.
func (m *backing) releaseLocked(d *Device) {
	if m == nil {
		return
	}
	if m.counted {
		d.backed.Add(-m.n)
	}
	m.b, m.counted = nil, false
	m.made.Store(false)
}

// spareMemCap bounds how many byte holders of freed Mallocs are kept.
const spareMemCap = 1024

// newBackingLocked returns a holder for the bytes of a Malloc of n bytes,
// reusing one of a freed Malloc if there is one: a steady stream of Malloc
// and Free allocates nothing but the bytes, and those only when used.
func (d *Device) newBackingLocked(n uint64) *backing {
	if k := len(d.spareMem); k > 0 {
		m := d.spareMem[k-1]
		d.spareMem = d.spareMem[:k-1]
		m.n = n
		return m
	}
	return &backing{n: n}
}

// recycleBackingLocked keeps the holder of a freed Malloc for reuse. No
// one holds it any more: accesses keep the byte slice, not the holder.
func (d *Device) recycleBackingLocked(m *backing) {
	if m == nil {
		return
	}
	m.releaseLocked(d) // let the bytes go now
	if len(d.spareMem) < spareMemCap {
		d.spareMem = append(d.spareMem, m)
	}
}

// preset is a backing over existing bytes (mapped host memory).
func preset(b []byte) *backing {
	m := &backing{n: uint64(len(b)), b: b}
	m.made.Store(true)
	return m
}

type hostRec struct {
	n   uint64
	ptr device.Ptr
	id  uint64
	mem []byte // the whole mapping (hostBufMap), for hostBufUnmap
}

// Device is a simulated GPU. It implements device.Device and every
// optional interface of package device except ModuleLoader:
// device.AsyncAllocator, device.HostAllocator, device.FuncLauncher,
// device.StridedCopier, device.SubAllocationChecker and
// device.VirtualMemory.
//
// A Device is safe for concurrent use.
type Device struct {
	id     uint64
	cfg    Config
	faults Faults
	closed atomic.Bool
	gen    atomic.Uint64 // generation, bumped by Reset
	stamp  atomic.Uint64 // issue stamps of launches and async frees
	backed atomic.Uint64 // host bytes made for backings of this generation (Config.BackingLimit)

	mu          sync.RWMutex // protects the fields below
	rg          region       // this generation's address region
	va          *vaSpace
	old         []region // regions of the last keepGenerations earlier generations, oldest first
	live        tree[rec]
	ghosts      tree[ghost] // freed allocations by (start of what is left, id); span: what is left
	ghostOrder  forgetQueue // which ghosts to forget first
	ghostCut    []ghostNode // scratch for cutGhostsLocked
	spareMem    []*backing  // byte holders of freed Mallocs, for reuse
	mallocBytes uint64      // reserved by Malloc, rounded to the granularity
	mallocReq   uint64      // requested by live Mallocs
	nMalloc     int
	host        map[*byte]hostRec  // live pinned buffers by first byte
	hostFreed   map[uintptr]uint64 // recently freed host buffers (first byte → id)
	hostFreedQ  []uintptr
	oldHost     map[uintptr][]byte // mappings of host buffers of earlier generations, by first byte, until their HostFree
	pinnedBytes uint64             // bytes of live pinned host buffers
	pinnedPeak  uint64             // the most pinnedBytes has been
	pool        pool
	vm          vmState // virtual memory (vmm.go)
	def         *stream
	streams     map[*stream]struct{} // streams made by NewStream, not closed
	// retired are streams being closed, or of an earlier generation,
	// whose goroutine may still run: Close waits for them too.
	retired    map[*stream]struct{}
	nextStream uint64
	events     int
	nextID     uint64

	// shared is the ledger of a shared device (Config.Shared; shared.go),
	// nil for a private one. Set in New; its use is protected by mu, and
	// Close closes it under mu's write lock.
	shared *ledger
	// sharedID is Info's ID (Config.sharedID), fixed at New.
	sharedID string

	actMu sync.Mutex // protects active; taken after a stream's mu, never before
	// active lists the streams (of any generation) with work enqueued and
	// not finished, each at its stream.actIdx, so that Free and HostFree
	// wait for those alone: their cost does not grow with idle streams.
	active []*stream
}

// activeScratch holds the slices quiesce copies active into.
var activeScratch = sync.Pool{New: func() any { return new([]*stream) }}

// Factory returns a function that makes a fresh simulated device of cfg
// on each call (New), as a device.Device: what a trace replay takes
// (trace.DeviceFactory), one device per replay.
func Factory(cfg Config) func() (device.Device, error) {
	return func() (device.Device, error) {
		d, err := New(cfg)
		if err != nil {
			return nil, err
		}
		return d, nil
	}
}

// New makes a simulated device. Zero fields of cfg take their defaults;
// invalid ones return an error wrapping device.ErrInvalidValue.
func New(cfg Config) (*Device, error) {
	c, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	d := &Device{id: deviceIDs.Add(1), cfg: c, retired: map[*stream]struct{}{}, sharedID: c.sharedID()}
	d.pool.threshold = c.ReleaseThreshold
	d.faults.dev = d
	rg, err := newRegion(c.TotalBytes, d.id, 0)
	if err != nil {
		return nil, err
	}
	if c.Shared != "" {
		if d.shared, err = openLedger(c); err != nil {
			releaseRegions(rg)
			return nil, err
		}
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.startGenLocked(rg)
	return d, nil
}

// startGenLocked sets up a fresh generation in address region rg:
// indexes, pool and default stream.
func (d *Device) startGenLocked(rg region) {
	d.rg = rg
	d.va = newVASpace(rg)
	d.live.clear()
	d.ghosts.clear()
	d.ghostOrder = forgetQueue{}
	d.mallocBytes, d.mallocReq, d.nMalloc = 0, 0, 0
	d.host = map[*byte]hostRec{}
	d.hostFreed = map[uintptr]uint64{}
	d.hostFreedQ = nil
	d.pinnedBytes = 0
	d.backed.Store(0) // the earlier generation's bytes go with its allocations
	d.vm = vmState{}
	d.pool = pool{threshold: d.pool.threshold} // a Reset keeps SetReleaseThreshold's value, as CUDA's binding does
	d.streams = map[*stream]struct{}{}
	d.events = 0
	d.def = d.newStreamLocked(true)
	if d.shared != nil {
		d.shared.setMine(d.cfg.ContextBytes) // everything else is gone
	}
}

// streamsLocked appends the default stream and every open stream to dst.
func (d *Device) streamsLocked(dst []*stream) []*stream {
	if d.def != nil {
		dst = append(dst, d.def)
	}
	for s := range d.streams {
		dst = append(dst, s)
	}
	return dst
}

// addActive lists s among the streams with unfinished work.
func (d *Device) addActive(s *stream) {
	d.actMu.Lock()
	s.actIdx = len(d.active)
	d.active = append(d.active, s)
	d.actMu.Unlock()
}

// removeActive takes s off the list of streams with unfinished work.
func (d *Device) removeActive(s *stream) {
	d.actMu.Lock()
	last := len(d.active) - 1
	moved := d.active[last]
	d.active[s.actIdx] = moved
	moved.actIdx = s.actIdx
	d.active[last] = nil
	d.active = d.active[:last]
	d.actMu.Unlock()
}

// Config returns the device's configuration with defaults filled in.
func (d *Device) Config() Config { return d.cfg }

// Faults returns the device's fault injector.
func (d *Device) Faults() *Faults { return &d.faults }

// String names the device, e.g. "sim#3 (8 GiB)", or "sim#3 (1 GiB,
// shared "jobs")" for a shared one.
func (d *Device) String() string {
	if d.cfg.Shared != "" {
		return fmt.Sprintf("sim#%d (%s, shared %q)", d.id, units.Format(d.cfg.TotalBytes), d.cfg.Shared)
	}
	return fmt.Sprintf("sim#%d (%s)", d.id, units.Format(d.cfg.TotalBytes))
}

// Info describes the device.
func (d *Device) Info() device.Info {
	return device.Info{
		Backend:      "sim",
		Name:         d.cfg.Name,
		Ordinal:      d.cfg.Ordinal,
		TotalBytes:   d.cfg.TotalBytes,
		ContextBytes: d.cfg.ContextBytes,
		Granularity:  d.cfg.Granularity,
		Driver:       "vram simulator 1",
		Backed:       !d.cfg.AddressOnly,
		ID:           d.sharedID,
	}
}

func (d *Device) errClosed(op string) error {
	return fmt.Errorf("%v: %s: device is closed: %w", d, op, device.ErrClosed)
}

// freeLocked is the device memory not reserved by anything: on a shared
// device, by any Device of it.
func (d *Device) freeLocked() uint64 {
	if d.shared != nil {
		return d.shared.free()
	}
	return d.cfg.TotalBytes - d.cfg.ContextBytes - d.mallocBytes - d.pool.reserved - d.vm.physBytes
}

// takeLocked decides whether n more bytes of device memory may be
// reserved; the caller then counts them (mallocBytes, pool.reserved,
// vm.physBytes). On a shared device the bytes are taken in the ledger,
// atomically against the other processes, and go back with giveLocked.
func (d *Device) takeLocked(n uint64) (bool, error) {
	if d.shared == nil {
		return n <= d.freeLocked(), nil
	}
	return d.shared.take(n)
}

// giveLocked returns n bytes reserved with takeLocked, once the caller
// has stopped counting them.
func (d *Device) giveLocked(n uint64) {
	if d.shared != nil {
		d.shared.give(n)
	}
}

// MemInfo reports free and total device memory as the driver does. On a
// shared device free is what no Device of it holds, in any process; a
// MemInfo at least sweepEvery after the last sweep drops the slots of
// dead processes first.
func (d *Device) MemInfo() (free, total uint64, err error) {
	if d.closed.Load() {
		return 0, 0, d.errClosed("meminfo")
	}
	d.mu.RLock()
	defer d.mu.RUnlock()
	if d.closed.Load() {
		return 0, 0, d.errClosed("meminfo")
	}
	if d.shared != nil {
		if err := d.shared.maybeSweep(); err != nil {
			return 0, 0, fmt.Errorf("%v: meminfo: %w", d, err)
		}
	}
	return d.freeLocked(), d.cfg.TotalBytes, nil
}

// oomLocked explains why n bytes (reserving need) do not fit.
func (d *Device) oomLocked(op string, n, need uint64) error {
	if need < n { // rounding n up to the granularity overflowed
		need = math.MaxUint64
	}
	others := ""
	if d.shared != nil {
		used, clients := d.shared.othersUsed()
		others = fmt.Sprintf("; other clients (%d) of shared device %q hold %s", clients, d.cfg.Shared, units.Format(used))
	}
	return fmt.Errorf("%v: %s %s: needs %s at %s granularity but only %s of %s is free "+
		"(context %s, Malloc %s, async pool %s reserved, physical memory %s%s): %w",
		d, op, units.Format(n), units.Format(need), units.Format(d.cfg.Granularity),
		units.Format(d.freeLocked()), units.Format(d.cfg.TotalBytes),
		units.Format(d.cfg.ContextBytes), units.Format(d.mallocBytes), units.Format(d.pool.reserved),
		units.Format(d.vm.physBytes), others, device.ErrOutOfMemory)
}

// notTakenLocked is the error of a takeLocked that failed (err) or found
// no room.
func (d *Device) notTakenLocked(op string, n, need uint64, err error) error {
	if err != nil {
		return fmt.Errorf("%v: %s %s: %w", d, op, units.Format(n), err)
	}
	return d.oomLocked(op, n, need)
}

// Malloc allocates n > 0 bytes. It reserves n rounded up to the
// granularity, and the address is aligned to the granularity.
func (d *Device) Malloc(n uint64) (device.Ptr, error) {
	if d.closed.Load() {
		return 0, d.errClosed("malloc")
	}
	if n == 0 {
		return 0, fmt.Errorf("%v: malloc of 0 bytes: the size must be > 0: %w", d, device.ErrInvalidValue)
	}
	if err := d.faults.check(OpAlloc, "malloc", n); err != nil {
		return 0, err
	}
	need, ok := units.RoundUp(n, d.cfg.Granularity)
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed.Load() {
		return 0, d.errClosed("malloc")
	}
	if !ok {
		return 0, d.oomLocked("malloc", n, need)
	}
	if taken, err := d.takeLocked(need); err != nil || !taken {
		return 0, d.notTakenLocked("malloc", n, need, err)
	}
	a, ok := d.va.alloc(need)
	if !ok {
		d.giveLocked(need)
		return 0, fmt.Errorf("%v: malloc %s: address space exhausted: %w", d, units.Format(n), device.ErrOutOfMemory)
	}
	var mem *backing
	if !d.cfg.AddressOnly {
		mem = d.newBackingLocked(n)
	}
	d.nextID++
	d.live.insert(a, 0, need, rec{kind: kMalloc, size: n, id: d.nextID, mem: mem})
	d.dropGhostsLocked(a, need)
	d.mallocBytes += need
	d.mallocReq += n
	d.nMalloc++
	return device.Ptr(a), nil
}

// Free releases a pointer from Malloc (or, synchronously, one from
// MallocAsync). Like cuMemFree it first waits for all work enqueued on the
// device's streams.
func (d *Device) Free(p device.Ptr) error {
	if d.closed.Load() {
		return d.errClosed("free")
	}
	if err := d.faults.check(OpFree, "free", 0); err != nil {
		return err
	}
	d.quiesce()
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed.Load() {
		return d.errClosed("free")
	}
	a := uint64(p)
	nd := d.live.get(a, 0)
	if nd == nil || nd.v.kind != kMalloc {
		if b := d.pool.usedBlockAt(d, a); b != nil {
			d.addGhostLocked(a, ghost{size: b.req, id: b.id, kind: kPoolBlock, stamp: d.stamp.Add(1)})
			d.pool.freeLocked(nil, b)
			d.pool.promoteLocked()
			return nil
		}
		return d.badFreeLocked(p, "free")
	}
	r, span := nd.v, nd.span
	d.live.remove(a, 0)
	d.va.release(a, span)
	d.addGhostLocked(a, ghost{size: r.size, id: r.id, kind: kMalloc})
	d.recycleBackingLocked(r.mem)
	d.mallocBytes -= span
	d.mallocReq -= r.size
	d.nMalloc--
	d.giveLocked(span)
	return nil
}

// quiesce waits until every stream has finished the work enqueued so far.
// It reports no errors: they stay for the streams' Synchronize.
// Only streams with unfinished work are looked at: push lists a stream in
// d.active before it returns, and its goroutine takes it off only once
// everything enqueued has finished.
func (d *Device) quiesce() {
	buf := activeScratch.Get().(*[]*stream)
	d.actMu.Lock()
	l := append((*buf)[:0], d.active...)
	d.actMu.Unlock()
	for _, s := range l {
		s.waitFor(s.enq.Load())
	}
	clear(l)
	*buf = l[:0]
	activeScratch.Put(buf)
}

// Synchronize waits for all work on all streams of the device and returns
// the errors that work raised and that no Synchronize has reported yet.
// As a synchronization point it lets the async pool release memory above
// its release threshold.
func (d *Device) Synchronize() error {
	if d.closed.Load() {
		return d.errClosed("synchronize")
	}
	if err := d.faults.check(OpSync, "synchronize", 0); err != nil {
		return err
	}
	d.mu.RLock()
	all := d.streamsLocked(nil)
	d.mu.RUnlock()
	var errs []error
	for _, s := range all {
		s.waitFor(s.enq.Load())
		if err := s.takeErr(); err != nil {
			errs = append(errs, err)
		}
	}
	d.syncPoint()
	return joinErrs(errs)
}

func joinErrs(errs []error) error {
	switch len(errs) {
	case 0:
		return nil
	case 1:
		return errs[0]
	}
	return fmt.Errorf("%w (and %d more stream errors)", errs[0], len(errs)-1)
}

// syncPoint runs the async pool's work at a synchronization point.
func (d *Device) syncPoint() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.pool.promoteLocked()
	d.pool.releaseLocked(d, d.pool.threshold)
}

// Reset destroys the context's state, like cuDevicePrimaryCtxReset:
// all memory is freed, work still queued is dropped, and every pointer,
// stream and event made before it returns an error wrapping
// device.ErrInvalidated afterwards. Work already running (a copy or a
// kernel) runs to its end, and a kernel's device accesses from then on
// fail; Reset returns only once it has ended, so no work from before the
// reset reads or writes host memory after Reset returns. (So a kernel
// must not call Reset, nor wait for something done after Reset.) The
// device stays open, with a new default stream; fault injection settings
// are kept.
func (d *Device) Reset() error {
	if d.closed.Load() {
		return d.errClosed("reset")
	}
	d.mu.Lock()
	if d.closed.Load() {
		d.mu.Unlock()
		return d.errClosed("reset")
	}
	rg, err := newRegion(d.cfg.TotalBytes, d.id, d.gen.Load()+1)
	if err != nil {
		d.mu.Unlock()
		return fmt.Errorf("%v: reset: %w", d, err)
	}
	old := d.streamsLocked(make([]*stream, 0, len(d.streams)+1))
	for k, h := range d.host {
		d.oldHostAdd(k, h.mem)
	}
	d.old = append(d.old, d.rg)
	if len(d.old) > keepGenerations {
		releaseRegions(d.old[0])
		d.old = slices.Delete(d.old, 0, 1)
	}
	vmHosts := d.vmHostsLocked()
	d.gen.Add(1)
	d.startGenLocked(rg)
	// Old streams drop their queues; one may still be running an
	// operation (a copy into a host buffer, a kernel), which is waited for
	// without the lock (a kernel's accesses take it). Meanwhile they are
	// retired, so a concurrent Close waits for them too.
	for _, s := range old {
		d.retired[s] = struct{}{}
		s.halt(true)
	}
	d.mu.Unlock()
	for _, s := range old {
		s.join()
	}
	releaseVMHosts(vmHosts) // no work from before the reset runs any more
	d.mu.Lock()
	for _, s := range old {
		delete(d.retired, s)
	}
	d.mu.Unlock()
	return nil
}

// Generation counts the device's Resets (device.Generational): 0 until
// the first.
func (d *Device) Generation() uint64 { return d.gen.Load() }

func (d *Device) oldHostAdd(k *byte, mem []byte) {
	if d.oldHost == nil {
		d.oldHost = map[uintptr][]byte{}
	}
	d.oldHost[addrOf(k)] = mem
}

// Close waits for the work on every stream, then releases everything.
// Afterwards every method returns an error wrapping device.ErrClosed.
//
// If memory was still allocated (Malloc, MallocAsync or pinned host
// buffers), Close still releases it and returns a *LeakError (matching
// ErrLeak) whose report lists it; streams and events left open are listed
// in the report but are not an error. Pinned host buffers not freed,
// this generation's or an earlier one's, are unmapped as the CUDA
// backend's are: their Data must not be used after Close. Closing twice
// returns ErrClosed.
func (d *Device) Close() error {
	// Closed is set under d.mu, where NewStream and Reset check it before
	// they start a stream, so the streams listed here are all there will
	// ever be.
	d.mu.Lock()
	if !d.closed.CompareAndSwap(false, true) {
		d.mu.Unlock()
		return d.errClosed("close")
	}
	streams := d.streamsLocked(nil)
	for s := range d.retired {
		streams = append(streams, s)
	}
	d.mu.Unlock()
	// Let queued work finish first; it may still use the memory.
	for _, s := range streams {
		s.halt(false)
	}
	for _, s := range streams {
		s.join()
	}
	d.mu.Lock()
	clear(d.retired)
	rep := d.leaksLocked()
	d.live.clear()
	d.ghosts.clear()
	for _, h := range d.host {
		hostBufUnmap(h.mem)
	}
	for _, mem := range d.oldHost {
		hostBufUnmap(mem)
	}
	d.host, d.oldHost, d.pinnedBytes = nil, nil, 0
	d.pool = pool{}
	releaseVMHosts(d.vmHostsLocked())
	d.vm = vmState{}
	d.mallocBytes, d.mallocReq, d.nMalloc = 0, 0, 0
	d.backed.Store(0)
	d.streams = map[*stream]struct{}{}
	releaseRegions(append(d.old, d.rg)...)
	d.old = nil
	if d.shared != nil {
		d.shared.close() // the slot goes, and with it all this Device held
	}
	d.mu.Unlock()
	if rep.leaksMemory() {
		return &LeakError{Device: d.String(), Report: rep}
	}
	return nil
}
