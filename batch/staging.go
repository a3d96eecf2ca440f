package batch

// Staging a batch through the manager's staging pool. Each staged array
// wants lag+k buffers (an input, filled k−1 chunks ahead) or its slots
// (an output: lag+1, one more for the writer to drain behind; run.go,
// writer.go), each of the run's chunk length, and never more than the
// chunks left. Pinned memory is dear (on a GPU pinning takes about a
// millisecond a MiB), so a run pins no more than it uses, and as late as
// it can:
//   - before its probe chunk (elastic.go), which runs alone, it takes one
//     buffer per staged array; the rest once the probe has picked the
//     shape (topUpStaging, or the re-cut's restage);
//   - it asks for all it wants at once (StagingPool.TryAcquireSet), so
//     that the pool reuses the idle buffers that serve, and gives up
//     those that would waste its room for new ones: a re-cut re-pins
//     only what the new length needs more;
//   - with fewer than it wants, it takes one buffer per staged array
//     together, waiting for them if the pool is busy, then as many more
//     as the pool can give at once, and keeps fewer output slots, then
//     the host fewer chunks ahead (lag 0: each chunk is waited for as
//     soon as it is enqueued) and, if still short, fewer buffers in
//     flight. When not even one buffer per staged array fits (a host
//     limit or the RAM available below one chunk), the chunk length
//     shrinks until one does, down to one run; below that the error
//     gives the figures.
// The time taken and the bytes pinned anew are the report's Pin and
// PinnedBytes.

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/vramkit/vram"
	"github.com/vramkit/vram/internal/units"
)

// staged lists the run's staged arrays.
func (r *batchRun) staged() []*batchArr {
	var out []*batchArr
	for _, a := range r.arrs {
		if a.stagedSide {
			out = append(out, a)
		}
	}
	return out
}

// acquireStaging fills every staged array's slots from the pool for
// chunks of length runs, shrinking it until one buffer each fits, and
// fits k, lag and the slots to what it got (unless it is taking the
// probe's one each). It returns the length staged.
func (r *batchRun) acquireStaging(length int) (int, error) {
	staged := r.staged()
	if len(staged) == 0 {
		return length, nil
	}
	defer r.timePin(time.Now(), r.b.m.Host().Staging().Stats().Made)
	got, length, err := r.takeStaging(staged, length)
	if err != nil {
		return 0, err
	}
	if !r.el.lazy {
		r.fitToStaging(staged, counts(got, nil), length)
	}
	for i, a := range staged {
		a.stage = a.stage[:0]
		if err := r.viewStaging(a, got[i], length); err != nil {
			releaseAll(got[i+1:])
			return 0, err
		}
	}
	return length, nil
}

// timePin adds the time since start, and the bytes the pool made since
// it had made made0, to the report's Pin and PinnedBytes.
func (r *batchRun) timePin(start time.Time, made0 uint64) {
	r.rep.Pin += time.Since(start)
	r.rep.PinnedBytes += r.b.m.Host().Staging().Stats().Made - made0
}

// takeStaging takes the buffers of the staged arrays' slots at length
// runs: all at once if the pool has them now, or the most of them
// fitToStaging would keep that it has; else one each (waiting, and
// shrinking the length until they fit) and as many more as it gives.
func (r *batchRun) takeStaging(staged []*batchArr, length int) ([][]*vram.StagingBuffer, int, error) {
	pool := r.b.m.Host().Staging()
	for _, want := range r.slotSteps(staged, length) {
		if got, err := r.tryStaging(staged, want, length); got != nil || err != nil {
			return got, length, err
		}
	}
	first, length, err := r.firstSet(staged, length)
	if err != nil {
		return nil, 0, err
	}
	got := make([][]*vram.StagingBuffer, len(staged))
	for i := range staged {
		got[i] = []*vram.StagingBuffer{first[i]}
	}
	// More, round by round, while the pool gives them at once.
	for more := true; more; {
		more = false
		for i, a := range staged {
			if len(got[i]) >= r.wantSlots(a, length) {
				continue
			}
			b, err := pool.TryAcquire(a.run * uint64(length))
			if err != nil {
				releaseAll(got)
				return nil, 0, fmt.Errorf("batch: staging buffer for %s: %w", a, err)
			}
			if b != nil {
				got[i] = append(got[i], b)
				more = true
			}
		}
	}
	return got, length, nil
}

