package cuda

// Virtual memory management (device.VirtualMemory): cuMemAddressReserve,
// cuMemAddressFree, cuMemCreate, cuMemRelease, cuMemMap, cuMemUnmap,
// cuMemSetAccess and cuMemGetAllocationGranularity (CUDA 10.2 and newer).
//
// Physical memory is pinned device memory of this device (CUmemAllocationProp
// with CU_MEM_ALLOCATION_TYPE_PINNED at CU_MEM_LOCATION_TYPE_DEVICE, no
// shareable handle); access is read and write for this device alone.
//
// Records. An access is checked against the allocation records (spans.go)
// before the driver sees it, as for Malloc. Mapped memory is recorded once
// access is granted, one span (kindVM) per run of adjacent accessible
// mappings, so that a copy may run across the mappings an expandable
// allocator makes; Unmap cuts the mapping out of its span, and the part cut
// out is remembered as freed (an access there is ErrUseAfterFree). A range
// reserved but not mapped is in no span: an access there is refused with
// ErrInvalidPointer, never sent to the GPU.
//
// The Device also records what it made (vmRecords): reservations, mappings
// and physical memory handles. With them it refuses what the driver
// reference does not promise to refuse — freeing a reservation with
// mappings in it (the driver may succeed and leak them), mapping over a
// mapping — and gives everything back at Close and before a Reset, which
// is not documented to free virtual memory (physical memory belongs to the
// device, not the context). After a Reset every reservation, mapping and
// handle from before it is refused with device.ErrInvalidated: the handles
// vram gives out (device.PhysMem) are its own numbers, tagged with the
// generation that made them, never the driver's, which a new generation
// may hand out again; reservations from before it are kept with the other
// stale ranges, and new ones pass over them (allocFresh).
//
// Reservations are aligned to the granularity (cuMemAddressReserve's
// alignment argument): the reference leaves the default alignment (0) to
// the driver, and a mapping must start on a granule.

import (
	"fmt"
	"sync"
	"unsafe"

	"github.com/vramkit/vram/device"
	"github.com/vramkit/vram/internal/units"
)

var _ device.VirtualMemory = (*Device)(nil)

// Constants from cuda.h for virtual memory management.
const (
	cuDevAttrVirtualMemoryManagementSupported = 102 // CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED
	cuMemAllocationTypePinned                 = 1   // CU_MEM_ALLOCATION_TYPE_PINNED
	cuMemLocationTypeDevice                   = 1   // CU_MEM_LOCATION_TYPE_DEVICE
	cuMemAllocGranularityMinimum              = 0   // CU_MEM_ALLOC_GRANULARITY_MINIMUM
	cuMemAccessFlagsProtReadWrite             = 3   // CU_MEM_ACCESS_FLAGS_PROT_READWRITE
)

// memLocation is CUmemLocation: a 32-bit enum and a 32-bit id.
type memLocation struct {
	typ int32
	id  int32
}

// memAllocationProp is CUmemAllocationProp on a 64-bit system: type,
// requestedHandleTypes, location (8 bytes), win32HandleMetaData (a
// pointer), allocFlags (compressionType, gpuDirectRDMACapable: 1 byte
// each; usage: 2 bytes; 4 reserved bytes). 32 bytes; TestVMLayouts checks
// the offsets and the fake driver, compiled from a C declaration, reads it.
type memAllocationProp struct {
	typ                  int32
	requestedHandleTypes int32
	location             memLocation
	win32HandleMetaData  uintptr
	compressionType      uint8
	gpuDirectRDMACapable uint8
	usage                uint16
	reserved             [4]uint8
}

// memAccessDesc is CUmemAccessDesc: a location and 32-bit flags, 12 bytes.
type memAccessDesc struct {
	location memLocation
	flags    int32
}

func (l *lib) memAddressReserve(p *uint64, n, align, addr uint64) Result {
	return l.call(symMemAddressReserve, uintptr(unsafe.Pointer(p)), uintptr(n), uintptr(align), uintptr(addr), 0)
}

func (l *lib) memAddressFree(p, n uint64) Result {
	return l.call(symMemAddressFree, uintptr(p), uintptr(n))
}

func (l *lib) memCreate(h *uint64, n uint64, prop *memAllocationProp) Result {
	return l.call(symMemCreate, uintptr(unsafe.Pointer(h)), uintptr(n), uintptr(unsafe.Pointer(prop)), 0)
}

func (l *lib) memRelease(h uint64) Result { return l.call(symMemRelease, uintptr(h)) }

