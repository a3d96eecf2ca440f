package cuda

import (
	"sync/atomic"

	"fmt"

	"github.com/vramkit/vram/device"
)

// stream is a CUstream. The default stream is the legacy NULL stream
// (handle 0); the others are made with CU_STREAM_NON_BLOCKING. Safe for
// concurrent use.
type stream struct {
	d         *Device
	h         uintptr // CUstream
	gen       uint64  // the primary context generation it was made in
	isDefault bool
	borrowed  bool // another program's CUstream (BorrowStream, foreign.go): never destroyed here
	closed    atomic.Bool
}

// DefaultStream is the legacy default stream (CUstream 0). Closing it is a
// no-op. After a Reset it is a new Stream value (the driver's NULL stream
// again) and the one from before returns device.ErrInvalidated, as every
// handle from before a reset does.
func (d *Device) DefaultStream() device.Stream {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.syncGenLocked()
	return d.defStr
}

// NewStream makes a stream that does not synchronize with the default
// stream (cuStreamCreate with CU_STREAM_NON_BLOCKING).
func (d *Device) NewStream() (device.Stream, error) {
	if err := d.enter(); err != nil {
		return nil, err
	}
	defer d.exit()
	var h uintptr
	if r := d.lib.streamCreate(&h, cuStreamNonBlocking); r != Success {
		return nil, fmt.Errorf("cuda: NewStream: %w", r)
	}
	s := &stream{d: d, h: h, gen: d.p.gen.Load()}
	d.mu.Lock()
	d.syncGenLocked()
	d.streams[s] = struct{}{}
	d.mu.Unlock()
	return s, nil
}

func (s *stream) String() string {
	if s.isDefault {
		return "cuda stream default"
	}
	if s.borrowed {
		return fmt.Sprintf("cuda stream %#x (borrowed)", s.h)
	}
	return fmt.Sprintf("cuda stream %#x", s.h)
}

// Handle is the CUstream; 0 for the default stream.
func (s *stream) Handle() uintptr { return s.h }

// enter is Device.enter plus this stream's validity.
func (s *stream) enter(op string) error {
	if err := s.d.enter(); err != nil {
		return err
	}
	if _, err := s.d.streamOf(op, s); err != nil {
		s.d.exit()
		return err
	}
	return nil
}

// Synchronize waits for the stream's work (cuStreamSynchronize) and
// returns the first error it raised.
func (s *stream) Synchronize() error {
	if err := s.enter("Synchronize"); err != nil {
		return err
	}
	defer s.d.exit()
	if r := s.d.lib.streamSynchronize(s.h); r != Success {
		return fmt.Errorf("cuda: synchronize %v: %w", s, r)
	}
	return nil
}

// Query reports whether the stream's work has finished (cuStreamQuery).
func (s *stream) Query() (bool, error) {
	if err := s.enter("Query"); err != nil {
		return false, err
	}
	defer s.d.exit()
	switch r := s.d.lib.streamQuery(s.h); r {
	case Success:
		return true, nil
	case ErrorNotReady:
		return false, nil
	default:
		return false, fmt.Errorf("cuda: query %v: %w", s, r)
	}
}

// Close waits for the stream's work and destroys it. Closing the default
// stream is a no-op; closing a stream twice returns device.ErrClosed; a
// stream made before a Reset is already gone and returns
// device.ErrInvalidated. Closing a borrowed stream only marks it closed:
// its work and its handle are its owner's.
func (s *stream) Close() error {
	if s.isDefault {
		return nil
	}
	if s.borrowed {
		if !s.closed.CompareAndSwap(false, true) {
			return fmt.Errorf("cuda: close %v: %w", s, device.ErrClosed)
		}
		return nil
	}
	if err := s.enter("Close"); err != nil {
		return err
	}
	defer s.d.exit()
	if !s.closed.CompareAndSwap(false, true) {
		return fmt.Errorf("cuda: close %v: %w", s, device.ErrClosed)
	}
	s.d.mu.Lock()
	delete(s.d.streams, s)
	s.d.mu.Unlock()
	rs := s.d.lib.streamSynchronize(s.h)
	rd := s.d.lib.streamDestroy(s.h)
	if rs != Success {
		return fmt.Errorf("cuda: close %v: synchronize: %w", s, rs)
	}
	if rd != Success {
		return fmt.Errorf("cuda: close %v: %w", s, rd)
	}
	return nil
}

