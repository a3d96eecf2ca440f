package batch

// Re-cutting a run between chunks. A run goes in segments: each takes
// chunks from the queue at the run's shape (its buffers, lead, staging
// slots and chunk length) until the queue is empty or a re-cut is due;
// it then finishes the chunks it took, waits until they are drained,
// and re-cuts: the device arrays re-allocated at the new length (the
// manager frees the old ones first where the new ones need their
// memory), the staging taken again, and the next segment goes on from
// the next run. No run is taken twice or dropped: the queue hands each
// out once, and a segment ends only when all it took are back.
//
// A re-cut is due when:
//   - the probe chunk is back: with the buffers to choose (Options.Buffers
//     0) or arrays to stage, the first chunk runs alone, each step waited
//     for and timed, and choose (choose.go) picks the shape for the rest;
//   - the manager's budget changed (vram.Manager.BudgetChange: a cap set,
//     a claim made or met) and vram.Client.PlanNow gives the arrays
//     another length: shorter, always (the arrays no longer fit what the
//     group may hold); longer, with Options.Grow. A budget that ended
//     (BudgetChange.Ended: the broker's lease is gone) stops the run
//     there, with that error.
//
// Each re-cut is one entry of Report.Recuts. A re-allocation that fails
// while the old arrays are still there is noted and the run goes on with
// them; one that lost them (the manager freed them first, then could not
// allocate) is the run's error, naming the chunks done.

import (
	"fmt"
	"time"

	"github.com/vramkit/vram"
)

// Recut is one change of a run's chunk length or buffers between chunks.
// A plain value.
type Recut struct {
	At       time.Duration // into the run
	Chunk    int           // the first chunk (from 0, in the run's order) cut the new way
	From, To int           // chunk lengths, runs
	// ArraysFrom and ArraysTo are the device arrays' length along their
	// chunk axes (runs): shorter arrays give memory back even where the
	// chunks were cut shorter than them already.
	ArraysFrom, ArraysTo int
	Buffers              int // buffers in flight from then on
	Why                  string
}

// elastic is a run's re-cut state (its goroutine's).
type elastic struct {
	auto    bool // the buffers are the run's to choose (Options.Buffers 0)
	probe   bool // the first segment is the probe chunk
	probing bool // the current segment is the probe chunk
	fig     figures
	seg0    int       // the current segment's first chunk
	segT    time.Time // when it began
	due     bool      // a re-cut is due: take no new chunk
	want    target
	seen    uint64 // the manager's budget change last acted on
	ended   error  // the manager's budget ended (BudgetChange.Ended): the run stops
	pref    shape  // the lead and output slots wanted (the probe's choice), which staging may lower
	lk      looks  // looking again at the shape (look.go)
}

// target is what a re-cut is for.
type target struct {
	k      int    // device buffers to allocate
	stride int    // the device arrays' chunk length the plan gives
	sh     *shape // the shape chosen after the probe; nil: keep lead and slots
	why    string
}

// firstShape sets the shape the run starts with, allocating again when an
// explicit count asks for more buffers than were allocated.
func (r *batchRun) firstShape() error {
	e := &r.el
	e.auto = r.o.Buffers == 0
	allocated := r.b.buffers()
	many := r.q.chunksLeft(r.length) > 1
	r.k = min(allocated, MaxBuffers)
	if !e.auto {
		r.k = r.o.Buffers
		if r.k > allocated && many {
			if err := r.b.reallocate(r.ctx, r.k); err != nil {
				return fmt.Errorf("batch: allocate %s in flight (the arrays had %d): %w", plural(r.k, "buffer"), allocated, err)
			}
			r.stride, r.length = r.b.stride(), r.capped(r.b.stride())
		}
		r.k = min(r.k, r.b.buffers())
	}
	if !many {
		r.k = 1
	}
	r.lag = max(1, r.k-1)
	r.outSlots = r.lag + 2 // one for the writer to drain behind
	e.pref = shape{k: r.k, lag: r.lag, slots: r.outSlots}
	e.probe = many && (e.auto || len(r.staged()) > 0)
	return nil
}

