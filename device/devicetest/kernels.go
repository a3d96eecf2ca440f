package devicetest

// Kernels: device.FuncLauncher (and device.ModuleLoader, through hold).

import (
	"sync/atomic"
	"testing"

	"github.com/vramkit/vram/device"
)

func testKernels(t *testing.T, o opener) {
	d := o.fresh(t)
	fl, isFL := d.(device.FuncLauncher)
	if !isFL {
		t.Skip("device is no device.FuncLauncher")
	}
	backed(t, d)
	s := d.DefaultStream()
	sizes := map[string]int{"one": 1, "small": 7, "odd": 1001, "large": 1 << 16}
	for _, name := range sortedKeys(sizes) {
		n := sizes[name]
		t.Run(name, func(t *testing.T) {
			p := ptr(t)(d.Malloc(uint64(n)))
			defer func() { ok(t, d.Free(p)) }()
			var calls atomic.Int64
			ok(t, fl.LaunchFunc(s, n, func(mem device.View, lo, hi int) error {
				calls.Add(1)
				b, err := mem.Bytes(p.Add(uint64(lo)), uint64(hi-lo))
				if err != nil {
					return err
				}
				for i := range b {
					b[i]++ // each index once: 1 everywhere, or a block ran twice
				}
				return nil
			}))
			got := make([]byte, n)
			ok(t, d.CopyDtoH(got, p, s))
			syncStream(t, s)
			for i, v := range got {
				if v != 1 {
					t.Fatalf("index %d was covered %d times, want once", i, v)
				}
			}
			if calls.Load() < 1 || calls.Load() > int64(n) {
				t.Errorf("%d blocks for %d indices", calls.Load(), n)
			}
		})
	}
	t.Run("view bounds", func(t *testing.T) {
		p := ptr(t)(d.Malloc(100))
		defer func() { ok(t, d.Free(p)) }()
		ok(t, fl.LaunchFunc(s, 1, func(mem device.View, lo, hi int) error {
			_, err := mem.Bytes(p.Add(50), 51)
			return err
		}))
		var err error
		within(t, "Synchronize", func() { err = s.Synchronize() })
		isErr(t, err, device.ErrOutOfBounds, "kernel access one byte past the end")
	})
}