// slotSteps lists the slots the staged arrays want at length runs with
// the run's k, lag and output slots, and with each fewer that
// fitToStaging goes down through, to one each.
func (r *batchRun) slotSteps(staged []*batchArr, length int) [][]int {
	k, lag, out := r.k, r.lag, r.outSlots
	defer func() { r.k, r.lag, r.outSlots = k, lag, out }()
	var steps [][]int
	for {
		want, more := make([]int, len(staged)), false
		for i, a := range staged {
			want[i] = r.wantSlots(a, length)
			more = more || want[i] > 1
		}
		if len(steps) == 0 || !slices.Equal(want, steps[len(steps)-1]) {
			steps = append(steps, want)
		}
		if !more || !r.fewerSlots() {
			return steps
		}
	}
}

// tryStaging takes want[i] buffers of staged[i]'s chunk at length runs
// for every array at once if the pool has them all now; nil if not.
func (r *batchRun) tryStaging(staged []*batchArr, want []int, length int) ([][]*vram.StagingBuffer, error) {
	var sizes []uint64
	for i, a := range staged {
		for range want[i] {
			sizes = append(sizes, a.run*uint64(length))
		}
	}
	if len(sizes) == 0 {
		return make([][]*vram.StagingBuffer, len(staged)), nil
	}
	bs, err := r.b.m.Host().Staging().TryAcquireSet(sizes)
	if err != nil {
		return nil, fmt.Errorf("batch: staging buffers for %s: %w", stagedNames(staged, length), err)
	}
	if bs == nil {
		return nil, nil
	}
	got := make([][]*vram.StagingBuffer, len(staged))
	for i := range staged {
		got[i], bs = bs[:want[i]:want[i]], bs[want[i]:]
	}
	return got, nil
}

// topUpStaging takes the slots the run's shape wants beyond those it
// holds, at its length (after the probe, which ran with one each); with
// fewer than that it fits k, lag and the slots to what it has.
func (r *batchRun) topUpStaging() error {
	staged := r.staged()
	if len(staged) == 0 {
		return nil
	}
	defer r.timePin(time.Now(), r.b.m.Host().Staging().Stats().Made)
	pool := r.b.m.Host().Staging()
	more := make([]int, len(staged))
	for i, a := range staged {
		more[i] = max(0, r.wantSlots(a, r.length)-len(a.stage))
	}
	got, err := r.tryStaging(staged, more, r.length)
	if err != nil {
		return err
	}
	if got == nil { // as many as the pool gives now
		got = make([][]*vram.StagingBuffer, len(staged))
		for i, a := range staged {
			for len(got[i]) < more[i] {
				b, err := pool.TryAcquire(a.run * uint64(r.length))
				if err != nil || b == nil {
					break
				}
				got[i] = append(got[i], b)
			}
		}
	}
	r.fitToStaging(staged, counts(got, staged), r.length)
	for i, a := range staged {
		if err := r.viewStaging(a, got[i], r.length); err != nil {
			releaseAll(got[i+1:])
			return err
		}
	}
	return nil
}

// counts is how many buffers each staged array has with got: got[i]'s,
// and the slots it holds when staged is given.
func counts(got [][]*vram.StagingBuffer, staged []*batchArr) []int {
	n := make([]int, len(got))
	for i := range got {
		n[i] = len(got[i])
		if staged != nil {
			n[i] += len(staged[i].stage)
		}
	}
	return n
}

// firstSet takes one buffer per staged array at length runs, shrinking
// the length while the pool has no room for them and nothing in use to
// wait for.
func (r *batchRun) firstSet(staged []*batchArr, length int) ([]*vram.StagingBuffer, int, error) {
	pool := r.b.m.Host().Staging()
	var perRun uint64
	for _, a := range staged {
		perRun += a.run
	}
	for {
		sizes := make([]uint64, len(staged))
		for i, a := range staged {
			sizes[i] = a.run * uint64(length)
		}
		bs, err := pool.AcquireSet(r.ctx, sizes)
		if err == nil {
			return bs, length, nil
		}
		if !errors.Is(err, vram.ErrOutOfMemory) {
			return nil, 0, fmt.Errorf("batch: staging buffers for %s: %w", stagedNames(staged, length), err)
		}
		// Shorter, to what the pool says it has room for, and by an
		// eighth at least (a buffer may take a little more than asked).
		next := min(int(min(pool.Room()/perRun, uint64(length))), length-max(1, length/8))
		if next < 1 && length > 1 {
			next = 1 // one run, the last try
		}
		if next < 1 {
			hs := r.b.m.Host().Stats()
			limit := "none"
			if hs.Limit > 0 {
				limit = units.Format(hs.Limit)
			}
			return nil, 0, fmt.Errorf("batch: staging: one run of %s takes %s, more than the staging pool has room for (%s; host limit %s with %s of host RAM in use, pinned limit %s): raise the host memory limit or free host memory: %w",
				stagedNames(staged, 1), units.Format(perRun), units.Format(pool.Room()), limit, units.Format(hs.RAM()), units.Format(hs.PinnedLimit), err)
		}
		length = next
	}
}