// mayOverlap reports whether the run may use more than one buffer.
func (r *batchRun) mayOverlap() bool {
	return r.k > 1 || (r.el.auto && r.q.chunksLeft(r.length) > 1)
}

// recutDue reports whether the run should take no new chunk before a
// re-cut; it asks the manager only when its budget changed.
func (r *batchRun) recutDue() bool {
	e := &r.el
	switch {
	case e.due:
		return true
	case e.probing && len(r.chunks) > e.seg0:
		e.due = true // the probe chunk is taken: it runs alone
		return true
	case e.lk.due:
		if t, ok := r.look(); ok {
			e.want, e.due = t, true
			return true
		}
	}
	bc := r.b.m.BudgetChange()
	if bc.Seq == e.seen {
		return false
	}
	e.seen = bc.Seq
	if bc.Ended != nil {
		e.ended, e.due = bc.Ended, true // the run stops at the re-cut
		return true
	}
	if t, ok := r.budgetTarget(bc); ok {
		e.want, e.due = t, true
	}
	return e.due
}

// budgetTarget is the re-cut a budget change calls for, if any: the
// arrays at the length the group's budget allows now, with as many of
// the run's buffers as still fit.
func (r *batchRun) budgetTarget(bc vram.BudgetChange) (target, bool) {
	for k := r.k; k >= 1; k-- {
		stride, err := r.planNow(k)
		if err != nil {
			continue
		}
		switch {
		case k == r.k && stride == r.stride, k == r.k && stride > r.stride && !r.o.Grow:
			return target{}, false
		}
		return target{k: k, stride: stride, why: bc.Why}, true
	}
	r.rep.Recuts = append(r.rep.Recuts, Recut{At: time.Since(r.start), Chunk: len(r.chunks), From: r.length, To: r.length,
		ArraysFrom: r.stride, ArraysTo: r.stride, Buffers: r.k, Why: bc.Why + ": not even one run fits the budget now; the arrays are kept as they are"})
	return target{}, false
}

// planNow is the device arrays' chunk length the manager would plan with
// k buffers now; an error when they cannot have k (a plan of one chunk
// has one buffer).
func (r *batchRun) planNow(k int) (int, error) {
	p, err := r.b.arrays[0].client.PlanNow(r.ctx, r.b.chunkedRequests(), vram.WithBuffers(k))
	switch {
	case err != nil:
		return 0, err
	case k > 1 && p.Buffers < k:
		return 0, fmt.Errorf("the batch fits in one chunk, which has one buffer")
	case p.TotalRuns == 0 || p.Chunks == 1:
		return r.b.runs, nil
	}
	return p.ChunkLength, nil
}

// limits are what bound the run's shapes now: the device's plan for
// each count of buffers (k alone when k > 0), the staging room, the cap.
func (r *batchRun) limits(k int) limits {
	l := limits{maxLen: r.o.MaxChunkLength, buffers: k, runsLeft: r.q.runsLeft(),
		room: r.b.m.Host().Staging().Room() + r.stagingHeld()}
	for _, a := range r.staged() {
		if a.dir == dirOut {
			l.outRun += a.run
		} else {
			l.inRun += a.run
		}
	}
	for n := 1; n <= MaxBuffers; n++ {
		switch {
		case n == r.b.buffers():
			l.devLen[n] = r.stride
		case k == 0 || n == k:
			l.devLen[n], _ = r.planNow(n)
		}
	}
	return l
}

// probeTarget is the re-cut choose picks once the probe chunk is back.
func (r *batchRun) probeTarget() (target, bool) {
	e := &r.el
	l := r.limits(r.o.Buffers)
	cur := shape{k: r.k, lag: r.lag, slots: r.outSlots, length: r.length}
	best, why := choose(e.fig, l, cur)
	r.rep.BufferChoice = why
	e.pref = best
	r.startLooks(cur, e.fig, best != cur)
	if best == cur {
		return target{}, false
	}
	return target{k: best.k, stride: l.devLen[best.k], sh: &best, why: why}, true
}

