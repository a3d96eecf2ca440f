package oscillator

import (
	"math"

	"github.com/vramkit/vram/kernel"
)

// goForm is the kernel's Go form, for devices that run Go kernels. Its
// arguments are those of the PTX entry, in its order (see Args): typed
// views of the four arrays, then N, LD, Dt, Steps and Every. It computes
// in float32 like the PTX form, with math.Cos in place of the GPU's fast
// cosine.
func goForm(a kernel.Args, lo, hi int) error {
	init, params, out, status := a.Float32s(0), a.Float32s(1), a.Float32s(2), a.Int32s(3)
	ld, dt, steps, every := int(a.Uint32(5)), a.Float32(6), a.Uint32(7), a.Uint32(8)
	for i := lo; i < hi; i++ {
		integrate32(init, params, out, status, ld, i, dt, steps, every)
	}
	return nil
}

func finite32(x float32) bool { return !math.IsNaN(float64(x)) && !math.IsInf(float64(x), 0) }

// integrate32 is one thread of the kernel: run i, in float32, step for step
// as oscillate.ptx.
func integrate32(init, params, out []float32, status []int32, ld, i int, dt float32, steps, every uint32) {
	x, v := init[i], init[ld+i]
	w, zeta := params[i], params[ld+i]
	amp, drive := params[2*ld+i], params[3*ld+i]
	nc1, nc2 := -2*(zeta*w), -(w * w)
	half, sixth := dt*0.5, dt/6
	cos := func(t float32) float32 { return amp * float32(math.Cos(float64(drive*t))) }
	out[outIndex(ld, 0, 0, i)] = x
	out[outIndex(ld, 0, 1, i)] = v
	bad := !finite32(x) || !finite32(v)
	s, cnt := 1, uint32(0)
	for k := uint32(1); k <= steps; k++ {
		t := float32(k-1) * dt
		c0, ch, c1 := cos(t), cos(t+half), cos(t+dt)
		k1x, k1v := v, nc1*v+c0+nc2*x
		xs, vs := x+half*k1x, v+half*k1v
		k2x, k2v := vs, nc1*vs+ch+nc2*xs
		xs, vs = x+half*k2x, v+half*k2v
		k3x, k3v := vs, nc1*vs+ch+nc2*xs
		xs, vs = x+dt*k3x, v+dt*k3v
		k4x, k4v := vs, nc1*vs+c1+nc2*xs
		x += sixth * (k1x + 2*(k2x+k3x) + k4x)
		v += sixth * (k1v + 2*(k2v+k3v) + k4v)
		if cnt++; cnt == every {
			cnt = 0
			out[outIndex(ld, s, 0, i)] = x
			out[outIndex(ld, s, 1, i)] = v
			s++
			bad = bad || !finite32(x) || !finite32(v)
		}
	}
	bad = bad || !finite32(x) || !finite32(v)
	var st int32
	if bad {
		st = 1
	}
	status[i] = st
}
