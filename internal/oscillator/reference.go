package oscillator

import (
	"fmt"
	"math"
)

// Tolerance is the relative tolerance of Verify: a device value d passes
// against the reference r when |d − r| ≤ Tolerance·(1 + |r|).
const Tolerance = 1e-3

// Reference integrates one run in float64 exactly as the kernels do in
// float32 — RK4 at step dt, the step starting at time t = (k−1)·dt computed
// by multiplication, not accumulation — and returns steps/every + 1
// samples, the first being (x0, v0). every must divide steps.
func Reference(x0, v0, omega, zeta, a, drive, dt float64, steps, every int) []Sample {
	if every <= 0 || steps < 0 || steps%every != 0 {
		panic(fmt.Sprintf("oscillator.Reference: steps %d and every %d: every must be positive and divide steps", steps, every))
	}
	c1, c2 := 2*zeta*omega, omega*omega
	f := func(t, x, v float64) (float64, float64) {
		return v, a*math.Cos(drive*t) - c1*v - c2*x
	}
	out := make([]Sample, 0, steps/every+1)
	out = append(out, Sample{x0, v0})
	x, v := x0, v0
	h := dt / 2
	for k := 1; k <= steps; k++ {
		t := float64(k-1) * dt
		k1x, k1v := f(t, x, v)
		k2x, k2v := f(t+h, x+h*k1x, v+h*k1v)
		k3x, k3v := f(t+h, x+h*k2x, v+h*k2v)
		k4x, k4v := f(t+dt, x+dt*k3x, v+dt*k3v)
		x += dt / 6 * (k1x + 2*k2x + 2*k3x + k4x)
		v += dt / 6 * (k1v + 2*k2v + 2*k3v + k4v)
		if k%every == 0 {
			out = append(out, Sample{x, v})
		}
	}
	return out
}

// ReferenceRun is Reference for r, with r's values and dt rounded to
// float32 first, as a device sees them.
func ReferenceRun(r Run, dt float32, steps, every int) []Sample {
	f := func(v float64) float64 { return float64(float32(v)) }
	return Reference(f(r.X0), f(r.V0), f(r.Omega), f(r.Zeta), f(r.A), f(r.Drive), float64(dt), steps, every)
}

// Verify checks device samples got against the reference want: the same
// count, and every x and v within Tolerance. The error names the first
// sample that fails and by how much.
func Verify(got, want []Sample) error {
	if len(got) != len(want) {
		return fmt.Errorf("oscillator: %d samples, want %d", len(got), len(want))
	}
	for k := range want {
		for _, c := range [2]struct {
			name string
			g, w float64
		}{{"x", got[k].X, want[k].X}, {"v", got[k].V, want[k].V}} {
			lim := Tolerance * (1 + math.Abs(c.w))
			if d := math.Abs(c.g - c.w); !(d <= lim) {
				return fmt.Errorf("oscillator: sample %d: %s = %.7g, reference %.7g: off by %.3g, more than the tolerance %.3g",
					k, c.name, c.g, c.w, d, lim)
			}
		}
	}
	return nil
}

// VerifyOutput checks a whole launch's results, copied back to the host:
// for each of runs (column i of the arrays), status 0 and samples within
// Tolerance of ReferenceRun. It reports the first run that fails.
func VerifyOutput(runs []Run, dt float32, steps, every uint32, ld int, out, status []byte) error {
	samples := Samples(steps, every)
	if uint64(len(status)) < StatusBytes(ld) || len(runs) > ld {
		return fmt.Errorf("oscillator: %d runs, status array of %d bytes for ld %d: %w", len(runs), len(status), ld, ErrArgs)
	}
	for i, r := range runs {
		if st := Status(status, i); st != 0 {
			return fmt.Errorf("oscillator: run %d (%+v): status %d, want 0", i, r, st)
		}
		got, err := Decode(out, ld, samples, i)
		if err != nil {
			return err
		}
		if err := Verify(got, ReferenceRun(r, dt, int(steps), int(every))); err != nil {
			return fmt.Errorf("run %d (%+v): %w", i, r, err)
		}
	}
	return nil
}
