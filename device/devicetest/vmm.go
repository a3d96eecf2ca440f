package devicetest

// Tests of device.VirtualMemory: reservations, physical memory handles,
// mappings and access, as an expandable allocator uses them.

import (
	"bytes"
	"testing"

	"github.com/vramkit/vram/device"
)

func vmOf(t *testing.T, d device.Device) device.VirtualMemory {
	t.Helper()
	vm, isVM := d.(device.VirtualMemory)
	if !isVM {
		t.Skip("device is no device.VirtualMemory")
	}
	return vm
}

func phys(t *testing.T) func(device.PhysMem, error) device.PhysMem { return must[device.PhysMem](t) }

func testVirtualMemory(t *testing.T, o opener) {
	t.Run("accounting", func(t *testing.T) { vmAccounting(t, o) })
	t.Run("across mappings", func(t *testing.T) { vmAcross(t, o) })
	t.Run("contents survive a remap", func(t *testing.T) { vmRemap(t, o) })
	t.Run("refused", func(t *testing.T) { vmRefused(t, o) })
	t.Run("memcheck", func(t *testing.T) { vmMemcheck(t, o) })
}

// vmAccounting: a reservation takes no memory; physical memory does from
// CreatePhysical until it is released and unmapped.
func vmAccounting(t *testing.T, o opener) {
	d := o.fresh(t)
	vm := vmOf(t, d)
	g := vm.VMGranularity()
	if g == 0 {
		t.Fatal("VMGranularity is 0")
	}
	free0 := memFree(t, d)
	p := ptr(t)(vm.ReserveAddress(8 * g))
	if p == 0 || uint64(p)%g != 0 {
		t.Fatalf("ReserveAddress = %v; want a non-zero address aligned to %d", p, g)
	}
	if f := memFree(t, d); f+g < free0 { // a driver may take a little for page tables
		t.Errorf("reserving %d bytes took %d bytes of device memory; want none", 8*g, free0-f)
	}
	h := phys(t)(vm.CreatePhysical(2 * g))
	afterCreate := memFree(t, d)
	if drop := free0 - afterCreate; drop < 2*g || drop > 3*g {
		t.Errorf("CreatePhysical(%d) took %d bytes; want %d", 2*g, drop, 2*g)
	}
	ok(t, vm.Map(p.Add(2*g), 2*g, h))
	ok(t, vm.SetAccess(p.Add(2*g), 2*g))
	ok(t, vm.ReleasePhysical(h)) // still mapped: the memory stays
	if f := memFree(t, d); f > afterCreate+g {
		t.Errorf("releasing a mapped handle gave back %d bytes; the memory must stay until it is unmapped", f-afterCreate)
	}
	ok(t, vm.Unmap(p.Add(2*g), 2*g))
	if f := memFree(t, d); f+g < free0 {
		t.Errorf("after release and unmap %d bytes are still taken", free0-f)
	}
	ok(t, vm.FreeAddress(p, 8*g))
}

// vmMapPages maps k fresh handles of one granule each at p, grants access
// and releases the handles (the mappings keep the memory); the returned
// function unmaps them.
func vmMapPages(t *testing.T, vm device.VirtualMemory, p device.Ptr, k int) (unmap func()) {
	t.Helper()
	g := vm.VMGranularity()
	for i := range k {
		h := phys(t)(vm.CreatePhysical(g))
		ok(t, vm.Map(p.Add(uint64(i)*g), g, h))
		ok(t, vm.ReleasePhysical(h))
	}
	ok(t, vm.SetAccess(p, uint64(k)*g))
	return func() {
		for i := range k {
			ok(t, vm.Unmap(p.Add(uint64(i)*g), g))
		}
	}
}

// vmAcross: copies, memsets and device-to-device copies run across the
// boundary between two mappings as through one allocation.
func vmAcross(t *testing.T, o opener) {
	d := o.fresh(t)
	vm := vmOf(t, d)
	backed(t, d)
	g := vm.VMGranularity()
	s := d.DefaultStream()
	p := ptr(t)(vm.ReserveAddress(4 * g))
	defer func() { ok(t, vm.FreeAddress(p, 4*g)) }()
	unmap := vmMapPages(t, vm, p, 3)
	defer unmap()
	const n = 4096
	at := p.Add(g - n/2) // straddles the first boundary
	want := pattern(n, 7)
	ok(t, d.CopyHtoD(at, want, s))
	got := make([]byte, n)
	ok(t, d.CopyDtoH(got, at, s))
	syncStream(t, s)
	if !bytes.Equal(got, want) {
		t.Fatal("bytes copied across two mappings came back different")
	}
	ok(t, d.CopyDtoD(p.Add(2*g-n/2), at, n, s)) // to the second boundary
	ok(t, d.Memset(at, 0xab, n/2, s))
	ok(t, d.CopyDtoH(got, p.Add(2*g-n/2), s))
	syncStream(t, s)
	if !bytes.Equal(got, want) {
		t.Error("a device-to-device copy across mappings came back different")
	}
	ok(t, d.CopyDtoH(got, at, s))
	syncStream(t, s)
	if !bytes.Equal(got[:n/2], bytes.Repeat([]byte{0xab}, n/2)) || !bytes.Equal(got[n/2:], want[n/2:]) {
		t.Error("a memset across mappings set the wrong bytes")
	}
}