func stagedNames(staged []*batchArr, length int) string {
	names := make([]string, len(staged))
	for i, a := range staged {
		names[i] = fmt.Sprintf("%s (%s)", a, units.Format(a.run*uint64(length)))
	}
	return strings.Join(names, ", ")
}

// viewStaging adds to a's staging slots views of bufs: each shaped like
// its device array with length runs along the chunk axis (freeing it
// gives the buffer back), while a has fewer than it wants; the rest go
// back. It releases every buffer of bufs on an error.
func (r *batchRun) viewStaging(a *batchArr, bufs []*vram.StagingBuffer, length int) error {
	shape := append([]int(nil), a.dev[0].Shape()...)
	shape[a.axis] = length
	for j, b := range bufs {
		if len(a.stage) >= r.wantSlots(a, length) {
			b.Release()
			continue
		}
		h, err := b.Array(shape, a.dev[0].DType())
		if err != nil {
			for _, rest := range bufs[j:] {
				rest.Release()
			}
			return fmt.Errorf("batch: staging buffer for %s: %w", a, err)
		}
		a.stage = append(a.stage, h)
	}
	return nil
}

// releaseStaging gives every staging slot back to the pool.
func (r *batchRun) releaseStaging() error {
	var errs []error
	for _, a := range r.arrs {
		for _, h := range a.stage {
			errs = append(errs, h.Free())
		}
		a.stage = nil
	}
	return errors.Join(errs...)
}

// stagingHeld is the bytes of the run's staging slots.
func (r *batchRun) stagingHeld() uint64 {
	var n uint64
	for _, a := range r.arrs {
		for _, h := range a.stage {
			n += h.Bytes()
		}
	}
	return n
}

func releaseAll(got [][]*vram.StagingBuffer) {
	for _, bs := range got {
		for _, b := range bs {
			b.Release()
		}
	}
}

// slots is the staging buffers a needs with r's k, lag and output slots.
func (r *batchRun) slots(a *batchArr) int {
	if a.dir == dirOut {
		return r.outSlots
	}
	return r.lag + r.k
}

// wantSlots is slots, but never more than the chunks left at length
// when the run's queue is its own (a shared one may cut shorter chunks),
// and one before the probe chunk (el.lazy): it runs alone.
func (r *batchRun) wantSlots(a *batchArr, length int) int {
	switch {
	case r.el.lazy:
		return 1
	case r.q.shared():
		return r.slots(a)
	}
	return max(1, min(r.slots(a), r.q.chunksLeft(length)))
}

// segmentCap is how many chunks a segment may take with the staging it
// has: each input's slot is refilled only once the chunk that last used
// it is retired, which needs lag+k of them; with fewer (no more chunks
// were left) a segment takes at most as many chunks as it has slots.
func (r *batchRun) segmentCap() int {
	n := math.MaxInt
	for _, a := range r.arrs {
		if a.stagedSide && a.dir != dirOut && len(a.stage) < r.slots(a) {
			n = min(n, len(a.stage))
		}
	}
	return n
}

// outStage is the fewest staging slots of a staged output: chunk j's
// copies out wait until the writer has drained chunk j−outStage.
func (r *batchRun) outStage() int {
	n := math.MaxInt
	for _, a := range r.arrs {
		if a.stagedSide && a.dir == dirOut {
			n = min(n, len(a.stage))
		}
	}
	return n
}

// fitToStaging lowers the output slots, then lag, then k, until every
// staged array has the buffers it needs (staged[i] has have[i]); one
// buffer each always suffices (k = 1, lag 0, one slot).
func (r *batchRun) fitToStaging(staged []*batchArr, have []int, length int) {
	enough := func() bool {
		for i, a := range staged {
			if have[i] < r.wantSlots(a, length) {
				return false
			}
		}
		return true
	}
	for !enough() {
		if !r.fewerSlots() {
			return // one each: enough whatever they have
		}
	}
}

// fewerSlots lowers the run's shape by one step towards one staging
// buffer per array: an output slot fewer, then a chunk of lead fewer,
// then a buffer in flight fewer; false at k = 1, lag 0, one slot.
func (r *batchRun) fewerSlots() bool {
	switch {
	case r.outSlots > r.lag+1:
		r.outSlots--
	case r.lag > 0:
		r.lag--
		r.outSlots = r.lag + 1
	case r.k > 1:
		r.k--
	default:
		return false
	}
	return true
}
