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
