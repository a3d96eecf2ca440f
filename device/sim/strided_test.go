package sim_test

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/vramkit/vram/device"
	"github.com/vramkit/vram/device/sim"
)

// The simulator's own rules for 2-D copies, beyond the conformance suite:
// which sentinel each refusal wraps, what its message says, and how fault
// injection and the bandwidth emulation count a 2-D copy.
func TestStridedErrors(t *testing.T) {
	d := newSim(t, sim.Config{TotalBytes: 64 * MiB})
	s := d.DefaultStream()
	p := get[device.Ptr](t)(d.Malloc(1000))
	defer func() { check(t, d.Free(p)) }()
	host := make([]byte, 4096)
	tests := map[string]struct {
		call func() error
		want error
		says []string
	}{
		"device pitch": {func() error { return d.CopyHtoD2D(p, 99, host, 100, 100, 2, s) }, device.ErrInvalidValue,
			[]string{"device destination pitch 99 B is less than the row width", "2 rows of 100 B"}},
		"host pitch": {func() error { return d.CopyDtoH2D(host, 10, p, 100, 11, 2, s) }, device.ErrInvalidValue,
			[]string{"host destination pitch 10 B"}},
		"host too short": {func() error { return d.CopyHtoD2D(p, 100, host[:899], 100, 100, 9, s) }, device.ErrInvalidValue,
			[]string{"host source slice holds 899 B but the rows need 900 B"}},
		"host extent overflows": {func() error { return d.CopyHtoD2D(p, 100, host, 1<<63, 10, 3, s) }, device.ErrInvalidValue,
			[]string{"more than 2^64 bytes"}},
		"last row past the end": {func() error { return d.CopyHtoD2D(p.Add(10), 100, host, 100, 91, 10, s) }, device.ErrOutOfBounds,
			[]string{"row 9 (at ", "ends 1 B past the end of the 1000 B allocation", "so row 9 lies outside it"}},
		"device extent overflows": {func() error { return d.CopyHtoD2D(p, 1<<63, host, 1, 1, 3, s) }, device.ErrOutOfBounds,
			[]string{"overflows the address space"}},
		"row 0 past the end": {func() error { return d.CopyDtoH2D(host, 100, p.Add(950), 100, 100, 1, s) }, device.ErrOutOfBounds,
			[]string{"(row 0) of 100 B", "runs 50 B past its end"}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			err := tc.call()
			wantErr(t, err, tc.want)
			for _, say := range tc.says {
				if !strings.Contains(err.Error(), say) {
					t.Errorf("error %q does not say %q", err, say)
				}
			}
		})
	}
	check(t, s.Synchronize())
}

func TestStridedAddressOnly(t *testing.T) {
	d := newSim(t, sim.Config{TotalBytes: GiB, AddressOnly: true})
	p := get[device.Ptr](t)(d.Malloc(4096))
	defer func() { check(t, d.Free(p)) }()
	err := d.CopyHtoD2D(p, 64, make([]byte, 64), 64, 64, 1, d.DefaultStream())
	wantErr(t, err, device.ErrNotSupported)
	err = d.CopyDtoH2D(make([]byte, 64), 64, p, 64, 64, 1, d.DefaultStream())
	wantErr(t, err, device.ErrNotSupported)
}

