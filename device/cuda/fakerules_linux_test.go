//go:build linux

package cuda

// The stand-in driver's rules (testdata/fakecuda.c lists them), each shown
// on the driver's own calls, so that the test fails if the stand-in
// forgets the rule, and, where the rule caught something in the backend,
// the backend under it. Run in the stand-in's child process
// (TestFakeDriverChild); BENCHMARKS.md ("CUDA backend") says what each
// rule caught.

import (
	"errors"
	"maps"
	"math"
	"runtime"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/vramkit/vram/device"
)

// contextRefusals and destroyedRefusals count the calls the rules have
// the stand-in refuse on purpose: for want of the primary context, and in
// a reset context not yet retained. TestFakeDriverChild's last check is
// that the backend made no other.
var contextRefusals, destroyedRefusals atomic.Int32

func fakeRules(t *testing.T) {
	f := bindFake(t)
	rules := map[string]func(*testing.T, fakeHooks){
		"1 contexts":          ruleContexts,
		"1 context stack":     ruleContextStack,
		"2 reset":             ruleReset,
		"3 faults":            ruleFaults,
		"3 faults are sticky": ruleFaultsSticky,
		"4 lazy memory":       ruleLazyMemory,
		"5 asynchrony":        ruleAsynchrony,
		"6 virtual memory":    ruleVirtualMemory,
		"7 driver and PTX":    ruleVersions,
		"7 MIG-aware UUIDs":   ruleUUID,
		"2 reset gives back":  ruleResetGivesBack,
	}
	for _, name := range slices.Sorted(maps.Keys(rules)) {
		t.Run(name, func(t *testing.T) { rules[name](t, f) })
	}
}

