package alloc_test

import (
	"errors"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/vramkit/vram/alloc"
	"github.com/vramkit/vram/device"
	"github.com/vramkit/vram/device/sim"
	"github.com/vramkit/vram/internal/units"
)

// TestDirectCountsDeviceGranules checks that Direct charges each block as
// the device holds it, so that its Reserved is exactly what MemInfo says
// the device gave.
func TestDirectCountsDeviceGranules(t *testing.T) {
	tests := map[string]struct {
		gran  uint64
		sizes []uint64
		want  uint64 // bytes charged
	}{
		"2 MiB granules":  {gran: 2 * units.MiB, sizes: []uint64{1, 2 * units.MiB, 2*units.MiB + 1}, want: 8 * units.MiB},
		"64 KiB granules": {gran: 64 * units.KiB, sizes: []uint64{1, 100 * units.KiB}, want: 192 * units.KiB},
		"exact multiples": {gran: 2 * units.MiB, sizes: []uint64{4 * units.MiB, 6 * units.MiB}, want: 10 * units.MiB},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			dev := openSimT(t, sim.Config{TotalBytes: units.GiB, Granularity: tc.gran, AddressOnly: true})
			free0, _, _ := dev.MemInfo()
			d := alloc.NewDirect(dev)
			defer d.Close()
			if d.Granularity() != tc.gran {
				t.Errorf("Granularity() = %d, want %d", d.Granularity(), tc.gran)
			}
			s := dev.DefaultStream()
			var ptrs []device.Ptr
			for _, n := range tc.sizes {
				p, err := d.Alloc(n, s)
				if err != nil {
					t.Fatal(err)
				}
				ptrs = append(ptrs, p)
			}
			st := d.Stats()
			free, _, _ := dev.MemInfo()
			if st.InUse != tc.want || st.Reserved != tc.want || free0-free != tc.want {
				t.Errorf("InUse %d, Reserved %d, device gave %d; want all %d", st.InUse, st.Reserved, free0-free, tc.want)
			}
			if st.DeviceAllocs != uint64(len(tc.sizes)) || st.CacheHits != 0 {
				t.Errorf("DeviceAllocs %d, CacheHits %d; want %d, 0", st.DeviceAllocs, st.CacheHits, len(tc.sizes))
			}
			for _, p := range ptrs {
				if err := d.Free(p, s); err != nil {
					t.Fatal(err)
				}
			}
			if st := d.Stats(); st.DeviceFrees != uint64(len(tc.sizes)) || st.Reserved != 0 || st.PeakReserved != tc.want {
				t.Errorf("after frees: %+v", st)
			}
		})
	}
}

// TestDirectOutOfMemoryMessage checks that the error says what was asked
// and what the device has.
func TestDirectOutOfMemoryMessage(t *testing.T) {
	dev := openSimT(t, sim.Config{TotalBytes: 64 * units.MiB, NoContext: true, AddressOnly: true})
	d := alloc.NewDirect(dev)
	defer d.Close()
	_, err := d.Alloc(100*units.MiB, dev.DefaultStream())
	if !errors.Is(err, device.ErrOutOfMemory) {
		t.Fatalf("err = %v, want device.ErrOutOfMemory", err)
	}
	for _, want := range []string{"100 MiB", "64 MiB free of 64 MiB"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
}

// TestDirectRejectsBadArguments checks a zero size and a nil stream.
func TestDirectRejectsBadArguments(t *testing.T) {
	dev := openSimT(t, sim.Config{TotalBytes: 64 * units.MiB, AddressOnly: true})
	d := alloc.NewDirect(dev)
	defer d.Close()
	tests := map[string]struct {
		n uint64
		s device.Stream
	}{
		"zero size":  {0, dev.DefaultStream()},
		"nil stream": {4096, nil},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if _, err := d.Alloc(tc.n, tc.s); !errors.Is(err, device.ErrInvalidValue) {
				t.Errorf("err = %v, want device.ErrInvalidValue", err)
			}
			if st := d.Stats(); st.Allocs != 0 || st.OOMs != 0 {
				t.Errorf("a refused call changed Stats: %+v", st)
			}
		})
	}
}

// gatedDevice is a simulated device whose Free and FreeAsync, once armed,
// wait for the test to let them go on.
type gatedDevice struct {
	*sim.Device
	armed   atomic.Bool
	entered chan struct{}
	release chan struct{}
}

func (g *gatedDevice) wait() {
	if g.armed.Load() {
		g.entered <- struct{}{}
		<-g.release
	}
}

func (g *gatedDevice) Free(p device.Ptr) error {
	g.wait()
	return g.Device.Free(p)
}

func (g *gatedDevice) FreeAsync(p device.Ptr, s device.Stream) error {
	g.wait()
	return g.Device.FreeAsync(p, s)
}

// TestCloseDuringDeviceFree: a Free whose device call fails after Close
// has run (here: the device is reset under it) returns the error and
// leaves the closed allocator alone, instead of writing to the live table
// Close gave up.
func TestCloseDuringDeviceFree(t *testing.T) {
	tests := map[string]func(t *testing.T, dev device.Device) alloc.Allocator{
		"Direct":    func(t *testing.T, dev device.Device) alloc.Allocator { return alloc.NewDirect(dev) },
		"AsyncPool": func(t *testing.T, dev device.Device) alloc.Allocator { return newAsyncT(t, dev, alloc.AsyncConfig{}) },
	}
	for name, newAlloc := range tests {
		t.Run(name, func(t *testing.T) {
			sd := openSimT(t, sim.Config{TotalBytes: 64 * units.MiB, AddressOnly: true})
			g := &gatedDevice{Device: sd, entered: make(chan struct{}, 1), release: make(chan struct{})}
			a := newAlloc(t, g)
			s := g.DefaultStream()
			p, err := a.Alloc(units.MiB, s)
			if err != nil {
				t.Fatal(err)
			}
			g.armed.Store(true)
			done := make(chan error, 1)
			go func() { done <- a.Free(p, s) }()
			<-g.entered
			g.armed.Store(false)
			if err := a.Close(); err != nil {
				t.Fatalf("Close: %v", err)
			}
			sd.Faults().ResetAt(sim.OpFree, 1)
			close(g.release)
			if err := <-done; !errors.Is(err, device.ErrInvalidated) {
				t.Errorf("Free across Close and a reset: err = %v, want device.ErrInvalidated", err)
			}
			if err := a.Free(p, s); !errors.Is(err, alloc.ErrClosed) {
				t.Errorf("Free after Close: err = %v, want alloc.ErrClosed", err)
			}
		})
	}
}
