package sim_test

import (
	"testing"

	"github.com/vramkit/vram/device"
	"github.com/vramkit/vram/device/sim"
)

// A backed device makes an allocation's bytes on first access; bytes past
// Config.BackingLimit are ErrOutOfMemory, never the Go runtime's fatal
// out of memory (a 64 GiB granularity made a 64 GiB slice for an 80-byte
// copy and ended the process).
func TestBackingLimit(t *testing.T) {
	tests := map[string]struct {
		cfg   sim.Config
		alloc func(d *sim.Device) (device.Ptr, func() error, error)
	}{
		"async pool segment of a 64 GiB granule": {
			cfg: sim.Config{TotalBytes: 256 * GiB, Granularity: 64 * GiB, BackingLimit: GiB},
			alloc: func(d *sim.Device) (device.Ptr, func() error, error) {
				p, err := d.MallocAsync(80, d.DefaultStream())
				return p, func() error { return d.FreeAsync(p, d.DefaultStream()) }, err
			},
		},
		"Malloc past the limit": {
			cfg: sim.Config{TotalBytes: 8 * GiB, BackingLimit: 64 * MiB},
			alloc: func(d *sim.Device) (device.Ptr, func() error, error) {
				p, err := d.Malloc(65 * MiB)
				return p, func() error { return d.Free(p) }, err
			},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			d := newSim(t, tc.cfg)
			p, free, err := tc.alloc(d)
			check(t, err)
			s := d.DefaultStream()
			wantErr(t, d.CopyHtoD(p, make([]byte, 80), s), device.ErrOutOfMemory)
			wantErr(t, d.Memset(p, 1, 80, s), device.ErrOutOfMemory)
			check(t, s.Synchronize())
			check(t, free())
			check(t, d.TrimPool(0))
		})
	}
	t.Run("freed bytes count no more", func(t *testing.T) {
		d := newSim(t, sim.Config{TotalBytes: GiB, BackingLimit: 48 * MiB})
		s := d.DefaultStream()
		for range 4 { // 4 × 32 MiB through a 48 MiB limit
			p := get[device.Ptr](t)(d.Malloc(32 * MiB))
			check(t, d.CopyHtoD(p, []byte{1}, s))
			q := get[device.Ptr](t)(d.MallocAsync(32*MiB, s))
			wantErr(t, d.CopyHtoD(q, []byte{1}, s), device.ErrOutOfMemory)
			check(t, d.FreeAsync(q, s))
			check(t, s.Synchronize())
			check(t, d.Free(p))
			check(t, d.TrimPool(0))
		}
		p := get[device.Ptr](t)(d.Malloc(32 * MiB))
		check(t, d.CopyHtoD(p, []byte{1}, s))
		check(t, d.Reset()) // the reset drops the bytes
		q := get[device.Ptr](t)(d.Malloc(32 * MiB))
		check(t, d.CopyHtoD(q, []byte{1}, d.DefaultStream()))
		check(t, d.Free(q))
	})
	t.Run("default limit", func(t *testing.T) {
		d := newSim(t, sim.Config{TotalBytes: 256 * GiB, Granularity: 64 * GiB})
		if lim := d.Config().BackingLimit; lim == 0 || lim > sim.DefaultBackingLimit {
			t.Fatalf("default BackingLimit = %d, want 1 to %d", lim, sim.DefaultBackingLimit)
		}
		if d.Config().BackingLimit >= 64*GiB {
			t.Skip("the host could back a 64 GiB allocation")
		}
		s := d.DefaultStream()
		p := get[device.Ptr](t)(d.MallocAsync(80, s))
		wantErr(t, d.CopyHtoD(p, make([]byte, 80), s), device.ErrOutOfMemory)
		check(t, d.FreeAsync(p, s))
		check(t, s.Synchronize())
	})
}

func TestParseSpecBacking(t *testing.T) {
	c, err := sim.ParseSpec("backing=3GiB")
	check(t, err)
	if c.BackingLimit != 3*GiB {
		t.Errorf("backing=3GiB gives BackingLimit %d", c.BackingLimit)
	}
	_, err = sim.ParseSpec("backing=0")
	wantErr(t, err, device.ErrBadSpec)
}