func (l *lib) memMap(p, n, off, h uint64) Result {
	return l.call(symMemMap, uintptr(p), uintptr(n), uintptr(off), uintptr(h), 0)
}

func (l *lib) memUnmap(p, n uint64) Result { return l.call(symMemUnmap, uintptr(p), uintptr(n)) }

func (l *lib) memSetAccess(p, n uint64, desc *memAccessDesc) Result {
	return l.call(symMemSetAccess, uintptr(p), uintptr(n), uintptr(unsafe.Pointer(desc)), 1)
}

func (l *lib) memGetAllocationGranularity(g *uint64, prop *memAllocationProp, option int) Result {
	return l.call(symMemGetAllocationGranularity, uintptr(unsafe.Pointer(g)), uintptr(unsafe.Pointer(prop)), uintptr(option))
}

// vmInfo is what the device says about virtual memory, asked once.
type vmInfo struct {
	once        sync.Once
	supported   bool
	granularity uint64
	err         error // why virtual memory cannot be used here
}

// vmRecords is the virtual memory a Device has made and not given back.
// Protected by Device.mu; syncGenLocked moves the reservations of an
// earlier generation to the stale ranges and forgets the rest.
type vmRecords struct {
	res  spanSet                   // reservations (kindReserved)
	maps spanSet                   // mappings (kindMapping), one span per Map
	phys map[device.PhysMem]vmPhys // handles not yet released, by vram's handle
	seq  uint64                    // handles made: the number of the last
}

// vmPhys is physical memory from cuMemCreate.
type vmPhys struct {
	h uint64 // CUmemGenericAllocationHandle
	n uint64 // bytes
}

// forget drops every record (after a Reset or Close).
func (r *vmRecords) forget() {
	r.maps.clear()
	clear(r.phys)
}

// prop is the allocation properties of this device's physical memory.
func (d *Device) prop() memAllocationProp {
	return memAllocationProp{typ: cuMemAllocationTypePinned, location: memLocation{typ: cuMemLocationTypeDevice, id: d.p.dev}}
}

// vmReady asks the device, once, whether it supports virtual memory
// management and at what granularity. Requires enter.
func (d *Device) vmReady() error {
	d.vm.once.Do(func() {
		var ok int32
		if r := d.lib.deviceGetAttribute(&ok, cuDevAttrVirtualMemoryManagementSupported, d.p.dev); r != Success || ok == 0 {
			d.vm.err = fmt.Errorf("cuda device %d: virtual memory management is not supported (CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED): %w",
				d.p.ordinal, device.ErrNotSupported)
			return
		}
		prop := d.prop()
		var g uint64
		if r := d.lib.memGetAllocationGranularity(&g, &prop, cuMemAllocGranularityMinimum); r != Success || g == 0 {
			d.vm.err = fmt.Errorf("cuda device %d: cuMemGetAllocationGranularity: %w", d.p.ordinal, r)
			return
		}
		d.vm.supported, d.vm.granularity = true, g
	})
	return d.vm.err
}

// VMGranularity is the minimum granularity of this device's physical
// memory (cuMemGetAllocationGranularity); 2 MiB where the device cannot
// say, in which case every other method returns ErrNotSupported.
func (d *Device) VMGranularity() uint64 {
	if err := d.enter(); err != nil {
		return Granularity
	}
	defer d.exit()
	if d.vmReady() != nil {
		return Granularity
	}
	return d.vm.granularity
}

// vmEnter is enter plus the checks every virtual memory call shares.
func (d *Device) vmEnter(op string, p device.Ptr, n uint64, needPtr bool) error {
	if err := d.enter(); err != nil {
		return err
	}
	if err := d.vmReady(); err != nil {
		d.exit()
		return err
	}
	g := d.vm.granularity
	if n == 0 || n%g != 0 || uint64(p)%g != 0 || (needPtr && p == 0) {
		d.exit()
		return fmt.Errorf("cuda: %s of %d bytes at %v: the address and size must be non-zero multiples of the granularity, %s: %w",
			op, n, p, units.Format(g), device.ErrInvalidValue)
	}
	return nil
}

// staleVMLocked explains a range that is in none of d's records: from
// before a Reset (device.ErrInvalidated), or not d's (ErrInvalidValue,
// saying what was wanted). Requires d.mu.
func (d *Device) staleVMLocked(op string, p device.Ptr, n uint64, want string) error {
	if sp, ok := d.stale.containing(uint64(p)); ok {
		return fmt.Errorf("cuda: %s of %s at %v: the %s of %s at %v was made before a device reset: %w",
			op, units.Format(n), p, sp.kind, units.Format(sp.size), device.Ptr(sp.base), device.ErrInvalidated)
	}
	return fmt.Errorf("cuda: %s of %s at %v: %s on cuda device %d: %w", op, units.Format(n), p, want, d.p.ordinal, device.ErrInvalidValue)
}

