// `vram run`'s batch: each run's parameters, and the check of the
// results against the float64 reference.

package main

import (
	"fmt"
	"math"
	"slices"

	"github.com/vramkit/vram"
	"github.com/vramkit/vram/internal/oscillator"
)

// checkStable refuses a --dt at which RK4 blows up on some run of the
// batch: ω·dt must stay within rk4Limit for the batch's largest ω (found
// run by run up to stabilityScanRuns runs, else taken as maxOmega).
func checkStable(dt float64, runs int, seed uint64) error {
	if dt*maxOmega <= rk4Limit {
		return nil // stable whatever ω the batch draws
	}
	omega := maxOmega
	if runs <= stabilityScanRuns {
		omega = 0
		for i := range runs {
			omega = max(omega, runAt(seed, i).Omega)
		}
		if dt*omega <= rk4Limit {
			return nil
		}
	}
	// The largest dt allowed, rounded down to 4 significant digits.
	most := rk4Limit / omega
	scale := math.Pow(10, 3-math.Floor(math.Log10(most)))
	most = math.Floor(most*scale) / scale
	return usagef("--dt %v: RK4 is unstable at this step: it needs ω·dt ≤ %v for these oscillators, and the batch's largest ω is %.4g (ω·dt = %.3g); want --dt of at most %v",
		dt, rk4Limit, omega, dt*omega, most)
}

// verifyIndices picks up to want runs spread evenly over the batch, plus
// the first and last run of every chunk.
func (j *job) verifyIndices(want int) []int {
	idx := spreadRuns(j.shape.runs, want)
	for _, sp := range j.chunkSpans() {
		idx = append(idx, sp.Start, sp.Start+sp.Len-1)
	}
	slices.Sort(idx)
	return slices.Compact(idx)
}

// verify checks the chosen runs against the float64 reference and returns
// how many it checked.
func (j *job) verify(want int) (int, error) {
	idx := j.verifyIndices(want)
	status, sh := j.hStatus.Data(), j.shape
	got, err := j.runsSamples(idx)
	if err != nil {
		return len(idx), err
	}
	for k, i := range idx {
		r := runAt(j.seed, j.shape.first+i)
		if st := oscillator.Status(status, i); st != 0 {
			return len(idx), fmt.Errorf("run %d (%s, chunk %d of %d): the integration became non-finite (NaN or ±Inf; status %d): %w",
				sh.first+i, describeRun(r), j.chunkOf(i)+1, len(j.chunkSpans()), st, errVerify)
		}
		want := oscillator.ReferenceRun(r, sh.dt, int(sh.steps), int(sh.every))
		if err := oscillator.Verify(got[k], want); err != nil {
			return len(idx), fmt.Errorf("run %d (%s, chunk %d of %d): %v: %w", sh.first+i, describeRun(r), j.chunkOf(i)+1, len(j.chunkSpans()), err, errVerify)
		}
	}
	return len(idx), nil
}

// chunkSpans is the batch's chunks: as it cut them once it ran, else
// as planned.
func (j *job) chunkSpans() []vram.Span {
	if len(j.spans) > 0 {
		return j.spans
	}
	var out []vram.Span
	for i := range j.plan.Chunks {
		start, n, _ := j.plan.Chunk(i) // i in range
		out = append(out, vram.Span{Start: start, Len: n})
	}
	return out
}

// chunkOf is the chunk (0-based) that ran run i.
func (j *job) chunkOf(i int) int {
	spans := j.chunkSpans()
	k, _ := slices.BinarySearchFunc(spans, i, func(sp vram.Span, run int) int {
		switch {
		case sp.Start+sp.Len <= run:
			return -1
		case sp.Start > run:
			return 1
		}
		return 0
	})
	return min(k, max(len(spans)-1, 0))
}

// failedRuns counts the runs whose status is not 0.
func (j *job) failedRuns() int {
	bad := 0
	for _, st := range j.hStatus.Int32s() {
		if st != 0 {
			bad++
		}
	}
	return bad
}

func describeRun(r oscillator.Run) string {
	return fmt.Sprintf("x0 %.3g, v0 %.3g, ω %.3g, ζ %.3g, A %.3g, Ω %.3g", r.X0, r.V0, r.Omega, r.Zeta, r.A, r.Drive)
}

// runAt is run i's initial state and parameters, a pure function of seed
// and i (so verification needs no copy of them): x0, v0 ∈ [−1, 1),
// ω ∈ [0.5, 4), ζ ∈ [0.02, 0.5), A ∈ [0, 2), Ω ∈ [0.2, maxDrive).
func runAt(seed uint64, i int) oscillator.Run {
	h := seed*0x9e3779b97f4a7c15 ^ uint64(i)*0xbf58476d1ce4e5b9
	u := func(lo, hi float64) float64 {
		h += 0x9e3779b97f4a7c15
		z := h
		z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
		z = (z ^ z>>27) * 0x94d049bb133111eb
		z ^= z >> 31
		return lo + (hi-lo)*float64(z>>11)/(1<<53)
	}
	return oscillator.Run{
		X0: u(-1, 1), V0: u(-1, 1),
		Omega: u(minOmega, maxOmega), Zeta: u(minZeta, maxZeta), A: u(0, 2), Drive: u(0.2, maxDrive),
	}
}
