package alloc

// Trace records every call that passes through it as a line of the CSV
// that RAPIDS RMM's logging resource adaptor writes:
//
//	Thread,Time,Action,Pointer,Size,Stream
//	7,0.000412,allocate,0x7f3a00000000,4096,0
//	7,0.000977,free,0x7f3a00000000,4096,0
//	9,0.001230,allocate failure,0x0,1099511627776,3
//
// so that a log recorded here replays like one recorded by RMM (package
// vram/trace reads both). Lines are written in the order the calls took
// effect: a free's line is written before the upstream may hand the
// memory out again, an allocation's line after the upstream returned it,
// so a pointer never appears allocated twice without a free between.

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"runtime"
	"strconv"
	"sync"
	"time"

	"github.com/vramkit/vram/device"
	"github.com/vramkit/vram/internal/units"
)

// TraceHeader is the first line a Trace writes (without its newline).
const TraceHeader = "Thread,Time,Action,Pointer,Size,Stream"

// Actions written in a Trace's log, as RMM names them.
const (
	ActionAllocate        = "allocate"
	ActionFree            = "free"
	ActionAllocateFailure = "allocate failure"
)

// Trace is an adaptor that logs every Alloc (successful or failed) and
// every Free that takes a pointer back (a successful one, or one of a
// pointer lost to a device reset) as RMM logging CSV. Time is in seconds since
// NewTrace; Thread is the calling goroutine's id; Stream is the stream's
// Handle; a failed allocation is logged as "allocate failure" with
// pointer 0x0. A Free of a pointer that did not come through the Trace is
// refused with ErrUnknownPointer and not logged.
//
// Output is buffered: call Flush to see it before Close. A write error does
// not fail the allocator's calls; it is kept and returned by Flush and
// Close.
//
// A Trace owns its upstream: Close closes it. Stats are the upstream's.
//
// A Trace is safe for concurrent use.
type Trace struct {
	up    Allocator
	start time.Time

	mu     sync.Mutex            // protects the fields below
	w      *bufio.Writer         // the log
	line   []byte                // scratch for one line
	live   map[device.Ptr]uint64 // live pointer → bytes asked for
	err    error                 // first write error
	closed bool                  // set by Close
}

// NewTrace wraps up and writes its log, starting with TraceHeader, to w.
func NewTrace(up Allocator, w io.Writer) *Trace {
	t := &Trace{
		up:    up,
		start: time.Now(),
		w:     bufio.NewWriterSize(w, 64<<10),
		line:  make([]byte, 0, 128),
		live:  make(map[device.Ptr]uint64),
	}
	if _, err := t.w.WriteString(TraceHeader + "\n"); err != nil {
		t.err = err
	}
	return t
}

// Upstream is the wrapped allocator.
func (t *Trace) Upstream() Allocator { return t.up }

// Granularity is the upstream's granularity, or 1.
func (t *Trace) Granularity() uint64 {
	if g, ok := t.up.(Granular); ok {
		return g.Granularity()
	}
	return 1
}

// Cost forwards to the upstream (Coster).
func (t *Trace) Cost(sizes []uint64) (uint64, bool) { return costOf(t.up, sizes) }

// Room forwards to the upstream (Coster); math.MaxUint64 when it has none.
func (t *Trace) Room() uint64 { return roomOf(t.up) }

// Alloc allocates from the upstream and logs the outcome.
func (t *Trace) Alloc(n uint64, s device.Stream) (device.Ptr, error) {
	return t.alloc(n, s, false)
}

// AllocExact is Alloc through the upstream's AllocExact (ExactGrower),
// logged the same way.
func (t *Trace) AllocExact(n uint64, s device.Stream) (device.Ptr, error) {
	return t.alloc(n, s, true)
}

func (t *Trace) alloc(n uint64, s device.Stream, exact bool) (device.Ptr, error) {
	if t.isClosed() {
		return 0, fmt.Errorf("alloc: trace: alloc of %s: %w", units.Format(n), ErrClosed)
	}
	var p device.Ptr
	var err error
	if exact {
		p, err = AllocExact(t.up, n, s)
	} else {
		p, err = t.up.Alloc(n, s)
	}
	thread := goroutineID()
	t.mu.Lock()
	defer t.mu.Unlock()
	if err != nil {
		t.logLocked(thread, ActionAllocateFailure, 0, n, s)
		return 0, err
	}
	if t.closed {
		return 0, errors.Join(fmt.Errorf("alloc: trace: alloc of %s: %w", units.Format(n), ErrClosed), t.up.Free(p, s))
	}
	t.live[p] = n
	t.logLocked(thread, ActionAllocate, p, n, s)
	return p, nil
}

