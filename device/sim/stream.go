package sim

// Streams and events.
//
// A stream is a FIFO of operations (Go closures) served by one goroutine
// that the stream owns from its first operation to Close (a stream that
// is never given work costs no goroutine, and NewStream and Close cost
// O(1) however many streams there are). Enqueueing appends under the
// stream's mutex and returns at once, so work runs asynchronously with the
// caller and strictly in order on its stream. While a stream has
// unfinished work it is listed in the device's active list, which is all
// that Free and HostFree wait for. Each stream counts the
// operations enqueued (enq) and finished (done); both only grow, and
// "the work enqueued so far" is simply the count enq at that moment.
//
// An event records a (stream, count) pair. Query is done >= count;
// Synchronize waits for it on the stream's condition variable; Wait(s2)
// enqueues on s2 an operation that blocks s2's goroutine until the
// recorded stream reaches the count. Because a record only captures work
// already enqueued, and a wait is enqueued after it, waits cannot form a
// cycle.
//
// The first error raised by a stream's work is kept (sticky) until the
// stream's Synchronize, or the device's, reports it; Query reports it
// without clearing it. Later operations still run.
//
// Synchronizing a stream, an event or the device is a synchronization
// point for the async pool (see pool.go).

import (
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/vramkit/vram/device"
)

type stream struct {
	dev       *Device
	gen       uint64 // device generation the stream belongs to
	handle    uint64 // 0 for the default stream
	isDefault bool

	enq  atomic.Uint64 // operations enqueued; written under mu
	done atomic.Uint64 // operations finished; written under mu

	mu      sync.Mutex // protects the fields below
	work    sync.Cond  // signalled when an operation is enqueued or stopping
	idle    sync.Cond  // broadcast when done grows and someone waits
	q       []op
	head    int
	err     error // first unreported error of the stream's work
	waiters int
	closed  bool // no more work accepted
	dead    bool // queued work is dropped (reset)
	stopped bool // the goroutine should exit once the queue is empty
	started bool // the goroutine was started, or quit closed without one
	busy    bool // listed in dev.active: done < enq
	quit    chan struct{}

	actIdx int // index in dev.active while busy; protected by dev.actMu

	// Async pool bookkeeping, protected by dev.mu.
	pend      tree[*block] // blocks freed on this stream, not yet reusable elsewhere, by (size, start)
	fifo      []fifoEntry  // the same blocks in the order they were freed
	fifoHead  int
	inPending bool // listed in dev.pool.pendingStreams
}

// op is one queued operation: fn, or (when fn is nil) a wait until
// stream after has finished n operations (an event wait, kept as data so
// that Event.Wait allocates nothing).
type op struct {
	fn    func() error
	after *stream
	n     uint64
}

func (o op) run() error {
	if o.fn != nil {
		return o.fn()
	}
	o.after.waitFor(o.n)
	return nil
}

type fifoEntry struct {
	b   *block
	tag uint64
}

// newStreamLocked makes a stream and starts its goroutine.
func (d *Device) newStreamLocked(isDefault bool) *stream {
	s := &stream{dev: d, gen: d.gen.Load(), isDefault: isDefault, quit: make(chan struct{})}
	if !isDefault {
		d.nextStream++
		s.handle = d.nextStream
		d.streams[s] = struct{}{}
	}
	s.work.L = &s.mu
	s.idle.L = &s.mu
	return s
}

// serve runs the stream's operations in order until stopped.
func (s *stream) serve() {
	defer close(s.quit)
	s.mu.Lock()
	for {
		for s.head == len(s.q) && !s.stopped {
			s.work.Wait()
		}
		if s.head == len(s.q) {
			s.mu.Unlock()
			return
		}
		o := s.q[s.head]
		s.q[s.head] = op{}
		s.head++
		if s.head == len(s.q) {
			s.q, s.head = s.q[:0], 0
		}
		dead := s.dead
		s.mu.Unlock()
		var err error
		if !dead {
			err = o.run()
		}
		s.mu.Lock()
		if err != nil && s.err == nil {
			s.err = err
		}
		s.done.Add(1)
		if s.busy && s.done.Load() == s.enq.Load() {
			s.busy = false
			s.dev.removeActive(s)
		}
		if s.waiters > 0 {
			s.idle.Broadcast()
		}
	}
}

