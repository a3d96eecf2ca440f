package sim_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/vramkit/vram/device"
	"github.com/vramkit/vram/device/sim"
)

// memcheckErrs are the memory checker's sentinels; each misuse must wrap
// exactly one of them.
var memcheckErrs = []error{device.ErrOutOfBounds, device.ErrUseAfterFree, device.ErrDoubleFree,
	device.ErrInvalidated, device.ErrInvalidPointer}

func wantOnly(t *testing.T, err, want error) {
	t.Helper()
	wantErr(t, err, want)
	for _, other := range memcheckErrs {
		if other != want && errors.Is(err, other) {
			t.Errorf("error %v wraps %q as well as %q", err, other, want)
		}
	}
}

// Every kind of allocation, every kind of access: each misuse gives its
// own sentinel and no other.
func TestMemcheckDistinct(t *testing.T) {
	d := newSim(t, sim.Config{TotalBytes: 64 * MiB})
	other := newSim(t, sim.Config{TotalBytes: 64 * MiB})
	s := d.DefaultStream()
	live := get[device.Ptr](t)(d.Malloc(100))
	defer func() { check(t, d.Free(live)) }()
	liveAsync := get[device.Ptr](t)(d.MallocAsync(100, s))
	defer func() { check(t, d.FreeAsync(liveAsync, s)) }()
	mapped := get[device.HostBuffer](t)(d.HostAlloc(100, true))
	defer func() { check(t, d.HostFree(mapped)) }()
	freed := get[device.Ptr](t)(d.Malloc(100))
	check(t, d.Free(freed))
	freedAsync := get[device.Ptr](t)(d.MallocAsync(100, s))
	check(t, d.FreeAsync(freedAsync, s))
	foreign := get[device.Ptr](t)(other.Malloc(100))
	defer func() { check(t, other.Free(foreign)) }()
	// A device reset in the middle: pointers of a generation before.
	old := newSim(t, sim.Config{TotalBytes: 64 * MiB})
	stale := get[device.Ptr](t)(old.Malloc(100))
	check(t, old.Reset())
	one := []byte{1}
	tests := map[string]struct {
		call func() error
		want error
	}{
		"HtoD past a Malloc":            {func() error { return d.CopyHtoD(live.Add(99), []byte{1, 2}, s) }, device.ErrOutOfBounds},
		"DtoH past a MallocAsync":       {func() error { return d.CopyDtoH(make([]byte, 101), liveAsync, s) }, device.ErrOutOfBounds},
		"memset past mapped memory":     {func() error { return d.Memset(mapped.DevicePtr.Add(50), 0, 51, s) }, device.ErrOutOfBounds},
		"DtoD into a freed Malloc":      {func() error { return d.CopyDtoD(freed, live, 8, s) }, device.ErrUseAfterFree},
		"DtoD from a freed MallocAsync": {func() error { return d.CopyDtoD(live, freedAsync, 8, s) }, device.ErrUseAfterFree},
		"2-D copy into a freed Malloc":  {func() error { return d.CopyHtoD2D(freed, 16, make([]byte, 32), 16, 8, 2, s) }, device.ErrUseAfterFree},
		"Free twice":                    {func() error { return d.Free(freed) }, device.ErrDoubleFree},
		"FreeAsync twice":               {func() error { return d.FreeAsync(freedAsync, s) }, device.ErrDoubleFree},
		"Free of a stale pointer":       {func() error { return old.Free(stale) }, device.ErrInvalidated},
		"copy to a stale pointer":       {func() error { return old.CopyHtoD(stale, one, old.DefaultStream()) }, device.ErrInvalidated},
		"copy to a foreign pointer":     {func() error { return d.CopyHtoD(foreign, one, s) }, device.ErrInvalidPointer},
		"Free of a foreign pointer":     {func() error { return d.Free(foreign) }, device.ErrInvalidPointer},
		"Free of an interior pointer":   {func() error { return d.Free(live.Add(1)) }, device.ErrInvalidPointer},
		"copy to null":                  {func() error { return d.CopyHtoD(0, one, s) }, device.ErrInvalidPointer},
		"copy into pool free memory":    {func() error { return d.CopyHtoD(liveAsync.Add(64<<10), one, s) }, device.ErrInvalidPointer},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) { wantOnly(t, tc.call(), tc.want) })
	}
	check(t, s.Synchronize())
}

// A freed address stays a use after free after the device has forgotten
// which allocation it was (past the last 65,536 frees).
func TestUseAfterFreeBeyondMemory(t *testing.T) {
	if testing.Short() {
		t.Skip("70,000 Malloc/Free pairs")
	}
	d := newSim(t, sim.Config{TotalBytes: 64 * MiB, Granularity: 4096})
	first := get[device.Ptr](t)(d.Malloc(100))
	check(t, d.Free(first))
	for range 70_000 {
		p := get[device.Ptr](t)(d.Malloc(100))
		check(t, d.Free(p))
	}
	err := d.CopyHtoD(first, []byte{1}, d.DefaultStream())
	wantOnly(t, err, device.ErrUseAfterFree)
	if !strings.Contains(err.Error(), "forgotten") {
		t.Errorf("the error does not say why the allocation is not named: %v", err)
	}
	err = d.Free(first)
	wantOnly(t, err, device.ErrInvalidPointer)
	if !strings.Contains(err.Error(), "double free") {
		t.Errorf("the error does not say it may be a double free: %v", err)
	}
	// An address never handed out is still just invalid.
	err = d.CopyHtoD(first.Add(1<<30), []byte{1}, d.DefaultStream())
	wantOnly(t, err, device.ErrInvalidPointer)
	check(t, d.Synchronize())
}

// A pointer from before a Reset stays invalidated however many new
// allocations follow: a generation's addresses are never handed out again.
func TestResetPointersStayInvalid(t *testing.T) {
	d := newSim(t, sim.Config{TotalBytes: 64 * MiB})
	p := get[device.Ptr](t)(d.Malloc(2 * MiB))
	check(t, d.Reset())
	var ps []device.Ptr
	for range 30 { // fill the device
		ps = append(ps, get[device.Ptr](t)(d.Malloc(2*MiB)))
	}
	for _, q := range ps {
		if q == p {
			t.Fatalf("an address from before the Reset was handed out again: %v", q)
		}
	}
	wantOnly(t, d.CopyHtoD(p, []byte{1}, d.DefaultStream()), device.ErrInvalidated)
	wantOnly(t, d.Free(p), device.ErrInvalidated)
	for _, q := range ps {
		check(t, d.Free(q))
	}
}