// Free logs the free and returns p to the upstream. If the upstream
// refuses, p is logged as allocated again, so the log still matches what
// is live, unless the error wraps device.ErrInvalidated: then p went with
// a device reset and the upstream has taken it back (see Allocator), so
// the free stands.
func (t *Trace) Free(p device.Ptr, s device.Stream) error {
	thread := goroutineID()
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return fmt.Errorf("alloc: trace: free of %v: %w", p, ErrClosed)
	}
	n, ok := t.live[p]
	if !ok {
		t.mu.Unlock()
		return fmt.Errorf("alloc: trace: free of %v: %w", p, ErrUnknownPointer)
	}
	delete(t.live, p)
	t.logLocked(thread, ActionFree, p, n, s)
	t.mu.Unlock()
	if err := t.up.Free(p, s); err != nil {
		if lostToReset(err) {
			return err
		}
		t.mu.Lock()
		if !t.closed {
			t.live[p] = n
			t.logLocked(thread, ActionAllocate, p, n, s)
		}
		t.mu.Unlock()
		return err
	}
	return nil
}

// logLocked writes one line. t.mu must be held.
func (t *Trace) logLocked(thread uint64, action string, p device.Ptr, n uint64, s device.Stream) {
	var stream uint64
	if s != nil {
		stream = uint64(s.Handle())
	}
	b := t.line[:0]
	b = strconv.AppendUint(b, thread, 10)
	b = append(b, ',')
	b = strconv.AppendFloat(b, time.Since(t.start).Seconds(), 'f', -1, 64)
	b = append(b, ',')
	b = append(b, action...)
	b = append(b, ",0x"...)
	b = strconv.AppendUint(b, uint64(p), 16)
	b = append(b, ',')
	b = strconv.AppendUint(b, n, 10)
	b = append(b, ',')
	b = strconv.AppendUint(b, stream, 10)
	b = append(b, '\n')
	t.line = b
	if _, err := t.w.Write(b); err != nil && t.err == nil {
		t.err = err
	}
}

// Flush writes buffered lines to the underlying writer and returns the
// first write error met so far.
func (t *Trace) Flush() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.flushLocked()
}

func (t *Trace) flushLocked() error {
	if err := t.w.Flush(); err != nil && t.err == nil {
		t.err = err
	}
	if t.err != nil {
		return fmt.Errorf("alloc: trace: write log: %w", t.err)
	}
	return nil
}

// Stats are the upstream's.
func (t *Trace) Stats() Stats { return t.up.Stats() }

// ResetPeaks resets the upstream's peaks, when it can.
func (t *Trace) ResetPeaks() {
	if r, ok := t.up.(PeakResetter); ok {
		r.ResetPeaks()
	}
}

// Trim trims the upstream.
func (t *Trace) Trim() error {
	if t.isClosed() {
		return fmt.Errorf("alloc: trace: trim: %w", ErrClosed)
	}
	return t.up.Trim()
}

// Close flushes the log and closes the upstream. Allocations still live
// are not logged as freed. Later calls return ErrClosed; a second Close
// returns nil.
func (t *Trace) Close() error {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return nil
	}
	t.closed = true
	t.live = nil
	ferr := t.flushLocked()
	t.mu.Unlock()
	return errors.Join(ferr, t.up.Close())
}

func (t *Trace) isClosed() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.closed
}

// goroutineID is the calling goroutine's id, read from the first line of
// its stack trace ("goroutine 42 [running]:"), or 0 if that cannot be
// read. It costs about a microsecond and does not allocate.
func goroutineID() uint64 {
	var buf [64]byte
	b := buf[:runtime.Stack(buf[:], false)]
	const prefix = "goroutine "
	if len(b) <= len(prefix) || string(b[:len(prefix)]) != prefix {
		return 0
	}
	var id uint64
	for _, c := range b[len(prefix):] {
		if c < '0' || c > '9' {
			break
		}
		id = id*10 + uint64(c-'0')
	}
	return id
}

var (
	_ Adaptor      = (*Trace)(nil)
	_ PeakResetter = (*Trace)(nil)
	_ Granular     = (*Trace)(nil)
)
