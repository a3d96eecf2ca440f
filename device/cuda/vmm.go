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

// ReserveAddress reserves n bytes of address space (cuMemAddressReserve).
func (d *Device) ReserveAddress(n uint64) (device.Ptr, error) {
	if err := d.vmEnter("ReserveAddress", 0, n, false); err != nil {
		return 0, err
	}
	defer d.exit()
	var p uint64
	if r := d.lib.memAddressReserve(&p, n, 0, 0); r != Success {
		return 0, fmt.Errorf("cuda: ReserveAddress %s: cuMemAddressReserve: %w", units.Format(n), r)
	}
	return device.Ptr(p), nil
}

// FreeAddress gives back a reservation (cuMemAddressFree).
func (d *Device) FreeAddress(p device.Ptr, n uint64) error {
	if err := d.vmEnter("FreeAddress", p, n, true); err != nil {
		return err
	}
	defer d.exit()
	if r := d.lib.memAddressFree(uint64(p), n); r != Success {
		return fmt.Errorf("cuda: FreeAddress %s at %v: cuMemAddressFree: %w", units.Format(n), p, r)
	}
	return nil
}

// CreatePhysical makes n bytes of physical memory (cuMemCreate).
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
	return device.PhysMem(h), nil
}

// ReleasePhysical lets a handle go (cuMemRelease).
func (d *Device) ReleasePhysical(h device.PhysMem) error {
	if err := d.enter(); err != nil {
		return err
	}
	defer d.exit()
	if err := d.vmReady(); err != nil {
		return err
	}
	if r := d.lib.memRelease(uint64(h)); r != Success {
		return fmt.Errorf("cuda: ReleasePhysical(%#x): cuMemRelease: %w", uint64(h), r)
	}
	return nil
}

// Map maps the whole of h at p (cuMemMap).
func (d *Device) Map(p device.Ptr, n uint64, h device.PhysMem) error {
	if err := d.vmEnter("Map", p, n, true); err != nil {
		return err
	}
	defer d.exit()
	if r := d.lib.memMap(uint64(p), n, 0, uint64(h)); r != Success {
		if r == ErrorOutOfMemory {
			return d.oomError("Map", n, r)
		}
		return fmt.Errorf("cuda: Map %s at %v of handle %#x: cuMemMap: %w", units.Format(n), p, uint64(h), r)
	}
	return nil
}

// Unmap removes one mapping (cuMemUnmap). The records forget the range
// first, so no access from now on reaches the driver.
func (d *Device) Unmap(p device.Ptr, n uint64) error {
	if err := d.vmEnter("Unmap", p, n, true); err != nil {
		return err
	}
	defer d.exit()
	d.mu.Lock()
	d.syncGenLocked()
	cut, had := d.cutVMLocked(uint64(p), n)
	d.mu.Unlock()
	if r := d.lib.memUnmap(uint64(p), n); r != Success {
		if had {
			d.mu.Lock()
			d.addVMLocked(cut)
			d.mu.Unlock()
		}
		return fmt.Errorf("cuda: Unmap %s at %v: cuMemUnmap: %w", units.Format(n), p, r)
	}
	return nil
}

// SetAccess grants this device read and write access (cuMemSetAccess).
func (d *Device) SetAccess(p device.Ptr, n uint64) error {
	if err := d.vmEnter("SetAccess", p, n, true); err != nil {
		return err
	}
	defer d.exit()
	desc := memAccessDesc{location: memLocation{typ: cuMemLocationTypeDevice, id: d.p.dev}, flags: cuMemAccessFlagsProtReadWrite}
	if r := d.lib.memSetAccess(uint64(p), n, &desc); r != Success {
		return fmt.Errorf("cuda: SetAccess %s at %v: cuMemSetAccess: %w", units.Format(n), p, r)
	}
	d.mu.Lock()
	d.syncGenLocked()
	d.addVMLocked(span{base: uint64(p), size: n, kind: kindVM})
	d.mu.Unlock()
	return nil
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
