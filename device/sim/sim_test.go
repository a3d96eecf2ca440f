package sim_test

import (
	"errors"
	"fmt"
	"math"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/vramkit/vram/device"
	"github.com/vramkit/vram/device/devicetest"
	"github.com/vramkit/vram/device/sim"
	"github.com/vramkit/vram/internal/simtest"
	"github.com/vramkit/vram/internal/units"
)

// TestMain runs the tests, or, in a process the shared-device tests
// started (helperEnv set), the helper they asked for.
func TestMain(m *testing.M) {
	if mode := os.Getenv(helperEnv); mode != "" {
		os.Exit(helperMain(mode))
	}
	goleak.VerifyTestMain(m)
}

const (
	MiB = units.MiB
	GiB = units.GiB
)

// newSim is simtest's device of cfg: closed when the test ends, and the
// test failed if anything is left on it.
func newSim(t testing.TB, cfg sim.Config) *sim.Device {
	t.Helper()
	return simtest.New(t, cfg.TotalBytes, func(c *sim.Config) { *c = cfg })
}

func check(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func get[T any](t testing.TB) func(T, error) T {
	return func(v T, err error) T {
		t.Helper()
		check(t, err)
		return v
	}
}

func wantErr(t testing.TB, err error, targets ...error) {
	t.Helper()
	for _, target := range targets {
		if !errors.Is(err, target) {
			t.Fatalf("error %v: want it to wrap %q", err, target)
		}
	}
}

func freeMem(t testing.TB, d *sim.Device) uint64 {
	t.Helper()
	f, _, err := d.MemInfo()
	check(t, err)
	return f
}

func TestConformance(t *testing.T) {
	configs := map[string]sim.Config{
		"backed":        {TotalBytes: 256 * MiB},
		"address-only":  {TotalBytes: 100 * GiB, AddressOnly: true},
		"small granule": {TotalBytes: 64 * MiB, Granularity: 64 << 10, KernelWorkers: 3},
		"defaults":      {},
	}
	for name, cfg := range configs {
		t.Run(name, func(t *testing.T) {
			devicetest.Run(t, func(t *testing.T) device.Device {
				d, err := sim.New(cfg)
				check(t, err)
				return d
			})
		})
	}
}

func TestConfigDefaults(t *testing.T) {
	tests := map[string]struct {
		cfg                  sim.Config
		total, context, gran uint64
		backed               bool
	}{
		"zero":         {sim.Config{}, 8 * GiB, 256 * MiB, 2 * MiB, true},
		"small":        {sim.Config{TotalBytes: 256 * MiB}, 256 * MiB, 8 * MiB, 2 * MiB, true},
		"tiny rounds":  {sim.Config{TotalBytes: 40 * MiB}, 40 * MiB, 0, 2 * MiB, true},
		"no context":   {sim.Config{TotalBytes: GiB, NoContext: true, ContextBytes: 5 * MiB}, GiB, 0, 2 * MiB, true},
		"explicit":     {sim.Config{TotalBytes: GiB, ContextBytes: 3 * MiB, Granularity: 4096}, GiB, 3 * MiB, 4096, true},
		"address-only": {sim.Config{TotalBytes: 80 * GiB, AddressOnly: true}, 80 * GiB, 256 * MiB, 2 * MiB, false},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			d := newSim(t, tc.cfg)
			info := d.Info()
			if info.TotalBytes != tc.total || info.ContextBytes != tc.context || info.Granularity != tc.gran || info.Backed != tc.backed {
				t.Fatalf("Info = %+v; want total %d context %d granularity %d backed %v", info, tc.total, tc.context, tc.gran, tc.backed)
			}
			if f := freeMem(t, d); f != tc.total-tc.context {
				t.Errorf("free = %d, want total - context = %d", f, tc.total-tc.context)
			}
		})
	}
}

func TestConfigInvalid(t *testing.T) {
	tests := map[string]sim.Config{
		"granularity not a power of two": {Granularity: 3 * MiB},
		"granularity below alignment":    {Granularity: 256},
		"total below granularity":        {TotalBytes: MiB},
		"context takes everything":       {TotalBytes: 64 * MiB, ContextBytes: 64 * MiB},
		"negative workers":               {KernelWorkers: -1},
		"negative ordinal":               {Ordinal: -2},
	}
	for name, cfg := range tests {
		t.Run(name, func(t *testing.T) {
			d, err := sim.New(cfg)
			if err == nil {
				d.Close()
				t.Fatal("New accepted an invalid config")
			}
			wantErr(t, err, device.ErrInvalidValue)
		})
	}
}

