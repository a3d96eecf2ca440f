package oscillator_test

import (
	"fmt"

	"github.com/vramkit/vram/internal/oscillator"
)

// The reference of an undamped, undriven oscillator returns to its start
// after one period, 2π/ω.
func ExampleReference() {
	const omega = 2.0
	period := 3.141592653589793 // 2π/ω
	steps := 1000
	s := oscillator.Reference(1, 0, omega, 0, 0, 0, period/float64(steps), steps, steps/4)
	for _, p := range s {
		fmt.Printf("x=%+.4f v=%+.4f\n", p.X, p.V)
	}
	// Output:
	// x=+1.0000 v=+0.0000
	// x=+0.0000 v=-2.0000
	// x=-1.0000 v=-0.0000
	// x=-0.0000 v=+2.0000
	// x=+1.0000 v=+0.0000
}