// reshape sets the lead, output slots and length for the arrays as now
// allocated: the probe's choice when there is one, else as it was
// wanted before, at most what the device arrays and the cap allow.
func (r *batchRun) reshape(t target) int {
	e := &r.el
	r.k = min(t.k, r.b.buffers())
	want := r.capped(r.stride)
	switch {
	case t.sh != nil:
		r.lag, r.outSlots, want = t.sh.lag, t.sh.slots, min(want, t.sh.length)
	case e.fig.runs > 0:
		l := r.limits(r.k)
		p := e.pref
		p.k, p.length = r.k, 0
		if best, _ := choose(e.fig, l, shape{}); best.length > 0 {
			p = best
		}
		r.lag, r.outSlots = p.lag, p.slots
		if p.length > 0 {
			want = min(want, p.length)
		}
	default:
		r.lag = min(e.pref.lag, max(1, r.k-1))
		r.outSlots = r.lag + max(1, e.pref.slots-e.pref.lag)
	}
	return want
}

// recut ends a segment: it re-allocates and re-stages for the target the
// segment ended for, and records the change.
func (r *batchRun) recut() error {
	e := &r.el
	if e.ended != nil && r.q.runsLeft() > 0 {
		return fmt.Errorf("batch: stopped after %d of %d chunks: the manager's budget ended: %w", len(r.chunks), r.estimate(), e.ended)
	}
	t, ok := e.want, e.due
	if e.probing {
		e.probing = false
		if e.fig.runs > 0 {
			t, ok = r.probeTarget()
		}
	}
	e.due, e.want = false, target{}
	if !ok {
		return nil
	}
	if err := r.ctx.Err(); err != nil {
		return err // stopped: nothing to re-cut for
	}
	from, fromStride := r.length, r.stride
	if t.k != r.b.buffers() || t.stride != r.stride {
		if err := r.b.reallocate(r.ctx, t.k); err != nil {
			if !r.b.intact() {
				return fmt.Errorf("batch: re-cut after %d of %d chunks (%s): the arrays were given up and could not be allocated again: %w",
					len(r.chunks), r.estimate(), t.why, err)
			}
			r.rep.Recuts = append(r.rep.Recuts, Recut{At: time.Since(r.start), Chunk: len(r.chunks), From: from, To: from,
				ArraysFrom: r.stride, ArraysTo: r.stride, Buffers: r.k, Why: fmt.Sprintf("%s; could not allocate again, the arrays are kept: %v", t.why, err)})
			return nil
		}
		r.stride = r.b.stride()
	}
	want := r.reshape(t)
	if err := r.restage(want); err != nil {
		return err
	}
	r.q.setLength(r.part, r.length)
	r.rep.Recuts = append(r.rep.Recuts, Recut{At: time.Since(r.start), Chunk: len(r.chunks), From: from, To: r.length,
		ArraysFrom: fromStride, ArraysTo: r.stride, Buffers: r.k, Why: t.why})
	e.lk.restart(len(r.chunks))
	r.rep.Buffers, r.rep.Lag, r.rep.ChunkLength = r.k, r.lag, 0
	return nil
}

// restage gives the staging back and takes it again for chunks of want
// runs, setting the run's length to what it got. Its old buffers, of
// another length, are trimmed from the pool first: the pool would hand
// one of them out again, larger than asked, to one slot and leave no
// room for the next.
func (r *batchRun) restage(want int) error {
	held := r.stagingHeld() > 0
	if err := r.releaseStaging(); err != nil {
		return fmt.Errorf("batch: re-cut: give the staging back: %w", err)
	}
	if held && want != r.length {
		if err := r.b.m.Host().Staging().Trim(); err != nil {
			return fmt.Errorf("batch: re-cut: trim the staging pool: %w", err)
		}
	}
	n, err := r.acquireStaging(min(want, r.q.longest()))
	if err != nil {
		return err
	}
	r.length = n
	return nil
}

// estimate is the batch's chunks as now cut: those taken and those left
// at the run's length.
func (r *batchRun) estimate() int { return r.q.estimate(r.length) }

// plural writes n and a noun, with an s unless n is 1.
func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}
