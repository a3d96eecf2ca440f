package tracefamily

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"testing"

	"github.com/vramkit/vram/internal/sharedtraces"
	"github.com/vramkit/vram/trace"
)

// synthetic is a source of n steps of a training loop: a weight block
// live throughout, and each step activations of three sizes allocated,
// then freed in reverse.
func synthetic(name string, n int) Source {
	var ev []trace.Event
	ptr, t := uint64(0x1000), 0.0
	ev = append(ev, trace.Event{Time: t, Action: trace.Allocate, Pointer: ptr, Size: 64 << 20})
	for i := range n {
		var step []uint64
		for j, size := range []uint64{3 << 20, 1 << 20, 96 << 10} {
			p := ptr + uint64(1+i*3+j)*0x10000000
			t += 0.001
			ev = append(ev, trace.Event{Time: t, Action: trace.Allocate, Pointer: p, Size: size})
			step = append(step, p)
		}
		for j := len(step) - 1; j >= 0; j-- {
			t += 0.001
			ev = append(ev, trace.Event{Time: t, Action: trace.Free, Pointer: step[j]})
		}
	}
	return Source{Name: name, Events: ev}
}

// wellFormed reports what is wrong with a member's events: a free before
// its allocation or of a block not live, a pointer allocated while live,
// a size that is not a multiple of 512, a time going back.
func wellFormed(events []trace.Event) error {
	live := map[uint64]uint64{}
	last := 0.0
	for i, e := range events {
		if e.Time < last {
			return fmt.Errorf("event %d at %v s, after one at %v s", i, e.Time, last)
		}
		last = e.Time
		switch e.Action {
		case trace.Allocate:
			if _, ok := live[e.Pointer]; ok {
				return fmt.Errorf("event %d allocates %#x, live already", i, e.Pointer)
			}
			if e.Size == 0 || e.Size%512 != 0 {
				return fmt.Errorf("event %d allocates %d bytes; want a positive multiple of 512", i, e.Size)
			}
			live[e.Pointer] = e.Size
		case trace.Free:
			n, ok := live[e.Pointer]
			if !ok {
				return fmt.Errorf("event %d frees %#x, not live", i, e.Pointer)
			}
			if e.Size != n {
				return fmt.Errorf("event %d frees %#x as %d bytes; it has %d", i, e.Pointer, e.Size, n)
			}
			delete(live, e.Pointer)
		default:
			return fmt.Errorf("event %d is %v", i, e.Action)
		}
	}
	return nil
}

func sources() []Source { return []Source{synthetic("a", 200), synthetic("b", 50)} }

// TestMembers: every member is well formed, has a peak the generator can
// draw (interleaving two parts at most doubles it; jitter and rounding
// add a little), and the same seed makes the same member.
func TestMembers(t *testing.T) {
	src := sources()
	for seed := range uint64(200) {
		m := Make(src, seed)
		if err := wellFormed(m.Events); err != nil {
			t.Fatalf("seed %d (%s): %v", seed, m.Name, err)
		}
		peak := float64(trace.Summarize(m.Events).PeakLive)
		if peak < 0.5*MinPeak || peak > 2.5*MaxPeak {
			t.Errorf("seed %d (%s): peak live %.0f bytes; want about %d to %d", seed, m.Name, peak, MinPeak, 2*MaxPeak)
		}
		if again := Make(src, seed); !reflect.DeepEqual(again, m) {
			t.Fatalf("seed %d made two different members", seed)
		}
	}
	if reflect.DeepEqual(Make(src, 1).Events, Make(src, 2).Events) {
		t.Error("seeds 1 and 2 made the same events")
	}
}

// TestSharedMembers: members made from the shared traces are well formed.
func TestSharedMembers(t *testing.T) {
	src, err := Load(sharedtraces.Dir(t))
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range Family(src, 0, 32) {
		if err := wellFormed(m.Events); err != nil {
			t.Errorf("seed %d (%s): %v", m.Seed, m.Name, err)
		}
	}
}

// TestWindow: a window starts with the blocks live at its start, in the
// order they were allocated, at time 0, then its own events.
func TestWindow(t *testing.T) {
	a := func(p, n uint64, at float64) trace.Event {
		return trace.Event{Time: at, Action: trace.Allocate, Pointer: p, Size: n}
	}
	f := func(p uint64, at float64) trace.Event { return trace.Event{Time: at, Action: trace.Free, Pointer: p} }
	events := clean([]trace.Event{a(10, 512, 0), a(20, 1024, 1), f(10, 2), a(30, 2048, 3), f(20, 4), a(40, 512, 5), f(30, 6), f(40, 7)})
	// Pointers are numbered: 10 → 1, 20 → 2, 30 → 3, 40 → 4. Events
	// [4, 6) are f(2) at 4 s and a(4) at 5 s; live at event 4: blocks 2
	// and 3, allocated at the window's first time, which becomes 0.
	got := window(events, 0.5, 0.75)
	want := []trace.Event{a(2, 1024, 0), a(3, 2048, 0), f(2, 0), a(4, 512, 1)}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("window =\n%v\nwant\n%v", got, want)
	}
}

// TestReorder: events move by fewer than k places, and a free never
// comes before its allocation.
func TestReorder(t *testing.T) {
	events := clean(synthetic("a", 100).Events)
	r := rand.New(rand.NewPCG(1, 2))
	for _, k := range []int{2, 8, 16} {
		got := reorder(events, k, r)
		if err := wellFormed(scale(got, 1, 0, r)); err != nil {
			t.Fatalf("k %d: %v", k, err)
		}
		pos := map[trace.Event]int{}
		for i, e := range events {
			e.Time = 0
			pos[e] = i
		}
		moved := 0
		for i, e := range got {
			e.Time = 0
			if d := i - pos[e]; d != 0 {
				moved++
				if d <= -k || d >= 2*k {
					t.Errorf("k %d: event %d moved to %d", k, pos[e], i)
				}
			}
		}
		if moved == 0 {
			t.Errorf("k %d: nothing moved", k)
		}
	}
}

// FuzzMake: any seed makes a well-formed member.
func FuzzMake(f *testing.F) {
	src := sources()
	f.Add(uint64(0))
	f.Add(uint64(1 << 40))
	f.Fuzz(func(t *testing.T, seed uint64) {
		if err := wellFormed(Make(src, seed).Events); err != nil {
			t.Fatal(err)
		}
	})
}
