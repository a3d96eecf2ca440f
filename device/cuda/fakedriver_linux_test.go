//go:build linux

package cuda

// Regression tests for the desk check of the backend (the CUDA rules a
// real driver breaks on silently), run in the fake driver's child process
// (see fakedriver_test.go). The fake counts each breach; vram_fake_count
// reads the counters and vram_fake_set arms its failure hooks.

import (
	"errors"
	"math"
	"os"
	"runtime"
	"strings"
	"sync"
	"testing"
	"unsafe"

	"github.com/ebitengine/purego"
	"github.com/vramkit/vram/device"
)

// fakeHooks binds the fake driver's test entry points, and the context
// stack calls a program may make that the backend does not bind.
type fakeHooks struct {
	count func(string) int32
	set   func(string, int32) int32
	push  func(uintptr) int32  // cuCtxPushCurrent_v2
	pop   func(*uintptr) int32 // cuCtxPopCurrent_v2
}

func bindFake(t *testing.T) fakeHooks {
	t.Helper()
	h, err := purego.Dlopen(os.Getenv(fakeEnv), purego.RTLD_NOW|purego.RTLD_LOCAL) // the library already loaded
	if err != nil {
		t.Fatalf("dlopen the fake driver: %v", err)
	}
	var f fakeHooks
	purego.RegisterLibFunc(&f.count, h, "vram_fake_count")
	purego.RegisterLibFunc(&f.set, h, "vram_fake_set")
	purego.RegisterLibFunc(&f.push, h, "cuCtxPushCurrent_v2")
	purego.RegisterLibFunc(&f.pop, h, "cuCtxPopCurrent_v2")
	return f
}

