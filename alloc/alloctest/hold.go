package alloctest

import (
	_ "embed"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/vramkit/vram/device"
)

// A holder keeps a stream busy for a while, so that work queued on it
// behind the hold runs late: on a device that runs Go kernels, a kernel
// that sleeps; on one that loads PTX and maps host memory (CUDA), a kernel
// that spins until the host sets a flag in mapped memory, which a timer
// does. Not safe for concurrent use.
type holder struct {
	dev     device.Device
	fl      device.FuncLauncher // the Go-kernel way, or nil
	ha      device.HostAllocator
	fn      device.Function // the spin kernel
	mu      sync.Mutex      // protects the fields below (timers fire on their own goroutines)
	flags   []device.HostBuffer
	timers  []*time.Timer
	cleaned bool
}

// waitPTX spins until the 32-bit word at flag (mapped host memory) is not
// zero. A volatile load re-reads the word over the bus on every pass.
//
//go:embed wait.ptx
var waitPTX string

// newHolder returns a holder for dev, or skips the test, saying why, when
// dev cannot hold a stream busy. On the PTX path it first checks that a
// held stream is really busy (a driver that does not run kernels, such as
// a stand-in library, leaves it idle).
func newHolder(t *testing.T, dev device.Device) *holder {
	t.Helper()
	if !dev.Info().Backed {
		t.Skip("the device is address-only: it cannot run the work that holds a stream busy")
	}
	h := &holder{dev: dev}
	if fl, ok := dev.(device.FuncLauncher); ok {
		h.fl = fl
		return h
	}
	ml, isML := dev.(device.ModuleLoader)
	ha, isHA := dev.(device.HostAllocator)
	if !isML || !isHA {
		t.Skip("the device runs no Go kernels and cannot load PTX into mapped host memory: it cannot hold a stream busy")
	}
	h.ha = ha
	mod, err := ml.LoadPTX(waitPTX)
	if err != nil {
		t.Skipf("cannot hold a stream busy: loading the wait kernel: %v", err)
	}
	t.Cleanup(func() {
		h.cleanup(t)
		if err := mod.Close(); err != nil {
			t.Errorf("closing the wait kernel's module: %v", err)
		}
	})
	if h.fn, err = mod.Function("vram_alloctest_wait"); err != nil {
		t.Fatalf("the wait kernel: %v", err)
	}
	s, err := dev.NewStream()
	if err != nil {
		t.Fatalf("NewStream: %v", err)
	}
	release := h.start(t, s)
	done, err := s.Query()
	release()
	if serr := s.Close(); serr != nil {
		t.Fatalf("closing the probe stream: %v", serr)
	}
	if err != nil {
		t.Fatalf("Query of the held stream: %v", err)
	}
	if done {
		t.Skip("a stream was idle right after the wait kernel was launched on it: this driver does not run kernels, so no stream can be held busy")
	}
	return h
}

// hold keeps s busy for about d from now: work enqueued on s after hold
// runs only then. It does not block the caller.
func (h *holder) hold(t *testing.T, s device.Stream, d time.Duration) {
	t.Helper()
	if h.fl != nil {
		if err := h.fl.LaunchFunc(s, 1, func(device.View, int, int) error {
			time.Sleep(d)
			return nil
		}); err != nil {
			t.Fatalf("LaunchFunc: %v", err)
		}
		return
	}
	release := h.start(t, s)
	h.mu.Lock()
	h.timers = append(h.timers, time.AfterFunc(d, release))
	h.mu.Unlock()
}

// start launches the wait kernel on s with a fresh flag and returns the
// function that sets the flag.
func (h *holder) start(t *testing.T, s device.Stream) (release func()) {
	t.Helper()
	flag, err := h.ha.HostAlloc(4, true)
	if err != nil {
		t.Fatalf("mapped host memory for the wait kernel's flag: %v", err)
	}
	h.mu.Lock()
	h.flags = append(h.flags, flag)
	h.mu.Unlock()
	word := (*uint32)(unsafe.Pointer(&flag.Data[0]))
	atomic.StoreUint32(word, 0)
	one := device.Dim3{X: 1, Y: 1, Z: 1}
	if err := h.fn.Launch(s, one, one, 0, flag.DevicePtr); err != nil {
		t.Fatalf("launching the wait kernel: %v", err)
	}
	return func() {
		h.mu.Lock()
		defer h.mu.Unlock()
		if !h.cleaned { // after cleanup the flag may be unmapped
			atomic.StoreUint32(word, 1)
		}
	}
}

// cleanup ends every hold, waits for the device and frees the flags.
func (h *holder) cleanup(t *testing.T) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.cleaned {
		return
	}
	h.cleaned = true
	for _, tm := range h.timers {
		tm.Stop()
	}
	for _, f := range h.flags {
		atomic.StoreUint32((*uint32)(unsafe.Pointer(&f.Data[0])), 1)
	}
	if err := h.dev.Synchronize(); err != nil {
		t.Errorf("waiting for the wait kernels: %v", err)
	}
	for _, f := range h.flags {
		if err := h.ha.HostFree(f); err != nil {
			t.Errorf("freeing a wait kernel's flag: %v", err)
		}
	}
}
