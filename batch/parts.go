package batch

// The queue a run takes its chunks from, and a batch on several devices:
// RunParts deals the chunks of one queue of runs to one part per device
// (a batch allocated on that device's manager and its compute step), each
// part taking the next chunk when it has a buffer free, so a faster
// device takes more chunks.
//
// One queue. The batch's R runs are handed out in order, each chunk cut
// from what is left at the length its taker asks for: its own (its plan
// for its device's memory, re-cut as the budget changes), and on P
// devices at most its share of half the runs left, by rate (weighted
// factoring: Hummel, Schonberg and Flynn, "Factoring: a method for
// scheduling parallel loops", CACM 35(8), 1992; Hummel, Schmidt, Uma and
// Wein, "Load-sharing in heterogeneous systems via weighted factoring",
// SPAA 1996), so that the chunks shrink as the queue empties and the
// parts finish together:
//   - each part's rate is measured: the runs of its chunks done (their
//     copies out complete) over the time since it took its first, on the
//     queue's clock;
//   - a part's first chunk is a probe, ⌈left/64P⌉ runs (probeShare), and
//     the chunks it takes ahead of it one run each: a device many times
//     slower than the others then holds little of the batch before its
//     rate is known;
//   - once its rate is known a part takes ⌈left × r/(2 Σr)⌉ runs, Σr over
//     the parts still taking, each counted at its measured rate (at the
//     taker's while not yet measured): on equal devices ⌈left/2P⌉; but
//     at most twice its longest chunk yet (rates measured on small
//     chunks are rough: their fixed costs weigh on them) and no fewer
//     than the batch's first probe's runs (⌈R/64P⌉: a finer cut costs
//     more chunks than it evens out);
//   - a part whose chunk would end later than the other parts, at their
//     measured rates, would finish every run left takes no more: a slow
//     device's last chunk never sets the batch's end.
// A batch much larger than the devices is thus cut at each device's own
// length, a larger device's chunks the longer, and a faster device takes
// more of them, and longer ones. A chunk's
// outputs land at its runs of the host arrays (or in the drain
// function's span), so the results do not depend on how the chunks were
// cut or dealt, provided the kernel's result for a run depends on that
// run's inputs alone.
//
// Threads. Each part runs on its own goroutine, locked to its OS thread
// for the whole batch: a backend whose context is per thread (CUDA) then
// keeps one context current on that thread, and the parts' driver calls
// run in parallel.
//
// Failure. The first part to fail stops the dealing and cancels the
// others, which finish what they enqueued; RunParts returns that part's
// error, naming the device. A panic on a part's goroutine in one of the
// batch's functions is that part's error (ErrPanic), not the process's
// end.

import (
	"context"
	"fmt"
	"math"
	"runtime"
	"slices"
	"sync"
	"time"
)

// dealtChunk is one chunk of a batch: its index in the batch's order,
// its runs, and the bytes its copies move.
type dealtChunk struct {
	index, start, len int
	in, out           uint64
}

// runQueue hands out a batch's runs in order, as chunks: one run's own,
// or one for every part of RunParts. Safe for concurrent use.
type runQueue struct {
	runs int
	now  func() time.Duration // the queue's clock: time since it was made (tests set their own)

	mu      sync.Mutex // protects the fields below
	lengths []int      // per part: the length it cuts at now
	parts   []partRate // per part: what it took and did, for its rate
	next    int        // the first run not handed out
	taken   int        // chunks handed out
	stopped bool
}

// partRate is what one part of a shared queue took and did.
type partRate struct {
	started bool
	start   time.Duration // when it took its first chunk
	longest int           // runs of the longest chunk it took
	held    int           // runs taken and not yet done
	done    int           // runs done
	at      time.Duration // when its last chunk was done
	out     bool          // it takes no more (the others finish sooner, or it ended)
}

// rate is the part's runs per second so far, 0 until a chunk is done.
func (p partRate) rate() float64 {
	if p.done == 0 || p.at <= p.start {
		return 0
	}
	return float64(p.done) / (p.at - p.start).Seconds()
}

// backlog is the runs the part has yet to do of those it holds, at its
// rate since its last chunk was done (all it holds until one is).
func (p partRate) backlog(now time.Duration) float64 {
	r := p.rate()
	if r == 0 {
		return float64(p.held)
	}
	return max(0, float64(p.held)-(now-p.at).Seconds()*r)
}

// newRunQueue is a queue of runs for parts takers.
func newRunQueue(runs, parts int) *runQueue {
	t0 := time.Now()
	return &runQueue{runs: runs, lengths: make([]int, max(parts, 1)), parts: make([]partRate, max(parts, 1)),
		now: func() time.Duration { return time.Since(t0) }}
}