func fakeRegressions(t *testing.T) {
	f := bindFake(t)
	open := func(t *testing.T) *Device {
		t.Helper()
		d, err := Open(0)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { d.Close() })
		return d
	}

	// Item 1: cuMemFree of cuMemAllocAsync memory does not wait for the
	// work that uses it, so Free must synchronize the context first.
	t.Run("FreeOfAsyncMemoryWaits", func(t *testing.T) {
		d := open(t)
		s, err := d.NewStream()
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		before := f.count("free_unsynced")
		p, err := d.MallocAsync(1<<20, s)
		if err != nil {
			t.Fatal(err)
		}
		if err := d.Memset(p, 7, 1<<20, s); err != nil {
			t.Fatal(err)
		}
		if err := d.Free(p); err != nil {
			t.Errorf("Free of a MallocAsync pointer with work queued = %v", err)
		}
		if n := f.count("free_unsynced") - before; n != 0 {
			t.Errorf("cuMemFree of stream-ordered memory ran %d times before a cuCtxSynchronize", n)
		}
	})

	// cuMemFreeAsync is documented for stream-ordered memory only.
	t.Run("FreeAsyncOfMallocMemory", func(t *testing.T) {
		d := open(t)
		s, err := d.NewStream()
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		before := f.count("freeasync_malloc")
		p, err := d.Malloc(1 << 20)
		if err != nil {
			t.Fatal(err)
		}
		if err := d.Memset(p, 7, 1<<20, s); err != nil {
			t.Fatal(err)
		}
		if err := d.FreeAsync(p, s); err != nil {
			t.Errorf("FreeAsync of a Malloc pointer = %v", err)
		}
		if n := f.count("freeasync_malloc") - before; n != 0 {
			t.Errorf("cuMemFreeAsync was given cuMemAlloc memory %d times", n)
		}
		if err := d.Free(p); !errors.Is(err, device.ErrDoubleFree) {
			t.Errorf("Free after FreeAsync = %v; want ErrDoubleFree", err)
		}
	})

	// Item 2: the kernel parameters reach the driver intact while the
	// collector runs (they are pinned, and the array the driver reads
	// holds addresses as integers).
	t.Run("LaunchWhileCollecting", func(t *testing.T) {
		d := open(t)
		mod, err := d.LoadPTX(fillPTX)
		if err != nil {
			t.Fatal(err)
		}
		defer mod.Close()
		fn, err := mod.Function("fill")
		if err != nil {
			t.Fatal(err)
		}
		const n = 64
		p, err := d.Malloc(4 * n)
		if err != nil {
			t.Fatal(err)
		}
		defer d.Free(p)
		s := d.DefaultStream()
		stop := make(chan struct{})
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
					runtime.GC()
				}
			}
		}()
		defer func() { close(stop); wg.Wait() }()
		got := make([]byte, 4*n)
		for i := range 100 {
			a, b := float32(i), float64(-i)
			if err := fn.Launch(s, device.Dim3{X: 1, Y: 1, Z: 1}, device.Dim3{X: n, Y: 1, Z: 1}, 0, p, uint32(n), a, b); err != nil {
				t.Fatal(err)
			}
			if err := d.CopyDtoH(got, p, s); err != nil {
				t.Fatal(err)
			}
			v := math.Float32frombits(*(*uint32)(unsafe.Pointer(&got[4*(n-1)])))
			if want := a*float32(n-1) + float32(b); v != want {
				t.Fatalf("launch %d: p[%d] = %v, want %v", i, n-1, v, want)
			}
		}
	})

	// A refused pinning is out of memory, whatever code the driver used.
	t.Run("PinningRefused", func(t *testing.T) {
		d := open(t)
		for _, tc := range []struct {
			code Result
			oom  bool
		}{{ErrorOutOfMemory, true}, {ErrorOperatingSystem, true}, {ErrorInvalidValue, true}, {ErrorHostMemoryAlreadyReg, false}} {
			if f.set("register_error", int32(tc.code)) != 1 {
				t.Fatal("the fake has no register_error hook")
			}
			_, err := d.HostAlloc(1<<20, false)
			if errors.Is(err, device.ErrOutOfMemory) != tc.oom || !errors.Is(err, tc.code) {
				t.Errorf("HostAlloc refused with %v = %v; want out of memory %v", tc.code, err, tc.oom)
			}
		}
		h, err := d.HostAlloc(1<<20, false) // the hook fired once each
		if err != nil {
			t.Fatal(err)
		}
		if err := d.HostFree(h); err != nil {
			t.Fatal(err)
		}
	})

	// A kernel exception is sticky: the device says it needs a reset, and
	// refuses work until one.
	t.Run("StickyKernelError", func(t *testing.T) {
		d, other := open(t), open(t)
		mod, err := d.LoadPTX(fillPTX)
		if err != nil {
			t.Fatal(err)
		}
		fn, err := mod.Function("fill")
		if err != nil {
			t.Fatal(err)
		}
		// A raw address, not a device.Ptr, passes the package's checks and
		// makes the fake kernel fault when it runs: the launch succeeds, and
		// the fault shows in the next call.
		if err := fn.Launch(d.DefaultStream(), device.Dim3{X: 1, Y: 1, Z: 1}, device.Dim3{X: 1, Y: 1, Z: 1}, 0,
			uint64(0x10), uint32(1), float32(1), 1.0); err != nil {
			t.Fatalf("Launch of a kernel that will fault = %v; the launch is asynchronous and succeeds", err)
		}
		err = d.DefaultStream().Synchronize()
		if !errors.Is(err, ErrNeedsReset) || !errors.Is(err, device.ErrInvalidPointer) || !strings.Contains(err.Error(), "sticky") {
			t.Fatalf("Synchronize after a kernel that faults = %v; want CUDA_ERROR_ILLEGAL_ADDRESS saying it is sticky", err)
		}
		if err := d.Err(); !errors.Is(err, ErrorIllegalAddress) {
			t.Errorf("Err() = %v; want the sticky error", err)
		}
		if _, err := other.Malloc(4096); !errors.Is(err, ErrNeedsReset) || !strings.Contains(err.Error(), "Reset the device") {
			t.Errorf("Malloc on another Device of the broken context = %v; want ErrNeedsReset", err)
		}
		if err := d.Reset(); err != nil {
			t.Fatal(err)
		}
		if err := d.Err(); err != nil {
			t.Errorf("Err() after Reset = %v", err)
		}
		p, err := other.Malloc(4096)
		if err != nil {
			t.Fatalf("Malloc after Reset: %v", err)
		}
		other.Free(p)
	})

	// A Reset through one Device unpins the host buffers of every Device on
	// the GPU, so none stays registered at an address a later HostAlloc
	// may get again.
	t.Run("ResetUnpinsEveryDevice", func(t *testing.T) {
		d1, d2 := open(t), open(t)
		base := f.count("registered")
		h, err := d2.HostAlloc(1<<20, true)
		if err != nil {
			t.Fatal(err)
		}
		if err := d1.Reset(); err != nil {
			t.Fatal(err)
		}
		if n := f.count("registered") - base; n != 0 {
			t.Errorf("%d host ranges of another Device still registered after Reset", n)
		}
		if err := d2.HostFree(h); !errors.Is(err, device.ErrInvalidated) {
			t.Errorf("HostFree of a buffer from before the Reset = %v; want ErrInvalidated", err)
		}
		h2, err := d2.HostAlloc(1<<20, true)
		if err != nil {
			t.Fatalf("HostAlloc after Reset: %v", err)
		}
		if err := d2.HostFree(h2); err != nil {
			t.Fatal(err)
		}
	})

	// Open reads the context, pool and generation under the lock a
	// concurrent Reset takes (the race detector checks the child).
	t.Run("OpenDuringReset", func(t *testing.T) {
		d := open(t)
		var wg sync.WaitGroup
		wg.Add(2)
		errs := make(chan error, 100)
		go func() {
			defer wg.Done()
			for range 300 {
				if err := d.Reset(); err != nil {
					errs <- err
				}
			}
		}()
		go func() {
			defer wg.Done()
			for range 300 {
				d2, err := Open(0)
				if err != nil {
					errs <- err
					continue
				}
				if d2.Info().TotalBytes != 1<<30 {
					errs <- errors.New("Open during a Reset described the device wrongly")
				}
				d2.Close()
			}
		}()
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
	})
}