func TestExactAccounting(t *testing.T) {
	d := newSim(t, sim.Config{TotalBytes: 64 * MiB, NoContext: true})
	tests := map[string]struct{ n, reserved uint64 }{
		"one byte":       {1, 2 * MiB},
		"granule":        {2 * MiB, 2 * MiB},
		"granule plus 1": {2*MiB + 1, 4 * MiB},
		"odd":            {5*MiB + 77, 6 * MiB},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			before := freeMem(t, d)
			p := get[device.Ptr](t)(d.Malloc(tc.n))
			if got := before - freeMem(t, d); got != tc.reserved {
				t.Errorf("Malloc(%d) reserved %d, want %d", tc.n, got, tc.reserved)
			}
			if uint64(p)%(2*MiB) != 0 || uint64(p) < sim.AddressBase {
				t.Errorf("Malloc address %v: want 2 MiB aligned, at or above 0x%x", p, sim.AddressBase)
			}
			check(t, d.Free(p))
			if freeMem(t, d) != before {
				t.Errorf("free did not return to %d", before)
			}
		})
	}
	t.Run("fill exactly", func(t *testing.T) {
		var ps []device.Ptr
		for range 32 {
			ps = append(ps, get[device.Ptr](t)(d.Malloc(2*MiB)))
		}
		if f := freeMem(t, d); f != 0 {
			t.Fatalf("after 32 × 2 MiB on a 64 MiB device free = %d", f)
		}
		_, err := d.Malloc(1)
		wantErr(t, err, device.ErrOutOfMemory)
		if !strings.Contains(err.Error(), "0 B of 64 MiB is free") {
			t.Errorf("OOM message does not give the figures: %v", err)
		}
		for _, p := range ps {
			check(t, d.Free(p))
		}
	})
	t.Run("pool counts", func(t *testing.T) {
		s := d.DefaultStream()
		check(t, d.SetReleaseThreshold(1<<62))
		before := freeMem(t, d)
		p := get[device.Ptr](t)(d.MallocAsync(1000, s))
		q := get[device.Ptr](t)(d.MallocAsync(3*MiB, s))
		res, used, err := d.PoolUsage()
		check(t, err)
		// 1000 B → a 2 MiB segment; 3 MiB does not fit the rest → a 4 MiB one.
		if res != 6*MiB || used != 1024+3*MiB {
			t.Errorf("PoolUsage = %d reserved, %d used; want 6 MiB, 3 MiB + 1024", res, used)
		}
		if got := before - freeMem(t, d); got != 6*MiB {
			t.Errorf("the pool took %d of free memory, want 6 MiB", got)
		}
		if uint64(p)%sim.PoolAlignment != 0 || uint64(q)%sim.PoolAlignment != 0 {
			t.Errorf("MallocAsync addresses %v, %v not %d-aligned", p, q, sim.PoolAlignment)
		}
		check(t, d.FreeAsync(p, s))
		check(t, d.FreeAsync(q, s))
		check(t, d.SetReleaseThreshold(0))
		check(t, s.Synchronize())
		if freeMem(t, d) != before {
			t.Errorf("free memory did not return after the pool released")
		}
	})
	t.Run("pinned takes nothing", func(t *testing.T) {
		before := freeMem(t, d)
		b := get[device.HostBuffer](t)(d.HostAlloc(10*MiB, true))
		if freeMem(t, d) != before {
			t.Errorf("mapped pinned memory changed device free memory")
		}
		check(t, d.HostFree(b))
	})
}

func TestAddresses(t *testing.T) {
	d1 := newSim(t, sim.Config{TotalBytes: 64 * MiB})
	d2 := newSim(t, sim.Config{TotalBytes: 64 * MiB})
	p := get[device.Ptr](t)(d1.Malloc(100))
	q := get[device.Ptr](t)(d2.Malloc(100))
	if p == q {
		t.Fatalf("two devices handed out the same address %v", p)
	}
	// Next-fit: a freed address is not handed out again at once, so a
	// stale pointer stays recognisable.
	check(t, d1.Free(p))
	p2 := get[device.Ptr](t)(d1.Malloc(100))
	if p2 == p {
		t.Errorf("the address just freed was handed out again at once")
	}
	err := d1.CopyHtoD(p, []byte{1}, d1.DefaultStream())
	wantErr(t, err, device.ErrUseAfterFree)
	err = d1.CopyHtoD(q, []byte{1}, d1.DefaultStream())
	wantErr(t, err, device.ErrInvalidPointer)
	if !strings.Contains(err.Error(), "another device") {
		t.Errorf("a foreign pointer's error does not say so: %v", err)
	}
	check(t, d1.Free(p2))
	check(t, d2.Free(q))
}

func TestAddressOnly(t *testing.T) {
	d := newSim(t, sim.Config{TotalBytes: 100 * GiB, AddressOnly: true})
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	var ps []device.Ptr
	for range 90 {
		ps = append(ps, get[device.Ptr](t)(d.Malloc(GiB)))
	}
	s := d.DefaultStream()
	var as []device.Ptr
	for range 4 {
		as = append(as, get[device.Ptr](t)(d.MallocAsync(GiB, s)))
	}
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	if grew := int64(after.HeapAlloc) - int64(before.HeapAlloc); grew > 16<<20 {
		t.Errorf("94 GiB of address-only allocations grew the heap by %s", units.Format(uint64(grew)))
	}
	ops := map[string]func() error{
		"CopyHtoD":   func() error { return d.CopyHtoD(ps[0], []byte{1}, s) },
		"CopyDtoH":   func() error { return d.CopyDtoH([]byte{1}, ps[0], s) },
		"CopyDtoD":   func() error { return d.CopyDtoD(ps[0], ps[1], 1, s) },
		"Memset":     func() error { return d.Memset(ps[0], 1, 1, s) },
		"LaunchFunc": func() error { return d.LaunchFunc(s, 1, func(device.View, int, int) error { return nil }) },
	}
	for name, op := range ops {
		t.Run(name, func(t *testing.T) {
			err := op()
			wantErr(t, err, device.ErrNotSupported)
			if !strings.Contains(err.Error(), "address-only") {
				t.Errorf("error does not say the device is address-only: %v", err)
			}
		})
	}
	_, err := d.Malloc(6 * GiB)
	wantErr(t, err, device.ErrOutOfMemory)
	for _, p := range ps {
		check(t, d.Free(p))
	}
	for _, p := range as {
		check(t, d.FreeAsync(p, s))
	}
	check(t, d.Synchronize())
	if f := freeMem(t, d); f != 100*GiB-256*MiB {
		t.Errorf("free after everything was released = %d", f)
	}
}

