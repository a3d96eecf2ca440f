package sim

// Virtual memory management (device.VirtualMemory), as CUDA's
// cuMemAddressReserve / cuMemCreate / cuMemMap / cuMemSetAccess /
// cuMemUnmap / cuMemRelease / cuMemAddressFree.
//
// Accounting. Reserved address space takes no device memory; it comes out
// of the generation's address region (vaspace.go) like a Malloc's
// addresses. Physical memory is taken from MemInfo's free memory by
// CreatePhysical and given back when its handle has been released and its
// last mapping removed, so MemInfo counts every mapped page (and pages made
// but not mapped yet). VMUsage reports the three figures apart.
//
// Checking. Each mapping is a node of d.live (kind kVMMap) spanning the
// mapped bytes, so the memory checker finds it like any allocation. An
// access must lie in mapped pages of one reservation with access granted
// (SetAccess); it may run across adjacent mappings. An access to an
// unmapped page fails with device.ErrUseAfterFree where a mapping was
// removed there (its ghost), else device.ErrOutOfBounds (running off the
// mapped pages) or device.ErrInvalidPointer (reserved, never mapped).
//
// Bytes (backed devices). A reservation's bytes are one host mapping of
// its whole length that takes host RAM only where touched (mmap with
// MAP_NORESERVE on Linux), made on the first access, so an access across
// mappings is one slice. A mapping's pages count against
// Config.BackingLimit from its first access until it is unmapped; unmapping
// gives the host RAM back. A handle unmapped before it is released keeps
// its bytes and shows them again where it is mapped next, as on CUDA; a
// handle released first (what an allocator that is done with the memory
// does) costs no copy.

import (
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/vramkit/vram/device"
	"github.com/vramkit/vram/internal/units"
)

var _ device.VirtualMemory = (*Device)(nil)
var _ device.PoolSegmenter = (*Device)(nil)

// vmState is a generation's virtual memory. Protected by Device.mu.
type vmState struct {
	res       tree[*vmRes]                // reservations by start; span: length
	phys      map[device.PhysMem]*physMem // handles alive: not yet both released and unmapped
	nextPhys  uint64
	physBytes uint64 // bytes of the handles in phys (counted in MemInfo)
	resBytes  uint64 // reserved address space
	mapped    uint64 // bytes mapped
	maps      uint64 // Map calls that succeeded, this generation
	unmaps    uint64 // Unmap calls that succeeded, this generation
}

// vmRes is a reservation.
type vmRes struct {
	start, n uint64
	mapped   uint64 // bytes mapped in it; protected by Device.mu

	mu   sync.Mutex // serializes making host
	made atomic.Bool
	host []byte // backed devices: the bytes of the whole range, made on first access
}

// physMem is a physical memory handle.
type physMem struct {
	h        device.PhysMem // its handle, its key in vmState.phys
	n        uint64
	released bool
	maps     int    // mappings of it
	saved    []byte // its bytes while unmapped and not released (backed devices, once written)
}

// vmMap is the record of one mapping (rec.vm).
type vmMap struct {
	res     *vmRes
	ph      *physMem
	access  bool        // SetAccess granted; protected by Device.mu
	touched atomic.Bool // its bytes count against Device.backed
}

// VMUsage reports a simulated device's virtual memory: bytes reserved,
// bytes of physical memory alive (as MemInfo counts them), bytes mapped,
// and the Map and Unmap calls that succeeded since the last Reset.
type VMUsage struct {
	Reserved, Physical, Mapped uint64
	Maps, Unmaps               uint64
}

// VMUsage reports the device's virtual memory now.
func (d *Device) VMUsage() VMUsage {
	d.mu.RLock()
	defer d.mu.RUnlock()
	v := &d.vm
	return VMUsage{Reserved: v.resBytes, Physical: v.physBytes, Mapped: v.mapped, Maps: v.maps, Unmaps: v.unmaps}
}

// VMGranularity is the device's granularity (device.VirtualMemory).
func (d *Device) VMGranularity() uint64 { return d.cfg.Granularity }

// checkVMArgs checks that p (unless zero is allowed) and n are non-zero
// multiples of the granularity.
func (d *Device) checkVMArgs(op string, p device.Ptr, n uint64, needPtr bool) error {
	if d.closed.Load() {
		return d.errClosed(op)
	}
	g := d.cfg.Granularity
	if n == 0 || n%g != 0 || uint64(p)%g != 0 || (needPtr && p == 0) {
		return fmt.Errorf("%v: %s of %d bytes at %v: the address and size must be non-zero multiples of the granularity, %s: %w",
			d, op, n, p, units.Format(g), device.ErrInvalidValue)
	}
	return nil
}

