package capi

import (
	"context"
	"errors"
	"testing"
	"unsafe"

	"github.com/vramkit/vram"
	"github.com/vramkit/vram/device"
)

// FuzzCopy: a copy between C's host memory (any shape, any span, as C may
// pass them) and a (3, 16) float32 device array either is refused, with an
// error naming a mismatch or a bad request, and touches nothing, or moves
// exactly the span's runs: the device's first span.len runs of each row to
// or from the host's runs [start, start+len), and not one byte outside the
// host array.
func FuzzCopy(f *testing.F) {
	var r Registry
	var cs Clients
	m, err := r.Open(Options{Spec: "sim:vram=16MiB"})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { _ = cs.CloseManager(&r, m.Handle()) })
	c, err := cs.Register(m, ClientOptions{Name: "fuzz"})
	if err != nil {
		f.Fatal(err)
	}
	if err := cs.Queue(c, map[string]vram.ArrayRequest{"a": {Shape: []int{3, 16}, DType: vram.Float32, ChunkAxis: 1}}); err != nil {
		f.Fatal(err)
	}
	rh, err := cs.Allocate(c, 0)
	if err != nil {
		f.Fatal(err)
	}
	dev := make([]float32, 48) // the device array's contents, kept in step
	for i := range dev {
		dev[i] = float32(1000 + i)
	}
	sync := func() error {
		return cs.Do(c, "sync", func(c *vram.Client) error { return c.Sync(context.Background()) })
	}
	if err := cs.Copy(true, c, rh, "a", 0, f32(dev, 3, 16), nil); err != nil {
		f.Fatal(err)
	}
	f.Add(uint8(3), uint8(20), int8(1), int8(4), int8(8), true)
	f.Add(uint8(3), uint8(20), int8(1), int8(12), int8(8), false)
	f.Add(uint8(3), uint8(16), int8(0), int8(0), int8(3), false)
	f.Add(uint8(2), uint8(16), int8(1), int8(0), int8(16), true)
	f.Add(uint8(3), uint8(8), int8(1), int8(-1), int8(4), false)
	f.Fuzz(func(t *testing.T, rows, cols uint8, axis, start, n int8, toDevice bool) {
		const guard = 8
		R, C := int(rows), int(cols)
		buf := make([]float32, R*C+2*guard)
		for i := range buf {
			buf[i] = -7
		}
		host := buf[guard : guard+R*C]
		for i := range host {
			host[i] = float32(i)
		}
		sp := vram.Span{Axis: int(axis), Start: int(start), Len: int(n)}
		hd := HostDesc{Data: unsafe.Pointer(&buf[guard]), Shape: []int{R, C}, DType: vram.Float32}
		err := cs.Copy(toDevice, c, rh, "a", 0, hd, &sp)
		if serr := sync(); serr != nil {
			t.Fatal(serr)
		}
		for i := range guard {
			if buf[i] != -7 || buf[len(buf)-1-i] != -7 {
				t.Fatalf("a copy of %+v with host shape (%d, %d) wrote outside the host array", sp, R, C)
			}
		}
		valid := R == 3 && sp.Axis == 1 && sp.Start >= 0 && sp.Len >= 0 && sp.Start+sp.Len <= C && sp.Len <= 16 ||
			C == 16 && sp.Axis == 0 && sp.Start >= 0 && sp.Len >= 0 && sp.Start+sp.Len <= R && sp.Len <= 3
		if R == 0 || C == 0 {
			valid = false
		}
		if err != nil {
			if valid || !(errors.Is(err, vram.ErrMismatch) || errors.Is(err, vram.ErrInvalidRequest) || errors.Is(err, device.ErrInvalidValue)) {
				t.Fatalf("copy of %+v with host shape (%d, %d): %v (valid: %v)", sp, R, C, err, valid)
			}
			return
		}
		if !valid {
			t.Fatalf("copy of %+v with host shape (%d, %d) succeeded; want it refused", sp, R, C)
		}
		checkSpan(t, &cs, c, rh, dev, host, R, C, sp, toDevice, sync)
	})
}

// checkSpan checks what a copy of the runs sp moved, and keeps dev (the
// device array's contents) in step.
func checkSpan(t *testing.T, cs *Clients, c, rh int64, dev, host []float32, R, C int, sp vram.Span, toDevice bool, sync func() error) {
	t.Helper()
	for i := range R {
		for j := range C {
			// the device element that host[i, j] pairs with, if any
			di, dj, in := i, j-sp.Start, j >= sp.Start && j < sp.Start+sp.Len
			if sp.Axis == 0 {
				di, dj, in = i-sp.Start, j, i >= sp.Start && i < sp.Start+sp.Len
			}
			want := float32(i*C + j)
			if in && !toDevice {
				want = dev[di*16+dj]
			}
			if in && toDevice {
				dev[di*16+dj] = host[i*C+j]
			}
			if host[i*C+j] != want {
				t.Fatalf("host[%d, %d] = %v after a copy of %+v; want %v", i, j, host[i*C+j], sp, want)
			}
		}
	}
	if !toDevice {
		return
	}
	got := make([]float32, 48)
	if err := cs.Copy(false, c, rh, "a", 0, f32(got, 3, 16), nil); err != nil {
		t.Fatal(err)
	}
	if err := sync(); err != nil {
		t.Fatal(err)
	}
	for i := range got {
		if got[i] != dev[i] {
			t.Fatalf("device element %d = %v after a copy of %+v to the device; want %v", i, got[i], sp, dev[i])
		}
	}
}