// ReserveAddress reserves n bytes of address space aligned to the
// granularity (cuMemAddressReserve), passing over ranges reserved or
// allocated before the last Reset.
func (d *Device) ReserveAddress(n uint64) (device.Ptr, error) {
	if err := d.vmEnter("ReserveAddress", 0, n, false); err != nil {
		return 0, err
	}
	defer d.exit()
	g := d.vm.granularity
	p, r := d.allocFresh(n,
		func(p *uint64) Result { return d.lib.memAddressReserve(p, n, g, 0) },
		func(p uint64) Result { return d.lib.memAddressFree(p, n) })
	if r != Success {
		return 0, fmt.Errorf("cuda: ReserveAddress %s: cuMemAddressReserve: %w", units.Format(n), r)
	}
	if p%g != 0 { // the driver ignored the alignment: the range cannot be mapped
		d.lib.memAddressFree(p, n)
		return 0, fmt.Errorf("cuda: ReserveAddress %s: cuMemAddressReserve gave %#x, not aligned to the granularity %s: %w",
			units.Format(n), p, units.Format(g), device.ErrNotSupported)
	}
	d.mu.Lock()
	d.syncGenLocked()
	d.vmr.res.insert(span{base: p, size: n, kind: kindReserved})
	d.stale.removeOverlapping(p, n)
	d.freed.forget(p, n)
	d.mu.Unlock()
	return device.Ptr(p), nil
}

// FreeAddress gives back a reservation (cuMemAddressFree). A reservation
// with mappings in it is refused: the driver reference does not say that
// the driver refuses it, and a driver that does not leaks the mappings.
func (d *Device) FreeAddress(p device.Ptr, n uint64) error {
	const op = "FreeAddress"
	if err := d.vmEnter(op, p, n, true); err != nil {
		return err
	}
	defer d.exit()
	d.mu.Lock()
	d.syncGenLocked()
	sp, ok := d.vmr.res.get(uint64(p))
	var err error
	switch {
	case !ok:
		err = d.staleVMLocked(op, p, n, "no address reservation starts there")
	case sp.size != n:
		err = fmt.Errorf("cuda: %s of %s at %v: the reservation there is %s; free it whole: %w",
			op, units.Format(n), p, units.Format(sp.size), device.ErrInvalidValue)
	case d.mappedInLocked(uint64(p), n) > 0:
		err = fmt.Errorf("cuda: %s of %s at %v: %s is still mapped in it; unmap it first: %w",
			op, units.Format(n), p, units.Format(d.mappedInLocked(uint64(p), n)), device.ErrInvalidValue)
	default:
		d.vmr.res.remove(uint64(p))
	}
	d.mu.Unlock()
	if err != nil {
		return err
	}
	if r := d.lib.memAddressFree(uint64(p), n); r != Success {
		d.mu.Lock()
		d.vmr.res.insert(sp)
		d.mu.Unlock()
		return fmt.Errorf("cuda: %s %s at %v: cuMemAddressFree: %w", op, units.Format(n), p, r)
	}
	return nil
}

// mappedInLocked is the bytes mapped in [a, a+n). Requires d.mu.
func (d *Device) mappedInLocked(a, n uint64) uint64 {
	ms := d.vmr.maps.all()
	i := d.vmr.maps.search(a)
	if i > 0 {
		i--
	}
	var m uint64
	for ; i < len(ms) && ms[i].base < a+n; i++ {
		if lo, hi := max(ms[i].base, a), min(ms[i].end(), a+n); lo < hi {
			m += hi - lo
		}
	}
	return m
}

