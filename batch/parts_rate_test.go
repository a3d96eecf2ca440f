package batch

import (
	"cmp"
	"container/heap"
	"fmt"
	"testing"
	"time"
)

// simDevice is one device of dealSim: its rate, the chunks it may hold
// at once (its buffers in flight) and what each chunk costs beyond its
// runs.
type simDevice struct {
	rate     float64       // runs per second
	inFlight int           // chunks it holds at once
	alone    bool          // its first chunk runs alone (a probe: buffers to choose, or arrays staged)
	overhead time.Duration // per chunk
	limit    int           // its plan's chunk length
}

// simEvent is a device's chunk ending at a time.
type simEvent struct {
	at         time.Duration
	part, runs int
}

type simEvents []simEvent

func (e simEvents) Len() int { return len(e) }
func (e simEvents) Less(i, j int) bool {
	return e[i].at < e[j].at || (e[i].at == e[j].at && e[i].part < e[j].part)
}
func (e simEvents) Swap(i, j int) { e[i], e[j] = e[j], e[i] }
func (e *simEvents) Push(x any)   { *e = append(*e, x.(simEvent)) }
func (e *simEvents) Pop() any {
	old := *e
	x := old[len(old)-1]
	*e = old[:len(old)-1]
	return x
}

// dealResult is what a dealt batch did: when the last chunk ended, and
// each device's runs and chunks.
type dealResult struct {
	wall    time.Duration
	runs    []int
	chunks  []int
	longest []int // each device's longest chunk
}

// dealSim deals a batch of runs over devs from one runQueue on a clock of
// its own: each device runs its chunks one after another, each taking
// runs/rate plus its overhead, and takes its next chunk as soon as it
// holds fewer than inFlight. No wall time is involved.
func dealSim(runs int, devs []simDevice) dealResult {
	q := newRunQueue(runs, len(devs))
	var now time.Duration
	q.now = func() time.Duration { return now }
	res := dealResult{runs: make([]int, len(devs)), chunks: make([]int, len(devs)), longest: make([]int, len(devs))}
	free := make([]time.Duration, len(devs)) // when each device is done with what it holds
	held := make([]int, len(devs))
	var ev simEvents
	fill := func(i int) {
		for held[i] < devs[i].inFlight && (!devs[i].alone || held[i] == 0 || res.chunks[i] > 1) {
			ch, ok := q.take(i, devs[i].limit)
			if !ok {
				return
			}
			held[i]++
			res.runs[i] += ch.len
			res.chunks[i]++
			res.longest[i] = max(res.longest[i], ch.len)
			free[i] = max(free[i], now) + devs[i].overhead + time.Duration(float64(ch.len)/devs[i].rate*float64(time.Second))
			heap.Push(&ev, simEvent{at: free[i], part: i, runs: ch.len})
		}
	}
	for i := range devs {
		fill(i)
	}
	for ev.Len() > 0 {
		e := heap.Pop(&ev).(simEvent)
		now = e.at
		res.wall = max(res.wall, now)
		held[e.part]--
		q.done(e.part, e.runs)
		fill(e.part)
	}
	return res
}

