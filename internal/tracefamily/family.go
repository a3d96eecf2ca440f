package tracefamily

import (
	"cmp"
	"fmt"
	"math"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"strings"

	"github.com/vramkit/vram/trace"
)

// Source is a trace members are made from.
type Source struct {
	Name   string
	Events []trace.Event
}

// Member is one generated trace.
type Member struct {
	Seed   uint64
	Name   string // how it was made: sources, window, scale, shift, reordering
	Events []trace.Event
}

// Peaks drawn for members, in bytes: log-uniform between them.
const (
	MinPeak = 16 << 20
	MaxPeak = 4 << 30
)

// Chances of each step, out of 1.
const (
	windowChance     = 0.5
	jitterChance     = 0.5
	interleaveChance = 0.35
	reorderChance    = 0.5
	sizeJitter       = 0.10 // each distinct size moves by up to this part
)

// Family makes the members of seeds first, first+1, … first+n−1.
func Family(sources []Source, first uint64, n int) []Member {
	out := make([]Member, n)
	for i := range out {
		out[i] = Make(sources, first+uint64(i))
	}
	return out
}

// Make makes the member of seed. It panics on no sources or a source with
// no allocation (a caller's bug: the sources are the caller's files).
func Make(sources []Source, seed uint64) Member {
	r := rand.New(rand.NewPCG(seed, 0x7ace))
	target := math.Exp(uniform(r, math.Log(MinPeak), math.Log(MaxPeak)))
	events, name := part(sources, r, target)
	if r.Float64() < interleaveChance {
		second, sname := part(sources, r, target*uniform(r, 0.2, 1))
		var shift string
		events, shift = interleave(events, second, r)
		name += " | " + sname + " " + shift
	}
	if r.Float64() < reorderChance {
		k := 2 + r.IntN(15)
		events = reorder(events, k, r)
		name += fmt.Sprintf(" | reordered within %d", k)
	}
	return Member{Seed: seed, Name: name, Events: events}
}

// part is one source's contribution to a member: a source drawn by the
// square root of its events (so that small placement problems are a
// minority), maybe a window of it, scaled to a peak of target bytes.
func part(sources []Source, r *rand.Rand, target float64) ([]trace.Event, string) {
	src := pick(sources, r)
	events := clean(src.Events)
	name := src.Name
	if r.Float64() < windowChance {
		length := uniform(r, 0.2, 0.8)
		lo := uniform(r, 0, 1-length)
		events = window(events, lo, lo+length)
		name += fmt.Sprintf("[%.2f–%.2f]", lo, lo+length)
	}
	peak := trace.Summarize(events).PeakLive
	if peak == 0 {
		panic(fmt.Sprintf("tracefamily: source %s has no allocation", src.Name))
	}
	jitter := 0.0
	if r.Float64() < jitterChance {
		jitter = sizeJitter
	}
	f := target / float64(peak)
	events = scale(events, f, jitter, r)
	name += fmt.Sprintf(" ×%.4g", f)
	if jitter > 0 {
		name += fmt.Sprintf(" ±%.0f%%", 100*jitter)
	}
	return events, name
}

func uniform(r *rand.Rand, lo, hi float64) float64 { return lo + (hi-lo)*r.Float64() }

// pick draws a source, each weighted by the square root of its events.
func pick(sources []Source, r *rand.Rand) Source {
	if len(sources) == 0 {
		panic("tracefamily: no sources")
	}
	total := 0.0
	for _, s := range sources {
		total += math.Sqrt(float64(len(s.Events)))
	}
	x := r.Float64() * total
	for _, s := range sources {
		if x -= math.Sqrt(float64(len(s.Events))); x < 0 {
			return s
		}
	}
	return sources[len(sources)-1]
}

// clean keeps a trace's allocations and the frees of live blocks (an
// allocation of a live pointer frees the earlier block first), each
// block's pointer replaced by its number: 1, 2, 3… in order of
// allocation. Zero-byte allocations and failures go.
func clean(events []trace.Event) []trace.Event {
	live := map[uint64]uint64{}
	out := make([]trace.Event, 0, len(events))
	next := uint64(0)
	for _, e := range events {
		switch {
		case e.Action == trace.Allocate && e.Size > 0:
			if id, ok := live[e.Pointer]; ok {
				out = append(out, trace.Event{Time: e.Time, Action: trace.Free, Pointer: id, Stream: e.Stream})
			}
			next++
			live[e.Pointer] = next
			e.Pointer = next
			out = append(out, e)
		case e.Action == trace.Free:
			id, ok := live[e.Pointer]
			if !ok {
				continue
			}
			delete(live, e.Pointer)
			e.Pointer = id
			out = append(out, e)
		}
	}
	for i := range out {
		out[i].Thread = 0
	}
	return out
}

// window keeps the events from fraction lo to hi of a clean trace: the
// blocks live where it starts are allocated first, at its first time, in
// the order they were allocated (as a snapshot taken mid-run records
// them), then its events, frees of blocks from before included.
func window(events []trace.Event, lo, hi float64) []trace.Event {
	a, b := int(lo*float64(len(events))), int(hi*float64(len(events)))
	b = max(b, a+1)
	live := map[uint64]trace.Event{}
	for _, e := range events[:a] {
		if e.Action == trace.Allocate {
			live[e.Pointer] = e
		} else {
			delete(live, e.Pointer)
		}
	}
	start := make([]trace.Event, 0, len(live)+b-a)
	for _, e := range live {
		e.Time = events[a].Time
		start = append(start, e)
	}
	slices.SortFunc(start, func(x, y trace.Event) int { return cmp.Compare(x.Pointer, y.Pointer) })
	t0 := events[a].Time
	out := append(start, events[a:b]...)
	for i := range out {
		out[i].Time -= t0
	}
	return out
}

