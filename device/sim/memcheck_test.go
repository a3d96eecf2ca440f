package sim_test

import (
	"errors"
	"strings"
	"sync"
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

// memcheckFixture is one of every kind of allocation, live and freed, on
// a 64 MiB simulator d: live and liveAsync (100 B each), mapped (pinned,
// 100 B), freed and freedAsync (freed), whole (2 MiB, allocated last, so
// that nothing follows it: its end is where its granule ends, and the
// address there is in no allocation), foreign (on another simulator) and
// stale (on old, from before a Reset). The live ones are freed at cleanup.
type memcheckFixture struct {
	d, old                                    *sim.Device
	s                                         device.Stream
	live, liveAsync, freed, freedAsync, whole device.Ptr
	foreign, stale                            device.Ptr
	mapped                                    device.HostBuffer
}

func newMemcheckFixture(t *testing.T) memcheckFixture {
	t.Helper()
	var f memcheckFixture
	f.d = newSim(t, sim.Config{TotalBytes: 64 * MiB})
	other := newSim(t, sim.Config{TotalBytes: 64 * MiB})
	d, s := f.d, f.d.DefaultStream()
	f.s = s
	f.live = get[device.Ptr](t)(d.Malloc(100))
	t.Cleanup(func() { check(t, d.Free(f.live)) })
	f.liveAsync = get[device.Ptr](t)(d.MallocAsync(100, s))
	t.Cleanup(func() { check(t, d.FreeAsync(f.liveAsync, s)) })
	f.mapped = get[device.HostBuffer](t)(d.HostAlloc(100, true))
	t.Cleanup(func() { check(t, d.HostFree(f.mapped)) })
	f.freed = get[device.Ptr](t)(d.Malloc(100))
	check(t, d.Free(f.freed))
	f.freedAsync = get[device.Ptr](t)(d.MallocAsync(100, s))
	check(t, d.FreeAsync(f.freedAsync, s))
	f.whole = get[device.Ptr](t)(d.Malloc(2 * MiB))
	t.Cleanup(func() { check(t, d.Free(f.whole)) })
	f.foreign = get[device.Ptr](t)(other.Malloc(100))
	t.Cleanup(func() { check(t, other.Free(f.foreign)) })
	f.old = newSim(t, sim.Config{TotalBytes: 64 * MiB})
	f.stale = get[device.Ptr](t)(f.old.Malloc(100))
	check(t, f.old.Reset())
	return f
}

// Every kind of allocation, every kind of access: each misuse gives its
// own sentinel and no other.
func TestMemcheckDistinct(t *testing.T) {
	f := newMemcheckFixture(t)
	d, s, old := f.d, f.s, f.old
	live, liveAsync, mapped, freed, freedAsync := f.live, f.liveAsync, f.mapped, f.freed, f.freedAsync
	foreign, stale := f.foreign, f.stale
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

// A kernel launched before a stream-ordered free may use the freed
// block's whole range when it runs, even after the block has been handed
// out again (smaller, at the same address) on the freeing stream; kernels
// launched later are checked against the new owner.
func TestKernelUsesBlockFreedAfterLaunch(t *testing.T) {
	// The pool keeps its free segments, so that a freed block's address is
	// handed out again even after a synchronization.
	d := newSim(t, sim.Config{TotalBytes: 64 * MiB, ReleaseThreshold: 64 * MiB})
	// kernel launches a one-block kernel on s that records the error of
	// each read in errs when it runs.
	type read struct {
		p device.Ptr
		n uint64
	}
	kernel := func(s device.Stream, reads ...read) *[]error {
		errs := make([]error, len(reads))
		check(t, d.LaunchFunc(s, 1, func(v device.View, lo, hi int) error {
			for i, r := range reads {
				_, errs[i] = v.Bytes(r.p, r.n)
			}
			return nil
		}))
		return &errs
	}
	gate := func(s device.Stream) (open func()) {
		ch := make(chan struct{})
		check(t, d.LaunchFunc(s, 1, func(device.View, int, int) error { <-ch; return nil }))
		var once sync.Once
		open = func() { once.Do(func() { close(ch) }) }
		t.Cleanup(open)
		return open
	}
	want := func(what string, errs *[]error, wants ...error) {
		t.Helper()
		for i, w := range wants {
			if w == nil && (*errs)[i] != nil || w != nil && !errors.Is((*errs)[i], w) {
				t.Errorf("%s, read %d: %v, want %v", what, i, (*errs)[i], w)
			}
		}
	}
	sameAddr := func(p, q device.Ptr) {
		t.Helper()
		if p != q {
			t.Fatalf("the pool handed out %v after freeing %v; the test needs the same address", q, p)
		}
	}

	t.Run("re-handed smaller on the same stream", func(t *testing.T) {
		s := d.DefaultStream()
		open := gate(s)
		p := get[device.Ptr](t)(d.MallocAsync(8192, s))
		before := kernel(s, read{p, 8192}, read{p.Add(4096), 4096}, read{p.Add(8000), 500})
		check(t, d.FreeAsync(p, s))
		q := get[device.Ptr](t)(d.MallocAsync(1024, s))
		sameAddr(p, q)
		after := kernel(s, read{q, 1024}, read{q, 2048}, read{q.Add(4096), 1})
		open()
		check(t, s.Synchronize())
		want("kernel launched before the free", before, nil, nil, device.ErrOutOfBounds)
		want("kernel launched after", after, nil, device.ErrOutOfBounds, device.ErrUseAfterFree)
		check(t, d.FreeAsync(q, s))
		check(t, s.Synchronize())
	})

	t.Run("freed and re-handed twice", func(t *testing.T) {
		s := d.DefaultStream()
		open := gate(s)
		x := get[device.Ptr](t)(d.MallocAsync(8192, s))
		k1 := kernel(s, read{x, 8192})
		check(t, d.FreeAsync(x, s))
		y := get[device.Ptr](t)(d.MallocAsync(4096, s))
		sameAddr(x, y)
		k2 := kernel(s, read{y, 4096}, read{y.Add(6000), 1})
		check(t, d.FreeAsync(y, s))
		z := get[device.Ptr](t)(d.MallocAsync(1024, s))
		sameAddr(y, z)
		open()
		check(t, s.Synchronize())
		want("kernel launched before the first free", k1, nil)
		want("kernel launched between the frees", k2, nil, device.ErrUseAfterFree)
		check(t, d.FreeAsync(z, s))
		wantOnly(t, d.FreeAsync(z, s), device.ErrDoubleFree)
		check(t, s.Synchronize())
	})

	t.Run("free ordered after the kernel by an event", func(t *testing.T) {
		s1 := d.DefaultStream()
		s2 := get[device.Stream](t)(d.NewStream())
		defer func() { check(t, s2.Close()) }()
		p := get[device.Ptr](t)(d.MallocAsync(8192, s1))
		ev := get[device.Event](t)(d.NewEvent())
		defer func() { check(t, ev.Close()) }()
		check(t, ev.Record(s1))
		check(t, ev.Wait(s2))
		open := gate(s2)
		k := kernel(s2, read{p, 8192})
		check(t, ev.Record(s2))
		check(t, ev.Wait(s1))
		check(t, d.FreeAsync(p, s1))
		q := get[device.Ptr](t)(d.MallocAsync(1024, s1))
		sameAddr(p, q)
		open()
		check(t, d.Synchronize())
		want("kernel on another stream, ordered before the free", k, nil)
		check(t, d.FreeAsync(q, s1))
		check(t, d.Synchronize())
	})

	t.Run("free not ordered after the kernel", func(t *testing.T) {
		s1 := d.DefaultStream()
		s2 := get[device.Stream](t)(d.NewStream())
		defer func() { check(t, s2.Close()) }()
		p := get[device.Ptr](t)(d.MallocAsync(8192, s1))
		check(t, s1.Synchronize())
		open := gate(s2)
		k := kernel(s2, read{p.Add(4096), 4096})
		check(t, d.FreeAsync(p, s1)) // s1 is idle: the free completes at once
		check(t, s1.Synchronize())
		q := get[device.Ptr](t)(d.MallocAsync(1024, s1))
		sameAddr(p, q)
		open()
		check(t, d.Synchronize())
		want("kernel on another stream, not ordered before the free", k, device.ErrUseAfterFree)
		check(t, d.FreeAsync(q, s1))
		check(t, d.Synchronize())
	})

	t.Run("Free waits for the kernel", func(t *testing.T) {
		s := d.DefaultStream()
		open := gate(s)
		p := get[device.Ptr](t)(d.Malloc(8192))
		k := kernel(s, read{p, 8192})
		freed := make(chan error)
		go func() { freed <- d.Free(p) }()
		open()
		check(t, <-freed)
		want("kernel launched before Free", k, nil)
		check(t, s.Synchronize())
	})
}

// Copies and memsets of 0 bytes move nothing but still check a non-nil
// device pointer; a nil one is a no-op, and a pointer just past the end
// of an allocation is in bounds.
func TestZeroByteOpsChecked(t *testing.T) {
	f := newMemcheckFixture(t)
	d, s, old := f.d, f.s, f.old
	live, async, whole, freed, freedAsync := f.live, f.liveAsync, f.whole, f.freed, f.freedAsync
	foreign, stale := f.foreign, f.stale
	tests := map[string]struct {
		call func() error
		want error // nil: no error
	}{
		"HtoD nil pointer":                 {func() error { return d.CopyHtoD(0, nil, s) }, nil},
		"DtoD nil pointers":                {func() error { return d.CopyDtoD(0, 0, 0, s) }, nil},
		"memset nil pointer":               {func() error { return d.Memset(0, 1, 0, s) }, nil},
		"2-D nil pointer":                  {func() error { return d.CopyHtoD2D(0, 16, nil, 16, 0, 4, s) }, nil},
		"HtoD live":                        {func() error { return d.CopyHtoD(live.Add(50), nil, s) }, nil},
		"DtoH just past the end":           {func() error { return d.CopyDtoH(nil, live.Add(100), s) }, nil},
		"memset just past a whole granule": {func() error { return d.Memset(whole.Add(2*MiB), 0, 0, s) }, nil},
		"DtoD just past a MallocAsync":     {func() error { return d.CopyDtoD(async.Add(100), live, 0, s) }, nil},
		"HtoD past the end":                {func() error { return d.CopyHtoD(live.Add(101), nil, s) }, device.ErrOutOfBounds},
		"memset past a MallocAsync":        {func() error { return d.Memset(async.Add(101), 0, 0, s) }, device.ErrOutOfBounds},
		"HtoD freed":                       {func() error { return d.CopyHtoD(freed, []byte{}, s) }, device.ErrUseAfterFree},
		"DtoD freed":                       {func() error { return d.CopyDtoD(freed, freed, 0, s) }, device.ErrUseAfterFree},
		"DtoD freed source":                {func() error { return d.CopyDtoD(live, freedAsync, 0, s) }, device.ErrUseAfterFree},
		"memset freed":                     {func() error { return d.Memset(freed, 1, 0, s) }, device.ErrUseAfterFree},
		"2-D freed, zero height":           {func() error { return d.CopyDtoH2D(nil, 16, freed, 16, 8, 0, s) }, device.ErrUseAfterFree},
		"2-D freed, zero width":            {func() error { return d.CopyHtoD2D(freedAsync, 16, nil, 16, 0, 3, s) }, device.ErrUseAfterFree},
		"HtoD foreign":                     {func() error { return d.CopyHtoD(foreign, nil, s) }, device.ErrInvalidPointer},
		"DtoH stale":                       {func() error { return old.CopyDtoH(nil, stale, old.DefaultStream()) }, device.ErrInvalidated},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			err := tc.call()
			if tc.want == nil {
				check(t, err)
				return
			}
			wantOnly(t, err, tc.want)
		})
	}
	check(t, s.Synchronize())
}
