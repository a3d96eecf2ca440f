package cuda

// Calls from a foreign program (device.ForeignCaller): PyTorch, CuPy and
// Numba reach vram through its C library from their allocator hooks, on
// their own threads, with their own context current and their own streams.
//
// Contexts. The CUDA runtime (PyTorch, CuPy) and Numba use each GPU's
// primary context, which is the one a Device retains, so a pointer vram
// hands out is valid in theirs. A context current on the calling thread
// that belongs to the same GPU but is not its primary context (one made by
// cuCtxCreate) is refused: pointers do not cross contexts. Every driver
// call of a Device makes the primary context current on the calling
// thread (enter, device.go); KeepThread reads what was current before and
// puts it back afterwards, so a hook that frees device 1's memory while
// the program's thread is on device 0 leaves it on device 0.
//
// Streams. A borrowed stream is the program's CUstream (cudaStream_t is
// the same handle): events are recorded on it and its work is waited for,
// but it is never destroyed, and it is not one of the Device's own streams
// (Close and Reset leave it to its owner).

import (
	"errors"
	"fmt"
	"runtime"

	"github.com/vramkit/vram/device"
)

// ErrForeignContext: the calling thread's current context is a context of
// the Device's GPU other than the primary context the Device uses.
var ErrForeignContext = errors.New("the thread's current context is not the GPU's primary context")

var _ device.ForeignCaller = (*Device)(nil)

// BorrowStream wraps h, a CUstream made by another program in this process
// (or 0, the legacy default stream; CU_STREAM_LEGACY and
// CU_STREAM_PER_THREAD are accepted as the driver accepts them), as a
// Stream of d. The driver checks the handle when the stream is first used;
// a handle of a destroyed stream is undefined, as it is for the driver.
// Close of the result marks it closed and releases nothing.
func (d *Device) BorrowStream(h uintptr) (device.Stream, error) {
	if d.closed.Load() {
		return nil, fmt.Errorf("cuda device %d: borrow stream %#x: %w", d.p.ordinal, h, device.ErrClosed)
	}
	if h == cuDefaultLegacyStream {
		return d.DefaultStream(), nil
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.syncGenLocked()
	return &stream{d: d, h: h, gen: d.seenGen, borrowed: true}, nil
}

// KeepThread locks the calling goroutine to its OS thread, reads the
// context current on it (cuCtxGetCurrent) and returns a function that
// makes that context current again (none included) and unlocks the
// thread. It fails with ErrForeignContext when the current context is of
// d's GPU but is not its primary context.
func (d *Device) KeepThread() (restore func(), err error) {
	if d.closed.Load() {
		return nil, fmt.Errorf("cuda device %d: %w", d.p.ordinal, device.ErrClosed)
	}
	runtime.LockOSThread()
	var prev uintptr
	if r := d.lib.ctxGetCurrent(&prev); r != Success {
		runtime.UnlockOSThread()
		return nil, fmt.Errorf("cuda device %d: cuCtxGetCurrent: %w", d.p.ordinal, r)
	}
	if err := d.checkShared(prev); err != nil {
		runtime.UnlockOSThread()
		return nil, err
	}
	return func() {
		d.lib.ctxSetCurrent(prev) // 0 unbinds: the thread had none
		runtime.UnlockOSThread()
	}, nil
}

// checkShared refuses ctx, current on the locked calling thread, when it
// is a context of d's GPU other than the primary context. The primary
// context handle is read under the record's lock, which a Reset holds
// while it replaces it.
func (d *Device) checkShared(ctx uintptr) error {
	d.p.mu.RLock()
	primary := d.p.ctx
	d.p.mu.RUnlock()
	if ctx == 0 || ctx == primary {
		return nil
	}
	var dev int32
	if r := d.lib.ctxGetDevice(&dev); r != Success {
		return fmt.Errorf("cuda device %d: cuCtxGetDevice of the thread's context %#x: %w", d.p.ordinal, ctx, r)
	}
	if dev != d.p.dev {
		return nil // another GPU's context: put back afterwards
	}
	return fmt.Errorf("cuda device %d: context %#x (primary %#x): %w; vram, the CUDA runtime, PyTorch, CuPy and Numba share the primary context, and pointers are not valid across contexts",
		d.p.ordinal, ctx, primary, ErrForeignContext)
}
