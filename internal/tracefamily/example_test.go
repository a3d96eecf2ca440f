package tracefamily_test

import (
	"fmt"

	"github.com/vramkit/vram/internal/tracefamily"
	"github.com/vramkit/vram/trace"
)

// A member of a family made from one small trace: how it was made is in
// its name, and its peak is drawn from 16 MiB–4 GiB.
func ExampleMake() {
	var events []trace.Event
	for i := range uint64(100) {
		events = append(events,
			trace.Event{Time: float64(i), Action: trace.Allocate, Pointer: 2*i + 1, Size: 3 << 20},
			trace.Event{Time: float64(i), Action: trace.Allocate, Pointer: 2*i + 2, Size: 1 << 20},
			trace.Event{Time: float64(i) + 0.5, Action: trace.Free, Pointer: 2*i + 1})
	}
	m := tracefamily.Make([]tracefamily.Source{{Name: "loop", Events: events}}, 7)
	s := trace.Summarize(m.Events)
	fmt.Println(m.Name)
	fmt.Printf("%d events, %d allocations, peak %d MiB\n", s.Events, s.Allocs, s.PeakLive>>20)
	// Output:
	// loop[0.13–0.88] ×0.8047 ±10%
	// 236 events, 162 allocations, peak 67 MiB
}