// scale multiplies every size by f, each distinct size moved by a factor
// drawn once from [1 − jitter, 1 + jitter], rounded up to 512 bytes (at
// least 512): blocks of one size keep one size.
func scale(events []trace.Event, f, jitter float64, r *rand.Rand) []trace.Event {
	sizes := map[uint64]uint64{}
	var distinct []uint64
	for _, e := range events {
		if _, ok := sizes[e.Size]; !ok && e.Action == trace.Allocate {
			sizes[e.Size] = 0
			distinct = append(distinct, e.Size)
		}
	}
	slices.Sort(distinct) // the draws go to sizes in one order, not the map's
	for _, s := range distinct {
		g := f
		if jitter > 0 {
			g *= uniform(r, 1-jitter, 1+jitter)
		}
		sizes[s] = max(uint64(math.Ceil(float64(s)*g/512))*512, 512)
	}
	out := slices.Clone(events)
	live := map[uint64]uint64{}
	for i, e := range out {
		if e.Action == trace.Allocate {
			out[i].Size = sizes[e.Size]
			live[e.Pointer] = out[i].Size
		} else {
			out[i].Size = live[e.Pointer]
		}
	}
	return out
}

// interleave merges b into a by time, b's times stretched to a's length
// times a factor from [0.5, 1.5] and shifted to start between a quarter of
// a's length before a's start and three quarters after; on half the
// members b runs on a stream of its own. Times start at 0.
func interleave(a, b []trace.Event, r *rand.Rand) ([]trace.Event, string) {
	da, db := duration(a), duration(b)
	stretch := uniform(r, 0.5, 1.5)
	if db > 0 {
		stretch *= max(da, 1e-6) / db
	}
	shift := uniform(r, -0.25, 0.75) * da
	stream := uint64(0)
	if r.IntN(2) == 1 {
		stream = 1
	}
	var maxID uint64
	for _, e := range a {
		maxID = max(maxID, e.Pointer)
	}
	out := make([]trace.Event, 0, len(a)+len(b))
	out = append(out, a...)
	for _, e := range b {
		e.Time = shift + e.Time*stretch
		e.Pointer += maxID
		e.Stream = stream
		out = append(out, e)
	}
	slices.SortStableFunc(out, func(x, y trace.Event) int { return cmp.Compare(x.Time, y.Time) })
	t0 := out[0].Time
	for i := range out {
		out[i].Time -= t0
	}
	return out, fmt.Sprintf("@%+.3g s on stream %d", shift, stream)
}

func duration(events []trace.Event) float64 {
	if len(events) == 0 {
		return 0
	}
	return events[len(events)-1].Time - events[0].Time
}

// reorder moves each event by up to k places at random (a sort on its
// index plus a draw from [0, k)), keeping every free after its block's
// allocation; the times stay where they were, in order.
func reorder(events []trace.Event, k int, r *rand.Rand) []trace.Event {
	type keyed struct {
		key float64
		e   trace.Event
	}
	ks := make([]keyed, len(events))
	for i, e := range events {
		ks[i] = keyed{float64(i) + float64(k)*r.Float64(), e}
	}
	slices.SortStableFunc(ks, func(x, y keyed) int { return cmp.Compare(x.key, y.key) })
	out := make([]trace.Event, 0, len(events))
	allocated := map[uint64]bool{}
	waiting := map[uint64]trace.Event{} // frees that came before their allocation
	for _, x := range ks {
		e := x.e
		if e.Action == trace.Free && !allocated[e.Pointer] {
			waiting[e.Pointer] = e
			continue
		}
		out = append(out, e)
		if e.Action == trace.Allocate {
			allocated[e.Pointer] = true
			if f, ok := waiting[e.Pointer]; ok {
				delete(waiting, e.Pointer)
				out = append(out, f)
			}
		}
	}
	for i := range out {
		out[i].Time = events[i].Time
	}
	return out
}

// Describe is a one-line summary of members: how many, their events and
// peaks.
func Describe(members []Member) string {
	if len(members) == 0 {
		return "no members"
	}
	var events []int
	var peaks []uint64
	for _, m := range members {
		events = append(events, len(m.Events))
		peaks = append(peaks, trace.Summarize(m.Events).PeakLive)
	}
	slices.Sort(events)
	slices.Sort(peaks)
	var b strings.Builder
	fmt.Fprintf(&b, "%d members, events %d–%d (median %d), peak live %d–%d bytes (median %d)",
		len(members), events[0], events[len(events)-1], events[len(events)/2], peaks[0], peaks[len(peaks)-1], peaks[len(peaks)/2])
	return b.String()
}

// Load reads every RMM log (*.csv) in dir as a source, by file name.
func Load(dir string) ([]Source, error) {
	paths, err := filepath.Glob(filepath.Join(dir, "*.csv"))
	if err != nil {
		return nil, err
	}
	slices.Sort(paths)
	var out []Source
	for _, p := range paths {
		events, err := trace.ReadFile(p)
		if err != nil {
			return nil, err
		}
		out = append(out, Source{Name: strings.TrimSuffix(filepath.Base(p), ".csv"), Events: events})
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("tracefamily: no RMM logs (*.csv) in %s", dir)
	}
	return out, nil
}
