package batch

// Choosing a run's shape from what its first chunk cost: how many
// buffers in flight, how far the host stays ahead, how many staging
// slots its outputs get (write-behind), and the chunk length all that
// leaves. A pure function of the figures, so that it is tested alone.
//
// The model. The probe chunk runs alone, each step waited for, and
// gives per run: f, the host's time filling staged inputs; c, the
// device's copies; g, its compute; w, the writer's time draining staged
// outputs; and o, what the chunk cost beyond them (its overhead, paid
// once a chunk). A shape of k buffers, lag chunks of host lead and n
// output slots runs a run in
//
//	dev = c + g (k = 1; one stream does both) or max(c, g) (k ≥ 2, on a
//	      device whose copies and kernels overlap: device.Overlapper),
//	lag 0, n = 1: dev + f + w     (every step in turn)
//	lag 0, n ≥ 2: max(dev + f, w) (the writer drains behind the device)
//	lag ≥ 1:      max(dev, f, w)  (the host fills ahead, the writer drains behind)
//
// plus o per chunk, with k ≥ 2 one chunk's copies (the first chunk's in
// and the last's out overlap nothing), and the time to pin the staging
// it holds beyond what the run and the pool's idle buffers hold already,
// at the rate the pool's pinning went (on a GPU about a millisecond a
// MiB: a slot more can cost more than the writes it hides). Its chunk
// length is
// the least of the device's plan for k buffers (a second buffer halves
// it, near enough), what the
// staging slots leave (L × Σ bytes per run × slots ≤ the staging room)
// and the batch's cap. The shape with the least predicted time for the
// runs left wins, but only if it beats the shape the probe ran by more
// than minGain: a prediction from one chunk is no finer than that, and
// a re-cut is not free. k = 3 buys no more than 2 in this model (one copy
// stream); it is taken, with its lead of two chunks, only where it costs
// no chunk length, for the slack it gives against uneven chunks. The
// model takes overlap to be free, as a GPU's copy engines and kernels
// are beside the host; where the host's own cores run the kernels (the
// simulator) it may not be, and the looks (look.go) measure what a
// change bought and undo it when it bought nothing.

import (
	"fmt"
	"time"
)

// minGain is the least predicted saving, as a fraction of the time left,
// for which a run changes the shape its probe chunk ran with.
const minGain = 0.03

// figures are the probe chunk's costs.
type figures struct {
	runs                       int // the chunk's runs
	fill, copy, compute, write time.Duration
	wall                       time.Duration // the whole chunk, first step to drained
	from                       string        // where the figures come from, for messages ("" : the first chunk)
	// overlap says that the device runs copies beside kernels at full
	// speed (device.Overlapper): without it a second buffer hides
	// nothing.
	overlap bool
}

// overhead is what the chunk cost beyond its steps.
func (f figures) overhead() time.Duration {
	return max(0, f.wall-f.fill-f.copy-f.compute-f.write)
}

// shape is a run's configuration.
type shape struct {
	k, lag, slots int // buffers in flight; chunks the host stays ahead; staging slots per output
	length        int // runs a chunk is cut at
}

// words says s; staged says whether its lead and slots matter.
func (s shape) words(staged bool) string {
	if !staged {
		return fmt.Sprintf("%s, chunks of %s", plural(s.k, "buffer"), plural(s.length, "run"))
	}
	return fmt.Sprintf("%s, the host %s ahead, %s per output, chunks of %s",
		plural(s.k, "buffer"), plural(s.lag, "chunk"), plural(s.slots, "staging slot"), plural(s.length, "run"))
}

// limits bound the shapes a run may take.
type limits struct {
	devLen   [MaxBuffers + 1]int // the device plan's chunk length with k buffers; 0: none fits
	maxLen   int                 // Options.MaxChunkLength (0: none)
	room     uint64              // staging bytes the run may hold
	inRun    uint64              // staging bytes per run of its staged inputs
	outRun   uint64              // and of its staged outputs
	buffers  int                 // Options.Buffers: 0 to choose, else that many
	runsLeft int
	held     uint64  // staging bytes the run holds now, and the pool's idle ones (reused, not pinned)
	pinRate  float64 // seconds to pin a byte of staging, as the pool's pinning went (0: none measured)
}

// pinCost is the time pinning the staging s holds beyond what the run
// holds now takes: its slots, no more than the chunks left, at its
// length.
func (l limits) pinCost(s shape) time.Duration {
	chunks := uint64((l.runsLeft + max(s.length, 1) - 1) / max(s.length, 1))
	bytes := (l.inRun*min(uint64(s.lag+s.k), chunks) + l.outRun*min(uint64(s.slots), chunks)) * uint64(max(s.length, 0))
	if bytes <= l.held {
		return 0
	}
	return time.Duration(float64(bytes-l.held) * l.pinRate * float64(time.Second))
}

