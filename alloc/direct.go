package alloc

// Direct is the baseline allocator: every Alloc is one device Malloc and
// every Free one device Free, as Numba's default memory manager does. It
// keeps only a table of its live pointers, so that Free of a pointer it
// did not hand out is refused and Close can give everything back.

import (
	"errors"
	"fmt"
	"sync"

	"github.com/vramkit/vram/device"
	"github.com/vramkit/vram/internal/units"
)

// Direct sends every call to the device: no caching, no rounding of its
// own. Its Stats count each allocation as the device holds it, rounded up
// to the device's Granularity, so InUse and Reserved are equal and Cached
// is always zero; every Alloc is a device allocation and every Free a
// device free.
//
// The stream given to Alloc and Free orders nothing: the device's Free
// waits for all work that may use the pointer (as cuMemFree does), so
// memory freed by Direct is safe to reuse on any stream.
//
// After a device reset (see Allocator), Direct learns that an allocation
// is gone when the device's Free of it fails with device.ErrInvalidated:
// Free then forgets the pointer, counts a free and a device free, and
// returns that error; Close counts it the same way and returns nil for
// it. Until its pointers are freed, allocations from before the reset
// stay in InUse and Reserved.
//
// A Direct is safe for concurrent use.
type Direct struct {
	dev  device.Device
	gran uint64 // bytes; the device's allocation unit, at least 1
	st   counters

	mu     sync.Mutex            // protects the fields below
	live   map[device.Ptr]uint64 // live pointer → bytes charged (rounded)
	closed bool                  // set by Close

	oomHook // the out-of-memory observer (report.go)
}

// NewDirect returns a Direct allocator on dev.
func NewDirect(dev device.Device) *Direct {
	return &Direct{
		dev:  dev,
		gran: max(dev.Info().Granularity, 1),
		live: make(map[device.Ptr]uint64),
	}
}

// Alloc allocates n bytes with one device Malloc. s is only checked.
func (d *Direct) Alloc(n uint64, s device.Stream) (device.Ptr, error) {
	if n == 0 || s == nil {
		return 0, fmt.Errorf("alloc: direct alloc of %d bytes on stream %v: want n > 0 and a stream: %w",
			n, s, device.ErrInvalidValue)
	}
	if d.isClosed() {
		return 0, fmt.Errorf("alloc: direct alloc of %s: %w", units.Format(n), ErrClosed)
	}
	charged, ok := units.RoundUp(n, d.gran)
	if !ok {
		d.st.onOOM()
		return 0, d.fail(n, s, fmt.Errorf("alloc: direct alloc of %d bytes overflows the device's %s granularity: %w",
			n, units.Format(d.gran), device.ErrOutOfMemory), d.Report())
	}
	p, err := d.dev.Malloc(n)
	if err != nil {
		if errors.Is(err, device.ErrOutOfMemory) {
			d.st.onOOM()
			return 0, d.fail(n, s, fmt.Errorf("alloc: direct alloc of %s on stream %d: %s; free memory or use a pool that trims its cache: %w",
				units.Format(n), s.Handle(), d.memoryLine(), err), d.Report())
		}
		return 0, fmt.Errorf("alloc: direct alloc of %s on stream %d: %w", units.Format(n), s.Handle(), err)
	}
	d.mu.Lock()
	if d.closed {
		// Closed while the device call ran: give the memory back.
		d.mu.Unlock()
		return 0, errors.Join(fmt.Errorf("alloc: direct alloc of %s: %w", units.Format(n), ErrClosed), d.dev.Free(p))
	}
	d.live[p] = charged
	d.mu.Unlock()
	d.st.onDeviceAlloc(charged)
	d.st.onAlloc(charged, false)
	return p, nil
}

// memoryLine describes the device's memory and what d holds, for errors.
func (d *Direct) memoryLine() string {
	st := d.st.stats()
	free, total, err := d.dev.MemInfo()
	if err != nil {
		return fmt.Sprintf("this allocator holds %s (device memory unknown: %v)", units.Format(st.InUse), err)
	}
	return fmt.Sprintf("the device has %s free of %s and this allocator holds %s",
		units.Format(free), units.Format(total), units.Format(st.InUse))
}

// Free releases p with one device Free, which waits for work that may
// still use p. For a pointer from before a device reset it returns an
// error wrapping device.ErrInvalidated, having taken p back.
func (d *Direct) Free(p device.Ptr, s device.Stream) error {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return fmt.Errorf("alloc: direct free of %v: %w", p, ErrClosed)
	}
	charged, ok := d.live[p]
	if !ok {
		d.mu.Unlock()
		return fmt.Errorf("alloc: direct free of %v: %w", p, ErrUnknownPointer)
	}
	delete(d.live, p)
	d.mu.Unlock()
	if err := d.dev.Free(p); err != nil {
		if lostToReset(err) {
			// The reset freed it: taken back, and the caller told.
			d.st.onFree(charged)
			d.st.onDeviceFree(charged)
			return fmt.Errorf("alloc: direct free of %v: its memory went with a device reset: %w", p, err)
		}
		d.mu.Lock()
		if !d.closed { // else Close has given up the table
			d.live[p] = charged
		}
		d.mu.Unlock()
		return fmt.Errorf("alloc: direct free of %v: %w", p, err)
	}
	d.st.onFree(charged)
	d.st.onDeviceFree(charged)
	return nil
}

// Stats reports the counters.
func (d *Direct) Stats() Stats { return d.st.stats() }

// ResetPeaks sets the peaks to the current values.
func (d *Direct) ResetPeaks() { d.st.resetPeaks() }

// Granularity is the device's allocation unit.
func (d *Direct) Granularity() uint64 { return d.gran }

// Trim does nothing: Direct caches nothing.
func (d *Direct) Trim() error {
	if d.isClosed() {
		return fmt.Errorf("alloc: direct trim: %w", ErrClosed)
	}
	return nil
}

// Close frees every live allocation; those a device reset took count as
// freed, without an error. Later calls return ErrClosed; a second Close
// returns nil.
func (d *Direct) Close() error {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return nil
	}
	d.closed = true
	live := d.live
	d.live = nil
	d.mu.Unlock()
	var errs []error
	for p, charged := range live {
		if err := d.dev.Free(p); err != nil && !lostToReset(err) {
			errs = append(errs, fmt.Errorf("alloc: direct close: free %v: %w", p, err))
			continue
		}
		d.st.onFree(charged)
		d.st.onDeviceFree(charged)
	}
	return errors.Join(errs...)
}

func (d *Direct) isClosed() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.closed
}

var (
	_ Allocator    = (*Direct)(nil)
	_ PeakResetter = (*Direct)(nil)
	_ Granular     = (*Direct)(nil)
)
