package batch

// Staging a batch through the manager's staging pool. Each staged array
// wants lag+1 buffers (an output) or lag+k (an input) to keep k buffers
// in flight with the host lag chunks ahead (run.go). The run takes
// one buffer per staged array together, waiting for them if the pool is
// busy, then as many more as the pool can give at once; with fewer than
// it wants it keeps the host fewer chunks ahead (lag 0: each chunk is
// retired as soon as it is enqueued) and, if still short, fewer buffers
// in flight. So a host limit smaller than two chunks slows a batch down
// but does not stop it.

import (
	"fmt"
	"strings"

	"github.com/vramkit/vram"
	"github.com/vramkit/vram/internal/units"
)

// acquireStaging fills every staged array's slots from the pool and
// fits k and lag to what it got.
func (r *batchRun) acquireStaging() error {
	var staged []*batchArr
	var sizes []uint64
	var names []string
	for _, a := range r.arrs {
		if a.staged() {
			staged = append(staged, a)
			sizes = append(sizes, a.dev[0].Bytes())
			names = append(names, fmt.Sprintf("%s (%s a chunk)", a, units.Format(a.dev[0].Bytes())))
		}
	}
	if len(staged) == 0 {
		return nil
	}
	pool := r.b.m.Host().Staging()
	first, err := pool.AcquireSet(r.ctx, sizes)
	if err != nil {
		return fmt.Errorf("batch: staging buffers for %s: %w", strings.Join(names, ", "), err)
	}
	got := make([][]*vram.StagingBuffer, len(staged))
	for i := range staged {
		got[i] = []*vram.StagingBuffer{first[i]}
	}
	// More, round by round, while the pool gives them at once.
	for more := true; more; {
		more = false
		for i, a := range staged {
			if len(got[i]) >= len(a.stage) {
				continue
			}
			b, err := pool.TryAcquire(sizes[i])
			if err != nil {
				releaseAll(got)
				return fmt.Errorf("batch: staging buffer for %s: %w", a, err)
			}
			if b != nil {
				got[i] = append(got[i], b)
				more = true
			}
		}
	}
	r.fitToStaging(staged, got)
	for i, a := range staged {
		a.stage = a.stage[:0]
		for j, b := range got[i] {
			if j >= min(r.slots(a), r.total) {
				b.Release()
				continue
			}
			// A view of b shaped like the device array; freeing it
			// gives b back to the pool.
			h, err := b.Array(a.dev[0].Shape(), a.dev[0].DType())
			if err != nil {
				b.Release()
				releaseAll(got[i+1:])
				for _, rest := range got[i][j+1:] {
					rest.Release()
				}
				return fmt.Errorf("batch: staging buffer for %s: %w", a, err)
			}
			a.stage = append(a.stage, h)
		}
	}
	return nil
}

func releaseAll(got [][]*vram.StagingBuffer) {
	for _, bs := range got {
		for _, b := range bs {
			b.Release()
		}
	}
}

// slots is the staging buffers a needs with r's k and lag.
func (r *batchRun) slots(a *batchArr) int {
	if a.dir == dirOut {
		return r.lag + 1
	}
	return r.lag + r.k
}

// fitToStaging lowers lag, then k, until every staged array has the
// buffers it needs; one buffer each always suffices (k = 1, lag 0).
func (r *batchRun) fitToStaging(staged []*batchArr, got [][]*vram.StagingBuffer) {
	for k := r.k; k >= 1; k-- {
		lag := max(1, k-1)
		for i, a := range staged {
			if len(got[i]) >= r.total {
				continue // a buffer per chunk: never reused
			}
			if a.dir == dirOut {
				lag = min(lag, len(got[i])-1)
			} else {
				lag = min(lag, len(got[i])-k)
			}
		}
		if lag >= 0 {
			r.k, r.lag = k, lag
			break
		}
	}
	r.rep.Buffers, r.rep.Lag = r.k, r.lag
}
