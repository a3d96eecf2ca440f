package cuda

import (
	"fmt"
	"runtime"

	"github.com/vramkit/vram/device"
)

// RawCopier copies between a pinned host buffer and a device buffer with
// bare driver calls — cuMemcpyHtoDAsync or cuMemcpyDtoHAsync, then
// cuStreamSynchronize — on a goroutine locked to its thread with the
// context current: what a program calling the driver directly would do,
// the baseline the external benchmarks (manager_bench_test.go) measure the
// manager's copies against. Not safe for concurrent use; test-only.
type RawCopier struct {
	d    *Device
	host device.HostBuffer
	dev  device.Ptr
	s    *stream
}

// NewRawCopier makes its buffers of n bytes and its stream on d. Close it.
func NewRawCopier(d *Device, n uint64) (*RawCopier, error) {
	h, err := d.HostAlloc(n, false)
	if err != nil {
		return nil, err
	}
	p, err := d.Malloc(n)
	if err != nil {
		d.HostFree(h)
		return nil, err
	}
	s, err := d.NewStream()
	if err != nil {
		d.Free(p)
		d.HostFree(h)
		return nil, err
	}
	for i := range h.Data { // real pages with real bytes, like the manager's host array
		h.Data[i] = byte(i)
	}
	return &RawCopier{d: d, host: h, dev: p, s: s.(*stream)}, nil
}

// Pin locks the calling goroutine to its thread and makes the context
// current there, once, as a direct driver program would; Unpin undoes the
// lock. Device calls made in between keep the context current.
func (r *RawCopier) Pin() error {
	runtime.LockOSThread()
	if res := r.d.lib.ctxSetCurrent(r.d.p.ctx); res != Success {
		runtime.UnlockOSThread()
		return fmt.Errorf("cuCtxSetCurrent: %w", res)
	}
	return nil
}

// Unpin unlocks the thread Pin locked.
func (r *RawCopier) Unpin() { runtime.UnlockOSThread() }

// HtoD copies the host buffer to the device buffer and waits. Call between
// Pin and Unpin.
func (r *RawCopier) HtoD() error {
	if res := r.d.lib.memcpyHtoDAsync(uint64(r.dev), r.host.Data, r.s.h); res != Success {
		return res
	}
	if res := r.d.lib.streamSynchronize(r.s.h); res != Success {
		return res
	}
	return nil
}

// DtoH copies the device buffer to the host buffer and waits. Call between
// Pin and Unpin.
func (r *RawCopier) DtoH() error {
	if res := r.d.lib.memcpyDtoHAsync(r.host.Data, uint64(r.dev), r.s.h); res != Success {
		return res
	}
	if res := r.d.lib.streamSynchronize(r.s.h); res != Success {
		return res
	}
	return nil
}

// Host is the pinned host buffer.
func (r *RawCopier) Host() []byte { return r.host.Data }

// Close frees the buffers and the stream.
func (r *RawCopier) Close() error {
	return firstErr(r.s.Close(), r.d.Free(r.dev), r.d.HostFree(r.host))
}
