package sim_test

import (
	"testing"

	"github.com/vramkit/vram/device"
	"github.com/vramkit/vram/device/sim"
)

// Accesses to a Malloc with marked sub-allocations must lie inside one
// live mark; a Malloc never marked is checked as before.
func TestMarksCheckAccesses(t *testing.T) {
	d := newSim(t, sim.Config{TotalBytes: 64 * MiB})
	s := d.DefaultStream()
	seg := get[device.Ptr](t)(d.Malloc(1 << 16))
	defer func() { check(t, d.Free(seg)) }()
	plain := get[device.Ptr](t)(d.Malloc(1 << 16))
	defer func() { check(t, d.Free(plain)) }()
	a, b := seg, seg.Add(8192) // blocks [0, 4000) and [8192, 8192+100)
	check(t, d.MarkAllocated(a, 4000))
	check(t, d.MarkAllocated(b, 100))
	host := make([]byte, 8192)

	// Inside a mark: fine, from every path.
	check(t, d.CopyHtoD(a.Add(10), host[:3990], s))
	check(t, d.CopyDtoH(host[:100], b, s))
	check(t, d.Memset(a, 7, 4000, s))
	check(t, d.CopyDtoD(b, a.Add(3900), 100, s))
	check(t, d.CopyHtoD2D(a, 1000, host, 100, 100, 4, s)) // last row ends at 3100
	check(t, d.Synchronize())

	for name, f := range map[string]func() error{
		"straddles a mark's end": func() error { return d.CopyHtoD(a.Add(3999), host[:2], s) },
		"between marks":          func() error { return d.CopyDtoH(host[:1], seg.Add(5000), s) },
		"past the last mark":     func() error { return d.Memset(b.Add(100), 0, 1, s) },
		"DtoD source straddles":  func() error { return d.CopyDtoD(b, a.Add(3950), 100, s) },
		"2-D last row past mark": func() error { return d.CopyHtoD2D(a, 1000, host, 100, 100, 5, s) },
		"2-D rows from outside":  func() error { return d.CopyDtoH2D(host, 100, seg.Add(4096), 1000, 100, 2, s) },
	} {
		t.Run(name, func(t *testing.T) { wantOnly(t, f(), device.ErrOutOfBounds) })
	}

	// An unmarked Malloc is checked as today.
	check(t, d.CopyHtoD(plain.Add(5000), host[:100], s))
	wantOnly(t, d.CopyHtoD(plain.Add(1<<16-1), host[:2], s), device.ErrOutOfBounds)

	// After MarkFreed: use after free; a second free is a double free.
	check(t, d.MarkFreed(b))
	wantOnly(t, d.CopyDtoH(host[:1], b.Add(50), s), device.ErrUseAfterFree)
	wantOnly(t, d.MarkFreed(b), device.ErrDoubleFree)
	wantOnly(t, d.MarkFreed(a.Add(1)), device.ErrInvalidPointer)
	// Marked again (a pool reusing the block): usable again.
	check(t, d.MarkAllocated(b, 200))
	check(t, d.CopyDtoH(host[:200], b, s))
	check(t, d.Synchronize())

	// Bad marks.
	wantOnly(t, d.MarkAllocated(a.Add(3000), 10), device.ErrInvalidValue) // overlaps a
	wantOnly(t, d.MarkAllocated(seg.Add(1<<16-10), 11), device.ErrOutOfBounds)
	if err := d.MarkAllocated(seg, 0); err == nil {
		t.Error("MarkAllocated of 0 bytes: nil error")
	}
	mb := get[device.Ptr](t)(d.MallocAsync(100, s))
	wantOnly(t, d.MarkAllocated(mb, 10), device.ErrInvalidPointer)
	check(t, d.FreeAsync(mb, s))
	check(t, d.Synchronize())
}

// Go kernels see marks through View.Bytes; a kernel launched before the
// MarkFreed (stream-ordered after it) may still use the block.
func TestMarksKernelView(t *testing.T) {
	d := newSim(t, sim.Config{TotalBytes: 64 * MiB})
	s := d.DefaultStream()
	seg := get[device.Ptr](t)(d.Malloc(1 << 16))
	check(t, d.MarkAllocated(seg, 4000))
	read := func(p device.Ptr, n uint64) func(device.View, int, int) error {
		return func(v device.View, lo, hi int) error {
			_, err := v.Bytes(p, n)
			return err
		}
	}
	check(t, d.LaunchFunc(s, 1, read(seg, 4000)))
	check(t, d.Synchronize())
	check(t, d.LaunchFunc(s, 1, read(seg.Add(3000), 1001)))
	wantOnly(t, d.Synchronize(), device.ErrOutOfBounds)

	// Launched before the free, run after it: allowed.
	gate := make(chan struct{})
	check(t, d.LaunchFunc(s, 1, func(device.View, int, int) error { <-gate; return nil }))
	check(t, d.LaunchFunc(s, 1, read(seg, 4000)))
	check(t, d.MarkFreed(seg))
	close(gate)
	check(t, d.Synchronize())
	// Launched after it: use after free.
	check(t, d.LaunchFunc(s, 1, read(seg, 1)))
	wantOnly(t, d.Synchronize(), device.ErrUseAfterFree)

	// Re-handed smaller on the same stream: a kernel launched before the
	// free may still read the old block's whole range; one launched after
	// may not, and the block cannot be freed twice.
	check(t, d.MarkAllocated(seg, 4000))
	gate = make(chan struct{})
	check(t, d.LaunchFunc(s, 1, func(device.View, int, int) error { <-gate; return nil }))
	check(t, d.LaunchFunc(s, 1, read(seg.Add(2000), 2000)))
	check(t, d.MarkFreed(seg))
	check(t, d.MarkAllocated(seg, 1000))
	close(gate)
	check(t, d.Synchronize())
	check(t, d.LaunchFunc(s, 1, read(seg.Add(500), 1000)))
	wantOnly(t, d.Synchronize(), device.ErrOutOfBounds)
	check(t, d.LaunchFunc(s, 1, read(seg.Add(2000), 10)))
	wantOnly(t, d.Synchronize(), device.ErrUseAfterFree)
	check(t, d.MarkFreed(seg))
	wantOnly(t, d.MarkFreed(seg), device.ErrDoubleFree)

	// Freeing the Malloc drops its marks; a fresh Malloc is unmarked.
	check(t, d.Free(seg))
	p := get[device.Ptr](t)(d.Malloc(1 << 16))
	check(t, d.LaunchFunc(s, 1, read(p, 1<<16)))
	check(t, d.Synchronize())
	check(t, d.Free(p))
}
