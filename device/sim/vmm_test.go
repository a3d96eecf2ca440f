package sim_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/vramkit/vram/device"
	"github.com/vramkit/vram/device/sim"
)

func newVMSim(t *testing.T, cfg sim.Config) *sim.Device {
	t.Helper()
	if cfg.TotalBytes == 0 {
		cfg.TotalBytes = 64 << 20
	}
	d, err := sim.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Close() })
	return d
}

// TestVMAccountingExact: MemInfo counts physical memory to the byte,
// reservations not at all, and VMUsage reports the three apart.
func TestVMAccountingExact(t *testing.T) {
	d := newVMSim(t, sim.Config{})
	g := d.VMGranularity()
	free0, _, _ := d.MemInfo()
	p, err := d.ReserveAddress(16 * g)
	if err != nil {
		t.Fatal(err)
	}
	h, err := d.CreatePhysical(3 * g)
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Map(p.Add(g), 3*g, h); err != nil {
		t.Fatal(err)
	}
	free, _, _ := d.MemInfo()
	if free0-free != 3*g {
		t.Errorf("MemInfo took %d bytes; want exactly %d", free0-free, 3*g)
	}
	want := sim.VMUsage{Reserved: 16 * g, Physical: 3 * g, Mapped: 3 * g, Maps: 1}
	if u := d.VMUsage(); u != want {
		t.Errorf("VMUsage = %+v; want %+v", u, want)
	}
	// Physical memory and Malloc share the device.
	if _, err := d.Malloc(free + 1); !errors.Is(err, device.ErrOutOfMemory) || !strings.Contains(err.Error(), "physical memory 6 MiB") {
		t.Errorf("Malloc of more than is left = %v; want ErrOutOfMemory naming the physical memory", err)
	}
	if err := d.ReleasePhysical(h); err != nil {
		t.Fatal(err)
	}
	if err := d.ReleasePhysical(h); !errors.Is(err, device.ErrDoubleFree) {
		t.Errorf("second release = %v; want ErrDoubleFree", err)
	}
	if err := d.Unmap(p.Add(g), 3*g); err != nil {
		t.Fatal(err)
	}
	if free, _, _ := d.MemInfo(); free != free0 {
		t.Errorf("after release and unmap MemInfo is %d bytes short", free0-free)
	}
	if err := d.FreeAddress(p, 16*g); err != nil {
		t.Fatal(err)
	}
	if u := d.VMUsage(); u.Reserved+u.Physical+u.Mapped != 0 || u.Unmaps != 1 {
		t.Errorf("VMUsage at the end = %+v", u)
	}
}

// TestVMFaults: FailMapAt fails the nth Map with ErrOutOfMemory and leaves
// nothing mapped; OOMAtAlloc counts CreatePhysical.
func TestVMFaults(t *testing.T) {
	d := newVMSim(t, sim.Config{})
	g := d.VMGranularity()
	p, _ := d.ReserveAddress(4 * g)
	h, _ := d.CreatePhysical(g)
	d.Faults().FailMapAt(1)
	err := d.Map(p, g, h)
	if !errors.Is(err, device.ErrOutOfMemory) || !errors.Is(err, sim.ErrInjected) {
		t.Fatalf("Map with FailMapAt(1) = %v; want an injected ErrOutOfMemory", err)
	}
	if u := d.VMUsage(); u.Mapped != 0 || u.Maps != 0 {
		t.Errorf("a failed Map left %+v", u)
	}
	if err := d.Map(p, g, h); err != nil { // fired once
		t.Fatalf("Map after the fault fired = %v", err)
	}
	d.Faults().OOMAtAlloc(1)
	if _, err := d.CreatePhysical(g); !errors.Is(err, sim.ErrInjected) {
		t.Errorf("CreatePhysical with OOMAtAlloc(1) = %v; want an injected error", err)
	}
	_ = d.ReleasePhysical(h)
	_ = d.Unmap(p, g)
	_ = d.FreeAddress(p, 4*g)
}

// TestVMResetAndLeaks: a Reset invalidates handles and mappings; Close
// reports handles and reservations left behind.
func TestVMResetAndLeaks(t *testing.T) {
	d := newVMSim(t, sim.Config{})
	g := d.VMGranularity()
	p, _ := d.ReserveAddress(2 * g)
	h, _ := d.CreatePhysical(g)
	_ = d.Map(p, g, h)
	_ = d.SetAccess(p, g)
	if err := d.Reset(); err != nil {
		t.Fatal(err)
	}
	if err := d.ReleasePhysical(h); !errors.Is(err, device.ErrInvalidated) {
		t.Errorf("releasing a handle from before a reset = %v; want ErrInvalidated", err)
	}
	if err := d.Memset(p, 0, 8, d.DefaultStream()); !errors.Is(err, device.ErrInvalidated) {
		t.Errorf("an access to memory mapped before a reset = %v; want ErrInvalidated", err)
	}
	if free, total, _ := d.MemInfo(); free != total-d.Config().ContextBytes {
		t.Errorf("after a reset %d bytes are still taken", total-d.Config().ContextBytes-free)
	}
	p, _ = d.ReserveAddress(2 * g)
	h, _ = d.CreatePhysical(g)
	_ = d.Map(p, g, h)
	rep := d.Leaks()
	if rep.Physical != 1 || rep.PhysBytes != g || rep.Reserved != 1 || rep.ResBytes != 2*g {
		t.Errorf("Leaks = %+v; want 1 handle of %d bytes and 1 reservation of %d", rep, g, 2*g)
	}
	if err := d.Close(); !errors.Is(err, sim.ErrLeak) || !strings.Contains(err.Error(), "physical memory handles") {
		t.Errorf("Close with a handle left = %v; want ErrLeak naming it", err)
	}
}

// TestVMAddressOnly: an address-only device accounts mappings and refuses
// copies as it does for Malloc.
func TestVMAddressOnly(t *testing.T) {
	d := newVMSim(t, sim.Config{TotalBytes: 64 << 30, AddressOnly: true})
	g := d.VMGranularity()
	p, err := d.ReserveAddress(64 << 30)
	if err != nil {
		t.Fatal(err)
	}
	h, _ := d.CreatePhysical(32 << 30)
	if err := d.Map(p, 32<<30, h); err != nil {
		t.Fatal(err)
	}
	_ = d.SetAccess(p, 32<<30)
	if free, _, _ := d.MemInfo(); free > 32<<30 {
		t.Errorf("MemInfo free = %d after mapping 32 GiB of 64", free)
	}
	_ = d.ReleasePhysical(h)
	_ = d.Unmap(p, 32<<30)
	_ = g
	if err := d.FreeAddress(p, 64<<30); err != nil {
		t.Fatal(err)
	}
}
