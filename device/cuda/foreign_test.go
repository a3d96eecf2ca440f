package cuda

import (
	"errors"
	"runtime"
	"testing"

	"github.com/vramkit/vram/device"
)

// The stand-in driver's handles for contexts it never makes
// (testdata/fakecuda.c): a second context of device 0 and one of a device 1.
const (
	fakeOtherCtx uintptr = 0x7000
	fakePeerCtx  uintptr = 0x7040
)

// fakeForeign checks device.ForeignCaller against the stand-in driver, in
// TestFakeDriverChild: the thread's context is put back whatever it was,
// a second context of the same GPU is refused, and a borrowed stream is
// used but never destroyed.
func fakeForeign(t *testing.T) {
	d, err := Open(0)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	// The test is the foreign program: it sets its thread's context
	// itself, so it stays on one thread.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	current := func() uintptr {
		var c uintptr
		if r := d.lib.ctxGetCurrent(&c); r != Success {
			t.Fatalf("cuCtxGetCurrent: %v", r)
		}
		return c
	}
	set := func(c uintptr) {
		if r := d.lib.ctxSetCurrent(c); r != Success {
			t.Fatalf("cuCtxSetCurrent(%#x): %v", c, r)
		}
	}

	t.Run("ContextPutBack", func(t *testing.T) {
		for name, ctx := range map[string]uintptr{"none": 0, "primary": d.p.ctx, "another GPU's": fakePeerCtx} {
			set(ctx)
			restore, err := d.KeepThread()
			if err != nil {
				t.Fatalf("%s context: KeepThread = %v", name, err)
			}
			p, err := d.Malloc(1 << 20) // makes the primary context current
			if err != nil {
				t.Fatal(err)
			}
			if err := d.Free(p); err != nil {
				t.Fatal(err)
			}
			restore()
			if got := current(); got != ctx {
				t.Errorf("%s context: after the call the thread has %#x current; want %#x put back", name, got, ctx)
			}
		}
	})

	t.Run("OpenAndClosePutBack", func(t *testing.T) {
		set(fakePeerCtx)
		defer set(0)
		d2, err := Open(0)
		if err != nil {
			t.Fatal(err)
		}
		if got := current(); got != fakePeerCtx {
			t.Errorf("after Open the thread has %#x current; want %#x put back", got, fakePeerCtx)
		}
		if err := d2.Close(); err != nil {
			t.Fatal(err)
		}
		if got := current(); got != fakePeerCtx {
			t.Errorf("after Close the thread has %#x current; want %#x put back", got, fakePeerCtx)
		}
	})

	t.Run("SecondContextRefused", func(t *testing.T) {
		set(fakeOtherCtx)
		defer set(0)
		if _, err := d.KeepThread(); !errors.Is(err, ErrForeignContext) {
			t.Errorf("KeepThread with a second context of the GPU current = %v; want ErrForeignContext", err)
		}
		if got := current(); got != fakeOtherCtx {
			t.Errorf("a refused KeepThread changed the thread's context to %#x", got)
		}
	})

	t.Run("BorrowedStream", func(t *testing.T) {
		set(d.p.ctx)
		var h uintptr
		if r := d.lib.streamCreate(&h, cuStreamNonBlocking); r != Success {
			t.Fatalf("cuStreamCreate: %v", r)
		}
		defer d.lib.streamDestroy(h)
		s, err := d.BorrowStream(h)
		if err != nil {
			t.Fatal(err)
		}
		if s.Handle() != h {
			t.Errorf("borrowed stream's Handle = %#x; want %#x", s.Handle(), h)
		}
		p, err := d.MallocAsync(1<<20, s)
		if err != nil {
			t.Fatal(err)
		}
		ev, err := d.NewEvent()
		if err != nil {
			t.Fatal(err)
		}
		defer ev.Close()
		if err := ev.Record(s); err != nil {
			t.Errorf("event record on a borrowed stream: %v", err)
		}
		if err := d.FreeAsync(p, s); err != nil {
			t.Fatal(err)
		}
		if err := s.Synchronize(); err != nil {
			t.Fatal(err)
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		if err := s.Close(); !errors.Is(err, device.ErrClosed) {
			t.Errorf("second Close of a borrowed stream = %v; want ErrClosed", err)
		}
		if r := d.lib.streamQuery(h); r != Success {
			t.Errorf("the owner's stream after vram closed its borrow: cuStreamQuery = %v; want it alive", r)
		}
		if def, err := d.BorrowStream(0); err != nil || def != d.DefaultStream() {
			t.Errorf("BorrowStream(0) = %v, %v; want the default stream", def, err)
		}
	})

	t.Run("Closed", func(t *testing.T) {
		d2, err := Open(0)
		if err != nil {
			t.Fatal(err)
		}
		if err := d2.Close(); err != nil {
			t.Fatal(err)
		}
		if _, err := d2.BorrowStream(64); !errors.Is(err, device.ErrClosed) {
			t.Errorf("BorrowStream on a closed device = %v; want ErrClosed", err)
		}
		if _, err := d2.KeepThread(); !errors.Is(err, device.ErrClosed) {
			t.Errorf("KeepThread on a closed device = %v; want ErrClosed", err)
		}
	})
}
