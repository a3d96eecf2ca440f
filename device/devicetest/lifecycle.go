package devicetest

// Close, and use from many goroutines at once.

import (
	"sync"
	"testing"

	"github.com/vramkit/vram/device"
)

func testClosed(t *testing.T, o opener) {
	t.Run("device", func(t *testing.T) {
		d := o.fresh(t)
		s := d.DefaultStream()
		ns := strm(t)(d.NewStream())
		e := evt(t)(d.NewEvent())
		ok(t, e.Record(ns))
		ok(t, ns.Close())
		ok(t, e.Close())
		e2 := evt(t)(d.NewEvent()) // left open: Close takes it down
		ok(t, d.Close())
		calls := map[string]func() error{
			"MemInfo":     func() error { _, _, err := d.MemInfo(); return err },
			"Malloc":      func() error { _, err := d.Malloc(8); return err },
			"Free":        func() error { return d.Free(1) },
			"NewStream":   func() error { _, err := d.NewStream(); return err },
			"NewEvent":    func() error { _, err := d.NewEvent(); return err },
			"CopyHtoD":    func() error { return d.CopyHtoD(1, []byte{1}, s) },
			"CopyDtoH":    func() error { return d.CopyDtoH([]byte{1}, 1, s) },
			"CopyDtoD":    func() error { return d.CopyDtoD(1, 2, 1, s) },
			"Memset":      func() error { return d.Memset(1, 0, 1, s) },
			"Synchronize": func() error { return d.Synchronize() },
			"Reset":       func() error { return d.Reset() },
			"Close":       func() error { return d.Close() },
			"Stream.Sync": func() error { return s.Synchronize() },
			"Stream.Query": func() error {
				_, err := s.Query()
				return err
			},
			"Event.Record":      func() error { return e2.Record(s) },
			"Event.Query":       func() error { _, err := e2.Query(); return err },
			"Event.Synchronize": func() error { return e2.Synchronize() },
			"Event.Wait":        func() error { return e2.Wait(s) },
		}
		if aa, isAA := d.(device.AsyncAllocator); isAA {
			calls["MallocAsync"] = func() error { _, err := aa.MallocAsync(8, s); return err }
			calls["FreeAsync"] = func() error { return aa.FreeAsync(1, s) }
			calls["PoolUsage"] = func() error { _, _, err := aa.PoolUsage(); return err }
			calls["SetReleaseThreshold"] = func() error { return aa.SetReleaseThreshold(0) }
			calls["TrimPool"] = func() error { return aa.TrimPool(0) }
		}
		if ha, isHA := d.(device.HostAllocator); isHA {
			calls["HostAlloc"] = func() error { _, err := ha.HostAlloc(8, false); return err }
			calls["HostFree"] = func() error { return ha.HostFree(device.HostBuffer{Data: make([]byte, 8)}) }
		}
		if fl, isFL := d.(device.FuncLauncher); isFL {
			calls["LaunchFunc"] = func() error {
				return fl.LaunchFunc(s, 1, func(device.View, int, int) error { return nil })
			}
		}
		if sc, isSC := d.(device.StridedCopier); isSC {
			calls["CopyHtoD2D"] = func() error { return sc.CopyHtoD2D(1, 8, make([]byte, 16), 8, 8, 2, s) }
			calls["CopyDtoH2D"] = func() error { return sc.CopyDtoH2D(make([]byte, 16), 8, 1, 8, 8, 2, s) }
		}
		for _, name := range sortedKeys(calls) {
			t.Run(name, func(t *testing.T) {
				isErr(t, calls[name](), device.ErrClosed, name+" on a closed device")
			})
		}
	})
	t.Run("stream", func(t *testing.T) {
		d := o.fresh(t)
		s := strm(t)(d.NewStream())
		ok(t, s.Close())
		isErr(t, s.Synchronize(), device.ErrClosed, "Synchronize of a closed stream")
		isErr(t, s.Close(), device.ErrClosed, "second Close of a stream")
		e := evt(t)(d.NewEvent())
		isErr(t, e.Record(s), device.ErrClosed, "Record on a closed stream")
		ok(t, e.Close())
		isErr(t, e.Close(), device.ErrClosed, "second Close of an event")
		isErr(t, e.Record(d.DefaultStream()), device.ErrClosed, "Record of a closed event")
		ok(t, d.DefaultStream().Close()) // a no-op
		syncStream(t, d.DefaultStream())
	})
}

func testConcurrency(t *testing.T, o opener) {
	d := o.fresh(t)
	start := memFree(t, d)
	const workers, rounds = 8, 50
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s, err := d.NewStream()
			if err != nil {
				errs <- err
				return
			}
			defer s.Close()
			aa, isAA := d.(device.AsyncAllocator)
			for i := range rounds {
				n := uint64(1+w) * 4096 * uint64(1+i%3)
				p, err := d.Malloc(n)
				if err != nil {
					errs <- err
					return
				}
				if d.Info().Backed {
					if err := d.Memset(p, byte(w), n, s); err != nil {
						errs <- err
						return
					}
				}
				if isAA {
					q, err := aa.MallocAsync(n, s)
					if err != nil {
						errs <- err
						return
					}
					if err := aa.FreeAsync(q, s); err != nil {
						errs <- err
						return
					}
				}
				if err := s.Synchronize(); err != nil {
					errs <- err
					return
				}
				if err := d.Free(p); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	within(t, "concurrent workers", wg.Wait)
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if aa, isAA := d.(device.AsyncAllocator); isAA {
		ok(t, aa.TrimPool(0))
	}
	freeNear(t, d, memFree(t, d), start, "after concurrent alloc/free")
}