// halt closes the stream to new work and tells its goroutine to exit once
// the queue is empty. With drop, queued work is skipped (a reset); else it
// runs first. join waits for the goroutine to exit.
func (s *stream) halt(drop bool) {
	s.mu.Lock()
	s.closed = true
	s.stopped = true
	if drop {
		s.dead = true
	}
	if !s.started { // never given work: no goroutine to stop
		s.started = true
		close(s.quit)
	}
	s.work.Signal()
	s.mu.Unlock()
}

func (s *stream) join() { <-s.quit }

// enqueue appends fn to the stream's queue.
func (s *stream) enqueue(name string, fn func() error) error {
	return s.push(name, op{fn: fn})
}

// push appends o to the stream's queue.
func (s *stream) push(name string, o op) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return s.goneErr(name)
	}
	s.q = append(s.q, o)
	s.enq.Add(1)
	if !s.busy {
		s.busy = true
		s.dev.addActive(s)
	}
	if !s.started {
		s.started = true
		go s.serve()
	}
	s.work.Signal()
	return nil
}

// goneErr explains why a closed stream takes no work.
func (s *stream) goneErr(op string) error {
	d := s.dev
	switch {
	case d.closed.Load():
		return d.errClosed(op)
	case s.gen != d.gen.Load():
		return fmt.Errorf("%v: %s on %v: the stream was made before a device reset: %w", d, op, s, device.ErrInvalidated)
	}
	return fmt.Errorf("%v: %s on %v: the stream is closed: %w", d, op, s, device.ErrClosed)
}

// waitFor blocks until the stream has finished n operations.
func (s *stream) waitFor(n uint64) {
	if s.done.Load() >= n {
		return
	}
	s.mu.Lock()
	s.waiters++
	for s.done.Load() < n {
		s.idle.Wait()
	}
	s.waiters--
	s.mu.Unlock()
}

func (s *stream) takeErr() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	err := s.err
	s.err = nil
	return err
}

// check reports whether the stream can be used for op.
func (s *stream) check(op string) error {
	d := s.dev
	if d.closed.Load() {
		return d.errClosed(op)
	}
	if s.gen != d.gen.Load() {
		return fmt.Errorf("%v: %s on %v: the stream was made before a device reset: %w", d, op, s, device.ErrInvalidated)
	}
	s.mu.Lock()
	closed := s.closed
	s.mu.Unlock()
	if closed {
		return s.goneErr(op)
	}
	return nil
}

// String names the stream, e.g. "stream 3" or "the default stream".
func (s *stream) String() string {
	if s.isDefault {
		return "the default stream"
	}
	return fmt.Sprintf("stream %d", s.handle)
}

// Synchronize waits for the work enqueued so far and returns the first
// error that work raised (and clears it).
func (s *stream) Synchronize() error {
	if err := s.check("synchronize"); err != nil {
		return err
	}
	if err := s.dev.faults.check(OpSync, "synchronize", 0); err != nil {
		return err
	}
	s.waitFor(s.enq.Load())
	err := s.takeErr()
	s.dev.syncPoint()
	return err
}

// Query reports whether the work enqueued so far has finished, and the
// first unreported error of that work (without clearing it).
func (s *stream) Query() (bool, error) {
	if err := s.check("query"); err != nil {
		return false, err
	}
	done := s.done.Load() >= s.enq.Load()
	s.mu.Lock()
	err := s.err
	s.mu.Unlock()
	return done, err
}

// Handle is the stream's number on its device; 0 is the default stream.
func (s *stream) Handle() uintptr { return uintptr(s.handle) }

// Close waits for the stream's work, stops its goroutine and returns the
// first unreported error of its work. Closing the default stream is a
// no-op; closing twice returns ErrClosed.
func (s *stream) Close() error {
	d := s.dev
	if s.isDefault {
		return nil
	}
	if err := s.check("close stream"); err != nil {
		return err
	}
	d.mu.Lock()
	if _, ok := d.streams[s]; !ok {
		d.mu.Unlock()
		return s.goneErr("close stream")
	}
	delete(d.streams, s)
	// Until its goroutine has exited, the stream is retired: a concurrent
	// Device.Close still waits for its queued work.
	d.retired[s] = struct{}{}
	d.mu.Unlock()
	s.halt(false)
	s.join()
	d.mu.Lock()
	delete(d.retired, s)
	d.pool.promoteLocked() // the stream's frees are all complete now
	d.mu.Unlock()
	return s.takeErr()
}

