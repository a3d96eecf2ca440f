package batch

import (
	"strings"
	"testing"
	"time"
)

// TestChoose: the shape a run takes after its probe chunk, from the
// chunk's figures and what bounds the shapes. The figures are worked out
// in each case's comment; the probe ran 100,000 runs.
func TestChoose(t *testing.T) {
	ms := time.Millisecond
	cur := shape{k: 1, lag: 1, slots: 3, length: 100_000}
	dev := func(l1, l2, l3 int) [MaxBuffers + 1]int { return [MaxBuffers + 1]int{0, l1, l2, l3} }
	tests := map[string]struct {
		fig  figures
		lim  limits
		cur  shape
		want shape
		why  string
	}{
		// Copies 25 ms of 1,025: a second buffer could hide 2.4%, under
		// minGain, and halves the chunks: kept.
		"tiny copies keep one buffer": {
			fig:  figures{overlap: true, runs: 100_000, copy: 25 * ms, compute: 1000 * ms, wall: 1026 * ms},
			lim:  limits{devLen: dev(100_000, 57_143, 40_000), runsLeft: 900_000},
			cur:  cur,
			want: cur, why: "kept 1 buffer, chunks of 100000 runs",
		},
		// Copies and compute 500 ms each: two buffers overlap them (max
		// 500 ms instead of 1,000 ms per 100,000 runs) at half the length.
		"copies as long as compute take two": {
			fig:  figures{overlap: true, runs: 100_000, copy: 500 * ms, compute: 500 * ms, wall: 1001 * ms},
			lim:  limits{devLen: dev(100_000, 50_000, 33_333), runsLeft: 900_000},
			cur:  cur,
			want: shape{k: 2, lag: 1, slots: 2, length: 50_000}, why: "chose 2 buffers",
		},
		// The same on a device whose copies and kernels share the
		// host's cores: nothing to hide, kept.
		"copies that do not overlap kernels": {
			fig:  figures{runs: 100_000, copy: 500 * ms, compute: 500 * ms, wall: 1001 * ms},
			lim:  limits{devLen: dev(100_000, 50_000, 33_333), runsLeft: 900_000},
			cur:  cur,
			want: cur, why: "share the host's cores",
		},
		// The same, with an explicit count of one: kept.
		"an explicit count wins": {
			fig:  figures{overlap: true, runs: 100_000, copy: 500 * ms, compute: 500 * ms, wall: 1001 * ms},
			lim:  limits{devLen: dev(100_000, 50_000, 33_333), runsLeft: 900_000, buffers: 1},
			cur:  cur,
			want: cur, why: "kept",
		},
		// A third buffer where memory holds three at the length of two.
		"three where they cost no length": {
			fig:  figures{overlap: true, runs: 100_000, copy: 500 * ms, compute: 500 * ms, wall: 1001 * ms},
			lim:  limits{devLen: dev(100_000, 100_000, 100_000), runsLeft: 900_000},
			cur:  cur,
			want: shape{k: 3, lag: 2, slots: 3, length: 100_000}, why: "chose 3 buffers",
		},
		// Writes of 400 ms behind 1,000 ms of compute, staged at 2,000
		// bytes a run in 300 MB of room: one output slot at 100,000 runs
		// (200 MB) writes in turn (1,400 ms); two slots of 75,000 runs
		// (300 MB) write behind (1,000 ms).
		"writes behind the device": {
			fig:  figures{overlap: true, runs: 100_000, copy: 10 * ms, compute: 1000 * ms, write: 400 * ms, wall: 1411 * ms},
			lim:  limits{devLen: dev(125_000, 62_500, 41_666), runsLeft: 3_900_000, room: 300_000_000, outRun: 2000},
			cur:  shape{k: 1, lag: 0, slots: 1, length: 100_000},
			want: shape{k: 1, lag: 1, slots: 2, length: 75_000}, why: "chose 1 buffer, the host 1 chunk ahead, 2 staging slots per output, chunks of 75000 runs",
		},
		// Each chunk costs 500 ms beyond its steps: chunks of half the
		// length would cost more than two buffers save.
		"dear chunks stay long": {
			fig:  figures{overlap: true, runs: 100_000, copy: 300 * ms, compute: 700 * ms, wall: 1500 * ms},
			lim:  limits{devLen: dev(100_000, 50_000, 33_333), runsLeft: 900_000},
			cur:  cur,
			want: cur, why: "kept",
		},
		// A GPU's kernels: per 100,000 runs copies 10 ms, compute 10 ms,
		// writes 40 ms, 1 ms beyond. In turn, 60 ms: 9 chunks of the
		// 900,000 runs left, 549 ms. A second output slot writes behind
		// (40 ms: 369 ms) but pins 200 MB more at 1 ms a MiB (191 ms):
		// 560 ms, no better. Kept; with pinning free, chosen.
		"pinning dearer than the writes it hides": {
			fig:  figures{overlap: true, runs: 100_000, copy: 10 * ms, compute: 10 * ms, write: 40 * ms, wall: 61 * ms},
			lim:  limits{devLen: dev(100_000, 0, 0), runsLeft: 900_000, room: 1e9, outRun: 2000, held: 200_000_000, pinRate: 1e-3 / (1 << 20)},
			cur:  shape{k: 1, lag: 0, slots: 1, length: 100_000},
			want: shape{k: 1, lag: 0, slots: 1, length: 100_000}, why: "pinning staging took 1.02 s a GiB",
		},
		"pinning free": {
			fig:  figures{overlap: true, runs: 100_000, copy: 10 * ms, compute: 10 * ms, write: 40 * ms, wall: 61 * ms},
			lim:  limits{devLen: dev(100_000, 0, 0), runsLeft: 900_000, room: 1e9, outRun: 2000, held: 200_000_000},
			cur:  shape{k: 1, lag: 0, slots: 1, length: 100_000},
			want: shape{k: 1, lag: 1, slots: 2, length: 100_000}, why: "chose 1 buffer, the host 1 chunk ahead, 2 staging slots",
		},
		// Nothing but the current shape fits.
		"nothing else fits": {
			fig:  figures{overlap: true, runs: 100_000, copy: 500 * ms, compute: 500 * ms, wall: 1001 * ms},
			lim:  limits{devLen: dev(100_000, 0, 0), runsLeft: 900_000},
			cur:  shape{k: 1, lag: 1, slots: 2, length: 100_000},
			want: shape{k: 1, lag: 1, slots: 2, length: 100_000}, why: "kept",
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, why := choose(tc.fig, tc.lim, tc.cur)
			if got != tc.want || !strings.Contains(why, tc.why) {
				t.Errorf("choose = %+v, %q; want %+v, saying %q", got, why, tc.want, tc.why)
			}
		})
	}
}

// TestPredict: the model's times for the runs left, worked out by hand.
func TestPredict(t *testing.T) {
	ms := time.Millisecond
	// Per 1,000 runs: fill 100, copy 200, compute 500, write 300 ms;
	// 10 ms a chunk beyond them.
	f := figures{overlap: true, runs: 1000, fill: 100 * ms, copy: 200 * ms, compute: 500 * ms, write: 300 * ms, wall: 1110 * ms}
	tests := map[string]struct {
		s    shape
		want time.Duration
	}{
		"every step in turn":   {shape{k: 1, lag: 0, slots: 1, length: 1000}, 2*1100*ms + 2*10*ms},
		"writer behind":        {shape{k: 1, lag: 0, slots: 2, length: 1000}, 2*800*ms + 2*10*ms},
		"host ahead":           {shape{k: 1, lag: 1, slots: 2, length: 1000}, 2*700*ms + 2*10*ms},
		"two buffers, shorter": {shape{k: 2, lag: 1, slots: 2, length: 500}, 2*500*ms + 4*10*ms + 100*ms}, // + 500 runs' copies
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if got := predict(f, tc.s, 2000); got != tc.want {
				t.Errorf("predict(%+v) = %v, want %v", tc.s, got, tc.want)
			}
		})
	}
}
