package alloc_test

import (
	"fmt"

	"github.com/vramkit/vram/alloc"
	"github.com/vramkit/vram/device/sim"
)

// Every allocator has one name; cubie's names are aliases of it.
func ExampleLookup() {
	for _, name := range []string{"pool", "cupy", "CUPY-ASYNC", "default", "expandable"} {
		e, err := alloc.Lookup(name)
		if err != nil {
			panic(err)
		}
		fmt.Printf("%-10s → %-10s kind %v, needs %v\n", name, e.Name, e.Kind, e.Needs)
	}
	// Output:
	// pool       → pool       kind pool, needs <nil>
	// cupy       → pool       kind pool, needs <nil>
	// CUPY-ASYNC → async      kind async, needs device.AsyncAllocator
	// default    → direct     kind direct, needs <nil>
	// expandable → expandable kind pool, needs device.VirtualMemory
}

// A kind is what is asked for; the entry New returns names what serves it,
// as the allocator's report does.
func ExampleKind_New() {
	dev, err := sim.New(sim.Config{TotalBytes: 1 << 30, AddressOnly: true})
	if err != nil {
		panic(err)
	}
	defer dev.Close()
	a, e, err := alloc.KindPool.New(dev, alloc.Configs{})
	if err != nil {
		panic(err)
	}
	defer a.Close()
	fmt.Printf("kind %v is served by %s (its report: %q)\n", alloc.KindPool, e.Name, alloc.ReportOf(a).Allocator)
	// Output:
	// kind pool is served by expandable (its report: "expandable")
}