func TestStridedFaults(t *testing.T) {
	t.Run("a 2-D copy is one copy to FailCopyAt", func(t *testing.T) {
		d := newSim(t, sim.Config{TotalBytes: 64 * MiB})
		s := d.DefaultStream()
		p := get[device.Ptr](t)(d.Malloc(4096))
		defer func() { check(t, d.Free(p)) }()
		check(t, d.Memset(p, 0, 4096, s))
		d.Faults().FailCopyAt(2)
		rows := bytes.Repeat([]byte("abcdefgh"), 16)            // 16 rows of 8 bytes
		check(t, d.CopyHtoD2D(p, 64, rows, 8, 8, 16, s))        // copy 1: 16 rows, one copy
		check(t, d.CopyHtoD2D(p.Add(8), 64, rows, 8, 8, 16, s)) // copy 2: fails on the stream
		wantErr(t, s.Synchronize(), device.ErrCopyFailed, sim.ErrInjected)
		if d.Faults().Fired() != 1 {
			t.Fatalf("Fired = %d, want 1", d.Faults().Fired())
		}
		got := make([]byte, 16*8)
		check(t, d.CopyDtoH2D(got, 8, p, 64, 8, 16, s)) // copy 3: not counted any more
		moved := make([]byte, 16*8)
		check(t, d.CopyDtoH2D(moved, 8, p.Add(8), 64, 8, 16, s))
		check(t, s.Synchronize())
		if !bytes.Equal(got, rows) {
			t.Errorf("the first 2-D copy, before the fault, did not land: %q", got)
		}
		if !bytes.Equal(moved, make([]byte, 16*8)) {
			t.Errorf("the failed 2-D copy moved bytes: %q", moved)
		}
	})
	t.Run("ResetAt counts a 2-D copy as a copy", func(t *testing.T) {
		d := newSim(t, sim.Config{TotalBytes: 64 * MiB})
		s := d.DefaultStream()
		p := get[device.Ptr](t)(d.Malloc(4096))
		d.Faults().ResetAt(sim.OpCopy, 2)
		check(t, d.CopyHtoD(p, []byte{1}, s))
		err := d.CopyDtoH2D(make([]byte, 64), 8, p, 64, 8, 8, s)
		wantErr(t, err, device.ErrInvalidated, sim.ErrInjected)
		wantErr(t, d.Free(p), device.ErrInvalidated)
	})
	t.Run("refused copies count nothing", func(t *testing.T) {
		d := newSim(t, sim.Config{TotalBytes: 64 * MiB})
		s := d.DefaultStream()
		p := get[device.Ptr](t)(d.Malloc(4096))
		defer func() { check(t, d.Free(p)) }()
		d.Faults().FailCopyAt(1)
		wantErr(t, d.CopyHtoD2D(p, 4, make([]byte, 64), 8, 8, 8, s), device.ErrInvalidValue)
		check(t, d.CopyHtoD2D(p, 8, make([]byte, 0), 8, 0, 8, s)) // zero width: nothing
		check(t, d.CopyHtoD2D(p, 8, make([]byte, 64), 8, 8, 8, s))
		wantErr(t, s.Synchronize(), device.ErrCopyFailed)
	})
}

// The bandwidth emulation charges the bytes moved (width × height), not
// the extent the rows span.
func TestStridedBandwidth(t *testing.T) {
	d := newSim(t, sim.Config{TotalBytes: 256 * MiB, CopyBandwidth: 100e6}) // 100 MB/s
	s := d.DefaultStream()
	const width, height, pitch = 1000, 2000, 16000 // 2 MB moved over a 32 MB extent
	p := get[device.Ptr](t)(d.Malloc(pitch * height))
	defer func() { check(t, d.Free(p)) }()
	src := make([]byte, width*height)
	sim.RetryTimed(t, func() string {
		start := time.Now()
		check(t, d.CopyHtoD2D(p, pitch, src, width, width, height, s))
		done, _ := s.Query()
		check(t, s.Synchronize())
		el := time.Since(start)
		if el < 20*time.Millisecond {
			t.Errorf("2 MB at 100 MB/s took %v, want at least 20ms", el)
		}
		switch {
		case done: // the call took the copy's whole time (load, or no asynchrony)
			return fmt.Sprintf("a 2-D copy of 2 MB at 100 MB/s was done when the call returned (%v)", el)
		case el > 250*time.Millisecond:
			return fmt.Sprintf("2 MB at 100 MB/s took %v: the emulation charged the 32 MB extent, not the bytes moved", el)
		}
		return ""
	})
}
