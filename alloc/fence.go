package alloc

// Events of the free index: when they are recorded and checked, and how
// their results promote blocks (streamorder.go states the rule).
//
// # When events are recorded
//
//   - At a free on S, after the lock is released (recordAtFreeLocked): an
//     event covering every free on S so far, only when S has no event in
//     flight and no goroutine is recording or querying one for S. Every
//     other free makes no device call, so the hit path makes none; why
//     not at every free (RMM's rule) is in BENCHMARKS.md.
//   - Lazily, at a miss that finds nothing in its own set or the shared
//     set while another stream S owns free blocks (fenceLocked): with the
//     lock released, S's event in flight is queried and, once complete, a
//     new one is recorded covering every free on S so far and queried. A
//     lazy event covers S's work up to the frees and possibly later work,
//     so the rule holds and reuse is at worst later.
//   - A miss never blocks on an event: a block whose event is not
//     complete is not offered, and the pool grows instead.
//   - On the device's out of memory (waitLocked): with the lock released,
//     for every stream S owning free blocks another stream could use, S's
//     event in flight is synchronized if it covers all of S's frees, else
//     a new event recorded on S then; where no event can be made, S itself
//     is synchronized. A lazy event may cover work queued on S after the
//     frees, so the allocation may wait for that work too; work on S that
//     itself waits for the allocating goroutine (an event or host function
//     it releases only after Alloc returns) deadlocks with it, as with any
//     blocking allocation. Other goroutines allocate and free meanwhile.
//
// Events are recycled (spareEv). If the device cannot make an event, a
// stream that Query reports idle stands in for one. x.work belongs to the
// goroutine running a round while x.fencing is set.
//
// # Device resets
//
// A device Reset destroys every stream and event made before it, with the
// work queued on them: nothing that work did can still touch a block. So
// an event that fails with device.ErrInvalidated counts as complete and is
// dropped, not recycled; an event that cannot be recorded for that reason
// is replaced by a new one, once, and if the new one fails the same way
// the stream is from before the reset and counts as closed (its work is
// all gone). Events from before a reset thus leave the index at their next
// use and never keep a stream's blocks from being promoted. The
// strategies drop the memory from before a reset themselves
// (strategy.dropGenerationLocked).

import (
	"errors"
	"fmt"

	"github.com/vramkit/vram/device"
)

// freeRecord is the device work of recording an event at a free.
type freeRecord struct {
	st     *streamState
	s      device.Stream
	seq    uint64       // the free number the event covers
	ev     device.Event // the event (nil: make one)
	ok     bool         // recorded
	closed bool         // the stream is closed: its work is all done
}

// recordAtFreeLocked records an event on st covering the frees made on it
// so far; the caller has checked recordWanted. It releases the lock for
// the device work and returns with it released. An event that cannot be
// made or recorded is no error: the frees are then covered lazily, by the
// next miss's round. The error is that of closing the event when the pool
// was closed meanwhile.
func (c *core) recordAtFreeLocked(st *streamState) error {
	x := &c.idx
	st.busy = true
	r := freeRecord{st: st, s: st.s, seq: st.seq, ev: st.ev}
	st.ev = nil // an event in flight that guards nothing is recorded again
	if n := len(x.spareEv); r.ev == nil && n > 0 {
		r.ev = x.spareEv[n-1]
		x.spareEv[n-1] = nil
		x.spareEv = x.spareEv[:n-1]
	}
	c.mu.Unlock()
	x.runRecord(&r)
	c.mu.Lock()
	st.busy = false
	if c.closed {
		// Close took every event the index held, but not this one.
		c.mu.Unlock()
		if r.ev == nil {
			return nil
		}
		return closeEvents([]device.Event{r.ev})
	}
	switch {
	case r.ok:
		// st.ev is still nil: only a goroutine that marked st busy sets it.
		st.recorded = max(st.recorded, r.seq)
		st.ev, st.evSeq = r.ev, r.seq
	case r.closed:
		st.fenced, st.recorded = max(st.fenced, r.seq), max(st.recorded, r.seq)
		x.spareEv = append(x.spareEv, r.ev)
		x.promoteLocked(st)
	case r.ev != nil:
		x.spareEv = append(x.spareEv, r.ev)
	}
	c.mu.Unlock()
	return nil
}