func TestFaults(t *testing.T) {
	t.Run("OOM at the nth allocation", func(t *testing.T) {
		d := newSim(t, sim.Config{TotalBytes: 64 * MiB})
		d.Faults().OOMAtAlloc(4)
		s := d.DefaultStream()
		_, err := d.Malloc(0) // refused before counting
		wantErr(t, err, device.ErrInvalidValue)
		p1 := get[device.Ptr](t)(d.Malloc(10))
		p2 := get[device.Ptr](t)(d.MallocAsync(10, s))
		h := get[device.HostBuffer](t)(d.HostAlloc(10, false))
		check(t, d.HostFree(h))
		before := freeMem(t, d)
		_, err = d.Malloc(10)
		wantErr(t, err, device.ErrOutOfMemory, sim.ErrInjected)
		if freeMem(t, d) != before {
			t.Errorf("the failed allocation changed free memory")
		}
		p4 := get[device.Ptr](t)(d.Malloc(10)) // fires once
		if d.Faults().Fired() != 1 {
			t.Errorf("Fired = %d, want 1", d.Faults().Fired())
		}
		check(t, d.Free(p1))
		check(t, d.FreeAsync(p2, s))
		check(t, d.Free(p4))
	})
	t.Run("OOM above a size", func(t *testing.T) {
		d := newSim(t, sim.Config{TotalBytes: 64 * MiB})
		d.Faults().OOMAbove(MiB)
		_, err := d.Malloc(MiB + 1)
		wantErr(t, err, device.ErrOutOfMemory, sim.ErrInjected)
		_, err = d.MallocAsync(2*MiB, d.DefaultStream())
		wantErr(t, err, device.ErrOutOfMemory, sim.ErrInjected)
		_, err = d.HostAlloc(2*MiB, false)
		wantErr(t, err, device.ErrOutOfMemory, sim.ErrInjected)
		p := get[device.Ptr](t)(d.Malloc(MiB))
		check(t, d.Free(p))
		d.Faults().OOMAbove(0)
		p = get[device.Ptr](t)(d.Malloc(8 * MiB))
		check(t, d.Free(p))
	})
	t.Run("failing copy", func(t *testing.T) {
		d := newSim(t, sim.Config{TotalBytes: 64 * MiB})
		s := d.DefaultStream()
		p := get[device.Ptr](t)(d.Malloc(8))
		d.Faults().FailCopyAt(2)
		check(t, d.CopyHtoD(p, []byte("first"), s))
		check(t, d.CopyHtoD(p, []byte("second"), s)) // fails on the stream
		got := make([]byte, 6)
		check(t, d.CopyDtoH(got, p, s))
		err := s.Synchronize()
		wantErr(t, err, device.ErrCopyFailed, sim.ErrInjected)
		if string(got[:5]) != "first" {
			t.Errorf("the failed copy moved bytes: device holds %q", got)
		}
		check(t, s.Synchronize()) // reported once
		check(t, d.Free(p))
	})
	ops := map[string]struct {
		op   sim.Op
		call func(d *sim.Device, p device.Ptr) error
	}{
		"alloc":  {sim.OpAlloc, func(d *sim.Device, _ device.Ptr) error { _, err := d.Malloc(1); return err }},
		"free":   {sim.OpFree, func(d *sim.Device, p device.Ptr) error { return d.Free(p) }},
		"copy":   {sim.OpCopy, func(d *sim.Device, p device.Ptr) error { return d.CopyHtoD(p, []byte{1}, d.DefaultStream()) }},
		"memset": {sim.OpMemset, func(d *sim.Device, p device.Ptr) error { return d.Memset(p, 0, 1, d.DefaultStream()) }},
		"launch": {sim.OpLaunch, func(d *sim.Device, _ device.Ptr) error {
			return d.LaunchFunc(d.DefaultStream(), 1, func(device.View, int, int) error { return nil })
		}},
		"sync": {sim.OpSync, func(d *sim.Device, _ device.Ptr) error { return d.DefaultStream().Synchronize() }},
	}
	for name, tc := range ops {
		t.Run("reset at "+name, func(t *testing.T) {
			d := newSim(t, sim.Config{TotalBytes: 64 * MiB})
			start := freeMem(t, d)
			p := get[device.Ptr](t)(d.Malloc(8))
			keep := get[device.Ptr](t)(d.Malloc(8))
			d.Faults().ResetAt(tc.op, 1)
			wantErr(t, tc.call(d, p), device.ErrInvalidated, sim.ErrInjected)
			wantErr(t, d.Free(keep), device.ErrInvalidated)
			if freeMem(t, d) != start {
				t.Errorf("the injected reset did not release memory")
			}
			check(t, tc.call(d, get[device.Ptr](t)(d.Malloc(8)))) // fired once
			check(t, d.Reset())                                   // drop what is left
		})
	}
	t.Run("clear", func(t *testing.T) {
		d := newSim(t, sim.Config{TotalBytes: 64 * MiB})
		d.Faults().OOMAtAlloc(1)
		d.Faults().FailCopyAt(1)
		d.Faults().ResetAt(sim.OpSync, 1)
		d.Faults().Clear()
		p := get[device.Ptr](t)(d.Malloc(8))
		check(t, d.CopyHtoD(p, []byte{1}, d.DefaultStream()))
		check(t, d.Synchronize())
		check(t, d.Free(p))
		if d.Faults().Fired() != 0 {
			t.Errorf("Fired = %d after Clear", d.Faults().Fired())
		}
	})
}

