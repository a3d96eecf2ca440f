package alloc

// Limit caps the bytes a program has in use through one allocator. It
// counts only live allocations, charged as the upstream spends them (its
// Granularity when it has one), and never the upstream's cache: CuPy's
// set_limit counts cached blocks against the limit too, so a program that
// frees and reallocates can be refused while using less than its limit,
// a known complaint about it. Refused calls never reach the upstream.

import (
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"

	"github.com/vramkit/vram/device"
	"github.com/vramkit/vram/internal/units"
)

// Limit is an adaptor that refuses an allocation that would take the
// bytes in use through it over a cap. Bytes the upstream keeps cached do
// not count. A refusal returns an error wrapping both ErrLimit and
// device.ErrOutOfMemory, counts an out-of-memory in Stats, and leaves the
// upstream untouched.
//
// A Limit owns its upstream: Close closes it. Stats are the upstream's,
// with the Limit's refusals added to OOMs.
//
// When the upstream's Free fails with device.ErrInvalidated (a pointer
// from before a device reset, which the upstream takes back; see
// Allocator), the Limit takes it back too and its bytes leave Used.
//
// The cap may change while the Limit is in use (SetCap): lowered below
// the bytes in use, it frees nothing and refuses every allocation until
// frees bring them back under it.
//
// A Limit is safe for concurrent use.
type Limit struct {
	up   Allocator
	gran uint64        // the upstream's granularity, at least 1
	ooms atomic.Uint64 // refusals

	mu     sync.Mutex            // protects the fields below
	cap    uint64                // bytes; NoCap: none
	used   uint64                // bytes charged to live allocations and those in flight
	live   map[device.Ptr]uint64 // live pointer → bytes charged
	closed bool                  // set by Close

	oom oomHook // the observer of refusals (report.go)
}

// NoCap is the cap of a Limit that caps nothing (SetCap(NoCap)): its
// Room is its upstream's.
const NoCap = math.MaxUint64

// NewLimit wraps up with a cap of capBytes bytes in use.
func NewLimit(up Allocator, capBytes uint64) *Limit {
	g := uint64(1)
	if gr, ok := up.(Granular); ok {
		g = max(gr.Granularity(), 1)
	}
	return &Limit{up: up, cap: capBytes, gran: g, live: make(map[device.Ptr]uint64)}
}

// Upstream is the wrapped allocator.
func (l *Limit) Upstream() Allocator { return l.up }

// Cap is the cap in bytes (NoCap: none).
func (l *Limit) Cap() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.cap
}

// SetCap changes the cap to capBytes (NoCap: none). Lowered below the
// bytes in use, it frees nothing: every allocation is refused until
// frees bring the bytes in use back under it.
func (l *Limit) SetCap(capBytes uint64) {
	l.mu.Lock()
	l.cap = capBytes
	l.mu.Unlock()
}

// Adopt counts p, n bytes the upstream handed out before the Limit
// wrapped it, as allocated through the Limit: charged as the upstream
// spends it, in use until its Free through the Limit. It is how a cap
// is put on an allocator already in use. Adopting a pointer the Limit
// already counts, or after Close, does nothing.
func (l *Limit) Adopt(p device.Ptr, n uint64) {
	charged, ok := units.RoundUp(n, l.gran)
	if !ok {
		charged = n
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, dup := l.live[p]; dup || l.closed {
		return
	}
	l.live[p] = charged
	l.used += charged
}

// Used is the bytes charged to live allocations (and to allocations in
// progress).
func (l *Limit) Used() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.used
}

// Granularity is the upstream's granularity, or 1.
func (l *Limit) Granularity() uint64 { return l.gran }

// Cost forwards to the upstream (Coster): a Limit takes nothing from the
// device itself.
func (l *Limit) Cost(sizes []uint64) (uint64, bool) { return costOf(l.up, sizes) }

// Room is the cap less the bytes in use, or the upstream's Room when
// that is less (with NoCap, the upstream's).
func (l *Limit) Room() uint64 {
	l.mu.Lock()
	room := l.cap - min(l.cap, l.used)
	if l.cap == NoCap {
		room = NoCap
	}
	l.mu.Unlock()
	return min(room, roomOf(l.up))
}

