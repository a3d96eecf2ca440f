package alloc

// AsyncPool hands allocation to the device's own stream-ordered pool
// (cuMemAllocAsync / cuMemFreeAsync, or the simulator's exact emulation of
// its rules), as CuPy's MemoryAsyncPool and PyTorch's cudaMallocAsync
// backend do. The device pool keeps the cross-stream reuse rules; this
// type adds what the Allocator contract asks for on top: a table of live
// pointers (so a foreign Free is refused and Close can give everything
// back), the Stats counters, a retry after synchronizing on out-of-memory,
// and the release threshold.
//
// The pool's reservation is the device's business, so Reserved is read
// from PoolUsage: after every allocation (the only call that can grow it,
// which keeps PeakReserved exact) and in Stats and Trim. A growth seen
// after an allocation counts as a device allocation, a shrink seen later
// as a device free.

import (
	"errors"
	"fmt"
	"math"
	"sync"

	"github.com/vramkit/vram/device"
	"github.com/vramkit/vram/internal/units"
)

// KeepAll is the release threshold that keeps every freed byte in the
// device's pool until Trim or Close (PyTorch's choice for its
// cudaMallocAsync backend).
const KeepAll uint64 = math.MaxUint64

// AsyncConfig configures an AsyncPool. The zero value keeps freed memory
// cached in the device's pool (release threshold KeepAll). A plain value,
// safe to share.
type AsyncConfig struct {
	// ReleaseThreshold is how many bytes of freed memory the device's pool
	// keeps reserved when a synchronization point releases memory; what is
	// above it goes back to the device. Zero means KeepAll; to release
	// everything at every synchronization point (the driver's own
	// default), set ReleaseAtSync instead.
	ReleaseThreshold uint64
	// ReleaseAtSync sets the release threshold to 0, so that the pool
	// gives all freed memory back at each synchronization point. It
	// overrides ReleaseThreshold.
	ReleaseAtSync bool
}

// threshold is the release threshold the config asks for, in bytes.
func (c AsyncConfig) threshold() uint64 {
	switch {
	case c.ReleaseAtSync:
		return 0
	case c.ReleaseThreshold == 0:
		return KeepAll
	default:
		return c.ReleaseThreshold
	}
}

// AsyncPool allocates through the device's stream-ordered pool. A block
// freed on stream S is reusable at once by allocations on S and by
// allocations on other streams only after S's work up to the free has
// finished; the device enforces this.
//
// The device has one such pool, shared by every AsyncPool on it: the
// release threshold is the device's, and Reserved (from PoolUsage)
// includes what other AsyncPools on the device hold. InUse counts the
// bytes asked for. DeviceAllocs and DeviceFrees count the growths and
// shrinks of the device pool's reservation that the AsyncPool saw (it reads
// the reservation after each allocation, and in Stats, Trim and Close);
// CacheHits counts allocations that did not grow it. Under concurrent use
// two readings may be recorded out of order, so these three counts are
// then approximate; InUse, Allocs, Frees and OOMs are always exact.
//
// After a device reset (see Allocator), the device's pool starts afresh,
// so Reserved (read from it) drops at once, while a pointer from before
// the reset stays in InUse until it is freed: the device's FreeAsync of it
// fails with device.ErrInvalidated (on the stream given, and again on the
// default stream, in case only the stream was from before the reset), and
// Free then forgets it, counts a free and returns that error. Close counts
// such pointers the same way and returns nil for them.
//
// An AsyncPool is safe for concurrent use.
type AsyncPool struct {
	dev       device.Device
	aa        device.AsyncAllocator
	threshold uint64 // bytes, as set on the device pool
	maxReq    uint64 // largest request whose rounding to the device's granularity does not overflow
	st        counters

	mu       sync.Mutex                // protects the fields below
	live     map[device.Ptr]asyncBlock // live pointer → its block
	observed uint64                    // pool reservation last read from the device
	closed   bool                      // set by Close

	oomHook // the out-of-memory observer (report.go)
}

// asyncBlock is one live allocation of an AsyncPool.
type asyncBlock struct {
	size   uint64        // bytes asked for
	stream device.Stream // stream of the allocation; Close frees there
}