func TestLeakReport(t *testing.T) {
	d, err := sim.New(sim.Config{TotalBytes: 64 * MiB})
	check(t, err)
	s := get[device.Stream](t)(d.NewStream())
	_ = get[device.Event](t)(d.NewEvent())
	p := get[device.Ptr](t)(d.Malloc(3000))
	_ = get[device.Ptr](t)(d.Malloc(1 * MiB))
	_ = get[device.Ptr](t)(d.MallocAsync(100, s))
	_ = get[device.HostBuffer](t)(d.HostAlloc(50, false))
	check(t, d.Free(p))
	rep := d.Leaks()
	want := sim.LeakReport{Allocs: 1, AllocBytes: MiB, AsyncAllocs: 1, AsyncBytes: 100, HostBuffers: 1, HostBytes: 50, Streams: 1, Events: 1}
	rep.Details = nil
	if rep.String() != want.String() || rep.Allocs != 1 || rep.AsyncBytes != 100 {
		t.Errorf("Leaks = %v, want %v", rep, want)
	}
	err = d.Close()
	var le *sim.LeakError
	if !errors.As(err, &le) || !errors.Is(err, sim.ErrLeak) {
		t.Fatalf("Close with leaks = %v; want a *LeakError matching ErrLeak", err)
	}
	if len(le.Report.Details) != 3 || !strings.Contains(err.Error(), "MallocAsync #") || !strings.Contains(err.Error(), "1 Malloc allocations (1 MiB)") {
		t.Errorf("leak error lacks details: %v", err)
	}
	if !d.Leaks().Empty() {
		t.Errorf("Leaks after Close = %v, want nothing", d.Leaks())
	}

	clean, err := sim.New(sim.Config{TotalBytes: 64 * MiB})
	check(t, err)
	if !clean.Leaks().Empty() {
		t.Errorf("a fresh device reports %v", clean.Leaks())
	}
	check(t, clean.Close())
}