// setLength says that part now cuts chunks of length runs.
func (q *runQueue) setLength(part, length int) {
	q.mu.Lock()
	q.lengths[part] = length
	q.mu.Unlock()
}

// take cuts part's next chunk, of at most limit runs, from the runs left;
// false when there are none, or when, shared, the part is to take no
// more (shareLocked).
func (q *runQueue) take(part, limit int) (dealtChunk, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	left := q.runs - q.next
	if q.stopped || left <= 0 || q.parts[part].out {
		return dealtChunk{}, false
	}
	q.lengths[part] = limit
	n := min(limit, left)
	if len(q.lengths) > 1 {
		now := q.now()
		if n = min(n, q.shareLocked(part, left, now)); n < 1 {
			q.parts[part].out = true
			return dealtChunk{}, false
		}
		p := &q.parts[part]
		if !p.started {
			p.started, p.start = true, now
		}
		p.held, p.longest = p.held+n, max(p.longest, n)
	}
	ch := dealtChunk{index: q.taken, start: q.next, len: n}
	q.next += n
	q.taken++
	return ch, true
}

// shareLocked is the most runs part may take now of the left of a shared
// queue (see the file's overview): its probe before its rate is known,
// then its rate's share of half of them; 0 when its chunk would end
// after the others finish every run left.
func (q *runQueue) shareLocked(part, left int, now time.Duration) int {
	n, others, measured := q.fairShareLocked(part, left)
	self := q.parts[part]
	if self.rate() > 0 {
		// At most twice its longest chunk yet: rates measured on a few
		// small chunks are rough (a chunk's fixed costs weigh on them),
		// and a part holds little until they are not. No shorter than
		// the first probe: a chunk's fixed costs would outweigh what a
		// finer cut evens out.
		n = max(min(n, 2*self.longest), ceilDiv(q.runs, probeShare*len(q.parts)))
	}
	if !measured || others == 0 {
		return n
	}
	// When this part would end its chunk, and when the others would have
	// done every run left (this chunk's included) and what they hold.
	var theirs float64
	for j, p := range q.parts {
		if j != part && !p.out {
			theirs += p.backlog(now)
		}
	}
	if (self.backlog(now)+float64(n))/self.rate() > (float64(left)+theirs)/others {
		return 0
	}
	return n
}

// fairShareLocked is part's share of the left runs of a shared queue:
// its probe until its rate is known, then its rate's share of half of
// them (a take may cut less: shareLocked). others is the other parts'
// rates summed, measured whether each of them is measured (one that is
// not counts at part's rate).
func (q *runQueue) fairShareLocked(part, left int) (n int, others float64, measured bool) {
	self := q.parts[part]
	r := self.rate()
	if r == 0 {
		// The probe; a run that takes ahead of it (buffers in flight)
		// gets a run until the probe is back.
		return max(1, ceilDiv(left, probeShare*len(q.parts))-self.held), 0, false
	}
	measured = true
	for j, p := range q.parts {
		if j == part || p.out {
			continue
		}
		rj := p.rate()
		if rj == 0 {
			rj, measured = r, false
		}
		others += rj
	}
	return int(math.Ceil(float64(left) * r / (2 * (r + others)))), others, measured
}

// done says that part's chunk of runs is done (its copies out complete).
func (q *runQueue) done(part, runs int) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.parts) < 2 {
		return
	}
	p := &q.parts[part]
	p.held -= runs
	p.done += runs
	p.at = q.now()
}

// ended says that part takes no more chunks (it finished or failed).
func (q *runQueue) ended(part int) {
	q.mu.Lock()
	q.parts[part].out = true
	q.mu.Unlock()
}

// rates is each part's runs per second measured so far.
func (q *runQueue) rates() []float64 {
	q.mu.Lock()
	defer q.mu.Unlock()
	out := make([]float64, len(q.parts))
	for i, p := range q.parts {
		out[i] = p.rate()
	}
	return out
}

// probeShare sets a part's first chunk on a queue shared by P parts:
// ⌈left/(probeShare × P)⌉ runs. A device r times slower than the
// fastest ends its probe after the fastest alone would have done the
// whole batch only if r > probeShare × P (on two devices, 128 times
// slower).
const probeShare = 64

func ceilDiv(a, b int) int { return (a + b - 1) / b }

// longest is the most runs part's takes may cut, as things stand: the
// runs left, or its share of them when the queue is shared; at least 1.
// What its staging is sized for.
func (q *runQueue) longest(part int) int {
	q.mu.Lock()
	defer q.mu.Unlock()
	n := q.runs - q.next
	if len(q.lengths) > 1 {
		n, _, _ = q.fairShareLocked(part, n)
	}
	return max(n, 1)
}