// TestDealByRate: a batch dealt over devices of unequal speed, on an
// injected clock. The rule (parts.go): probes of ⌈left/64P⌉, then each
// device's share of half the runs left by its measured rate, and no
// chunk for a device that would end it after the others finish all that
// is left. A fast device with one 4× slower is at least 1.15× faster
// than the fast one alone (ideal 1.25×: 4 + 1 runs a second for 4) and
// never slower, with the slow one's share of the runs near its speed's
// (1/5 = 20 %).
func TestDealByRate(t *testing.T) {
	const runs = 4_000_000
	const limit = runs / 32 // each device's plan: 32 chunks of the batch
	dev := func(rate float64, inFlight int) simDevice {
		return simDevice{rate: rate, inFlight: inFlight, overhead: 5 * time.Millisecond, limit: limit}
	}
	tests := map[string]struct {
		devs     []simDevice
		runs     int     // 0: 4,000,000
		minSpeed float64 // the fast device alone's time over the batch's, at least
		share    [2]float64
	}{
		// Alone: 4M runs at 100k/s, 40 s (and 32 chunks × 5 ms).
		// Ideal with 25k/s beside: 4M/125k = 32 s, 1.25×.
		"4× slower, one buffer":     {devs: []simDevice{dev(100e3, 1), dev(25e3, 1)}, minSpeed: 1.15, share: [2]float64{0.15, 0.22}},
		"4× slower, two buffers":    {devs: []simDevice{dev(100e3, 2), dev(25e3, 2)}, minSpeed: 1.15, share: [2]float64{0.15, 0.22}},
		"4× slower, the slow first": {devs: []simDevice{dev(25e3, 2), dev(100e3, 2)}, minSpeed: 1.15, share: [2]float64{0.78, 0.85}},
		// Equal: ideal 2×.
		"equal": {devs: []simDevice{dev(100e3, 1), dev(100e3, 1)}, minSpeed: 1.8, share: [2]float64{0.45, 0.55}},
		// 2× slower: ideal 1.5×.
		"2× slower": {devs: []simDevice{dev(100e3, 2), dev(50e3, 2)}, minSpeed: 1.35, share: [2]float64{0.28, 0.38}},
		// Much slower: never slower than the fast one alone, the slow one
		// holding little.
		"20× slower":  {devs: []simDevice{dev(100e3, 2), dev(5e3, 2)}, minSpeed: 1.0, share: [2]float64{0, 0.06}},
		"100× slower": {devs: []simDevice{dev(100e3, 2), dev(1e3, 2)}, minSpeed: 1.0, share: [2]float64{0, 0.02}},
		// Each at its own length: a device that holds the batch whole
		// beside one whose plan is 1/32 of it, as fast: ideal 2×.
		"each at its own length": {devs: []simDevice{{rate: 100e3, inFlight: 2, overhead: 5 * time.Millisecond, limit: runs}, dev(100e3, 2)}, minSpeed: 1.8, share: [2]float64{0.45, 0.55}},
		// As `vram run --devices` on two simulators of 20 and 80 µs a
		// run: 400,000 runs, plans of 36,364, three buffers after a probe
		// that runs alone, 40 ms a chunk beyond its runs (a small probe's
		// rate is then half its device's). Alone: 11 chunks, 8.44 s;
		// ideal (47.4k + 12.3k runs/s) 6.7 s, 1.26×.
		"4× slower, small plans, dear chunks": {devs: []simDevice{
			{rate: 50e3, inFlight: 3, alone: true, overhead: 40 * time.Millisecond, limit: 36364},
			{rate: 12.5e3, inFlight: 3, alone: true, overhead: 40 * time.Millisecond, limit: 36364}}, runs: 400_000, minSpeed: 1.15, share: [2]float64{0.12, 0.22}},
		// Four devices, one 4× slower: ideal 13/4 = 3.25×.
		"four, one 4× slower": {devs: []simDevice{dev(100e3, 2), dev(100e3, 2), dev(100e3, 2), dev(25e3, 2)}, minSpeed: 2.9, share: [2]float64{0.05, 0.09}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			fast := 0
			for i, d := range tc.devs {
				if d.rate > tc.devs[fast].rate {
					fast = i
				}
			}
			runs := cmp.Or(tc.runs, runs)
			alone := dealSim(runs, tc.devs[fast:fast+1])
			got := dealSim(runs, tc.devs)
			total := 0
			for _, n := range got.runs {
				total += n
			}
			if total != runs {
				t.Fatalf("the devices ran %d runs of %d", total, runs)
			}
			speed := alone.wall.Seconds() / got.wall.Seconds()
			last := len(tc.devs) - 1
			share := float64(got.runs[last]) / float64(runs)
			t.Logf("%v alone, %v together (%.3f×); runs %v, chunks %v", alone.wall, got.wall, speed, got.runs, got.chunks)
			if speed < tc.minSpeed {
				t.Errorf("%.3f× the fast device alone's speed; want at least %.2f×", speed, tc.minSpeed)
			}
			if share < tc.share[0] || share > tc.share[1] {
				t.Errorf("the last device ran %.1f %% of the runs; want %.0f–%.0f %%", 100*share, 100*tc.share[0], 100*tc.share[1])
			}
			for i, d := range tc.devs {
				if got.longest[i] > d.limit {
					t.Errorf("device %d cut a chunk of %d runs, past its plan's %d", i, got.longest[i], d.limit)
				}
				if d.limit >= runs && got.longest[i] <= limit && len(tc.devs) == 2 {
					t.Errorf("device %d, which holds the batch whole, cut chunks of at most %d runs: no longer than the other's plan of %d", i, got.longest[i], limit)
				}
			}
		})
	}
}

// The plain factoring of equal devices is kept: after their probes,
// each of P devices takes ⌈left/2P⌉, its chunks doubling until they get
// there. A device taking ahead of its probe gets a run a chunk until
// the probe is back.
func TestDealEqualFactoring(t *testing.T) {
	const runs = 1_000_000
	q := newRunQueue(runs, 2)
	var now time.Duration
	q.now = func() time.Duration { return now }
	a, _ := q.take(0, 1<<30)
	b, _ := q.take(1, 1<<30)
	if want := ceilDiv(runs, 128); a.len != want {
		t.Fatalf("probe of %d runs; want ⌈1,000,000/128⌉ = %d", a.len, want)
	}
	if ahead, _ := q.take(1, 1<<30); ahead.len != 1 {
		t.Fatalf("a chunk taken ahead of the probe: %d runs; want 1", ahead.len)
	}
	// Both at 10,000 runs a second.
	const rate = 10_000
	at := func(runs int) time.Duration { return time.Duration(float64(runs) / rate * float64(time.Second)) }
	now = at(b.len + 1)
	q.done(1, b.len+1)
	now = at(a.len)
	q.done(0, a.len)
	if got := fmt.Sprint(q.rates()); got != "[10000 10000]" {
		t.Fatalf("rates %s; want 10,000 runs a second each", got)
	}
	longest, left := a.len, runs-a.len-b.len-1
	for range 8 {
		c, _ := q.take(0, 1<<30)
		share := ceilDiv(left, 4)
		if want := min(2*longest, share); c.len != want {
			t.Fatalf("with %d runs left and a longest chunk of %d, a chunk of %d; want min(2 × %d, ⌈%d/4⌉) = %d",
				left, longest, c.len, longest, left, want)
		}
		if c.len == share {
			return // at ⌈left/2P⌉
		}
		left -= c.len
		longest = max(longest, c.len)
		now += at(c.len)
		q.done(0, c.len)
	}
	t.Fatalf("after 8 chunks, still short of ⌈left/2P⌉ (%d runs left, the longest chunk %d)", left, longest)
}