func TestPoolEmulation(t *testing.T) {
	t.Run("release threshold kept across a reset", func(t *testing.T) {
		d := newSim(t, sim.Config{TotalBytes: 64 * MiB})
		check(t, d.SetReleaseThreshold(1<<62))
		check(t, d.Reset())
		s := d.DefaultStream()
		p := get[device.Ptr](t)(d.MallocAsync(2*MiB, s))
		check(t, d.FreeAsync(p, s))
		check(t, s.Synchronize())
		if res, _, _ := d.PoolUsage(); res != 2*MiB {
			t.Errorf("after a reset and a synchronize the pool keeps %d bytes, want 2 MiB: the release threshold set before the reset was lost", res)
		}
		check(t, d.TrimPool(0))
	})
	t.Run("cross-stream reuse after completion", func(t *testing.T) {
		d := newSim(t, sim.Config{TotalBytes: 64 * MiB})
		s1 := get[device.Stream](t)(d.NewStream())
		s2 := get[device.Stream](t)(d.NewStream())
		check(t, d.SetReleaseThreshold(1<<62))
		gate := make(chan struct{})
		check(t, d.LaunchFunc(s1, 1, func(device.View, int, int) error { <-gate; return nil }))
		p := get[device.Ptr](t)(d.MallocAsync(2*MiB, s1))
		check(t, d.FreeAsync(p, s1))
		q := get[device.Ptr](t)(d.MallocAsync(2*MiB, s2))
		if q == p {
			t.Fatal("reused across streams before the free completed")
		}
		close(gate)
		check(t, s1.Synchronize())
		r := get[device.Ptr](t)(d.MallocAsync(2*MiB, s2))
		if r != p {
			t.Errorf("after stream 1 finished its block %v should be reusable on stream 2, got %v", p, r)
		}
		res, _, _ := d.PoolUsage()
		if res != 4*MiB {
			t.Errorf("reserved %d, want 4 MiB (no third segment)", res)
		}
		check(t, d.FreeAsync(q, s2))
		check(t, d.FreeAsync(r, s2))
		check(t, s1.Close())
		check(t, s2.Close())
		check(t, d.TrimPool(0))
	})
	t.Run("reuse follows the work up to the free, not later work", func(t *testing.T) {
		// Stream 1: kernel A (held), MallocAsync p, FreeAsync p, kernel B
		// (held). While A runs, stream 2 may not have p; once A is done p
		// is free for stream 2, though B still runs on stream 1.
		d := newSim(t, sim.Config{TotalBytes: 64 * MiB})
		s1 := get[device.Stream](t)(d.NewStream())
		s2 := get[device.Stream](t)(d.NewStream())
		e := get[device.Event](t)(d.NewEvent())
		check(t, d.SetReleaseThreshold(1<<62))
		gateA, gateB := make(chan struct{}), make(chan struct{})
		check(t, d.LaunchFunc(s1, 1, func(device.View, int, int) error { <-gateA; return nil }))
		p := get[device.Ptr](t)(d.MallocAsync(MiB, s1))
		check(t, d.FreeAsync(p, s1))
		check(t, e.Record(s1)) // marks the work up to the free
		check(t, d.LaunchFunc(s1, 1, func(device.View, int, int) error { <-gateB; return nil }))

		q := get[device.Ptr](t)(d.MallocAsync(MiB, s2))
		if q == p {
			t.Fatal("stream 2 got the block while stream 1's work before the free was still running")
		}
		check(t, d.CheckInvariants())
		close(gateA)
		check(t, e.Synchronize())
		if done, _ := s1.Query(); done {
			t.Fatal("stream 1 finished kernel B: the test no longer holds later work")
		}
		r := get[device.Ptr](t)(d.MallocAsync(MiB, s2))
		if r != p {
			t.Errorf("stream 2 got %v, want the block %v whose free completed (stream 1's later work must not matter)", r, p)
		}
		check(t, d.CheckInvariants())
		close(gateB)
		check(t, d.FreeAsync(q, s2))
		check(t, d.FreeAsync(r, s2))
		check(t, e.Close())
		check(t, s1.Close())
		check(t, s2.Close())
		check(t, d.TrimPool(0))
	})
	t.Run("another stream's pending block is never taken", func(t *testing.T) {
		// One 2 MiB segment, two 1 MiB blocks; b is freed on held stream
		// 2. The only free block that fits is b, so stream 1 must grow
		// the pool rather than take it.
		d := newSim(t, sim.Config{TotalBytes: 64 * MiB})
		s1 := get[device.Stream](t)(d.NewStream())
		s2 := get[device.Stream](t)(d.NewStream())
		check(t, d.SetReleaseThreshold(1<<62))
		gate := make(chan struct{})
		check(t, d.LaunchFunc(s2, 1, func(device.View, int, int) error { <-gate; return nil }))
		a := get[device.Ptr](t)(d.MallocAsync(MiB, s1))
		b := get[device.Ptr](t)(d.MallocAsync(MiB, s2))
		if res, _, _ := d.PoolUsage(); res != 2*MiB {
			t.Fatalf("reserved %d, want one 2 MiB segment", res)
		}
		check(t, d.FreeAsync(b, s2))
		got := get[device.Ptr](t)(d.MallocAsync(MiB, s1))
		if got == b {
			t.Fatalf("stream 1 took a block pending on held stream 2")
		}
		if res, _, _ := d.PoolUsage(); res != 4*MiB {
			t.Errorf("reserved %d, want a second 2 MiB segment", res)
		}
		close(gate)
		check(t, s2.Synchronize())
		check(t, d.FreeAsync(a, s1))
		check(t, d.FreeAsync(got, s1))
		check(t, s1.Close())
		check(t, s2.Close())
		check(t, d.TrimPool(0))
		check(t, d.CheckInvariants())
	})
	t.Run("observed completion without sync", func(t *testing.T) {
		d := newSim(t, sim.Config{TotalBytes: 64 * MiB})
		s1 := get[device.Stream](t)(d.NewStream())
		s2 := get[device.Stream](t)(d.NewStream())
		p := get[device.Ptr](t)(d.MallocAsync(MiB, s1))
		check(t, d.FreeAsync(p, s1)) // s1 has no work: complete at once
		q := get[device.Ptr](t)(d.MallocAsync(MiB, s2))
		if q != p {
			t.Errorf("a block whose free had completed was not reused on another stream: %v vs %v", q, p)
		}
		check(t, d.FreeAsync(q, s2))
		check(t, s1.Close())
		check(t, s2.Close())
		check(t, d.Synchronize())
	})
	t.Run("split and coalesce", func(t *testing.T) {
		d := newSim(t, sim.Config{TotalBytes: 64 * MiB})
		s := d.DefaultStream()
		check(t, d.SetReleaseThreshold(1<<62))
		var ps []device.Ptr
		for range 4 {
			ps = append(ps, get[device.Ptr](t)(d.MallocAsync(512<<10, s)))
		}
		for i := 1; i < 4; i++ {
			if ps[i] != ps[i-1].Add(512<<10) {
				t.Fatalf("blocks not carved from one segment in order: %v", ps)
			}
		}
		if res, _, _ := d.PoolUsage(); res != 2*MiB {
			t.Fatalf("reserved %d, want one 2 MiB segment", res)
		}
		for _, p := range []device.Ptr{ps[1], ps[3], ps[0], ps[2]} {
			check(t, d.FreeAsync(p, s))
		}
		check(t, s.Synchronize())
		big := get[device.Ptr](t)(d.MallocAsync(2*MiB, s))
		if big != ps[0] {
			t.Errorf("freed blocks did not coalesce back into the whole segment: got %v, want %v", big, ps[0])
		}
		check(t, d.FreeAsync(big, s))
		check(t, d.TrimPool(0))
	})
	t.Run("threshold keeps whole segments", func(t *testing.T) {
		d := newSim(t, sim.Config{TotalBytes: 64 * MiB})
		s := d.DefaultStream()
		check(t, d.SetReleaseThreshold(5*MiB))
		var ps []device.Ptr
		for range 4 {
			ps = append(ps, get[device.Ptr](t)(d.MallocAsync(2*MiB, s)))
		}
		for _, p := range ps {
			check(t, d.FreeAsync(p, s))
		}
		check(t, s.Synchronize())
		if res, _, _ := d.PoolUsage(); res != 4*MiB {
			t.Errorf("with a 5 MiB threshold the pool keeps %d, want 4 MiB (whole segments at most 5 MiB)", res)
		}
		check(t, d.TrimPool(MiB))
		if res, _, _ := d.PoolUsage(); res != 0 {
			t.Errorf("TrimPool(1 MiB) kept %d", res)
		}
	})
	t.Run("grow releases own free segments", func(t *testing.T) {
		d := newSim(t, sim.Config{TotalBytes: 16 * MiB, NoContext: true})
		s := d.DefaultStream()
		check(t, d.SetReleaseThreshold(1<<62))
		a := get[device.Ptr](t)(d.MallocAsync(8*MiB, s))
		check(t, d.FreeAsync(a, s))
		check(t, s.Synchronize())
		b := get[device.Ptr](t)(d.MallocAsync(12*MiB, s)) // needs the 8 MiB back
		if res, _, _ := d.PoolUsage(); res != 12*MiB {
			t.Errorf("reserved %d, want 12 MiB", res)
		}
		check(t, d.FreeAsync(b, s))
		check(t, d.TrimPool(0))
	})
	t.Run("sync free of an async block", func(t *testing.T) {
		d := newSim(t, sim.Config{TotalBytes: 64 * MiB})
		p := get[device.Ptr](t)(d.MallocAsync(100, d.DefaultStream()))
		check(t, d.Free(p))
		wantErr(t, d.FreeAsync(p, d.DefaultStream()), device.ErrDoubleFree)
		check(t, d.Synchronize())
	})
}