// most is the most runs any take may cut from now on: the runs left, or
// half of them shared (a part's share is less); at least 1.
func (q *runQueue) most() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	n := q.runs - q.next
	if len(q.lengths) > 1 {
		n = ceilDiv(n, 2)
	}
	return max(n, 1)
}

// shared reports whether several parts take from q.
func (q *runQueue) shared() bool { return len(q.lengths) > 1 }

// runsLeft is the runs not yet handed out.
func (q *runQueue) runsLeft() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.runs - q.next
}

// chunksLeft is how many chunks of length runs the runs left make.
func (q *runQueue) chunksLeft(length int) int {
	left := q.runsLeft()
	return (left + max(length, 1) - 1) / max(length, 1)
}

// estimate is the batch's chunks: those handed out and those the runs
// left make at length.
func (q *runQueue) estimate(length int) int {
	q.mu.Lock()
	taken := q.taken
	q.mu.Unlock()
	return taken + q.chunksLeft(length)
}

// stop hands out nothing more.
func (q *runQueue) stop() {
	q.mu.Lock()
	q.stopped = true
	q.mu.Unlock()
}

// take makes sure the run has its chunk i (0-based, in its own order),
// taking the next one from its queue if i is the next and no re-cut is
// due; false when there is none.
func (r *batchRun) take(i int) bool {
	if i < len(r.chunks) {
		return true
	}
	if r.ended || i > len(r.chunks) || i-r.el.seg0 >= r.segmentCap() || r.recutDue() {
		return false
	}
	ch, ok := r.q.take(r.part, r.length)
	if !ok {
		r.ended = true
		return false
	}
	r.chunks = append(r.chunks, ch)
	r.rep.ChunkLength = max(r.rep.ChunkLength, ch.len)
	return true
}

// Part is one device's part of a batch run by RunParts: a batch
// allocated for the batch's runs on that device's manager, and the
// compute step for that device. A plain value.
type Part struct {
	Batch   *Batch
	Compute Compute
}

// PartsReport is what a batch on several devices did. A plain value.
type PartsReport struct {
	Chunks     int // the batch's chunks, every part's together
	ChunksDone int // chunks back on the host, every part together
	// Parts is each part's report, in the order of the parts: Chunks is
	// the chunks the part took, ChunksDone those back on the host, Runs
	// their runs, ChunkLength the length it cut them at last.
	Parts []Report
	// Rates is each part's runs per second as the dealing measured them:
	// the runs of its chunks done over the time from its first take to
	// its last chunk done (0: none done).
	Rates    []float64
	BytesIn  uint64
	BytesOut uint64
	Wall     time.Duration
}

// RunParts runs one batch on several devices: parts holds one part per
// device, each a Batch declaring the same arrays in the same order (the
// same labels and requests, its own device's clients) with the same host
// sides (the same host arrays, or fill and drain functions), allocated on
// its device's manager. The batch's runs are dealt from one queue (see
// the overview at the top of the file) to the parts as each has a
// buffer free, each part's chunks at its own length (its plan's, capped
// by o.MaxChunkLength, re-cut as Run's are) and at most its share of
// half the runs left by its measured rate (a probe first); each part runs
// its chunks as Run does,
// on its own goroutine locked to its OS thread. o's fields apply to every
// part; o.Progress is called one call at a time, counting the batch's
// chunks.
//
// It returns when every chunk is back, or when a part fails or ctx is
// done, after every part's enqueued work has finished. An output that is
// unchunkable cannot be gathered from several devices: a batch of more
// than one run with one is refused. Batches of different groups may run
// at once, from several goroutines.
func RunParts(ctx context.Context, parts []Part, o Options) (PartsReport, error) {
	if err := checkParts(parts); err != nil {
		return PartsReport{}, err
	}
	q := newRunQueue(parts[0].Batch.runs, len(parts))
	rep := PartsReport{Parts: make([]Report, len(parts))}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	t := &tally{in: make([]uint64, len(parts)), out: make([]uint64, len(parts)), progress: o.Progress, start: time.Now()}
	runs, err := prepareParts(ctx, parts, o, q, t)
	if err != nil {
		return rep, err
	}
	errs := make([]error, len(parts))
	var wg sync.WaitGroup
	for i, r := range runs {
		wg.Go(func() {
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			var err error
			if rep.Parts[i], err = r.runMarked(); err != nil {
				errs[i] = fmt.Errorf("device %d (%s): %w", i, r.dev.Info().Name, err)
				q.stop()
				cancel(errs[i])
			}
		})
	}
	wg.Wait()
	rep.Wall = time.Since(t.start)
	rep.Rates = q.rates()
	for _, p := range rep.Parts {
		rep.Chunks += p.Chunks
		rep.ChunksDone += p.ChunksDone
		rep.BytesIn += p.BytesIn
		rep.BytesOut += p.BytesOut
	}
	return rep, firstCause(ctx, errs)
}

