package batch

// Looking again at a run's shape. The probe's choice (choose.go) is a
// prediction from one chunk; the looks measure. Once lookAfter chunks of
// a shape are drained, timed from the first of them drained (so that the
// pipeline's filling is left out):
//   - a shape that a change led to is kept if its time per run beats the
//     shape before it by minGain, and changed back otherwise: overlap
//     the host cannot give (kernels on the host's own cores, as on the
//     simulator) buys nothing, or costs;
//   - a shape the probe kept is chosen again with those chunks' fills and
//     writes in place of the probe's (its first chunk met empty caches:
//     the page cache of a file takes it at memory speed), and a change
//     is looked at in its turn.
// A run looks at most twice; a re-cut for the budget starts the window
// again.

import (
	"fmt"
	"time"
)

// lookAfter is how many chunks a look measures: the mean of four halves
// the spread of one.
const lookAfter = 4

// looks is a run's state of looking again (its goroutine's).
type looks struct {
	due     bool // a look is to be made
	left    int  // looks left
	from    int  // the window's first chunk: its drain starts the clock
	started bool // the clock is started
	start   writerState
	fill0   time.Duration // the run's fill time when the clock started
	verify  bool          // the window's shape is a change to weigh against prev
	prev    shape
	prevPer float64 // prev's seconds per run, measured
}

// restart begins the window at chunk from, the next the run takes.
func (lk *looks) restart(from int) {
	lk.from, lk.started = from, false
}

// startLooks follows the probe's choice: cur is the shape it ran, its
// time per run the probe's, and changed says whether the run leaves it.
func (r *batchRun) startLooks(cur shape, f figures, changed bool) {
	lk := &r.el.lk
	*lk = looks{due: true, left: 2, from: len(r.chunks), verify: changed, prev: cur,
		prevPer: f.wall.Seconds() / float64(max(f.runs, 1))}
}

// look measures the window once it is long enough, and returns the
// re-cut it calls for, if any.
func (r *batchRun) look() (target, bool) {
	lk := &r.el.lk
	st := r.w.snapshot()
	if !lk.started {
		if st.drained > lk.from {
			lk.start, lk.fill0, lk.started = st, r.rep.Fill, true
		}
		return target{}, false
	}
	if st.drained < lk.start.drained+lookAfter {
		return target{}, false
	}
	runs := 0
	for _, c := range r.chunks[lk.start.drained:st.drained] {
		runs += c.len
	}
	per := st.lastAt.Sub(lk.start.lastAt).Seconds() / float64(max(runs, 1))
	cur := shape{k: r.k, lag: r.lag, slots: r.outSlots, length: r.length}
	lk.left--
	lk.due = lk.left > 0
	if lk.verify {
		return r.weigh(cur, per, st.drained)
	}
	f := r.el.fig
	scale := func(d time.Duration) time.Duration {
		return time.Duration(float64(d) * float64(f.runs) / float64(runs))
	}
	f.write, f.fill = scale(st.busy-lk.start.busy), scale(r.rep.Fill-lk.fill0)
	f.from = "the first chunk, with the mean fill and write of the chunks since,"
	l := r.limits(r.o.Buffers)
	best, why := choose(f, l, cur)
	why = fmt.Sprintf("after %s: %s", plural(st.drained, "chunk"), why)
	r.rep.BufferChoice += "; " + why
	if best == cur {
		lk.due = false
		return target{}, false
	}
	r.el.pref = best
	lk.verify, lk.prev, lk.prevPer = true, cur, per
	return target{k: best.k, stride: l.devLen[best.k], sh: &best, why: why}, true
}

// weigh keeps the changed shape cur, whose chunks took per seconds a run,
// if it beats the shape before it by minGain, and changes back if not.
func (r *batchRun) weigh(cur shape, per float64, drained int) (target, bool) {
	lk := &r.el.lk
	lk.due = false
	prevWords := lk.prev.words(len(r.staged()) > 0)
	if per < (1-minGain)*lk.prevPer {
		r.rep.BufferChoice += fmt.Sprintf("; after %s, kept: %.3g s per 100,000 runs measured against %.3g s with %s",
			plural(drained, "chunk"), per*1e5, lk.prevPer*1e5, prevWords)
		return target{}, false
	}
	why := fmt.Sprintf("after %s, back to %s: %.3g s per 100,000 runs measured, against %.3g s before the change; it bought nothing here",
		plural(drained, "chunk"), prevWords, per*1e5, lk.prevPer*1e5)
	r.rep.BufferChoice += "; " + why
	p := lk.prev
	r.el.pref = p
	l := r.limits(p.k)
	return target{k: p.k, stride: l.devLen[p.k], sh: &p, why: why}, true
}