func TestKernelAccessRules(t *testing.T) {
	d := newSim(t, sim.Config{TotalBytes: 64 * MiB, KernelWorkers: 4})
	s1 := get[device.Stream](t)(d.NewStream())
	s2 := get[device.Stream](t)(d.NewStream())
	defer func() { check(t, s1.Close()); check(t, s2.Close()) }()
	touch := func(p device.Ptr, n uint64) func(device.View, int, int) error {
		return func(mem device.View, lo, hi int) error {
			b, err := mem.Bytes(p, n)
			if err == nil {
				b[lo] = 1 // blocks write disjoint bytes
			}
			return err
		}
	}
	t.Run("free after launch on the same stream", func(t *testing.T) {
		gate := make(chan struct{})
		check(t, d.LaunchFunc(s1, 1, func(device.View, int, int) error { <-gate; return nil }))
		p := get[device.Ptr](t)(d.MallocAsync(4096, s1))
		check(t, d.LaunchFunc(s1, 8, touch(p, 4096)))
		check(t, d.FreeAsync(p, s1)) // the kernel runs before this free
		close(gate)
		check(t, s1.Synchronize())
	})
	t.Run("launch after free on another stream", func(t *testing.T) {
		p := get[device.Ptr](t)(d.MallocAsync(4096, s1))
		check(t, d.FreeAsync(p, s1))
		check(t, d.LaunchFunc(s2, 1, touch(p, 1)))
		wantErr(t, s2.Synchronize(), device.ErrUseAfterFree)
	})
	t.Run("Malloc freed before the kernel ran", func(t *testing.T) {
		p := get[device.Ptr](t)(d.Malloc(4096))
		check(t, d.Free(p))
		check(t, d.LaunchFunc(s1, 1, touch(p, 1)))
		wantErr(t, s1.Synchronize(), device.ErrUseAfterFree)
	})
	t.Run("panic", func(t *testing.T) {
		check(t, d.LaunchFunc(s1, 3, func(device.View, int, int) error { panic("boom") }))
		err := s1.Synchronize()
		wantErr(t, err, sim.ErrKernelPanic)
		if !strings.Contains(err.Error(), "boom") {
			t.Errorf("panic value lost: %v", err)
		}
	})
	t.Run("mapped host memory", func(t *testing.T) {
		b := get[device.HostBuffer](t)(d.HostAlloc(64, true))
		check(t, d.LaunchFunc(s1, 64, func(mem device.View, lo, hi int) error {
			v, err := mem.Bytes(b.DevicePtr.Add(uint64(lo)), uint64(hi-lo))
			for i := range v {
				v[i] = byte(lo + i)
			}
			return err
		}))
		check(t, s1.Synchronize())
		for i, v := range b.Data {
			if v != byte(i) {
				t.Fatalf("host byte %d = %d after the kernel wrote through the mapped address", i, v)
			}
		}
		check(t, d.HostFree(b))
	})
	t.Run("reset while running", func(t *testing.T) {
		d := newSim(t, sim.Config{TotalBytes: 64 * MiB})
		s := d.DefaultStream()
		p := get[device.Ptr](t)(d.Malloc(64))
		started, gate := make(chan struct{}), make(chan struct{})
		var got atomic.Value
		check(t, d.LaunchFunc(s, 1, func(mem device.View, lo, hi int) error {
			close(started)
			<-gate
			_, err := mem.Bytes(p, 1)
			got.Store(err)
			return err
		}))
		<-started
		reset := make(chan error)
		go func() { reset <- d.Reset() }() // waits for the running kernel
		select {
		case err := <-reset:
			t.Fatalf("Reset returned (%v) while a kernel from before it still ran", err)
		case <-time.After(20 * time.Millisecond):
		}
		close(gate)
		check(t, <-reset)
		if err, _ := got.Load().(error); !errors.Is(err, device.ErrInvalidated) {
			t.Errorf("kernel access after reset = %v, want ErrInvalidated (or none: Reset returned before the kernel ended)", err)
		}
		wantErr(t, s.Synchronize(), device.ErrInvalidated)
		check(t, d.Close())
	})
}