// cost is the time s takes for the runs left: predict's, and its
// pinning.
func cost(f figures, l limits, s shape) time.Duration {
	return predict(f, s, l.runsLeft) + l.pinCost(s)
}

// length is the chunk length s's resources leave (0: none).
func (l limits) length(s shape) int {
	n := l.devLen[s.k]
	if l.maxLen > 0 {
		n = min(n, l.maxLen)
	}
	if per := l.inRun*uint64(s.lag+s.k) + l.outRun*uint64(s.slots); per > 0 {
		n = min(n, int(min(l.room/per, uint64(n))))
	}
	return max(n, 0)
}

// predict is the time f says s takes for the runs left.
func predict(f figures, s shape, runsLeft int) time.Duration {
	per := func(d time.Duration) float64 { return float64(d) / float64(max(f.runs, 1)) }
	c, g, fl, w := per(f.copy), per(f.compute), per(f.fill), per(f.write)
	dev := c + g
	if s.k > 1 && f.overlap {
		dev = max(c, g)
	}
	var run float64
	switch {
	case s.lag == 0 && s.slots < 2:
		run = dev + fl + w
	case s.lag == 0:
		run = max(dev+fl, w)
	default:
		run = max(dev, fl, w)
	}
	chunks := (runsLeft + s.length - 1) / max(s.length, 1)
	t := run*float64(runsLeft) + float64(chunks)*float64(f.overhead())
	if s.k > 1 && f.overlap {
		t += c * float64(min(s.length, runsLeft)) // the first chunk's copies in and the last's out hide behind nothing
	}
	return time.Duration(t)
}

// bestOf is the best shape with k buffers, by lead and output slots, and
// its predicted time; k 0 when none fits.
func bestOf(f figures, l limits, k int) (shape, time.Duration) {
	var best shape
	var bestT time.Duration
	for lag := max(1, k-1); lag >= 0; lag-- {
		for slots := lag + 1; slots <= lag+2; slots++ {
			s := shape{k: k, lag: lag, slots: slots}
			if s.length = l.length(s); s.length < 1 {
				continue
			}
			if k == 3 && (lag < 2 || s.length < l.length(shape{k: 2, lag: 1, slots: slots - 1})) {
				continue // a third buffer for its lead of two chunks, and only where that costs no length
			}
			if t := cost(f, l, s); best.k == 0 || t < bestT {
				best, bestT = s, t
			}
		}
	}
	return best, bestT
}

// choose picks the shape for the runs left after the probe, which ran
// with cur; it returns cur when nothing beats it by minGain, and says why.
func choose(f figures, l limits, cur shape) (shape, string) {
	curT := cost(f, l, cur)
	var best shape
	var bestT time.Duration
	for k := 1; k <= MaxBuffers; k++ {
		if l.buffers > 0 && k != l.buffers {
			continue
		}
		s, t := bestOf(f, l, k)
		// More buffers only for what they buy: a second beats one by
		// minGain; a third, which costs no length, at least ties two.
		switch {
		case s.k == 0:
		case best.k == 0, k == 3 && t <= bestT, float64(t) < (1-minGain)*float64(bestT):
			best, bestT = s, t
		}
	}
	staged := l.inRun+l.outRun > 0
	per := func(d time.Duration) string { return fmt.Sprintf("%.3g s", d.Seconds()) }
	from := f.from
	if from == "" {
		from = "the first chunk"
	}
	costs := fmt.Sprintf("%s (%s) took %s copying, %s computing", from, plural(f.runs, "run"), per(f.copy), per(f.compute))
	if staged {
		costs += fmt.Sprintf(", %s filling and %s writing", per(f.fill), per(f.write))
	}
	if !f.overlap {
		costs += " (on this device copies and kernels share the host's cores: a second buffer hides nothing)"
	}
	if staged && l.pinRate > 0 {
		costs += fmt.Sprintf("; pinning staging took %.3g s a GiB", l.pinRate*(1<<30))
	}
	switch {
	case best.k == 0 || best.words(staged) == cur.words(staged):
		return cur, fmt.Sprintf("kept %s: %s; for the %s left it predicts %.3g s, and nothing else better", cur.words(staged), costs,
			plural(l.runsLeft, "run"), curT.Seconds())
	case float64(bestT) > (1-minGain)*float64(curT):
		return cur, fmt.Sprintf("kept %s: %s; for the %s left it predicts %.3g s, the best other (%s) %.3g s, not %.0f%% better",
			cur.words(staged), costs, plural(l.runsLeft, "run"), curT.Seconds(), best.words(staged), bestT.Seconds(), 100*minGain)
	}
	return best, fmt.Sprintf("chose %s: %s; for the %s left it predicts %.3g s, instead of %.3g s with %s",
		best.words(staged), costs, plural(l.runsLeft, "run"), bestT.Seconds(), curT.Seconds(), cur.words(staged))
}