// runRecord does a free's device work: make the event if needed and
// record it. Called without the pool's lock; r belongs to the caller.
func (x *freeIndex) runRecord(r *freeRecord) {
	var err error
	r.ev, r.closed, err = x.record(r.ev, r.s)
	r.ok = err == nil
}

// record records ev (or, when ev is nil, a new event) on s and returns the
// event to keep (nil when none could be made) and the error. closed
// reports that s's work is all done: s is closed (closing a stream waits
// for its work), or it is from before a device reset (which took its
// work). An event from before a reset is closed and replaced, once (see
// "Device resets" above). Called without the pool's lock.
func (x *freeIndex) record(ev device.Event, s device.Stream) (kept device.Event, closed bool, err error) {
	for try := 0; ; try++ {
		if ev == nil {
			if ev, err = x.dev.NewEvent(); err != nil {
				return nil, false, err
			}
		}
		err = ev.Record(s)
		switch {
		case err == nil:
			return ev, false, nil
		case errors.Is(err, device.ErrClosed):
			return ev, true, err
		case lostToReset(err) && try == 0:
			_ = ev.Close() // gone with the reset, or replaced: either way not kept
			ev = nil
		case lostToReset(err):
			return ev, true, err
		default:
			return ev, false, err
		}
	}
}

// settled reports whether a Query or Synchronize of an event ended with
// its work done: it returned done, or the event went with a device reset
// (lost), whose work can no longer touch any block.
func settled(done bool, err error) (ok, lost bool) {
	if lostToReset(err) {
		return true, true
	}
	return done && err == nil, false
}

// fenceWork is the device work for one stream in a fence round: query the
// event in flight, and record (and query) a new one.
type fenceWork struct {
	st    *streamState
	s     device.Stream
	ev    device.Event // in flight: query it
	evSeq uint64
	evOK  bool // ev completed

	evLost  bool         // ev went with a device reset (counted complete, not kept)
	newEv   device.Event // event to record (nil: make one)
	newSeq  uint64       // seq the new event covers; 0: record none
	newDone bool         // the new event completed
	newOK   bool         // the new event was recorded
	newLost bool         // newEv went with a device reset after its record
	closed  bool         // the stream is closed: its work is all done
	idle    bool         // no event could be made, but the stream was idle (or, waiting, has been synchronized)
	wait    bool         // block until the events complete (out of memory)
	err     error        // waiting failed
}

// needFences reports whether a fence round could make memory available to
// st: some stream other than st owns free blocks (or, for host-visible
// memory, any stream does), and no round is running.
func (x *freeIndex) needFences(st *streamState) bool {
	if x.fencing || x.owning == 0 {
		return false
	}
	return x.hostVisible || x.owning > 1 || st.owned == 0
}

// prepareFencesLocked lists the fence work for every stream that owns
// blocks another stream could use (every stream owning blocks, st
// included, when all is set), and marks a round as running; wait makes
// the round block until the events complete. Streams busy with a free's
// record are left out. It returns false when there is nothing to do or a
// round is already running.
func (x *freeIndex) prepareFencesLocked(st *streamState, all, wait bool) bool {
	if x.fencing {
		return false
	}
	x.work = x.work[:0]
	for h, o := range x.streams {
		if o.busy {
			continue
		}
		if o.owned == 0 && o.held == 0 && o != st {
			// Nothing to fence: forget the stream, so that a program
			// that makes and closes streams does not grow the map (and
			// every round with it). Only free blocks name their owner,
			// and it has none, in the index or held out of it; its
			// state starts afresh on next use. Its event in flight, if
			// any, guards no block: recycle it.
			if o.ev != nil {
				x.spareEv = append(x.spareEv, o.ev)
				o.ev = nil
			}
			delete(x.streams, h)
			if x.last == o {
				x.last = nil
			}
			continue
		}
		if o.owned == 0 || (o == st && !x.hostVisible && !all) {
			continue
		}
		w := fenceWork{st: o, s: o.s, ev: o.ev, evSeq: o.evSeq, wait: wait}
		if o.recorded < o.seq {
			w.newSeq = o.seq
			if n := len(x.spareEv); n > 0 {
				w.newEv = x.spareEv[n-1]
				x.spareEv = x.spareEv[:n-1]
			}
		}
		if w.ev != nil || w.newSeq != 0 {
			o.busy = true
			x.work = append(x.work, w)
		}
	}
	if len(x.work) == 0 {
		return false
	}
	x.fencing = true
	return true
}