func TestStickyQuery(t *testing.T) {
	d := newSim(t, sim.Config{TotalBytes: 64 * MiB})
	s := d.DefaultStream()
	boom := errors.New("boom")
	check(t, d.LaunchFunc(s, 1, func(device.View, int, int) error { return boom }))
	wantErr(t, d.Synchronize(), boom)
	check(t, d.Synchronize())
	// Device.Synchronize reported and cleared it; a new one stays until
	// reported, and Query shows it without clearing.
	check(t, d.LaunchFunc(s, 1, func(device.View, int, int) error { return boom }))
	for range 2 {
		for done, _ := s.Query(); !done; done, _ = s.Query() {
			runtime.Gosched()
		}
		if _, err := s.Query(); !errors.Is(err, boom) {
			t.Fatalf("Query = %v, want the sticky error", err)
		}
	}
	wantErr(t, s.Synchronize(), boom)
	check(t, s.Synchronize())
}

func TestSpec(t *testing.T) {
	tests := map[string]struct {
		spec string
		want sim.Config
		bad  bool
	}{
		"empty":       {spec: "", want: sim.Config{}},
		"vram":        {spec: "vram=256MiB", want: sim.Config{TotalBytes: 256 * MiB}},
		"all":         {spec: "vram=24GiB, context=300MiB,granularity=64KiB,backed=false,threshold=1GiB,workers=3,bandwidth=16GB,pinned=1GiB,name=test,ordinal=2", want: sim.Config{PinnedLimit: GiB, TotalBytes: 24 * GiB, ContextBytes: 300 * MiB, Granularity: 64 << 10, AddressOnly: true, ReleaseThreshold: GiB, KernelWorkers: 3, CopyBandwidth: 16e9, Name: "test", Ordinal: 2}},
		"no context":  {spec: "context=0", want: sim.Config{NoContext: true}},
		"upper keys":  {spec: "VRAM=1G", want: sim.Config{TotalBytes: GiB}},
		"unknown key": {spec: "colour=blue", bad: true},
		"no value":    {spec: "vram", bad: true},
		"bad size":    {spec: "vram=lots", bad: true},
		"zero vram":   {spec: "vram=0", bad: true},
		"bad bool":    {spec: "backed=maybe", bad: true},
		"bad workers": {spec: "workers=0", bad: true},
		"neg ordinal": {spec: "ordinal=-1", bad: true},
		"neg vram":    {spec: "vram=-1GiB", bad: true},
		"neg workers": {spec: "workers=-3", bad: true},
		"neg context": {spec: "context=-2MiB", bad: true},
		"zero gran":   {spec: "granularity=0", bad: true},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, err := sim.ParseSpec(tc.spec)
			if tc.bad {
				wantErr(t, err, device.ErrBadSpec)
				return
			}
			check(t, err)
			if got != tc.want {
				t.Errorf("ParseSpec(%q) = %+v, want %+v", tc.spec, got, tc.want)
			}
		})
	}
}

func TestKernelsRunInParallel(t *testing.T) {
	d := newSim(t, sim.Config{TotalBytes: 64 * MiB, KernelWorkers: 4})
	s := d.DefaultStream()
	var arrived sync.WaitGroup
	arrived.Add(4)
	// Each of the 4 blocks waits for all 4: only parallel blocks finish.
	check(t, d.LaunchFunc(s, 4, func(_ device.View, lo, hi int) error {
		arrived.Done()
		done := make(chan struct{})
		go func() { arrived.Wait(); close(done) }()
		select {
		case <-done:
			return nil
		case <-time.After(10 * time.Second):
			return fmt.Errorf("block [%d, %d) waited alone: blocks do not run in parallel", lo, hi)
		}
	}))
	check(t, s.Synchronize())
	check(t, d.LaunchFunc(s, 1, func(device.View, int, int) error { return nil }))
	wantErr(t, d.LaunchFunc(s, -5, func(device.View, int, int) error { return nil }), device.ErrInvalidValue)
	check(t, s.Synchronize())
}

func TestCopyBandwidth(t *testing.T) {
	d := newSim(t, sim.Config{TotalBytes: 64 * MiB, CopyBandwidth: 100e6}) // 100 MB/s
	s := d.DefaultStream()
	p := get[device.Ptr](t)(d.Malloc(2e6))
	src := make([]byte, 2e6)
	// The call only enqueues: it returns well before the copy's 20 ms
	// (retried, as load can stall the caller too).
	sim.RetryTimed(t, func() string {
		start := time.Now()
		check(t, d.CopyHtoD(p, src, s))
		el := time.Since(start)
		check(t, s.Synchronize())
		if total := time.Since(start); total < 20*time.Millisecond {
			t.Errorf("2 MB at 100 MB/s took %v, want at least 20ms", total)
		}
		if el > 10*time.Millisecond {
			return fmt.Sprintf("the copy call itself took %v; it should only enqueue", el)
		}
		return ""
	})
	check(t, d.Free(p))
}