// ReserveAddress reserves n bytes of address space (device.VirtualMemory).
func (d *Device) ReserveAddress(n uint64) (device.Ptr, error) {
	const op = "reserve address"
	if err := d.checkVMArgs(op, 0, n, false); err != nil {
		return 0, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed.Load() {
		return 0, d.errClosed(op)
	}
	a, ok := d.va.alloc(n)
	if !ok {
		return 0, fmt.Errorf("%v: %s of %s: the device's address space is exhausted (%s reserved): %w",
			d, op, units.Format(n), units.Format(d.vm.resBytes), device.ErrOutOfMemory)
	}
	d.vm.res.insert(a, 0, n, &vmRes{start: a, n: n})
	d.vm.resBytes += n
	return device.Ptr(a), nil
}

// FreeAddress gives back a reservation (device.VirtualMemory). It first
// waits for the work enqueued on every stream, as a Free does.
func (d *Device) FreeAddress(p device.Ptr, n uint64) error {
	const op = "free address"
	if err := d.checkVMArgs(op, p, n, true); err != nil {
		return err
	}
	d.quiesce()
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed.Load() {
		return d.errClosed(op)
	}
	nd := d.vm.res.get(uint64(p), 0)
	if nd == nil || nd.span != n {
		return d.vmMissLocked(op, p, n, "no reservation of that start and size")
	}
	r := nd.v
	if r.mapped > 0 {
		return fmt.Errorf("%v: %s of %s at %v: %s is still mapped in it; unmap it first: %w",
			d, op, units.Format(n), p, units.Format(r.mapped), device.ErrInvalidValue)
	}
	d.vm.res.remove(r.start, 0)
	d.va.release(r.start, r.n)
	d.vm.resBytes -= r.n
	if r.made.Load() {
		vmHostUnmap(r.host) // no access holds it: nothing is mapped and all work is done
		r.host = nil
	}
	return nil
}

// vmMissLocked explains an address in none of this generation's
// reservations or mappings: one from before a device reset
// (device.ErrInvalidated), or what was wanted there (ErrInvalidValue).
func (d *Device) vmMissLocked(op string, p device.Ptr, n uint64, what string) error {
	if r, _, ok := regionOf(uint64(p)); ok && r.dev == d.id && r.gen != d.gen.Load() {
		return fmt.Errorf("%v: %s of %s at %v: the address was reserved before a device reset (generation %d, now %d): %w",
			d, op, units.Format(n), p, r.gen, d.gen.Load(), device.ErrInvalidated)
	}
	return fmt.Errorf("%v: %s of %s at %v: %s: %w", d, op, units.Format(n), p, what, device.ErrInvalidValue)
}

// handleGen tags handles with the generation that made them.
func (d *Device) physHandle(seq uint64) device.PhysMem {
	return device.PhysMem((d.gen.Load()+1)<<40 | seq)
}

// physLocked finds a live handle.
func (d *Device) physLocked(op string, h device.PhysMem) (*physMem, error) {
	if ph := d.vm.phys[h]; ph != nil && !ph.released {
		return ph, nil
	}
	if g := uint64(h) >> 40; g != 0 && g != d.gen.Load()+1 {
		return nil, fmt.Errorf("%v: %s: physical memory handle %#x was made before a device reset: %w",
			d, op, uint64(h), device.ErrInvalidated)
	}
	if ph := d.vm.phys[h]; ph != nil {
		return nil, fmt.Errorf("%v: %s: physical memory handle %#x has been released: %w", d, op, uint64(h), device.ErrDoubleFree)
	}
	return nil, fmt.Errorf("%v: %s: %#x is not a live physical memory handle of this device: %w",
		d, op, uint64(h), device.ErrInvalidValue)
}

// CreatePhysical makes n bytes of physical memory (device.VirtualMemory).
// Fault injection counts it as an allocation (OOMAtAlloc, OOMAbove).
func (d *Device) CreatePhysical(n uint64) (device.PhysMem, error) {
	const op = "create physical memory"
	if err := d.checkVMArgs(op, 0, n, false); err != nil {
		return 0, err
	}
	if err := d.faults.check(OpAlloc, op, n); err != nil {
		return 0, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed.Load() {
		return 0, d.errClosed(op)
	}
	if taken, err := d.takeLocked(n); err != nil || !taken {
		return 0, d.notTakenLocked(op, n, n, err)
	}
	if d.vm.phys == nil {
		d.vm.phys = map[device.PhysMem]*physMem{}
	}
	d.vm.nextPhys++
	h := d.physHandle(d.vm.nextPhys)
	d.vm.phys[h] = &physMem{h: h, n: n}
	d.vm.physBytes += n
	return h, nil
}

// ReleasePhysical lets a handle go (device.VirtualMemory); its memory
// returns to the device once it is mapped nowhere.
func (d *Device) ReleasePhysical(h device.PhysMem) error {
	const op = "release physical memory"
	if d.closed.Load() {
		return d.errClosed(op)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	ph, err := d.physLocked(op, h)
	if err != nil {
		return err
	}
	ph.released, ph.saved = true, nil
	if ph.maps == 0 {
		d.dropPhysLocked(ph)
	}
	return nil
}

// dropPhysLocked forgets handle ph, released and mapped nowhere, and gives
// its memory back.
func (d *Device) dropPhysLocked(ph *physMem) {
	delete(d.vm.phys, ph.h)
	d.vm.physBytes -= ph.n
	d.giveLocked(ph.n)
}

// Map maps the whole of h at p (device.VirtualMemory). FailMapAt can make
// it fail.
func (d *Device) Map(p device.Ptr, n uint64, h device.PhysMem) error {
	const op = "map"
	if err := d.checkVMArgs(op, p, n, true); err != nil {
		return err
	}
	if err := d.faults.check(OpMap, op, n); err != nil {
		return err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed.Load() {
		return d.errClosed(op)
	}
	ph, err := d.physLocked(op, h)
	if err != nil {
		return err
	}
	a := uint64(p)
	if n != ph.n {
		return fmt.Errorf("%v: %s of %s at %v: handle %#x holds %s; map it whole: %w",
			d, op, units.Format(n), p, uint64(h), units.Format(ph.n), device.ErrInvalidValue)
	}
	rn := d.vm.res.floor(a, 0)
	if rn == nil || a+n > rn.k1+rn.span {
		return d.vmMissLocked(op, p, n, "the range is not inside one reservation")
	}
	if o := d.live.floor(a+n-1, 0); o != nil && o.k1+o.span > a {
		return fmt.Errorf("%v: %s of %s at %v: 0x%x is already mapped: %w",
			d, op, units.Format(n), p, max(o.k1, a), device.ErrInvalidValue)
	}
	vm := &vmMap{res: rn.v, ph: ph}
	if ph.saved != nil {
		host, err := rn.v.hostBytes(d, op)
		if err == nil {
			err = d.touch(vm, n, op)
		}
		if err != nil {
			return err
		}
		copy(host[a-rn.k1:], ph.saved)
		ph.saved = nil
	}
	d.nextID++
	d.live.insert(a, 0, n, rec{kind: kVMMap, size: n, id: d.nextID, vm: vm})
	d.dropGhostsLocked(a, n)
	ph.maps++
	rn.v.mapped += n
	d.vm.mapped += n
	d.vm.maps++
	return nil
}

// Unmap removes one mapping (device.VirtualMemory). It does not wait for
// work in flight.
func (d *Device) Unmap(p device.Ptr, n uint64) error {
	const op = "unmap"
	if err := d.checkVMArgs(op, p, n, true); err != nil {
		return err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed.Load() {
		return d.errClosed(op)
	}
	a := uint64(p)
	nd := d.live.get(a, 0)
	if nd == nil || nd.v.kind != kVMMap {
		return d.vmMissLocked(op, p, n, "no mapping starts there")
	}
	if nd.span != n {
		return fmt.Errorf("%v: %s of %s at %v: the mapping there is %s; unmap it whole: %w",
			d, op, units.Format(n), p, units.Format(nd.span), device.ErrInvalidValue)
	}
	r := nd.v
	vm := r.vm
	if vm.touched.Load() && vm.res.made.Load() {
		off := a - vm.res.start
		b := vm.res.host[off : off+n]
		if !vm.ph.released {
			vm.ph.saved = append([]byte(nil), b...)
		}
		vmHostDrop(b)
		d.backed.Add(-n)
	}
	d.live.remove(a, 0)
	d.addGhostLocked(a, ghost{size: n, id: r.id, kind: kVMMap})
	vm.ph.maps--
	vm.res.mapped -= n
	d.vm.mapped -= n
	d.vm.unmaps++
	if vm.ph.released && vm.ph.maps == 0 { // released while mapped: its last mapping frees it
		d.dropPhysLocked(vm.ph)
	}
	return nil
}

// SetAccess grants read and write access to mapped pages
// (device.VirtualMemory).
func (d *Device) SetAccess(p device.Ptr, n uint64) error {
	const op = "set access"
	if err := d.checkVMArgs(op, p, n, true); err != nil {
		return err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed.Load() {
		return d.errClosed(op)
	}
	a, end := uint64(p), uint64(p)+n
	var maps []*vmMap
	for at := a; at < end; {
		nd := d.live.floor(at, 0)
		if nd == nil || nd.v.kind != kVMMap || at >= nd.k1+nd.span {
			return d.vmMissLocked(op, p, n, fmt.Sprintf("0x%x is not mapped", at))
		}
		maps = append(maps, nd.v.vm)
		at = nd.k1 + nd.span
	}
	for _, m := range maps {
		m.access = true
	}
	return nil
}

// hostBytes returns the reservation's bytes, mapping them on first use;
// nil on an address-only device. Call with d.mu held (for reading at
// least).
func (r *vmRes) hostBytes(d *Device, op string) ([]byte, error) {
	if d.cfg.AddressOnly {
		return nil, nil
	}
	if r.made.Load() {
		return r.host, nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.made.Load() {
		b, err := vmHostMap(r.n)
		if err != nil {
			return nil, fmt.Errorf("%v: %s: cannot map %s of host memory for a reservation: %v: %w",
				d, op, units.Format(r.n), err, device.ErrOutOfMemory)
		}
		r.host = b
		r.made.Store(true)
	}
	return r.host, nil
}

// touch counts a mapping's n bytes against Config.BackingLimit on its
// first access. Call with d.mu held (for reading at least).
func (d *Device) touch(m *vmMap, n uint64, op string) error {
	if d.cfg.AddressOnly || m.touched.Load() {
		return nil
	}
	lim := d.cfg.BackingLimit
	for {
		used := d.backed.Load()
		if n > lim || used > lim-n {
			return fmt.Errorf("%v: %s: the host memory backing device memory would pass its limit "+
				"(%s in use of %s; Config.BackingLimit, spec backing=): %w",
				d, op, units.Format(used), units.Format(lim), device.ErrOutOfMemory)
		}
		if d.backed.CompareAndSwap(used, used+n) {
			break
		}
	}
	if !m.touched.CompareAndSwap(false, true) { // another access counted it first
		d.backed.Add(-n)
	}
	return nil
}

// resolveVMLocked checks an access of n bytes at p, which falls in mapping
// nd, and returns the reservation's bytes and start (nil on an
// address-only device).
func (d *Device) resolveVMLocked(op string, p device.Ptr, n uint64, nd *tnode[rec]) ([]byte, uint64, error) {
	a := uint64(p)
	end := a + n
	res := nd.v.vm.res
	host, err := res.hostBytes(d, op) // before any page counts as touched
	if err != nil {
		return nil, 0, err
	}
	for cur := nd; ; {
		if !cur.v.vm.access {
			return nil, 0, fmt.Errorf("%v: %s of %s at %v: the memory mapped at 0x%x has no access granted (SetAccess): %w",
				d, op, units.Format(n), p, cur.k1, device.ErrInvalidPointer)
		}
		if err := d.touch(cur.v.vm, cur.span, op); err != nil {
			return nil, 0, err
		}
		next := cur.k1 + cur.span
		if end <= next {
			break
		}
		cur = d.live.get(next, 0)
		if cur == nil || cur.v.kind != kVMMap || cur.v.vm.res != res {
			if g := d.ghostHoldingLocked(next); g != nil {
				return nil, 0, d.uafErr(op, p, n, g)
			}
			return nil, 0, fmt.Errorf("%v: %s of %s at %v: the access runs past the mapped pages at 0x%x: %w",
				d, op, units.Format(n), p, next, device.ErrOutOfBounds)
		}
	}
	return host, res.start, nil
}

// reservedUnmappedErr reports an access to reserved address space with no
// memory mapped, or returns nil when a lies in no reservation.
func (d *Device) reservedUnmappedErr(op string, p device.Ptr, n uint64) error {
	a := uint64(p)
	if r := d.vm.res.floor(a, 0); r != nil && a < r.k1+r.span {
		return fmt.Errorf("%v: %s of %s at %v: reserved address space (%s at 0x%x) with nothing mapped there: %w",
			d, op, units.Format(n), p, units.Format(r.span), r.k1, device.ErrInvalidPointer)
	}
	return nil
}

// vmHostsLocked lists the host bytes of the generation's reservations, to
// give back with releaseVMHosts once no work can use them (Reset, Close).
func (d *Device) vmHostsLocked() [][]byte {
	var hosts [][]byte
	d.vm.res.each(func(n *tnode[*vmRes]) bool {
		if n.v.made.Load() {
			hosts = append(hosts, n.v.host)
		}
		return true
	})
	return hosts
}

// releaseVMHosts gives back host bytes listed by vmHostsLocked.
func releaseVMHosts(hosts [][]byte) {
	for _, b := range hosts {
		vmHostUnmap(b)
	}
}