// CreatePhysical makes n bytes of physical memory (cuMemCreate). The
// handle is vram's own number for it (see the file comment).
func (d *Device) CreatePhysical(n uint64) (device.PhysMem, error) {
	if err := d.vmEnter("CreatePhysical", 0, n, false); err != nil {
		return 0, err
	}
	defer d.exit()
	prop := d.prop()
	var h uint64
	if r := d.lib.memCreate(&h, n, &prop); r != Success {
		if r == ErrorOutOfMemory {
			return 0, d.oomError("CreatePhysical", n, r)
		}
		return 0, fmt.Errorf("cuda: CreatePhysical %s: cuMemCreate: %w", units.Format(n), r)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.syncGenLocked()
	if d.vmr.phys == nil {
		d.vmr.phys = map[device.PhysMem]vmPhys{}
	}
	d.vmr.seq++
	id := device.PhysMem((d.p.gen.Load()+1)<<40 | d.vmr.seq)
	d.vmr.phys[id] = vmPhys{h: h, n: n}
	return id, nil
}

// physLocked finds a handle that has not been released. Requires d.mu and
// p.mu (read).
func (d *Device) physLocked(op string, id device.PhysMem) (vmPhys, error) {
	d.syncGenLocked()
	if ph, ok := d.vmr.phys[id]; ok {
		return ph, nil
	}
	if g := uint64(id) >> 40; g != 0 && g != d.p.gen.Load()+1 {
		return vmPhys{}, fmt.Errorf("cuda: %s: physical memory handle %#x was made before a device reset: %w",
			op, uint64(id), device.ErrInvalidated)
	}
	return vmPhys{}, fmt.Errorf("cuda: %s: %#x is no physical memory handle of cuda device %d that is not released: %w",
		op, uint64(id), d.p.ordinal, device.ErrInvalidValue)
}

// ReleasePhysical lets a handle go (cuMemRelease); its memory stays while
// a mapping of it does.
func (d *Device) ReleasePhysical(id device.PhysMem) error {
	if err := d.enter(); err != nil {
		return err
	}
	defer d.exit()
	if err := d.vmReady(); err != nil {
		return err
	}
	d.mu.Lock()
	ph, err := d.physLocked("ReleasePhysical", id)
	if err == nil {
		delete(d.vmr.phys, id)
	}
	d.mu.Unlock()
	if err != nil {
		return err
	}
	if r := d.lib.memRelease(ph.h); r != Success {
		d.mu.Lock()
		d.vmr.phys[id] = ph
		d.mu.Unlock()
		return fmt.Errorf("cuda: ReleasePhysical(%#x): cuMemRelease: %w", uint64(id), r)
	}
	return nil
}

// Map maps the whole of h at p (cuMemMap), a range of one reservation with
// nothing mapped in it.
func (d *Device) Map(p device.Ptr, n uint64, id device.PhysMem) error {
	const op = "Map"
	if err := d.vmEnter(op, p, n, true); err != nil {
		return err
	}
	defer d.exit()
	d.mu.Lock()
	ph, err := d.checkMapLocked(op, p, n, id)
	if err == nil {
		d.vmr.maps.insert(span{base: uint64(p), size: n, kind: kindMapping})
	}
	d.mu.Unlock()
	if err != nil {
		return err
	}
	if r := d.lib.memMap(uint64(p), n, 0, ph.h); r != Success {
		d.mu.Lock()
		d.vmr.maps.remove(uint64(p))
		d.mu.Unlock()
		if r == ErrorOutOfMemory {
			return d.oomError(op, n, r)
		}
		return fmt.Errorf("cuda: %s %s at %v of handle %#x: cuMemMap: %w", op, units.Format(n), p, uint64(id), r)
	}
	return nil
}

// checkMapLocked checks a Map against the records. Requires d.mu.
func (d *Device) checkMapLocked(op string, p device.Ptr, n uint64, id device.PhysMem) (vmPhys, error) {
	ph, err := d.physLocked(op, id)
	if err != nil {
		return vmPhys{}, err
	}
	a := uint64(p)
	if res, ok := d.vmr.res.containing(a); !ok || a+n > res.end() {
		return vmPhys{}, d.staleVMLocked(op, p, n, "the range is not inside one address reservation")
	}
	if ph.n != n {
		return vmPhys{}, fmt.Errorf("cuda: %s of %s at %v: handle %#x holds %s; map it whole: %w",
			op, units.Format(n), p, uint64(id), units.Format(ph.n), device.ErrInvalidValue)
	}
	if m := d.mappedInLocked(a, n); m > 0 {
		return vmPhys{}, fmt.Errorf("cuda: %s of %s at %v: %s of the range is already mapped; unmap it first: %w",
			op, units.Format(n), p, units.Format(m), device.ErrInvalidValue)
	}
	return ph, nil
}

// Unmap removes one mapping (cuMemUnmap): exactly one earlier Map. The
// records forget the range first, so no access from now on reaches the
// driver.
func (d *Device) Unmap(p device.Ptr, n uint64) error {
	const op = "Unmap"
	if err := d.vmEnter(op, p, n, true); err != nil {
		return err
	}
	defer d.exit()
	d.mu.Lock()
	d.syncGenLocked()
	m, ok := d.vmr.maps.get(uint64(p))
	var err error
	switch {
	case !ok:
		err = d.staleVMLocked(op, p, n, "no mapping starts there")
	case m.size != n:
		err = fmt.Errorf("cuda: %s of %s at %v: the mapping there is %s; unmap it whole: %w",
			op, units.Format(n), p, units.Format(m.size), device.ErrInvalidValue)
	}
	if err != nil {
		d.mu.Unlock()
		return err
	}
	d.vmr.maps.remove(m.base)
	cut, had := d.cutVMLocked(uint64(p), n)
	d.mu.Unlock()
	if r := d.lib.memUnmap(uint64(p), n); r != Success {
		d.mu.Lock()
		d.vmr.maps.insert(m)
		if had {
			d.addVMLocked(cut)
		}
		d.mu.Unlock()
		return fmt.Errorf("cuda: %s %s at %v: cuMemUnmap: %w", op, units.Format(n), p, r)
	}
	return nil
}

// SetAccess grants this device read and write access (cuMemSetAccess) to
// mapped memory.
func (d *Device) SetAccess(p device.Ptr, n uint64) error {
	const op = "SetAccess"
	if err := d.vmEnter(op, p, n, true); err != nil {
		return err
	}
	defer d.exit()
	d.mu.Lock()
	d.syncGenLocked()
	var err error
	if m := d.mappedInLocked(uint64(p), n); m == 0 {
		err = d.staleVMLocked(op, p, n, "nothing is mapped there")
	} else if m < n {
		err = fmt.Errorf("cuda: %s of %s at %v: only %s of the range is mapped: %w",
			op, units.Format(n), p, units.Format(m), device.ErrInvalidValue)
	}
	d.mu.Unlock()
	if err != nil {
		return err
	}
	desc := memAccessDesc{location: memLocation{typ: cuMemLocationTypeDevice, id: d.p.dev}, flags: cuMemAccessFlagsProtReadWrite}
	if r := d.lib.memSetAccess(uint64(p), n, &desc); r != Success {
		return fmt.Errorf("cuda: %s %s at %v: cuMemSetAccess: %w", op, units.Format(n), p, r)
	}
	d.mu.Lock()
	d.syncGenLocked()
	d.addVMLocked(span{base: uint64(p), size: n, kind: kindVM})
	d.mu.Unlock()
	return nil
}

// releaseVMLocked gives the driver back every mapping, handle and
// reservation d recorded, and returns what failed. The records are kept
// (syncGenLocked or Close forgets them). Requires d.mu and p.mu (write),
// with the context current on the locked thread.
func (d *Device) releaseVMLocked() []error {
	var errs []error
	note := func(what string, at uint64, r Result) {
		if r != Success {
			errs = append(errs, fmt.Errorf("cuda: give back %s %#x: %w", what, at, r))
		}
	}
	for _, m := range d.vmr.maps.all() {
		note("the mapping at", m.base, d.lib.memUnmap(m.base, m.size))
	}
	for id, ph := range d.vmr.phys {
		note("physical memory handle", uint64(id), d.lib.memRelease(ph.h))
	}
	for _, sp := range d.vmr.res.all() {
		note("the address reservation at", sp.base, d.lib.memAddressFree(sp.base, sp.size))
	}
	return errs
}

// addVMLocked records accessible mapped memory, merged with the kindVM
// spans it touches or overlaps. Requires d.mu.
func (d *Device) addVMLocked(sp span) {
	lo, hi := sp.base, sp.end()
	if left, ok := d.live.containing(lo - 1); lo > 0 && ok && left.kind == kindVM {
		lo = left.base
	}
	if right, ok := d.live.containing(hi); ok && right.kind == kindVM {
		hi = right.end()
	}
	merged := span{base: lo, size: hi - lo, kind: kindVM}
	d.live.insert(merged) // drops the spans it covers
	d.stale.removeOverlapping(merged.base, merged.size)
	d.freed.forget(merged.base, merged.size)
}

// cutVMLocked removes [a, a+n) from the kindVM span holding it, keeping the
// parts on either side, and remembers it as freed. It returns the span as
// it was. Requires d.mu.
func (d *Device) cutVMLocked(a, n uint64) (span, bool) {
	sp, ok := d.live.containing(a)
	if !ok || sp.kind != kindVM {
		return span{}, false
	}
	d.live.remove(sp.base)
	if sp.base < a {
		d.live.insert(span{base: sp.base, size: a - sp.base, kind: kindVM})
	}
	if end := min(a+n, sp.end()); end < sp.end() {
		d.live.insert(span{base: end, size: sp.end() - end, kind: kindVM})
	}
	d.freed.add(span{base: a, size: min(n, sp.end()-a), kind: kindVM})
	return sp, true
}