// Alloc allocates n bytes from the upstream if the bytes in use stay
// within the cap.
func (l *Limit) Alloc(n uint64, s device.Stream) (device.Ptr, error) {
	return l.alloc(n, s, false)
}

// AllocExact is Alloc through the upstream's AllocExact (ExactGrower),
// charged the same way.
func (l *Limit) AllocExact(n uint64, s device.Stream) (device.Ptr, error) {
	return l.alloc(n, s, true)
}

func (l *Limit) alloc(n uint64, s device.Stream, exact bool) (device.Ptr, error) {
	charged, ok := units.RoundUp(n, l.gran)
	if !ok {
		charged = n
	}
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return 0, fmt.Errorf("alloc: limit: alloc of %s: %w", units.Format(n), ErrClosed)
	}
	if charged > l.cap || l.used > l.cap-charged {
		used, capBytes := l.used, l.cap
		l.mu.Unlock()
		l.ooms.Add(1)
		asked := units.Format(n)
		if charged != n {
			asked += fmt.Sprintf(" (%s as the upstream spends it)", units.Format(charged))
		}
		return 0, l.oom.fail(n, s, fmt.Errorf("alloc: limit: alloc of %s with %s in use would pass the cap of %s by %s; free memory or raise the cap: %w (%w)",
			asked, units.Format(used), units.Format(capBytes), units.Format(used+charged-capBytes),
			ErrLimit, device.ErrOutOfMemory), l.Report())
	}
	l.used += charged
	l.mu.Unlock()
	var p device.Ptr
	var err error
	if exact {
		p, err = AllocExact(l.up, n, s)
	} else {
		p, err = l.up.Alloc(n, s)
	}
	l.mu.Lock()
	if l.closed {
		// Closed while the upstream call ran: Close has zeroed used.
		l.mu.Unlock()
		if err != nil {
			return 0, err
		}
		return 0, errors.Join(fmt.Errorf("alloc: limit: alloc of %s: %w", units.Format(n), ErrClosed), l.up.Free(p, s))
	}
	if err != nil {
		l.used -= charged
		l.mu.Unlock()
		return 0, err
	}
	l.live[p] = charged
	l.mu.Unlock()
	return p, nil
}

// Free returns p to the upstream and its bytes to the cap. If the
// upstream refuses, p stays charged, unless the error wraps
// device.ErrInvalidated: then p is gone with a device reset, and is
// released all the same.
func (l *Limit) Free(p device.Ptr, s device.Stream) error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return fmt.Errorf("alloc: limit: free of %v: %w", p, ErrClosed)
	}
	charged, ok := l.live[p]
	if !ok {
		l.mu.Unlock()
		return fmt.Errorf("alloc: limit: free of %v: %w", p, ErrUnknownPointer)
	}
	delete(l.live, p)
	l.mu.Unlock()
	err := l.up.Free(p, s)
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case l.closed:
		// Closed while the upstream call ran: Close has given up the
		// table and zeroed used.
	case err != nil && !lostToReset(err):
		l.live[p] = charged
	default:
		l.used -= charged
	}
	return err
}

// Stats are the upstream's, with the Limit's refusals added to OOMs.
func (l *Limit) Stats() Stats {
	st := l.up.Stats()
	st.OOMs += l.ooms.Load()
	return st
}

// ResetPeaks resets the upstream's peaks, when it can.
func (l *Limit) ResetPeaks() {
	if r, ok := l.up.(PeakResetter); ok {
		r.ResetPeaks()
	}
}

// Trim trims the upstream.
func (l *Limit) Trim() error {
	if l.isClosed() {
		return fmt.Errorf("alloc: limit: trim: %w", ErrClosed)
	}
	return l.up.Trim()
}

// Close closes the upstream. Later calls return ErrClosed; a second Close
// returns nil.
func (l *Limit) Close() error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil
	}
	l.closed = true
	l.live = nil
	l.used = 0
	l.mu.Unlock()
	return l.up.Close()
}

func (l *Limit) isClosed() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.closed
}

var (
	_ Adaptor      = (*Limit)(nil)
	_ PeakResetter = (*Limit)(nil)
	_ Granular     = (*Limit)(nil)
)
