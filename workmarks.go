package vram

// Work marks: a client says when work on its arrays begins and ends, so
// that the manager knows when it is idle (eviction, evict.go).
//
// BeginWork opens a mark; Work.End closes it and records an event on the
// client's stream after the work enqueued so far. A client is idle when
// no mark is open and every event recorded at an End has completed: the
// GPU, not only the host, is done with its arrays. Events are kept one
// per stream (a later End on a stream supersedes the earlier event on
// it) and closed once seen complete, or when the client or the manager
// closes.
//
// Locking: workState.mu is taken before Manager.mu (eviction holds it
// over taking a client's arrays, so that no mark opens meanwhile) and is
// never held over a hook. It may be held over an event's Record, Query
// or Close, which do not block.

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/vramkit/vram/device"
)

// useClock orders uses of clients' arrays across the process, for
// least-recently-used eviction: each use takes the next tick.
var useClock atomic.Uint64

// workState is a client's work marks and eviction state.
type workState struct {
	noEvict bool          // ClientOptions.NoEvict; set at Register
	lastUse atomic.Uint64 // useClock at the latest allocation, BeginWork or End
	evicted atomic.Bool   // its arrays were evicted and it has not been allocated since

	mu      sync.Mutex // protects the fields below; see the file's header
	open    int        // marks begun and not ended
	pending []endMark  // events recorded at Ends, at most one per stream
}

// endMark is the event an End recorded (nil if none could be: then the
// whole stream must be done), and the stream it was recorded on.
type endMark struct {
	ev device.Event
	s  device.Stream
}

// done reports whether the work the mark stands for has finished.
func (e endMark) done() (bool, error) {
	if e.ev == nil {
		return e.s.Query()
	}
	return e.ev.Query()
}

// touch records a use of the client's arrays now.
func (w *workState) touch() { w.lastUse.Store(useClock.Add(1)) }

// Work is one mark of work begun on a client's arrays, from BeginWork
// until End. Its methods are safe for concurrent use.
type Work struct {
	c     *Client
	ended atomic.Bool
}

// BeginWork marks work on c's arrays as begun: until the mark's End, and
// then until the GPU has finished the work enqueued on c's stream before
// that End, c is busy and its arrays are never evicted. Call End once
// the work is enqueued (a deferred End is fine). A client whose arrays
// were evicted gets an error wrapping ErrEvicted (and no mark): queue its
// requests and allocate again first.
func (c *Client) BeginWork() (*Work, error) {
	m := c.m
	if err := m.check(c); err != nil {
		return nil, err
	}
	c.work.mu.Lock()
	defer c.work.mu.Unlock()
	if c.work.evicted.Load() {
		return nil, fmt.Errorf("begin work of %v: its arrays were evicted for another group; queue its requests and allocate again: %w", c, ErrEvicted)
	}
	c.work.open++
	c.work.touch()
	return &Work{c: c}, nil
}

// End closes the mark: it records an event on the client's stream after
// the work enqueued there so far (work enqueued on another stream must be
// ordered before it, with an event or a Sync), and the client becomes
// idle once that work is done. It never waits. A second End does
// nothing and returns nil; so does the End of a mark whose client has
// closed. If no event can be recorded, the client stays busy until all
// the work on its stream is done.
func (w *Work) End() error {
	if w == nil || !w.ended.CompareAndSwap(false, true) {
		return nil
	}
	c := w.c
	// The event is recorded (or the stream waited for) before the mark
	// closes, so that the client is never idle before its work is done.
	var mark *endMark
	var err error
	if s, serr := c.m.stream(c); serr == nil { // else closed meanwhile: nothing left to wait for
		mark, err = c.markEnd(s)
	}
	c.work.mu.Lock()
	defer c.work.mu.Unlock()
	c.work.open--
	c.work.touch()
	if mark != nil {
		err = errors.Join(err, c.work.keepLocked(*mark))
	}
	return err
}

// markEnd records an event on s; when it cannot, the mark is s itself,
// and the client is idle only once all of s's work is done.
func (c *Client) markEnd(s device.Stream) (*endMark, error) {
	ev, err := recordOn(c.m.dev, s)
	if err != nil {
		c.m.log.Debug("vram: end work: no event recorded; the client is busy until its stream is idle", "client", c.String(), "err", err)
		return &endMark{s: s}, nil
	}
	return &endMark{ev: ev, s: s}, nil
}

// recordOn makes an event and records it on s.
func recordOn(dev device.Device, s device.Stream) (device.Event, error) {
	ev, err := dev.NewEvent()
	if err != nil {
		return nil, err
	}
	if err := ev.Record(s); err != nil {
		return nil, errors.Join(err, ev.Close())
	}
	return ev, nil
}

// keepLocked adds e to the pending events, closing the one it supersedes
// on the same stream. w.mu must be held.
func (w *workState) keepLocked(e endMark) error {
	var errs []error
	kept := w.pending[:0]
	for _, p := range w.pending {
		if p.s == e.s { // the new event comes after it on the same stream
			errs = append(errs, closeEvent(p.ev))
			continue
		}
		kept = append(kept, p)
	}
	clear(w.pending[len(kept):])
	w.pending = append(kept, e)
	return wrapIf("end work: close a superseded event", errors.Join(errs...))
}

// Idle reports whether c has no work mark open and the GPU has finished
// the work enqueued before each End: whether eviction may take its
// arrays (unless it opted out, ClientOptions.NoEvict).
func (c *Client) Idle() (bool, error) {
	if err := c.m.check(c); err != nil {
		return false, err
	}
	c.work.mu.Lock()
	defer c.work.mu.Unlock()
	return c.work.idleLocked()
}

// idleLocked reports whether no mark is open and every recorded event
// has completed, closing the events that have. An event that fails its
// query (a reset, a closed device) is taken as complete: there is no
// work left behind it. w.mu must be held.
func (w *workState) idleLocked() (bool, error) {
	if w.open > 0 {
		return false, nil
	}
	var errs []error
	kept := w.pending[:0]
	for _, p := range w.pending {
		done, err := p.done()
		if err == nil && !done {
			kept = append(kept, p)
			continue
		}
		errs = append(errs, closeEvent(p.ev))
	}
	clear(w.pending[len(kept):])
	w.pending = kept
	return len(kept) == 0, wrapIf("query work events", errors.Join(errs...))
}

// drop closes every pending event (the client or the manager is
// closing).
func (w *workState) drop() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	var errs []error
	for _, p := range w.pending {
		errs = append(errs, closeEvent(p.ev))
	}
	w.pending = nil
	return wrapIf("close work events", errors.Join(errs...))
}

// closeEvent closes ev (nil: nothing to close); an event already gone
// with a reset or a closed device is not an error.
func closeEvent(ev device.Event) error {
	if ev == nil {
		return nil
	}
	if err := ev.Close(); err != nil && !gone(err) {
		return err
	}
	return nil
}

// gone reports whether err says the thing used went with a reset or a
// close.
func gone(err error) bool {
	return errors.Is(err, device.ErrInvalidated) || errors.Is(err, device.ErrClosed)
}
