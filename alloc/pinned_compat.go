package alloc

// The free index's lock-lending entry points that PinnedPool still uses
// until it moves onto the core (core.go): the pool lends its lock and
// closed flag. Its index has no join.

import (
	"errors"
	"sync"

	"github.com/vramkit/vram/device"
)

// recordAtFreeLocked is core.recordAtFreeLocked for a pool whose lock is
// mu and whose closed flag is *closed.
func (x *freeIndex) recordAtFreeLocked(mu *sync.Mutex, closed *bool, st *streamState, _ func(*block)) error {
	st.busy = true
	r := freeRecord{st: st, s: st.s, seq: st.seq, ev: st.ev}
	st.ev = nil
	if n := len(x.spareEv); r.ev == nil && n > 0 {
		r.ev = x.spareEv[n-1]
		x.spareEv[n-1] = nil
		x.spareEv = x.spareEv[:n-1]
	}
	mu.Unlock()
	x.runRecord(&r)
	mu.Lock()
	st.busy = false
	if *closed {
		mu.Unlock()
		if r.ev == nil {
			return nil
		}
		return closeEvents([]device.Event{r.ev})
	}
	switch {
	case r.ok:
		st.recorded = max(st.recorded, r.seq)
		st.ev, st.evSeq = r.ev, r.seq
	case r.closed:
		st.fenced, st.recorded = max(st.fenced, r.seq), max(st.recorded, r.seq)
		x.spareEv = append(x.spareEv, r.ev)
		x.promoteLocked(st)
	case r.ev != nil:
		x.spareEv = append(x.spareEv, r.ev)
	}
	mu.Unlock()
	return nil
}

// fenceLocked is core.fenceLocked for a pool whose lock is mu.
func (x *freeIndex) fenceLocked(mu *sync.Mutex, closed *bool, st *streamState, all bool, _ func(*block)) (open bool, err error) {
	if !x.prepareFencesLocked(st, all, false) {
		return true, nil
	}
	return x.roundLocked(mu, closed)
}

// waitLocked is core.waitLocked for a pool whose lock is mu.
func (x *freeIndex) waitLocked(mu *sync.Mutex, closed *bool, st *streamState, _ func(*block)) (open bool, err error) {
	for x.fencing {
		if x.roundDone == nil {
			x.roundDone = make(chan struct{})
		}
		done := x.roundDone
		mu.Unlock()
		<-done
		mu.Lock()
		if *closed {
			mu.Unlock()
			return false, nil
		}
	}
	all := x.owning > 1 || (x.owning == 1 && st.owned == 0)
	if !x.prepareFencesLocked(st, all, true) {
		return true, nil
	}
	return x.roundLocked(mu, closed)
}

// roundLocked is core.roundLocked for a pool whose lock is mu.
func (x *freeIndex) roundLocked(mu *sync.Mutex, closed *bool) (open bool, err error) {
	mu.Unlock()
	x.runFences()
	mu.Lock()
	werr := x.finishFencesLocked()
	if *closed {
		evs := x.eventsLocked()
		mu.Unlock()
		return false, errors.Join(werr, closeEvents(evs))
	}
	return true, werr
}