// fenceLocked runs a whole fence round: it prepares the round (for every
// stream but st that owns free blocks, or every such stream when all is
// set), releases the lock for the device work, locks it again and applies
// the results. If the pool was closed meanwhile, it releases the lock,
// closes the events Close left to the round and returns false with any
// error closing them.
func (c *core) fenceLocked(st *streamState, all bool) (open bool, err error) {
	if !c.idx.prepareFencesLocked(st, all, false) {
		return true, nil
	}
	return c.roundLocked()
}

// awaitRoundLocked waits (lock released meanwhile) until no fence round
// runs; it returns false, the lock held, when the allocator was closed
// while it waited.
func (c *core) awaitRoundLocked() (open bool) {
	for x := &c.idx; x.fencing; {
		if x.roundDone == nil {
			x.roundDone = make(chan struct{})
		}
		done := x.roundDone
		c.mu.Unlock()
		<-done
		c.mu.Lock()
		if c.closed {
			return false
		}
	}
	return true
}

// waitLocked is fenceLocked for an allocation on st that the device could
// not serve, blocking until the work of the streams that own free blocks
// is done up to their frees: the out-of-memory path's last resort before
// giving up. It covers every stream but st that owns free blocks, and st
// too when another does (promoted, st's blocks may coalesce with theirs).
// A round already running is waited for first. With the pool open it
// returns true and the errors waiting raised (blocks whose wait failed
// stay with their streams); if the pool was closed meanwhile, it releases
// the lock and returns false, as fenceLocked.
func (c *core) waitLocked(st *streamState) (open bool, err error) {
	x := &c.idx
	if !c.awaitRoundLocked() {
		c.mu.Unlock()
		return false, nil
	}
	all := x.owning > 1 || (x.owning == 1 && st.owned == 0)
	if !x.prepareFencesLocked(st, all, true) {
		return true, nil
	}
	return c.roundLocked()
}

// roundLocked runs a prepared round: releases the lock for the device
// work, locks it again and applies the results. See fenceLocked.
func (c *core) roundLocked() (open bool, err error) {
	c.mu.Unlock()
	c.idx.runFences()
	c.mu.Lock()
	werr := c.idx.finishFencesLocked()
	if c.closed {
		evs := c.idx.eventsLocked()
		c.mu.Unlock()
		return false, errors.Join(werr, closeEvents(evs))
	}
	return true, werr
}

// runFences does the device work of a round. It must be called without the
// core's lock; x.work belongs to this goroutine while x.fencing is set, and
// nothing else reads or changes it.
func (x *freeIndex) runFences() {
	for i := range x.work {
		w := &x.work[i]
		if w.ev != nil && !w.checkInFlight() {
			continue
		}
		if w.newSeq != 0 {
			x.recordNew(w)
		}
	}
}

// checkInFlight queries (or, waiting, synchronizes) w's event in flight,
// and reports whether a new event is still to be recorded.
func (w *fenceWork) checkInFlight() bool {
	if w.wait && w.newSeq == 0 {
		// The event in flight covers every free: wait for it.
		err := w.ev.Synchronize()
		if w.evOK, w.evLost = settled(true, err); !w.evOK {
			w.err = err
		}
		return false
	}
	done, err := w.ev.Query()
	w.evOK, w.evLost = settled(done, err)
	if !w.evOK && !w.wait {
		// Still running: keep at most one event in flight (a newer
		// one could not complete first anyway).
		w.newSeq = 0
		return false
	}
	// Waiting: a newer event, recorded next, supersedes it.
	return true
}