// openFake opens device 0 of the stand-in for one test.
func openFake(t *testing.T) *Device {
	t.Helper()
	d, err := Open(0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

// inContext runs fn on a locked thread with d's context current, as the
// backend makes each driver call (Device.enter).
func inContext(t *testing.T, d *Device, fn func()) {
	t.Helper()
	if err := d.enter(); err != nil {
		t.Fatal(err)
	}
	defer d.exit()
	fn()
}

// bare runs fn on a locked thread whose context stack is empty before and
// after.
func bare(d *Device, fn func()) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	empty := func() {
		for c := uintptr(1); c != 0; {
			d.lib.ctxSetCurrent(0)
			d.lib.ctxGetCurrent(&c)
		}
	}
	empty()
	defer empty()
	fn()
}

// Rule 1: a call that works in a context is refused (201) unless the
// primary context is current.
func ruleContexts(t *testing.T, f fakeHooks) {
	d := openFake(t)
	for name, ctx := range map[string]uintptr{"none": 0, "a second context of the GPU": fakeOtherCtx, "another GPU's": fakePeerCtx, "the primary": d.p.ctx} {
		t.Run(name, func(t *testing.T) {
			want := ErrorInvalidContext
			if ctx == d.p.ctx {
				want = Success
			}
			bare(d, func() {
				if ctx != 0 {
					d.lib.ctxSetCurrent(ctx)
				}
				var free, total, p uint64
				var s uintptr
				got := []Result{d.lib.memGetInfo(&free, &total), d.lib.memAlloc(&p, 4096), d.lib.streamCreate(&s, cuStreamNonBlocking)}
				for i, r := range got {
					if r != want {
						t.Errorf("call %d with %s current = %v; want %v", i, name, r, want)
					}
					if r == ErrorInvalidContext {
						contextRefusals.Add(1)
					}
				}
				if want == Success {
					d.lib.memFree(p)
					d.lib.streamDestroy(s)
				}
			})
		})
	}
}

// Rule 1: each thread has a context stack; cuCtxSetCurrent(NULL) pops it,
// and the backend leaves a program's stack as it found it.
func ruleContextStack(t *testing.T, f fakeHooks) {
	d := openFake(t)
	bare(d, func() {
		f.push(fakeOtherCtx)
		f.push(fakePeerCtx)
		if r := d.lib.ctxSetCurrent(0); r != Success {
			t.Fatal(r)
		}
		var c uintptr
		if d.lib.ctxGetCurrent(&c); c != fakeOtherCtx {
			t.Fatalf("after cuCtxSetCurrent(NULL) on [other, peer] the current context is %#x; want the one below, %#x", c, fakeOtherCtx)
		}
		f.push(fakePeerCtx) // [other, peer]: another GPU's context on top
		restore, err := d.KeepThread()
		if err != nil {
			t.Fatal(err)
		}
		p, err := d.Malloc(4096)
		if err == nil {
			err = d.Free(p)
		}
		restore()
		if err != nil {
			t.Fatal(err)
		}
		for _, want := range []uintptr{fakePeerCtx, fakeOtherCtx} {
			if r := f.pop(&c); r != 0 || c != want {
				t.Fatalf("popped %#x (%d) off the program's stack after a call through vram; want %#x", c, r, want)
			}
		}
		if r := f.pop(&c); r == 0 {
			t.Errorf("the stack holds %#x more than the program pushed", c)
		}
	})
}

// Rule 2: a reset keeps the context's handle and leaves it inactive (709)
// until it is retained again; pool and virtual memory are left behind.
func ruleReset(t *testing.T, f fakeHooks) {
	d := openFake(t)
	pool0, vmm0 := f.count("reset_left_pool"), f.count("reset_left_vmm")
	inContext(t, d, func() {
		var p, h uint64
		if r := d.lib.memAllocAsync(&p, 1<<20, 0); r != Success {
			t.Fatal(r)
		}
		prop := d.prop()
		if r := d.lib.memCreate(&h, 2<<20, &prop); r != Success {
			t.Fatal(r)
		}
		if r := d.lib.primaryCtxReset(d.p.dev); r != Success {
			t.Fatal(r)
		}
		if r := d.lib.memAlloc(&p, 4096); r != ErrorContextIsDestroyed {
			t.Errorf("cuMemAlloc in a reset context not yet retained = %v; want CUDA_ERROR_CONTEXT_IS_DESTROYED", r)
		} else {
			destroyedRefusals.Add(1)
		}
		var ctx uintptr
		if r := d.lib.primaryCtxRetain(&ctx, d.p.dev); r != Success || ctx != d.p.ctx {
			t.Fatalf("retain after the reset = %#x, %v; want the same handle %#x", ctx, r, d.p.ctx)
		}
		defer d.lib.primaryCtxRelease(d.p.dev)
		if r := d.lib.memAlloc(&p, 4096); r != Success {
			t.Errorf("cuMemAlloc once retained again = %v", r)
		}
		d.lib.memFree(p)
	})
	if n := f.count("reset_left_pool") - pool0; n != 2<<20 {
		t.Errorf("the reset left %d bytes of pool memory; want the pool's 2 MiB reservation", n)
	}
	if n := f.count("reset_left_vmm") - vmm0; n != 2<<20 {
		t.Errorf("the reset left %d bytes of physical memory; want the 2 MiB made", n)
	}
}

// Rule 2, what it caught: Device.Reset gave pool and virtual memory back
// to nobody. It now frees them itself, and refuses their handles after.
func ruleResetGivesBack(t *testing.T, f fakeHooks) {
	d := openFake(t)
	s := d.DefaultStream()
	start := warmFree(t, d, s)
	left := func() [3]int32 {
		return [3]int32{f.count("reset_left_pool"), f.count("reset_left_vmm"), f.count("reset_left_reservations")}
	}
	before := left()
	if err := d.SetReleaseThreshold(math.MaxUint64); err != nil {
		t.Fatal(err)
	}
	cached, err := d.MallocAsync(3<<20, s)
	if err == nil {
		err = d.FreeAsync(cached, s)
	}
	if err == nil {
		_, err = d.MallocAsync(1<<20, s)
	}
	if err != nil {
		t.Fatal(err)
	}
	g := d.VMGranularity()
	res, err := d.ReserveAddress(4 * g)
	if err != nil {
		t.Fatal(err)
	}
	mapped, spare := mustPhys(t, d, g), mustPhys(t, d, g)
	if err := d.Map(res, g, mapped); err != nil {
		t.Fatal(err)
	}
	if err := d.Reset(); err != nil {
		t.Fatal(err)
	}
	if after := left(); after != before {
		t.Errorf("the reset left pool, physical memory, reservations: %v; want %v (none)", after, before)
	}
	if after := warmFree(t, d, d.DefaultStream()); after != start { // the driver's own memory taken again
		t.Errorf("free memory %d after the Reset, want %d as before the pool and virtual memory were made", after, start)
	}
	uses := map[string]error{
		"FreeAddress":     d.FreeAddress(res, 4*g),
		"Unmap":           d.Unmap(res, g),
		"ReleasePhysical": d.ReleasePhysical(spare),
		"Map":             d.Map(res.Add(g), g, spare),
	}
	for name, err := range uses {
		if !errors.Is(err, device.ErrInvalidated) {
			t.Errorf("%s of something from before the Reset = %v; want ErrInvalidated", name, err)
		}
	}
	if err := d.SetReleaseThreshold(0); err != nil {
		t.Fatal(err)
	}
}

func mustPhys(t *testing.T, d *Device, n uint64) device.PhysMem {
	t.Helper()
	h, err := d.CreatePhysical(n)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// Rule 3: a fault shows after the work that caused it, and every later
// call returns it until a reset. What it caught: only some paths recorded
// the sticky error, and CUDA_ERROR_LAUNCH_TIMEOUT was not sticky; now
// every result is noted where the driver is called (lib.call).
func ruleFaults(t *testing.T, f fakeHooks) {
	paths := map[string]func(d *Device) error{
		"Synchronize": func(d *Device) error { return d.Synchronize() },
		"MemInfo":     func(d *Device) error { _, _, err := d.MemInfo(); return err },
		"Malloc":      func(d *Device) error { _, err := d.Malloc(4096); return err },
		"NewStream":   func(d *Device) error { _, err := d.NewStream(); return err },
		"NewEvent":    func(d *Device) error { _, err := d.NewEvent(); return err },
		"LoadPTX":     func(d *Device) error { _, err := d.LoadPTX(fillPTX); return err },
		"PoolUsage":   func(d *Device) error { _, _, err := d.PoolUsage(); return err },
		"TrimPool":    func(d *Device) error { return d.TrimPool(0) },
		"HostAlloc":   func(d *Device) error { _, err := d.HostAlloc(4096, false); return err },
		"Reserve":     func(d *Device) error { _, err := d.ReserveAddress(d.VMGranularity()); return err },
		"Create":      func(d *Device) error { _, err := d.CreatePhysical(d.VMGranularity()); return err },
	}
	for _, code := range []Result{ErrorIllegalAddress, ErrorLaunchTimeout} {
		for _, name := range slices.Sorted(maps.Keys(paths)) {
			t.Run(code.Name()+"/"+name, func(t *testing.T) {
				d, other := openFake(t), openFake(t)
				d.VMGranularity() // asked before the fault
				p, err := d.Malloc(64)
				if err != nil {
					t.Fatal(err)
				}
				f.set("fault", int32(code))
				if err := d.Memset(p, 1, 64, d.DefaultStream()); err != nil {
					t.Fatalf("Memset that will fault = %v; the fault is asynchronous", err)
				}
				if got := f.count("sticky"); got != int32(code) {
					t.Fatalf("the stand-in's context is broken with %d; want %d", got, code)
				}
				err = paths[name](d)
				if !errors.Is(err, ErrNeedsReset) || !errors.Is(err, code) {
					t.Errorf("%s after the fault = %v; want %v, sticky", name, err, code)
				}
				if d.Err() == nil {
					t.Errorf("%s saw %v, but the device does not say it is broken (Err is nil)", name, code)
				}
				if _, err := other.Malloc(4096); !errors.Is(err, ErrNeedsReset) || !strings.Contains(fmtErr(err), "Reset the device") {
					t.Errorf("another Device after %s saw the fault: Malloc = %v; want ErrNeedsReset", name, err)
				}
				if err := d.Reset(); err != nil || d.Err() != nil {
					t.Fatalf("Reset = %v, Err = %v", err, d.Err())
				}
			})
		}
	}
}

// Rule 3, on the driver's calls: the operation that faults was enqueued
// with success, and every call in the context after it returns the fault,
// not just the first.
func ruleFaultsSticky(t *testing.T, f fakeHooks) {
	d := openFake(t)
	p := mustMalloc(t, d, 64)
	f.set("fault", int32(ErrorLaunchTimeout))
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if r := d.lib.ctxSetCurrent(d.p.ctx); r != Success {
		t.Fatal(r)
	}
	if r := d.lib.memsetD8Async(uint64(p), 1, 64, 0); r != Success {
		t.Fatalf("the memset that faults = %v; want success (the fault is asynchronous)", r)
	}
	var free, total, q uint64
	var s uintptr
	for i, r := range []Result{d.lib.memGetInfo(&free, &total), d.lib.memAlloc(&q, 64), d.lib.streamCreate(&s, cuStreamNonBlocking), d.lib.ctxSynchronize()} {
		if r != ErrorLaunchTimeout {
			t.Errorf("call %d after the fault = %v; want CUDA_ERROR_LAUNCH_TIMEOUT again", i, r)
		}
	}
	if err := d.Reset(); err != nil {
		t.Fatal(err)
	}
}

// Rule 4: the driver takes memory of its own lazily: per stream, and at
// a context's first copy, memset or launch. What it caught: tests that
// counted that memory against vram (TestAllocatorsOnCUDA, copy2d_test.go,
// and alloctest's Trim, Close and AfterReset on CUDA).
func ruleLazyMemory(t *testing.T, f fakeHooks) {
	if err := openFake(t).Reset(); err != nil { // a fresh context: nothing taken yet
		t.Fatal(err)
	}
	d := openFake(t)
	free := func() uint64 {
		n, _, err := d.MemInfo()
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	f0 := free()
	s, err := d.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	if f1 := free(); f1 >= f0 {
		t.Errorf("a stream took no device memory (%d → %d free)", f0, f1)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	p, err := d.Malloc(4096)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Free(p)
	f2 := free()
	for i := range 2 {
		if err := d.Memset(p, 1, 64, d.DefaultStream()); err != nil {
			t.Fatal(err)
		}
		f3 := free()
		if took := f2 - f3; (i == 0) != (took > 0) {
			t.Errorf("memset %d took %d bytes; want some the first time only", i, took)
		}
		f2 = f3
	}
}

// spinPTX's kernel holds its stream on the stand-in until the word it is
// given is not zero (a kernel named ..._spin).
const ruleSpinPTX = ".version 7.0\n.target sm_52\n.address_size 64\n.visible .entry rule_spin(.param .u64 rule_spin_flag)\n{\n\tret;\n}\n"

// Rule 5: work runs in stream order when the stream gets to it; a spin
// kernel holds its stream; cuMemFree waits for all work. What it caught:
// nothing in the backend; the conformance suites' busy-stream checks,
// which skipped on the stand-in, now run here.
func ruleAsynchrony(t *testing.T, f fakeHooks) {
	d := openFake(t)
	s, err := d.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	flag, err := d.HostAlloc(4, true)
	if err != nil {
		t.Fatal(err)
	}
	defer d.HostFree(flag)
	word := (*uint32)(unsafe.Pointer(&flag.Data[0]))
	host, err := d.HostAlloc(64, false)
	if err != nil {
		t.Fatal(err)
	}
	defer d.HostFree(host)
	mod, err := d.LoadPTX(ruleSpinPTX)
	if err != nil {
		t.Fatal(err)
	}
	defer mod.Close()
	fn, err := mod.Function("rule_spin")
	if err != nil {
		t.Fatal(err)
	}
	p, q := mustMalloc(t, d, 64), mustMalloc(t, d, 64)
	one := device.Dim3{X: 1, Y: 1, Z: 1}
	e, err := d.NewEvent()
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	for _, err := range []error{fn.Launch(s, one, one, 0, flag.DevicePtr), d.Memset(p, 7, 64, s), d.CopyDtoH(host.Data, p, s), e.Record(s)} {
		if err != nil {
			t.Fatal(err)
		}
	}
	if done, err := s.Query(); done || err != nil {
		t.Errorf("a stream behind a spin kernel: done %v (%v); want busy", done, err)
	}
	if done, err := e.Query(); done || err != nil {
		t.Errorf("an event behind a spin kernel: done %v (%v); want pending", done, err)
	}
	if host.Data[0] != 0 {
		t.Error("a copy behind a spin kernel ran before the kernel ended")
	}
	defer atomic.StoreUint32(word, 1) // the spin ends however the test does, before anything waits for it
	freed := make(chan error, 1)
	go func() { freed <- d.Free(q) }()
	waitFor(t, func() bool { return f.count("waiters") > 0 }, "cuMemFree to wait for the held stream")
	select {
	case err := <-freed:
		t.Fatalf("cuMemFree returned (%v) while a stream was held; want it to wait", err)
	default:
	}
	atomic.StoreUint32(word, 1)
	if err := <-freed; err != nil {
		t.Fatal(err)
	}
	if err := s.Synchronize(); err != nil || host.Data[0] != 7 {
		t.Errorf("after the spin ended: %v, host byte %d; want the copy done (7)", err, host.Data[0])
	}
	if done, err := e.Query(); !done || err != nil {
		t.Errorf("the event after the spin ended: done %v (%v)", done, err)
	}
	if err := d.Free(p); err != nil {
		t.Fatal(err)
	}
}

func mustMalloc(t *testing.T, d *Device, n uint64) device.Ptr {
	t.Helper()
	p, err := d.Malloc(n)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// waitFor polls cond until it holds, failing t after the device
// conformance suite's wait limit (a bound on a hang, not a timing claim).
func waitFor(t *testing.T, cond func() bool, what string) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting for %s", what)
		}
	}
}

// Rule 6: virtual memory as the reference allows: a reservation with
// alignment 0 is 64 KiB aligned, not granule aligned; freeing a range
// with mappings succeeds and leaks them. What it caught: ReserveAddress
// relied on the default alignment (every Map of alloc.Expandable failed);
// FreeAddress and Map now refuse, from the Device's records, what the
// driver may not.
func ruleVirtualMemory(t *testing.T, f fakeHooks) {
	d := openFake(t)
	g := d.VMGranularity()
	inContext(t, d, func() {
		var p uint64
		if r := d.lib.memAddressReserve(&p, 4*g, 0, 0); r != Success || p%(64<<10) != 0 || p%g == 0 {
			t.Errorf("cuMemAddressReserve with alignment 0 = %#x, %v; want a 64 KiB aligned range not aligned to %d", p, r, g)
		}
		d.lib.memAddressFree(p, 4*g)
		var h uint64
		prop := d.prop()
		leaks := f.count("addressfree_mapped")
		if r := d.lib.memAddressReserve(&p, 4*g, g, 0); r != Success {
			t.Fatal(r)
		}
		if r := d.lib.memCreate(&h, g, &prop); r != Success {
			t.Fatal(r)
		}
		if r := d.lib.memMap(p, g, 0, h); r != Success {
			t.Fatal(r)
		}
		if r := d.lib.memAddressFree(p, 4*g); r != Success || f.count("addressfree_mapped") != leaks+1 {
			t.Errorf("cuMemAddressFree of a range with a mapping = %v; want success, counted as a leak", r)
		}
		d.lib.memUnmap(p, g)
		d.lib.memRelease(h)
	})
	p, err := d.ReserveAddress(4 * g)
	if err != nil || uint64(p)%g != 0 {
		t.Fatalf("ReserveAddress = %v, %v; want a range aligned to %d", p, err, g)
	}
	h := mustPhys(t, d, g)
	if err := d.Map(p, g, h); err != nil {
		t.Fatal(err)
	}
	leaks, overs := f.count("addressfree_mapped"), f.count("map_over")
	if err := d.FreeAddress(p, 4*g); !errors.Is(err, device.ErrInvalidValue) {
		t.Errorf("FreeAddress of a range with a mapping = %v; want ErrInvalidValue", err)
	}
	if err := d.Map(p, g, h); !errors.Is(err, device.ErrInvalidValue) {
		t.Errorf("Map over a mapping = %v; want ErrInvalidValue", err)
	}
	if f.count("addressfree_mapped") != leaks || f.count("map_over") != overs {
		t.Error("the refusals reached the driver; the Device's records should have refused them")
	}
	for _, err := range []error{d.Unmap(p, g), d.ReleasePhysical(h), d.FreeAddress(p, 4*g)} {
		if err != nil {
			t.Fatal(err)
		}
	}
}

// Rule 7: CUDA 13.0's driver, whose JIT takes PTX ISA 9.0 at most and no
// target above the device. What it caught: nothing (vram ships ISA 7.0
// for sm_52); the JIT's log reaches the error.
func ruleVersions(t *testing.T, f fakeHooks) {
	d := openFake(t)
	var v int32
	if d.lib.driverGetVersion(&v); v != 13000 || !strings.Contains(d.Info().Driver, "CUDA driver 13.0") {
		t.Errorf("driver version %d, Info.Driver %q; want 13000, 13.0", v, d.Info().Driver)
	}
	ptx := map[string]struct {
		text string
		want Result
		log  string
	}{
		"ISA 9.1":    {".version 9.1\n.target sm_90\n.entry k() { ret; }", ErrorUnsupportedPTXVersion, "Unsupported .version 9.1"},
		"sm_100":     {".version 9.0\n.target sm_100\n.entry k() { ret; }", ErrorInvalidPTX, "sm_100 is higher"},
		"ISA 9.0":    {".version 9.0\n.target sm_90\n.entry k() { ret; }", Success, ""},
		"vram's 7.0": {fillPTX, Success, ""},
	}
	for name, tc := range ptx {
		t.Run(name, func(t *testing.T) {
			m, err := d.LoadPTX(tc.text)
			if tc.want == Success {
				if err != nil {
					t.Fatal(err)
				}
				m.Close()
				return
			}
			if !errors.Is(err, tc.want) || !strings.Contains(fmtErr(err), tc.log) {
				t.Errorf("LoadPTX = %v; want %v with the JIT's log %q", err, tc.want, tc.log)
			}
		})
	}
}

// Rule 7: cuDeviceGetUuid is the pre-13 entry point, which names the whole
// GPU on a MIG slice; cuDeviceGetUuid_v2 names the slice. What it caught:
// the backend bound the first, so a MIG slice's ID was its GPU's.
func ruleUUID(t *testing.T, f fakeHooks) {
	if f.set("mig", 1) != 1 {
		t.Fatal("the stand-in has no mig switch")
	}
	defer f.set("mig", 0)
	if id := openFake(t).Info().ID; id != "MIG-b0b1b2b3-b4b5-b6b7-b8b9-babbbcbdbebf" {
		t.Errorf("the ID of a MIG slice = %q; want its own UUID as MIG-…", id)
	}
	f.set("mig", 0)
	if id := openFake(t).Info().ID; id != "GPU-a0a1a2a3-a4a5-a6a7-a8a9-aaabacadaeaf" {
		t.Errorf("the ID of a whole GPU = %q; want GPU-…", id)
	}
}

// noCallOutsideTheContext is TestFakeDriverChild's last check: every call
// the stand-in refused for want of the primary context was one the rules
// made on purpose.
func noCallOutsideTheContext(t *testing.T) {
	f := bindFake(t)
	if n, want := f.count("no_context"), contextRefusals.Load(); n != want {
		t.Errorf("the stand-in refused %d calls made without the primary context current; the rules made %d of them", n, want)
	}
	if n, want := f.count("destroyed_context"), destroyedRefusals.Load(); n != want {
		t.Errorf("the stand-in refused %d calls in a reset context not yet retained; the rules made %d of them", n, want)
	}
}
