package sim

import (
	"bytes"
	"errors"
	"testing"

	"github.com/vramkit/vram/device"
)

// TestHostBytes: the host's view of device memory is the bytes copies use,
// both ways, at an offset, for a Malloc and for mapped virtual memory;
// an access the checker refuses, and an address-only device, fail.
func TestHostBytes(t *testing.T) {
	d, err := New(Config{TotalBytes: 64 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	p, err := d.Malloc(4096)
	if err != nil {
		t.Fatal(err)
	}
	s := d.DefaultStream()
	want := []byte("device bytes")
	if err := d.CopyHtoD(p.Add(100), want, s); err != nil {
		t.Fatal(err)
	}
	if err := s.Synchronize(); err != nil {
		t.Fatal(err)
	}
	b, err := d.HostBytes(p.Add(100), uint64(len(want)))
	if err != nil || !bytes.Equal(b, want) {
		t.Fatalf("HostBytes after a copy = %q, %v; want %q", b, err, want)
	}
	copy(b, "HOST")
	back := make([]byte, len(want))
	if err := d.CopyDtoH(back, p.Add(100), s); err != nil {
		t.Fatal(err)
	}
	if err := s.Synchronize(); err != nil {
		t.Fatal(err)
	}
	if string(back) != "HOSTce bytes" {
		t.Errorf("a copy after a host write = %q; want %q", back, "HOSTce bytes")
	}

	// Virtual memory: one page reserved, mapped and granted.
	g := d.VMGranularity()
	va, err := d.ReserveAddress(g)
	if err != nil {
		t.Fatal(err)
	}
	h, err := d.CreatePhysical(g)
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Map(va, g, h); err != nil {
		t.Fatal(err)
	}
	if err := d.SetAccess(va, g); err != nil {
		t.Fatal(err)
	}
	vb, err := d.HostBytes(va.Add(g-8), 8)
	if err != nil || len(vb) != 8 {
		t.Fatalf("HostBytes of mapped memory = %d bytes, %v", len(vb), err)
	}
	copy(vb, "vmm byte")
	if err := d.CopyDtoH(back[:8], va.Add(g-8), s); err != nil {
		t.Fatal(err)
	}
	if err := s.Synchronize(); err != nil {
		t.Fatal(err)
	}
	if string(back[:8]) != "vmm byte" {
		t.Errorf("a copy of mapped memory after a host write = %q", back[:8])
	}
	for _, step := range []error{d.Unmap(va, g), d.ReleasePhysical(h), d.FreeAddress(va, g), d.Free(p)} {
		if step != nil {
			t.Fatal(step)
		}
	}

	ao, err := New(Config{TotalBytes: 64 << 20, AddressOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer ao.Close()
	ap, err := ao.Malloc(4096)
	if err != nil {
		t.Fatal(err)
	}
	defer ao.Free(ap)
	live, err := d.Malloc(4096)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Free(live)
	for name, tc := range map[string]struct {
		dev  *Device
		p    device.Ptr
		n    uint64
		want error
	}{
		"past the end":    {d, live.Add(4000), 200, device.ErrOutOfBounds},
		"freed":           {d, p, 8, device.ErrUseAfterFree},
		"zero bytes":      {d, live, 0, device.ErrInvalidValue},
		"never allocated": {d, 0x10, 8, device.ErrInvalidPointer},
		"address only":    {ao, ap, 8, device.ErrNotSupported},
	} {
		t.Run(name, func(t *testing.T) {
			if b, err := tc.dev.HostBytes(tc.p, tc.n); !errors.Is(err, tc.want) || b != nil {
				t.Errorf("HostBytes(%v, %d) = %d bytes, %v; want %v", tc.p, tc.n, len(b), err, tc.want)
			}
		})
	}
}