// recordNew records w's new event and queries (or, waiting, synchronizes)
// it; where no event can be had, the stream itself stands in.
func (x *freeIndex) recordNew(w *fenceWork) {
	ev, closed, err := x.record(w.newEv, w.s)
	w.newEv = ev
	switch {
	case closed:
		// Its work is all done (closed, or gone with a device reset),
		// so everything freed on it is safe now.
		w.closed = true
		return
	case ev == nil:
		// No event to be had: an idle stream has finished everything
		// enqueued on it, the frees' work included.
		if w.wait {
			serr := w.s.Synchronize()
			if w.idle, _ = settled(true, serr); !w.idle {
				w.err = serr
			}
		} else {
			done, qerr := w.s.Query()
			w.idle, _ = settled(done, qerr)
		}
		return
	case err != nil:
		if w.wait {
			w.err = err
		}
		return
	}
	w.newOK = true
	if w.wait {
		serr := w.newEv.Synchronize()
		if w.newDone, w.newLost = settled(true, serr); !w.newDone {
			w.err = serr
		}
		// Work on a stream finishes in order: the older event too.
		w.evOK = w.evOK || (w.ev != nil && w.newDone)
		return
	}
	done, qerr := w.newEv.Query()
	w.newDone, w.newLost = settled(done, qerr)
}

// finishFencesLocked applies a round's results: advances each stream's
// fence, recycles completed events and promotes the blocks they cover.
// The index's join is called for every promoted block, already in the
// shared set, so the strategy can coalesce it with shared neighbours. It returns the errors
// waiting raised (a waiting round's only), naming their streams.
func (x *freeIndex) finishFencesLocked() error {
	var errs []error
	for i := range x.work {
		w := &x.work[i]
		st := w.st
		st.busy = false
		if w.err != nil {
			errs = append(errs, fmt.Errorf("waiting for stream %d: %w", st.handle, w.err))
		}
		// An event in flight that completed, or that a newer event
		// recorded on the same stream supersedes (only when waiting).
		if w.ev != nil && (w.evOK || w.newOK) {
			if w.evOK && w.evSeq > st.fenced {
				st.fenced = w.evSeq
			}
			st.ev = nil
			if !w.evLost {
				x.spareEv = append(x.spareEv, w.ev)
			}
		}
		switch {
		case w.closed || w.idle:
			st.fenced, st.recorded = w.newSeq, w.newSeq
			if w.newEv != nil {
				x.spareEv = append(x.spareEv, w.newEv)
			}
		case w.newOK && w.newDone:
			st.recorded = w.newSeq
			if w.newSeq > st.fenced {
				st.fenced = w.newSeq
			}
			if !w.newLost {
				x.spareEv = append(x.spareEv, w.newEv)
			}
		case w.newOK:
			st.recorded = w.newSeq
			st.ev, st.evSeq = w.newEv, w.newSeq
		case w.newEv != nil:
			x.spareEv = append(x.spareEv, w.newEv)
		}
		x.promoteLocked(st)
		x.work[i] = fenceWork{}
	}
	x.work = x.work[:0]
	x.fencing = false
	if x.roundDone != nil {
		close(x.roundDone)
		x.roundDone = nil
	}
	return errors.Join(errs...)
}

// promoteLocked moves st's blocks covered by its completed fence to the
// shared set.
func (x *freeIndex) promoteLocked(st *streamState) {
	for st.head != nil && st.head.seq <= st.fenced {
		b := st.head
		x.remove(b)
		x.insertShared(b)
		if x.join != nil {
			x.join(b)
		}
	}
}

// eventsLocked takes every event the index holds, for closing. The index
// must not be used for fencing afterwards.
func (x *freeIndex) eventsLocked() []device.Event {
	evs := x.spareEv
	x.spareEv = nil
	for _, st := range x.streams {
		if st.ev != nil {
			evs = append(evs, st.ev)
			st.ev = nil
		}
	}
	return evs
}