// NewAsyncPool returns an AsyncPool on dev's stream-ordered pool, with the
// pool's release threshold set from cfg. The error wraps
// device.ErrNotSupported when dev has no stream-ordered pool.
func NewAsyncPool(dev device.Device, cfg AsyncConfig) (*AsyncPool, error) {
	aa, ok := dev.(device.AsyncAllocator)
	if !ok {
		info := dev.Info()
		return nil, fmt.Errorf("alloc: async pool on %s device %q: the backend has no stream-ordered pool; use NewPool instead: %w",
			info.Backend, info.Name, device.ErrNotSupported)
	}
	a := &AsyncPool{
		dev:       dev,
		aa:        aa,
		threshold: cfg.threshold(),
		maxReq:    math.MaxUint64 &^ (max(dev.Info().Granularity, 1) - 1),
		live:      make(map[device.Ptr]asyncBlock),
	}
	if err := aa.SetReleaseThreshold(a.threshold); err != nil {
		return nil, fmt.Errorf("alloc: async pool: set release threshold to %d bytes: %w", a.threshold, err)
	}
	reserved, _, err := aa.PoolUsage()
	if err != nil {
		return nil, fmt.Errorf("alloc: async pool: read pool usage: %w", err)
	}
	a.observed = reserved
	a.st.setReserved(reserved)
	return a, nil
}

// ReleaseThreshold is the release threshold set on the device's pool, in
// bytes (KeepAll for no release).
func (a *AsyncPool) ReleaseThreshold() uint64 { return a.threshold }

// Alloc allocates n bytes ordered on s. When the device's pool is out of
// memory it synchronizes the device (so that blocks freed on other
// streams become reusable) and retries once.
func (a *AsyncPool) Alloc(n uint64, s device.Stream) (device.Ptr, error) {
	if n == 0 || s == nil {
		return 0, fmt.Errorf("alloc: async alloc of %d bytes on stream %v: want n > 0 and a stream: %w",
			n, s, device.ErrInvalidValue)
	}
	if a.isClosed() {
		return 0, fmt.Errorf("alloc: async alloc of %s: %w", units.Format(n), ErrClosed)
	}
	if n > a.maxReq {
		a.st.onOOM()
		return 0, a.fail(n, s, fmt.Errorf("alloc: async alloc of %d bytes: no device can hold it (rounding it up to the device's %s granularity overflows 64 bits): %w",
			n, units.Format(a.dev.Info().Granularity), device.ErrOutOfMemory), a.Report())
	}
	p, err := a.aa.MallocAsync(n, s)
	retried := ""
	if errors.Is(err, device.ErrOutOfMemory) {
		if serr := a.dev.Synchronize(); serr == nil {
			a.st.onRetry()
			retried = " (retried after synchronizing the device)"
			p, err = a.aa.MallocAsync(n, s)
		}
	}
	if err != nil {
		if errors.Is(err, device.ErrOutOfMemory) {
			a.st.onOOM()
			return 0, a.fail(n, s, fmt.Errorf("alloc: async alloc of %s on stream %d%s: %s; free memory, call Trim on other pools or lower the release threshold: %w",
				units.Format(n), s.Handle(), retried, a.memoryLine(), err), a.Report())
		}
		return 0, fmt.Errorf("alloc: async alloc of %s on stream %d: %w", units.Format(n), s.Handle(), err)
	}
	reserved, _, uerr := a.aa.PoolUsage()
	a.mu.Lock()
	if a.closed {
		a.mu.Unlock()
		return 0, errors.Join(fmt.Errorf("alloc: async alloc of %s: %w", units.Format(n), ErrClosed), a.aa.FreeAsync(p, s))
	}
	a.live[p] = asyncBlock{size: n, stream: s}
	grew := uerr == nil && reserved > a.observed
	if uerr == nil {
		a.observeLocked(reserved)
	}
	a.mu.Unlock()
	a.st.onAlloc(n, !grew)
	return p, nil
}

// observeLocked records the pool's reservation read from the device,
// counting a growth as a device allocation and a shrink as a device free.
// a.mu must be held.
func (a *AsyncPool) observeLocked(reserved uint64) {
	switch {
	case reserved > a.observed:
		a.st.deviceAllocs.Add(1)
	case reserved < a.observed:
		a.st.deviceFrees.Add(1)
	}
	a.observed = reserved
	a.st.setReserved(reserved)
}

// observe reads the pool's reservation from the device and records it.
func (a *AsyncPool) observe() error {
	reserved, _, err := a.aa.PoolUsage()
	if err != nil {
		return err
	}
	a.mu.Lock()
	a.observeLocked(reserved)
	a.mu.Unlock()
	return nil
}

// memoryLine describes the pool and the device, for errors.
func (a *AsyncPool) memoryLine() string {
	line := fmt.Sprintf("this pool has %s live", units.Format(a.st.inUse.Load()))
	if reserved, used, err := a.aa.PoolUsage(); err == nil {
		line += fmt.Sprintf(", the device pool reserves %s with %s in use", units.Format(reserved), units.Format(used))
	}
	if free, total, err := a.dev.MemInfo(); err == nil {
		line += fmt.Sprintf(", the device has %s free of %s", units.Format(free), units.Format(total))
	}
	return line
}

