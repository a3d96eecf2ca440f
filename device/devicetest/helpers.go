package devicetest

// Helpers of the suite: failing on errors, free memory read within a
// backend's slack, bounded waits, and a stream held busy.

import (
	_ "embed"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/vramkit/vram/device"
)

func backed(t *testing.T, d device.Device) {
	t.Helper()
	if !d.Info().Backed {
		t.Skip("device is not backed (address-only): it holds no bytes to copy")
	}
}

// must returns a function that fails t on an error and passes the value
// on: must[device.Ptr](t)(d.Malloc(n)).
func must[T any](t *testing.T) func(T, error) T {
	t.Helper()
	return func(v T, err error) T {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
}

func ptr(t *testing.T) func(device.Ptr, error) device.Ptr        { return must[device.Ptr](t) }
func strm(t *testing.T) func(device.Stream, error) device.Stream { return must[device.Stream](t) }
func evt(t *testing.T) func(device.Event, error) device.Event    { return must[device.Event](t) }

func hbuf(t *testing.T) func(device.HostBuffer, error) device.HostBuffer {
	return must[device.HostBuffer](t)
}

func ok(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func isErr(t *testing.T, err, want error, what string) {
	t.Helper()
	if !errors.Is(err, want) {
		t.Fatalf("%s: got error %v, want one wrapping %q", what, err, want)
	}
	if err != nil && err.Error() == want.Error() {
		t.Errorf("%s: error %q carries no detail; wrap the sentinel with what was asked", what, err)
	}
}

func memFree(t *testing.T, d device.Device) uint64 {
	t.Helper()
	free, _, err := d.MemInfo()
	ok(t, err)
	return free
}

// cudaMemSlack is how far free memory may move on a real CUDA driver for
// reasons of the driver's own between two readings the suite expects to
// be equal: it loads internal modules lazily (the first memset, copy or
// launch of a kind) and gives streams, events and the memory pool
// resources of their own. On every other backend (the simulator) free
// memory is accounted exactly, and the suite demands it.
const cudaMemSlack = 16 << 20

// memSlack is the tolerance of d's free-memory readings: cudaMemSlack on
// CUDA, 0 elsewhere.
func memSlack(d device.Device) uint64 {
	if d.Info().Backend == "cuda" {
		return cudaMemSlack
	}
	return 0
}

// freeNear fails t when free memory got is further than memSlack(d) from
// want; what says what the reading was after.
func freeNear(t *testing.T, d device.Device, got, want uint64, what string) {
	t.Helper()
	diff := got - want
	if got < want {
		diff = want - got
	}
	if slack := memSlack(d); diff > slack {
		t.Errorf("%s: free memory is %d, want %d (within %d bytes on %s)", what, got, want, slack, d.Info().Backend)
	}
}

func roundUp(n, g uint64) uint64 {
	if g == 0 {
		return n
	}
	return (n + g - 1) / g * g
}

// within fails the test if fn does not return within waitLimit.
func within(t *testing.T, what string, fn func()) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		fn()
	}()
	select {
	case <-done:
	case <-time.After(waitLimit):
		t.Fatalf("%s did not return within %v", what, waitLimit)
	}
}

func syncStream(t *testing.T, s device.Stream) {
	t.Helper()
	var err error
	within(t, "Stream.Synchronize", func() { err = s.Synchronize() })
	ok(t, err)
}

// hold blocks stream s until the returned release function is called (at
// the latest when the test ends): with a Go kernel that waits on a channel
// on a device.FuncLauncher, else with a PTX kernel that spins on a flag in
// mapped host memory on a device.ModuleLoader that is also a
// device.HostAllocator. It skips the test when the device can do neither,
// or when the stream is not busy right after the launch (a driver that
// does not really run kernels).
func hold(t *testing.T, d device.Device, s device.Stream) (release func()) {
	t.Helper()
	if !d.Info().Backed {
		t.Skip("device is address-only and runs no kernels: the suite cannot hold a stream busy")
	}
	if fl, isFL := d.(device.FuncLauncher); isFL {
		ch := make(chan struct{})
		ok(t, fl.LaunchFunc(s, 1, func(device.View, int, int) error {
			<-ch
			return nil
		}))
		var once sync.Once
		release = func() { once.Do(func() { close(ch) }) }
		t.Cleanup(release)
		return release
	}
	return holdPTX(t, d, s)
}

// spinPTX waits until the 32-bit word at flag is not zero.
//
//go:embed spin.ptx
var spinPTX string

func holdPTX(t *testing.T, d device.Device, s device.Stream) (release func()) {
	t.Helper()
	ml, isML := d.(device.ModuleLoader)
	ha, isHA := d.(device.HostAllocator)
	if !isML || !isHA {
		t.Skip("device is neither a device.FuncLauncher nor a ModuleLoader with HostAllocator: the suite cannot hold a stream busy")
	}
	flag, err := ha.HostAlloc(4, true)
	if err != nil {
		t.Skipf("cannot hold a stream: mapped host memory for the flag: %v", err)
	}
	mod, err := ml.LoadPTX(spinPTX)
	if err != nil {
		ok(t, ha.HostFree(flag))
		t.Skipf("cannot hold a stream: loading the spin kernel: %v", err)
	}
	cleanup := func() {
		if err := mod.Close(); err != nil {
			t.Errorf("closing the spin module: %v", err)
		}
		if err := ha.HostFree(flag); err != nil {
			t.Errorf("freeing the spin flag: %v", err)
		}
	}
	fn, err := mod.Function("vram_devicetest_spin")
	if err == nil {
		err = fn.Launch(s, device.Dim3{X: 1, Y: 1, Z: 1}, device.Dim3{X: 1, Y: 1, Z: 1}, 0, flag.DevicePtr)
	}
	if err != nil {
		cleanup()
		t.Fatalf("launching the spin kernel: %v", err)
	}
	if done, _ := s.Query(); done {
		ok(t, s.Synchronize())
		cleanup()
		t.Skip("the stream was idle right after launching the spin kernel: this driver does not run kernels, so the suite cannot hold a stream busy")
	}
	var once sync.Once
	release = func() {
		once.Do(func() { atomic.StoreUint32((*uint32)(unsafe.Pointer(&flag.Data[0])), 1) })
	}
	t.Cleanup(func() {
		release()
		within(t, "the spin kernel's end", func() { _ = d.Synchronize() })
		cleanup()
	})
	return release
}

func pattern(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = seed + byte(i*7)
	}
	return b
}

// hostBytes returns n zeroed host bytes for a copy that is enqueued behind
// held work. On a device with pinned host memory they are pinned: a driver
// may complete a copy to or from ordinary (pageable) memory before
// returning (CUDA does), which would block on the held stream forever.
// Elsewhere they are ordinary Go memory.
func hostBytes(t *testing.T, d device.Device, n int) []byte {
	t.Helper()
	ha, isHost := d.(device.HostAllocator)
	if !isHost {
		return make([]byte, n)
	}
	b, err := ha.HostAlloc(uint64(n), false)
	if err != nil {
		t.Fatalf("HostAlloc(%d) for a copy behind held work: %v", n, err)
	}
	t.Cleanup(func() {
		if err := ha.HostFree(b); err != nil {
			t.Errorf("HostFree: %v", err)
		}
	})
	clear(b.Data)
	return b.Data[:n]
}

// hostText is hostBytes holding s.
func hostText(t *testing.T, d device.Device, s string) []byte {
	t.Helper()
	b := hostBytes(t, d, len(s))
	copy(b, s)
	return b
}