// checkParts checks that the parts declare the same batch.
func checkParts(parts []Part) error {
	if len(parts) == 0 {
		return batchErr("no parts; give one per device")
	}
	for i, p := range parts {
		b, b0 := p.Batch, parts[0].Batch
		if b == nil || !b.ok {
			return batchErr("part %d: the batch is not allocated; Allocate it on its device first", i)
		}
		if len(b.arrays) != len(b0.arrays) {
			return batchErr("part %d declares %d arrays and part 0 %d; give every part the same arrays", i, len(b.arrays), len(b0.arrays))
		}
		for j, a := range b.arrays {
			if err := sameArray(a, b0.arrays[j]); err != nil {
				return fmt.Errorf("batch: part %d: %w", i, err)
			}
		}
		if b.runs != b0.runs {
			return batchErr("part %d has %d runs and part 0 %d; allocate every part for the same batch", i, b.runs, b0.runs)
		}
	}
	return nil
}

// sameArray checks that a part's array a is declared as part 0's a0 is.
func sameArray(a, a0 *Array) error {
	r, r0 := a.req, a0.req
	switch {
	case a.label != a0.label || a.dir != a0.dir || r.DType != r0.DType || r.ChunkAxis != r0.ChunkAxis ||
		r.Chunkable() != r0.Chunkable() || !slices.Equal(r.Shape, r0.Shape):
		return batchErr("%v %v (%v%v) is not part 0's %v %v (%v%v); declare the same arrays in the same order",
			a.dir, a, r.DType, r.Shape, a0.dir, a0, r0.DType, r0.Shape)
	case a.side.host != a0.side.host || (a.side.fill == nil) != (a0.side.fill == nil) || (a.side.drain == nil) != (a0.side.drain == nil):
		return batchErr("%v %v has another host side than part 0's; give every part the same host arrays or functions", a.dir, a)
	}
	return nil
}

// prepareParts makes each part's run, reporting progress to t; on an
// error it finishes the runs it made.
func prepareParts(ctx context.Context, parts []Part, o Options, q *runQueue, t *tally) ([]*batchRun, error) {
	runs := make([]*batchRun, len(parts))
	fail := func(err error) ([]*batchRun, error) {
		for _, r := range runs {
			if r != nil {
				_, _ = r.finish(nil)
			}
		}
		return nil, err
	}
	for i, p := range parts {
		for _, a := range p.Batch.arrays {
			if !a.req.Chunkable() && (a.dir == dirOut || a.dir == dirInOut) && len(parts) > 1 && q.runs > 1 {
				return fail(batchErr("device %d: output %v is unchunkable, and a batch of %d runs on several devices cannot gather it; make it chunkable", i, a, q.runs))
			}
		}
		r, err := newRun(ctx, p.Batch, p.Compute, o, q, i, t.of(i))
		if err != nil {
			return fail(fmt.Errorf("device %d: %w", i, err))
		}
		runs[i] = r
	}
	return runs, nil
}

// tally counts the chunks and bytes of RunParts' parts and calls
// progress, one call at a time. Safe for concurrent use.
type tally struct {
	progress func(Progress)
	start    time.Time

	mu      sync.Mutex // protects the fields below
	done    int
	in, out []uint64 // per part: bytes moved, as its last progress said
}

// of is part's Progress callback.
func (t *tally) of(part int) func(Progress) {
	return func(p Progress) {
		t.mu.Lock()
		defer t.mu.Unlock()
		t.done++
		t.in[part], t.out[part] = p.BytesIn, p.BytesOut
		if t.progress == nil {
			return
		}
		var in, out uint64
		for i := range t.in {
			in, out = in+t.in[i], out+t.out[i]
		}
		t.progress(Progress{Chunk: t.done, Chunks: max(p.Chunks, t.done), Start: p.Start, Len: p.Len,
			BytesIn: in, BytesOut: out, Elapsed: time.Since(t.start)})
	}
}

// firstCause is the error that stopped the batch: the failure of the
// part that cancelled the others, or, when ctx was done, the first
// part's error.
func firstCause(ctx context.Context, errs []error) error {
	cause := context.Cause(ctx)
	for _, err := range errs {
		if err != nil && err == cause {
			return err
		}
	}
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}