// Free returns p to the device's pool, ordered on s: the memory is
// reusable on s at once and on other streams once s's work up to this
// call has finished. For a pointer from before a device reset it returns
// an error wrapping device.ErrInvalidated, having taken p back.
func (a *AsyncPool) Free(p device.Ptr, s device.Stream) error {
	if s == nil {
		return fmt.Errorf("alloc: async free of %v on a nil stream: %w", p, device.ErrInvalidValue)
	}
	a.mu.Lock()
	if a.closed {
		a.mu.Unlock()
		return fmt.Errorf("alloc: async free of %v: %w", p, ErrClosed)
	}
	b, ok := a.live[p]
	if !ok {
		a.mu.Unlock()
		return fmt.Errorf("alloc: async free of %v: %w", p, ErrUnknownPointer)
	}
	delete(a.live, p)
	a.mu.Unlock()
	if err := a.freeAsync(p, s); err != nil {
		if lostToReset(err) {
			// The reset freed it: taken back, and the caller told.
			a.st.onFree(b.size)
			return fmt.Errorf("alloc: async free of %v on stream %d: its memory went with a device reset: %w", p, s.Handle(), err)
		}
		a.mu.Lock()
		if !a.closed { // else Close has given up the table
			a.live[p] = b
		}
		a.mu.Unlock()
		return fmt.Errorf("alloc: async free of %v on stream %d: %w", p, s.Handle(), err)
	}
	a.st.onFree(b.size)
	return nil
}

// freeAsync frees p on s. When that fails with device.ErrInvalidated it
// tries the default stream, since s may be what a device reset
// invalidated (its work went with the reset, so no work on it can still
// use p) while p is not; an error wrapping device.ErrInvalidated then
// means p itself is from before the reset.
func (a *AsyncPool) freeAsync(p device.Ptr, s device.Stream) error {
	err := a.aa.FreeAsync(p, s)
	if lostToReset(err) {
		return a.aa.FreeAsync(p, a.dev.DefaultStream())
	}
	return err
}

// Stats reports the counters, with Reserved read from the device's pool
// now.
func (a *AsyncPool) Stats() Stats {
	if !a.isClosed() {
		_ = a.observe() // on error, the last reading stands
	}
	return a.st.stats()
}

// ResetPeaks sets the peaks to the current values.
func (a *AsyncPool) ResetPeaks() {
	_ = a.observe()
	a.st.resetPeaks()
}

// Trim synchronizes the device, so that every pending free has completed,
// and then trims the device's pool to nothing it does not use
// (cuMemPoolTrimTo(0)), as PyTorch's empty_cache does for its async
// backend.
func (a *AsyncPool) Trim() error {
	if a.isClosed() {
		return fmt.Errorf("alloc: async trim: %w", ErrClosed)
	}
	if err := a.dev.Synchronize(); err != nil {
		return fmt.Errorf("alloc: async trim: synchronize: %w", err)
	}
	if err := a.aa.TrimPool(0); err != nil {
		return fmt.Errorf("alloc: async trim: %w", err)
	}
	if err := a.observe(); err != nil {
		return fmt.Errorf("alloc: async trim: read pool usage: %w", err)
	}
	return nil
}

// Close frees every live allocation (on the stream it was allocated on, or
// the default stream when that one is gone), synchronizes the device and
// trims the device's pool. Allocations a device reset took count as freed,
// without an error. Later calls return ErrClosed; a second Close returns
// nil.
func (a *AsyncPool) Close() error {
	a.mu.Lock()
	if a.closed {
		a.mu.Unlock()
		return nil
	}
	a.closed = true
	live := a.live
	a.live = nil
	a.mu.Unlock()
	var errs []error
	for p, b := range live {
		err := a.aa.FreeAsync(p, b.stream)
		if err != nil {
			err = a.aa.FreeAsync(p, a.dev.DefaultStream())
		}
		if err != nil && !lostToReset(err) {
			errs = append(errs, fmt.Errorf("alloc: async close: free %v: %w", p, err))
			continue
		}
		a.st.onFree(b.size)
	}
	if err := a.dev.Synchronize(); err != nil {
		errs = append(errs, fmt.Errorf("alloc: async close: synchronize: %w", err))
	} else if err := a.aa.TrimPool(0); err != nil {
		errs = append(errs, fmt.Errorf("alloc: async close: trim: %w", err))
	}
	if err := a.observe(); err != nil {
		errs = append(errs, fmt.Errorf("alloc: async close: read pool usage: %w", err))
	}
	return errors.Join(errs...)
}

func (a *AsyncPool) isClosed() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.closed
}

var (
	_ Allocator    = (*AsyncPool)(nil)
	_ PeakResetter = (*AsyncPool)(nil)
)