// event is a CUevent made with CU_EVENT_DISABLE_TIMING. Safe for
// concurrent use.
type event struct {
	d      *Device
	h      uintptr // CUevent
	gen    uint64
	closed atomic.Bool
}

// NewEvent makes an event with timing disabled (cuEventCreate).
func (d *Device) NewEvent() (device.Event, error) {
	if err := d.enter(); err != nil {
		return nil, err
	}
	defer d.exit()
	var h uintptr
	if r := d.lib.eventCreate(&h, cuEventDisableTiming); r != Success {
		return nil, fmt.Errorf("cuda: NewEvent: %w", r)
	}
	e := &event{d: d, h: h, gen: d.p.gen.Load()}
	d.mu.Lock()
	d.syncGenLocked()
	d.events[e] = struct{}{}
	d.mu.Unlock()
	return e, nil
}

func (e *event) String() string { return fmt.Sprintf("cuda event %#x", e.h) }

func (e *event) enter(op string) error {
	if err := e.d.enter(); err != nil {
		return err
	}
	switch {
	case e.closed.Load():
		e.d.exit()
		return fmt.Errorf("cuda: %s %v: %w", op, e, device.ErrClosed)
	case !e.d.current(e.gen):
		e.d.exit()
		return fmt.Errorf("cuda: %s %v made before a device reset: %w", op, e, device.ErrInvalidated)
	}
	return nil
}

// Record captures the work enqueued on s so far (cuEventRecord).
func (e *event) Record(s device.Stream) error {
	if err := e.enter("Record"); err != nil {
		return err
	}
	defer e.d.exit()
	st, err := e.d.streamOf("Record", s)
	if err != nil {
		return err
	}
	if r := e.d.lib.eventRecord(e.h, st.h); r != Success {
		return fmt.Errorf("cuda: record %v on %v: %w", e, st, r)
	}
	return nil
}

// Wait makes later work on s wait for the captured work
// (cuStreamWaitEvent). It does not block the host.
func (e *event) Wait(s device.Stream) error {
	if err := e.enter("Wait"); err != nil {
		return err
	}
	defer e.d.exit()
	st, err := e.d.streamOf("Wait", s)
	if err != nil {
		return err
	}
	if r := e.d.lib.streamWaitEvent(st.h, e.h); r != Success {
		return fmt.Errorf("cuda: %v wait for %v: %w", st, e, r)
	}
	return nil
}

// Synchronize blocks until the captured work has finished
// (cuEventSynchronize); an event never recorded is complete.
func (e *event) Synchronize() error {
	if err := e.enter("Synchronize"); err != nil {
		return err
	}
	defer e.d.exit()
	if r := e.d.lib.eventSynchronize(e.h); r != Success {
		return fmt.Errorf("cuda: synchronize %v: %w", e, r)
	}
	return nil
}

// Query reports whether the captured work has finished (cuEventQuery).
func (e *event) Query() (bool, error) {
	if err := e.enter("Query"); err != nil {
		return false, err
	}
	defer e.d.exit()
	switch r := e.d.lib.eventQuery(e.h); r {
	case Success:
		return true, nil
	case ErrorNotReady:
		return false, nil
	default:
		return false, fmt.Errorf("cuda: query %v: %w", e, r)
	}
}

// Close destroys the event (cuEventDestroy). Closing twice returns
// device.ErrClosed; an event made before a Reset returns
// device.ErrInvalidated.
func (e *event) Close() error {
	if err := e.enter("Close"); err != nil {
		return err
	}
	defer e.d.exit()
	if !e.closed.CompareAndSwap(false, true) {
		return fmt.Errorf("cuda: close %v: %w", e, device.ErrClosed)
	}
	e.d.mu.Lock()
	delete(e.d.events, e)
	e.d.mu.Unlock()
	if r := e.d.lib.eventDestroy(e.h); r != Success {
		return fmt.Errorf("cuda: close %v: %w", e, r)
	}
	return nil
}