// Asynchrony on an idle stream: a copy is not done when the call returns
// (the stream's goroutine does it), and it is done after Synchronize. The
// bandwidth emulation makes the copy last 40 ms, so that "not done" is
// observed with a wide margin; the suite's Asynchrony test shows the same
// on a stream held busy.
func TestAsynchronyIdleStream(t *testing.T) {
	d := newSim(t, sim.Config{TotalBytes: 64 * MiB})
	slow := newSim(t, sim.Config{TotalBytes: 64 * MiB, CopyBandwidth: 100e6})
	for name, dev := range map[string]*sim.Device{"host speed": d, "100 MB/s": slow} {
		t.Run(name, func(t *testing.T) {
			s := get[device.Stream](t)(dev.NewStream())
			defer func() { check(t, s.Close()) }()
			const n = 4e6
			p := get[device.Ptr](t)(dev.Malloc(n))
			defer func() { check(t, dev.Free(p)) }()
			want := make([]byte, n)
			for i := range want {
				want[i] = byte(i % 251)
			}
			check(t, dev.CopyHtoD(p, want, s))
			check(t, s.Synchronize())
			got := make([]byte, n)
			check(t, dev.CopyDtoH(got, p, s))
			done, err := s.Query()
			check(t, err)
			if done && dev == slow {
				t.Errorf("a 4 MB copy at 100 MB/s was done when the call returned")
			}
			t.Logf("done when the call returned: %v", done)
			check(t, s.Synchronize())
			if string(got) != string(want) {
				t.Errorf("the copy's bytes had not all arrived after Synchronize")
			}
		})
	}
}

func TestHostMemoryErrors(t *testing.T) {
	d := newSim(t, sim.Config{TotalBytes: 64 * MiB})
	b := get[device.HostBuffer](t)(d.HostAlloc(100, true))
	check(t, d.HostFree(b))
	tests := map[string]struct {
		call func() error
		want error
	}{
		"double free":      {func() error { return d.HostFree(b) }, device.ErrDoubleFree},
		"foreign buffer":   {func() error { return d.HostFree(device.HostBuffer{Data: make([]byte, 8)}) }, device.ErrInvalidPointer},
		"empty buffer":     {func() error { return d.HostFree(device.HostBuffer{}) }, device.ErrInvalidPointer},
		"mapped ptr freed": {func() error { return d.CopyHtoD(b.DevicePtr, []byte{1}, d.DefaultStream()) }, device.ErrUseAfterFree},
		"Free of mapped":   {func() error { c, _ := d.HostAlloc(8, true); defer d.HostFree(c); return d.Free(c.DevicePtr) }, device.ErrInvalidPointer},
		"FreeAsync of Malloc": {func() error {
			p, _ := d.Malloc(8)
			defer d.Free(p)
			return d.FreeAsync(p, d.DefaultStream())
		}, device.ErrInvalidPointer},
		"interior async free": {func() error {
			p, _ := d.MallocAsync(4096, d.DefaultStream())
			defer d.FreeAsync(p, d.DefaultStream())
			return d.FreeAsync(p.Add(512), d.DefaultStream())
		}, device.ErrInvalidPointer},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) { wantErr(t, tc.call(), tc.want) })
	}
	lim := newSim(t, sim.Config{TotalBytes: 64 * MiB, PinnedLimit: MiB})
	h := get[device.HostBuffer](t)(lim.HostAlloc(MiB/2, false))
	_, err := lim.HostAlloc(MiB/2+1, false)
	wantErr(t, err, device.ErrOutOfMemory)
	check(t, lim.HostFree(h))
	h = get[device.HostBuffer](t)(lim.HostAlloc(MiB, false))
	check(t, lim.HostFree(h))

	c := get[device.HostBuffer](t)(d.HostAlloc(100, false))
	check(t, d.Reset())
	wantErr(t, d.HostFree(c), device.ErrInvalidated)
}

func TestStreamHandles(t *testing.T) {
	d := newSim(t, sim.Config{TotalBytes: 64 * MiB})
	seen := map[uintptr]bool{0: true}
	for range 5 {
		s := get[device.Stream](t)(d.NewStream())
		if seen[s.Handle()] {
			t.Errorf("stream handle %d reused", s.Handle())
		}
		seen[s.Handle()] = true
		check(t, s.Close())
	}
	if d.Leaks().Streams != 0 {
		t.Errorf("closed streams still reported: %v", d.Leaks())
	}
}

func TestOOMMessageOfHugeSizes(t *testing.T) {
	d, err := sim.New(sim.Config{TotalBytes: 64 << 20, AddressOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	s := d.DefaultStream()
	for name, alloc := range map[string]func() error{
		"Malloc":      func() error { _, err := d.Malloc(math.MaxUint64); return err },
		"MallocAsync": func() error { _, err := d.MallocAsync(math.MaxUint64, s); return err },
	} {
		err := alloc()
		if !errors.Is(err, device.ErrOutOfMemory) {
			t.Fatalf("%s(MaxUint64) = %v, want ErrOutOfMemory", name, err)
		}
		if strings.Contains(err.Error(), "needs 0 B") {
			t.Errorf("%s(MaxUint64): the rounded size wrapped around in the message: %v", name, err)
		}
	}
}

// The default pinned limit is at most half the host's RAM: pinning more
// is ErrOutOfMemory naming the limit, refused before any memory is taken.
func TestDefaultPinnedLimitFitsTheHost(t *testing.T) {
	ram := sim.HostRAM()
	if ram == 0 {
		t.Skip("the host's RAM is unknown on this system: the default limit is DefaultPinnedLimit")
	}
	d := newSim(t, sim.Config{TotalBytes: 64 * MiB})
	n := min(ram/2, sim.DefaultPinnedLimit) + 4096
	_, err := d.HostAlloc(n, false)
	wantErr(t, err, device.ErrOutOfMemory)
	if err != nil && !strings.Contains(err.Error(), "pinned-memory limit") {
		t.Errorf("error %q does not name the pinned-memory limit", err)
	}
}
