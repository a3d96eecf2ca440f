package oscillator

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/vramkit/vram/device"
)

// goKernel is the kernel as a Go function, for devices that run Go kernels.
type goKernel struct{ dev device.FuncLauncher }

// NewGo returns the Go form of the kernel on dev. It computes in float32
// like the PTX form, with math.Cos in place of the GPU's fast cosine.
func NewGo(dev device.FuncLauncher) Kernel { return goKernel{dev: dev} }

func (goKernel) Kind() string { return "go" }
func (goKernel) Close() error { return nil }

// Launch enqueues the kernel over a.N runs on s.
func (k goKernel) Launch(s device.Stream, a Args) error {
	if err := a.Check(); err != nil {
		return err
	}
	ld, samples := int(a.LD), Samples(a.Steps, a.Every)
	return k.dev.LaunchFunc(s, int(a.N), func(mem device.View, lo, hi int) error {
		init, err := mem.Bytes(a.Init, InitBytes(ld))
		if err != nil {
			return fmt.Errorf("oscillator: init: %w", err)
		}
		params, err := mem.Bytes(a.Params, ParamsBytes(ld))
		if err != nil {
			return fmt.Errorf("oscillator: params: %w", err)
		}
		out, err := mem.Bytes(a.Out, OutBytes(ld, samples))
		if err != nil {
			return fmt.Errorf("oscillator: out: %w", err)
		}
		status, err := mem.Bytes(a.Status, StatusBytes(ld))
		if err != nil {
			return fmt.Errorf("oscillator: status: %w", err)
		}
		for i := lo; i < hi; i++ {
			integrate32(init, params, out, status, ld, i, a.Dt, a.Steps, a.Every)
		}
		return nil
	})
}

func finite32(x float32) bool { return !math.IsNaN(float64(x)) && !math.IsInf(float64(x), 0) }

// integrate32 is one thread of the kernel: run i, in float32, step for step
// as oscillate.ptx.
func integrate32(init, params, out, status []byte, ld, i int, dt float32, steps, every uint32) {
	x, v := f32at(init, i), f32at(init, ld+i)
	w, zeta := f32at(params, i), f32at(params, ld+i)
	amp, drive := f32at(params, 2*ld+i), f32at(params, 3*ld+i)
	nc1, nc2 := -2*(zeta*w), -(w * w)
	half, sixth := dt*0.5, dt/6
	cos := func(t float32) float32 { return amp * float32(math.Cos(float64(drive*t))) }
	putf32(out, outIndex(ld, 0, 0, i), x)
	putf32(out, outIndex(ld, 0, 1, i), v)
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
			putf32(out, outIndex(ld, s, 0, i), x)
			putf32(out, outIndex(ld, s, 1, i), v)
			s++
			bad = bad || !finite32(x) || !finite32(v)
		}
	}
	bad = bad || !finite32(x) || !finite32(v)
	var st uint32
	if bad {
		st = 1
	}
	binary.LittleEndian.PutUint32(status[4*i:], st)
}
