package batch

// Staging a batch through the manager's staging pool. Each staged array
// wants lag+k buffers (an input, filled k−1 chunks ahead) or its slots
// (an output: lag+1, one more for the writer to drain behind; run.go,
// writer.go), each of the run's chunk length. The run takes one buffer
// per staged array together, waiting for them if the pool is busy, then
// as many more as the pool can give at once; with fewer than it wants it
// keeps fewer output slots, then the host fewer chunks ahead (lag 0:
// each chunk is waited for as soon as it is enqueued) and, if still
// short, fewer buffers in flight. When not even one buffer per staged
// array fits (a host limit or the RAM available below one chunk), the
// chunk length shrinks until one does, down to one run; below that the
// error gives the figures.

import (
	"errors"
	"fmt"
	"math"
	"strings"

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
// fits k, lag and the slots to what it got. It returns the length staged.
func (r *batchRun) acquireStaging(length int) (int, error) {
	staged := r.staged()
	if len(staged) == 0 {
		return length, nil
	}
	pool := r.b.m.Host().Staging()
	first, length, err := r.firstSet(staged, length)
	if err != nil {
		return 0, err
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
				return 0, fmt.Errorf("batch: staging buffer for %s: %w", a, err)
			}
			if b != nil {
				got[i] = append(got[i], b)
				more = true
			}
		}
	}
	r.fitToStaging(staged, got, length)
	for i, a := range staged {
		if err := r.viewStaging(a, got[i], length); err != nil {
			releaseAll(got[i+1:])
			return 0, err
		}
	}
	return length, nil
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

// viewStaging makes a's staging slots from bufs: each a view shaped like
// its device array with length runs along the chunk axis (freeing it
// gives the buffer back). It releases every buffer of bufs on an error.
func (r *batchRun) viewStaging(a *batchArr, bufs []*vram.StagingBuffer, length int) error {
	a.stage = a.stage[:0]
	shape := append([]int(nil), a.dev[0].Shape()...)
	shape[a.axis] = length
	for j, b := range bufs {
		if j >= r.wantSlots(a, length) {
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
// when the run's queue is its own (a shared one may cut shorter chunks).
func (r *batchRun) wantSlots(a *batchArr, length int) int {
	if r.q.shared() {
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
// staged array has the buffers it needs; one buffer each always suffices
// (k = 1, lag 0, one slot).
func (r *batchRun) fitToStaging(staged []*batchArr, got [][]*vram.StagingBuffer, length int) {
	enough := func() bool {
		for i, a := range staged {
			if len(got[i]) < r.wantSlots(a, length) {
				return false
			}
		}
		return true
	}
	for !enough() {
		switch {
		case r.outSlots > r.lag+1:
			r.outSlots--
		case r.lag > 0:
			r.lag--
			r.outSlots = r.lag + 1
		default:
			r.k--
		}
	}
}