// DefaultStream returns the device's default stream (a new one after each
// Reset).
func (d *Device) DefaultStream() device.Stream {
	d.mu.RLock()
	defer d.mu.RUnlock()
	return d.def
}

// NewStream makes a stream served by its own goroutine. Close it when done.
func (d *Device) NewStream() (device.Stream, error) {
	if d.closed.Load() {
		return nil, d.errClosed("new stream")
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed.Load() {
		return nil, d.errClosed("new stream")
	}
	return d.newStreamLocked(false), nil
}

// streamOf checks that s is a usable stream of this device.
func (d *Device) streamOf(s device.Stream, op string) (*stream, error) {
	if d.closed.Load() {
		return nil, d.errClosed(op)
	}
	if s == nil {
		return nil, fmt.Errorf("%v: %s: nil stream (use DefaultStream()): %w", d, op, device.ErrInvalidValue)
	}
	st, ok := s.(*stream)
	if !ok {
		return nil, fmt.Errorf("%v: %s: stream %T is not a simulator stream: %w", d, op, s, device.ErrInvalidValue)
	}
	if st.dev != d {
		return nil, fmt.Errorf("%v: %s: %v belongs to another device (%v): %w", d, op, st, st.dev, device.ErrInvalidValue)
	}
	if err := st.check(op); err != nil {
		return nil, err
	}
	return st, nil
}

// event marks a point in a stream's work.
type event struct {
	dev *Device
	gen uint64

	mu     sync.Mutex // protects the fields below
	s      *stream    // nil until recorded
	n      uint64     // operations of s the event waits for
	closed bool
}

// NewEvent makes an event. Close it when done.
func (d *Device) NewEvent() (device.Event, error) {
	if d.closed.Load() {
		return nil, d.errClosed("new event")
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed.Load() {
		return nil, d.errClosed("new event")
	}
	d.events++
	return &event{dev: d, gen: d.gen.Load()}, nil
}

func (e *event) check(op string) error {
	d := e.dev
	if d.closed.Load() {
		return d.errClosed(op)
	}
	if e.gen != d.gen.Load() {
		return fmt.Errorf("%v: %s: the event was made before a device reset: %w", d, op, device.ErrInvalidated)
	}
	return nil
}

// target returns what the event waits for, checking it is usable.
func (e *event) target(op string) (*stream, uint64, error) {
	if err := e.check(op); err != nil {
		return nil, 0, err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return nil, 0, fmt.Errorf("%v: %s: the event is closed: %w", e.dev, op, device.ErrClosed)
	}
	return e.s, e.n, nil
}

// Record captures the work enqueued on s so far.
func (e *event) Record(s device.Stream) error {
	st, err := e.dev.streamOf(s, "record event")
	if err != nil {
		return err
	}
	if _, _, err := e.target("record event"); err != nil {
		return err
	}
	e.mu.Lock()
	e.s, e.n = st, st.enq.Load()
	e.mu.Unlock()
	return nil
}

// Wait makes work enqueued on s from now on wait for the captured work.
func (e *event) Wait(s device.Stream) error {
	st, err := e.dev.streamOf(s, "wait event")
	if err != nil {
		return err
	}
	src, n, err := e.target("wait event")
	if err != nil {
		return err
	}
	if src == nil || src == st || src.done.Load() >= n {
		return nil // never recorded, same stream, or already complete
	}
	return st.push("wait event", op{after: src, n: n})
}

// Synchronize blocks until the captured work has finished.
func (e *event) Synchronize() error {
	src, n, err := e.target("synchronize event")
	if err != nil {
		return err
	}
	if err := e.dev.faults.check(OpSync, "synchronize event", 0); err != nil {
		return err
	}
	if src != nil {
		src.waitFor(n)
	}
	e.dev.syncPoint()
	return nil
}

// Query reports whether the captured work has finished.
func (e *event) Query() (bool, error) {
	src, n, err := e.target("query event")
	if err != nil {
		return false, err
	}
	return src == nil || src.done.Load() >= n, nil
}

// Close releases the event; closing twice returns ErrClosed.
func (e *event) Close() error {
	if err := e.check("close event"); err != nil {
		return err
	}
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return fmt.Errorf("%v: close event: already closed: %w", e.dev, device.ErrClosed)
	}
	e.closed = true
	e.mu.Unlock()
	d := e.dev
	d.mu.Lock()
	if e.gen == d.gen.Load() {
		d.events--
	}
	d.mu.Unlock()
	return nil
}
