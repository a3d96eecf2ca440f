package batch

// The batch's timeline: when each step's device work finished, seen from
// the host, and from that how long copies and compute ran and how much of
// the copying no compute hid.
//
// Devices give no timed events, so each step is followed on its stream
// by an event from a small pool; one goroutine per stream waits for those
// events in order and notes the time each completes. A step started at
// the latest of: when it was enqueued, when the previous step on its
// stream finished, and when the step it waits for (a compute for its
// copy in, a copy out for its compute) finished; it ran until its event
// completed.

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/vramkit/vram/device"
)

type timeline struct {
	watchers []*watcher
	steps    [][3]*stepMark // per chunk of the run, in its order: its steps' marks (loop goroutine)
}

// watcher waits for the marks of one stream.
type watcher struct {
	st    device.Stream
	pool  []device.Event
	free  chan device.Event
	work  chan *stepMark
	order []*stepMark // marks in enqueue order (loop goroutine)
	err   error       // the first failed wait (watcher goroutine until stop)
	wg    sync.WaitGroup
}

// stepMark is one step followed on its stream: the event after it, when
// it was enqueued, and when its work finished (written by its watcher,
// read after stop).
type stepMark struct {
	ev        device.Event
	kind, i   int
	enq, done time.Time
}

// newTimeline starts a watcher for s and one for ks unless it is s, each
// with pool events. It follows any number of chunks.
func newTimeline(dev device.Device, s, ks device.Stream, pool int) (*timeline, error) {
	t := &timeline{}
	streams := []device.Stream{s}
	if ks != s {
		streams = append(streams, ks)
	}
	for _, st := range streams {
		w := &watcher{st: st, free: make(chan device.Event, pool), work: make(chan *stepMark, pool)}
		for range pool {
			e, err := dev.NewEvent()
			if err != nil {
				t.watchers = append(t.watchers, w)
				_, _, _, _ = t.stop()
				return nil, fmt.Errorf("make a timing event: %w", err)
			}
			w.pool = append(w.pool, e)
			w.free <- e
		}
		w.wg.Add(1)
		go t.watch(w)
		t.watchers = append(t.watchers, w)
	}
	return t, nil
}

func (t *timeline) watch(w *watcher) {
	defer w.wg.Done()
	for m := range w.work {
		err := m.ev.Synchronize()
		m.done = time.Now()
		if err != nil && w.err == nil {
			w.err = err
		}
		w.free <- m.ev
	}
}

// mark follows step kind of chunk i, enqueued at enq, on st, its stream
// (one of the timeline's).
func (t *timeline) mark(kind, i int, enq time.Time, st device.Stream) error {
	w := t.watchers[0]
	for _, o := range t.watchers {
		if o.st == st {
			w = o
		}
	}
	e := <-w.free
	if err := e.Record(w.st); err != nil {
		w.free <- e
		return err
	}
	for len(t.steps) <= i {
		t.steps = append(t.steps, [3]*stepMark{})
	}
	m := &stepMark{ev: e, kind: kind, i: i, enq: enq}
	t.steps[i][kind] = m
	w.order = append(w.order, m)
	w.work <- m
	return nil
}

// stop waits for the watchers, releases their events and returns the
// copy time, the compute time and the copy time no compute overlapped.
// A failed wait is not returned as an error (the batch reports the
// device's errors itself); it only leaves that step untimed.
func (t *timeline) stop() (copyT, computeT, exposed time.Duration, err error) {
	var errs []error
	for _, w := range t.watchers {
		close(w.work)
		w.wg.Wait()
		for _, e := range w.pool {
			errs = append(errs, e.Close())
		}
	}
	var copies, computes []interval
	for _, w := range t.watchers {
		var prev time.Time
		for _, m := range w.order {
			end := m.done
			if end.IsZero() {
				continue
			}
			start := later(m.enq, prev)
			if before := t.steps[m.i][max(m.kind-1, 0)]; m.kind > stepIn && before != nil {
				start = later(start, before.done)
			}
			prev = end
			if !end.After(start) {
				continue
			}
			iv := interval{start, end}
			if m.kind == stepCompute {
				computes = append(computes, iv)
				computeT += end.Sub(start)
			} else {
				copies = append(copies, iv)
				copyT += end.Sub(start)
			}
		}
	}
	return copyT, computeT, copyT - overlap(copies, computes), errors.Join(errs...)
}

type interval struct{ start, end time.Time }

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// overlap is the time two lists of disjoint intervals, each in order,
// share.
func overlap(a, b []interval) time.Duration {
	var d time.Duration
	for i, j := 0, 0; i < len(a) && j < len(b); {
		lo, hi := later(a[i].start, b[j].start), a[i].end
		if b[j].end.Before(hi) {
			hi = b[j].end
		}
		if hi.After(lo) {
			d += hi.Sub(lo)
		}
		if a[i].end.Before(b[j].end) {
			i++
		} else {
			j++
		}
	}
	return d
}
