package batch

import "time"

// Overlap is overlap for the black-box tests, each interval as its start
// and end.
func Overlap(a, b [][2]time.Time) time.Duration {
	conv := func(l [][2]time.Time) []interval {
		var out []interval
		for _, iv := range l {
			out = append(out, interval{iv[0], iv[1]})
		}
		return out
	}
	return overlap(conv(a), conv(b))
}

// RunQueue is the queue RunParts deals chunks from, for the black-box
// tests.
type RunQueue struct{ q *runQueue }

// NewRunQueue is a queue of runs shared by parts.
func NewRunQueue(runs, parts int) RunQueue { return RunQueue{newRunQueue(runs, parts)} }

// Take is part's next chunk of at most limit runs: its first run and its
// runs, or ok false when none are left.
func (q RunQueue) Take(part, limit int) (start, n int, ok bool) {
	ch, ok := q.q.take(part, limit)
	return ch.start, ch.len, ok
}

// MinGain is the least predicted or measured saving for which a run
// changes its shape.
const MinGain = minGain