// vmRemap: a handle unmapped but not released keeps its bytes and shows
// them where it is mapped next.
func vmRemap(t *testing.T, o opener) {
	d := o.fresh(t)
	vm := vmOf(t, d)
	backed(t, d)
	g := vm.VMGranularity()
	s := d.DefaultStream()
	p := ptr(t)(vm.ReserveAddress(2 * g))
	defer func() { ok(t, vm.FreeAddress(p, 2*g)) }()
	h := phys(t)(vm.CreatePhysical(g))
	ok(t, vm.Map(p, g, h))
	ok(t, vm.SetAccess(p, g))
	want := pattern(1000, 3)
	ok(t, d.CopyHtoD(p.Add(100), want, s))
	syncStream(t, s)
	ok(t, vm.Unmap(p, g))
	ok(t, vm.Map(p.Add(g), g, h))
	ok(t, vm.SetAccess(p.Add(g), g))
	got := make([]byte, 1000)
	ok(t, d.CopyDtoH(got, p.Add(g+100), s))
	syncStream(t, s)
	if !bytes.Equal(got, want) {
		t.Error("a handle mapped again lost its bytes")
	}
	ok(t, vm.Unmap(p.Add(g), g))
	ok(t, vm.ReleasePhysical(h))
}

// vmRefused: misuses are refused with device.ErrInvalidValue and change
// nothing.
func vmRefused(t *testing.T, o opener) {
	d := o.fresh(t)
	vm := vmOf(t, d)
	g := vm.VMGranularity()
	p := ptr(t)(vm.ReserveAddress(4 * g))
	h := phys(t)(vm.CreatePhysical(2 * g))
	ok(t, vm.Map(p, 2*g, h))
	cases := map[string]func() error{
		"reserve 0 bytes":             func() error { _, err := vm.ReserveAddress(0); return err },
		"reserve part of a granule":   func() error { _, err := vm.ReserveAddress(g + 1); return err },
		"create part of a granule":    func() error { _, err := vm.CreatePhysical(g / 2); return err },
		"map at an unaligned address": func() error { return vm.Map(p.Add(2*g+1), 2*g, h) },
		"map over a mapping":          func() error { return vm.Map(p.Add(g), 2*g, h) },
		"unmap part of a mapping":     func() error { return vm.Unmap(p, g) },
		"free a range with mappings":  func() error { return vm.FreeAddress(p, 4*g) },
	}
	for _, name := range sortedKeys(cases) {
		t.Run(name, func(t *testing.T) { isErr(t, cases[name](), device.ErrInvalidValue, name) })
	}
	ok(t, vm.Unmap(p, 2*g))
	ok(t, vm.ReleasePhysical(h))
	ok(t, vm.FreeAddress(p, 4*g))
}

// vmMemcheck: accesses to pages not mapped, or mapped without access, are
// refused before they reach the device.
func vmMemcheck(t *testing.T, o opener) {
	d := o.fresh(t)
	vm := vmOf(t, d)
	backed(t, d)
	g := vm.VMGranularity()
	s := d.DefaultStream()
	p := ptr(t)(vm.ReserveAddress(4 * g))
	defer func() { ok(t, vm.FreeAddress(p, 4*g)) }()
	unmap := vmMapPages(t, vm, p, 2)
	h := phys(t)(vm.CreatePhysical(g))
	ok(t, vm.Map(p.Add(3*g), g, h)) // no SetAccess
	ok(t, vm.ReleasePhysical(h))
	cases := map[string]struct {
		fn   func() error
		want error
	}{
		"past the mapped pages":  {func() error { return d.CopyHtoD(p.Add(2*g-8), make([]byte, 16), s) }, device.ErrOutOfBounds},
		"reserved, never mapped": {func() error { return d.Memset(p.Add(2*g+4096), 0, 8, s) }, device.ErrInvalidPointer},
		"mapped without access":  {func() error { return d.Memset(p.Add(3*g), 0, 8, s) }, device.ErrInvalidPointer},
	}
	for _, name := range sortedKeys(cases) {
		t.Run(name, func(t *testing.T) { isOnly(t, cases[name].fn(), cases[name].want, name) })
	}
	ok(t, vm.Unmap(p.Add(3*g), g))
	unmap()
	isOnly(t, d.Memset(p, 0, 8, s), device.ErrUseAfterFree, "an access to an unmapped page")
}
