package cuda

import (
	"testing"
	"unsafe"
)

// TestVMLayouts checks memAllocationProp and memAccessDesc against
// CUmemAllocationProp and CUmemAccessDesc as cuda.h declares them on a
// 64-bit system (the fake driver asserts the same sizes in C).
func TestVMLayouts(t *testing.T) {
	var p memAllocationProp
	var a memAccessDesc
	fields := map[string]struct{ got, want uintptr }{
		"prop size":                 {unsafe.Sizeof(p), 32},
		"prop.type":                 {unsafe.Offsetof(p.typ), 0},
		"prop.requestedHandleTypes": {unsafe.Offsetof(p.requestedHandleTypes), 4},
		"prop.location":             {unsafe.Offsetof(p.location), 8},
		"prop.win32HandleMetaData":  {unsafe.Offsetof(p.win32HandleMetaData), 16},
		"prop.compressionType":      {unsafe.Offsetof(p.compressionType), 24},
		"prop.gpuDirectRDMACapable": {unsafe.Offsetof(p.gpuDirectRDMACapable), 25},
		"prop.usage":                {unsafe.Offsetof(p.usage), 26},
		"prop.reserved":             {unsafe.Offsetof(p.reserved), 28},
		"access size":               {unsafe.Sizeof(a), 12},
		"access.flags":              {unsafe.Offsetof(a.flags), 8},
	}
	for name, f := range fields {
		t.Run(name, func(t *testing.T) {
			if f.got != f.want {
				t.Errorf("%s = %d, want %d", name, f.got, f.want)
			}
		})
	}
}

// TestVMSpans: accessible mappings merge into one record, so an access
// may cross them; unmapping cuts a mapping out and remembers it as freed.
func TestVMSpans(t *testing.T) {
	const g = 2 << 20
	d := &Device{}
	d.mu.Lock()
	defer d.mu.Unlock()
	base := uint64(0x100000000)
	for i := range 3 {
		d.addVMLocked(span{base: base + uint64(i)*g, size: g, kind: kindVM})
	}
	if sp, ok := d.live.containing(base + g); !ok || sp.base != base || sp.size != 3*g {
		t.Fatalf("three adjacent mappings are recorded as %+v; want one span of %d bytes", sp, 3*g)
	}
	d.cutVMLocked(base+g, g)
	if d.live.len() != 2 {
		t.Fatalf("after cutting out the middle mapping the record holds %d spans; want 2", d.live.len())
	}
	if _, ok := d.freed.containing(base + g); !ok {
		t.Error("the unmapped range is not remembered as freed")
	}
	d.addVMLocked(span{base: base + g, size: g, kind: kindVM})
	if d.live.len() != 1 {
		t.Errorf("mapping the hole again leaves %d spans; want 1", d.live.len())
	}
	if _, ok := d.freed.containing(base + g); ok {
		t.Error("a range mapped again is still remembered as freed")
	}
}
