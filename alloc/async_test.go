package alloc_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/vramkit/vram/alloc"
	"github.com/vramkit/vram/device"
	"github.com/vramkit/vram/device/sim"
	"github.com/vramkit/vram/internal/units"
)

// plainDevice is a real device seen only through device.Device, without
// its optional abilities.
type plainDevice struct{ device.Device }

func TestAsyncPoolNeedsStreamOrderedPool(t *testing.T) {
	dev := openSimT(t, sim.Config{TotalBytes: 64 * units.MiB, AddressOnly: true})
	_, err := alloc.NewAsyncPool(plainDevice{dev}, alloc.AsyncConfig{})
	if !errors.Is(err, device.ErrNotSupported) {
		t.Fatalf("NewAsyncPool on a device without a stream-ordered pool: err = %v, want device.ErrNotSupported", err)
	}
}

// TestAsyncPoolReleaseThreshold frees four 2 MiB blocks and synchronizes:
// the device pool keeps exactly what the threshold allows, and Trim gives
// back the rest.
func TestAsyncPoolReleaseThreshold(t *testing.T) {
	tests := map[string]struct {
		cfg           alloc.AsyncConfig
		wantAfterSync uint64 // bytes that stay reserved
	}{
		"keep all (zero config)": {cfg: alloc.AsyncConfig{}, wantAfterSync: 8 * units.MiB},
		"release at sync":        {cfg: alloc.AsyncConfig{ReleaseAtSync: true}, wantAfterSync: 0},
		"keep 4 MiB":             {cfg: alloc.AsyncConfig{ReleaseThreshold: 4 * units.MiB}, wantAfterSync: 4 * units.MiB},
		"threshold above use":    {cfg: alloc.AsyncConfig{ReleaseThreshold: 64 * units.MiB}, wantAfterSync: 8 * units.MiB},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			dev := openSimT(t, sim.Config{TotalBytes: 256 * units.MiB, AddressOnly: true})
			a, err := alloc.NewAsyncPool(dev, tc.cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer a.Close()
			s := dev.DefaultStream()
			var ps []device.Ptr
			for range 4 {
				p, err := a.Alloc(2*units.MiB, s)
				if err != nil {
					t.Fatal(err)
				}
				ps = append(ps, p)
			}
			if st := a.Stats(); st.Reserved != 8*units.MiB || st.DeviceAllocs != 4 {
				t.Errorf("after four 2 MiB allocs: %+v", st)
			}
			for _, p := range ps {
				if err := a.Free(p, s); err != nil {
					t.Fatal(err)
				}
			}
			if err := dev.Synchronize(); err != nil {
				t.Fatal(err)
			}
			st := a.Stats()
			if st.Reserved != tc.wantAfterSync {
				t.Errorf("after free and sync Reserved = %s, want %s", units.Format(st.Reserved), units.Format(tc.wantAfterSync))
			}
			if st.PeakReserved != 8*units.MiB {
				t.Errorf("PeakReserved = %s, want 8 MiB", units.Format(st.PeakReserved))
			}
			if err := a.Trim(); err != nil {
				t.Fatal(err)
			}
			if st := a.Stats(); st.Reserved != 0 || st.DeviceFrees == 0 {
				t.Errorf("after Trim: %+v", st)
			}
		})
	}
}

// TestAsyncPoolReusesOnTheSameStream: a block freed on a stream serves the
// next allocation there without growing the device pool.
func TestAsyncPoolReusesOnTheSameStream(t *testing.T) {
	dev := openSimT(t, sim.Config{TotalBytes: 256 * units.MiB, AddressOnly: true})
	a, err := alloc.NewAsyncPool(dev, alloc.AsyncConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	s, err := dev.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for range 10 {
		p, err := a.Alloc(units.MiB, s)
		if err != nil {
			t.Fatal(err)
		}
		if err := a.Free(p, s); err != nil {
			t.Fatal(err)
		}
	}
	st := a.Stats()
	if st.DeviceAllocs != 1 || st.CacheHits != 9 {
		t.Errorf("10 alloc/free pairs of 1 MiB on one stream: DeviceAllocs %d, CacheHits %d; want 1 and 9", st.DeviceAllocs, st.CacheHits)
	}
}

// TestAsyncPoolRetriesAfterSynchronizing: memory freed on a busy stream is
// not yet usable on another; when the device pool cannot grow, the pool
// synchronizes and retries once, and the retry succeeds.
func TestAsyncPoolRetriesAfterSynchronizing(t *testing.T) {
	dev := openSimT(t, sim.Config{TotalBytes: 64 * units.MiB, NoContext: true})
	a, err := alloc.NewAsyncPool(dev, alloc.AsyncConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	s1, err := dev.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	defer s1.Close()
	s2, err := dev.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	p, err := a.Alloc(48*units.MiB, s1)
	if err != nil {
		t.Fatal(err)
	}
	err = dev.LaunchFunc(s1, 1, func(device.View, int, int) error {
		time.Sleep(30 * time.Millisecond)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Free(p, s1); err != nil {
		t.Fatal(err)
	}
	q, err := a.Alloc(48*units.MiB, s2)
	if err != nil {
		t.Fatalf("Alloc after the other stream's free: %v", err)
	}
	if st := a.Stats(); st.Retries != 1 || st.OOMs != 0 {
		t.Errorf("Retries %d, OOMs %d; want 1 and 0", st.Retries, st.OOMs)
	}
	if err := a.Free(q, s2); err != nil {
		t.Fatal(err)
	}
}

// TestAsyncPoolOutOfMemory: the error says what was asked and what the
// pool and the device have, after one retry.
func TestAsyncPoolOutOfMemory(t *testing.T) {
	dev := openSimT(t, sim.Config{TotalBytes: 64 * units.MiB, NoContext: true, AddressOnly: true})
	a, err := alloc.NewAsyncPool(dev, alloc.AsyncConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	s := dev.DefaultStream()
	p, err := a.Alloc(16*units.MiB, s)
	if err != nil {
		t.Fatal(err)
	}
	_, err = a.Alloc(100*units.MiB, s)
	if !errors.Is(err, device.ErrOutOfMemory) {
		t.Fatalf("err = %v, want device.ErrOutOfMemory", err)
	}
	for _, want := range []string{"100 MiB", "retried", "16 MiB live", "48 MiB free of 64 MiB"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	if st := a.Stats(); st.Retries != 1 || st.OOMs != 1 || st.Allocs != 1 {
		t.Errorf("Stats = %+v, want 1 retry, 1 OOM, 1 alloc", st)
	}
	if err := a.Free(p, s); err != nil {
		t.Fatal(err)
	}
}
