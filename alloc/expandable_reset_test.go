package alloc_test

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/vramkit/vram/alloc"
	"github.com/vramkit/vram/device"
	"github.com/vramkit/vram/device/sim"
	"github.com/vramkit/vram/internal/units"
)

// vmResetDuring is a simulated device that, once armed, resets itself
// around its next virtual-memory call of the kind named (before it, or
// after it returned).
type vmResetDuring struct {
	*sim.Device
	call   string // "reserve", "create", "map", "access"
	before bool
	armed  atomic.Bool
}

func (d *vmResetDuring) around(call string, f func() error) error {
	armed := call == d.call && d.armed.CompareAndSwap(true, false)
	if armed && d.before {
		if err := d.Reset(); err != nil {
			return err
		}
	}
	err := f()
	if armed && !d.before {
		if rerr := d.Reset(); rerr != nil {
			return rerr
		}
	}
	return err
}

func (d *vmResetDuring) ReserveAddress(n uint64) (p device.Ptr, err error) {
	err = d.around("reserve", func() error { p, err = d.Device.ReserveAddress(n); return err })
	return p, err
}

func (d *vmResetDuring) CreatePhysical(n uint64) (h device.PhysMem, err error) {
	err = d.around("create", func() error { h, err = d.Device.CreatePhysical(n); return err })
	return h, err
}

func (d *vmResetDuring) Map(p device.Ptr, n uint64, h device.PhysMem) error {
	return d.around("map", func() error { return d.Device.Map(p, n, h) })
}

func (d *vmResetDuring) SetAccess(p device.Ptr, n uint64) error {
	return d.around("access", func() error { return d.Device.SetAccess(p, n) })
}

// TestExpandableGrowthOvertakenByReset resets the device around each
// virtual-memory call of a growth, into a new range and into the tail of
// one already there: the Alloc fails with an error wrapping
// device.ErrInvalidated, the books hold nothing (no page counted mapped,
// nothing reserved), and the allocator serves the next Alloc.
func TestExpandableGrowthOvertakenByReset(t *testing.T) {
	for _, call := range []string{"reserve", "create", "map", "access"} {
		for _, before := range []bool{true, false} {
			for _, existing := range []bool{false, true} {
				if call == "reserve" && existing {
					continue // growing a range reserves nothing
				}
				name := fmt.Sprintf("%s, reset %s, %s", call, map[bool]string{true: "before", false: "after"}[before],
					map[bool]string{false: "new range", true: "existing range"}[existing])
				t.Run(name, func(t *testing.T) {
					sd := openSimT(t, addressOnlySim(256*units.MiB))
					d := &vmResetDuring{Device: sd, call: call, before: before}
					e := newExpandableT(t, d, alloc.ExpandableConfig{})
					s := d.DefaultStream()
					if existing {
						p := mustAlloc(t, e, 2*units.MiB, s)
						if err := e.Free(p, s); err != nil {
							t.Fatal(err)
						}
					}
					d.armed.Store(true)
					_, err := e.Alloc(8*units.MiB, s)
					if !errors.Is(err, device.ErrInvalidated) {
						t.Fatalf("Alloc across a reset: %v; want an error wrapping device.ErrInvalidated", err)
					}
					if cerr := e.CheckInvariants(); cerr != nil {
						t.Error(cerr)
					}
					if st := e.Stats(); st.InUse != 0 || st.Reserved != 0 || e.PageStats().Mapped != 0 {
						t.Errorf("after the failed Alloc: %+v, %d pages mapped; want nothing held", st, e.PageStats().Mapped)
					}
					q := mustAlloc(t, e, units.MiB, d.DefaultStream())
					if err := errors.Join(e.Free(q, d.DefaultStream()), e.Close()); err != nil {
						t.Error(err)
					}
					if lr := sd.Leaks(); !lr.Empty() {
						t.Errorf("left on the device after Close: %v", lr)
					}
				})
			}
		}
	}
}

// TestExpandableResetDuringConcurrentAllocs has eight goroutines allocate
// and free on streams of their own while the device is reset under them,
// a few times: every Alloc either succeeds or fails wrapping
// device.ErrInvalidated, every pointer is taken back, and the books
// balance afterwards (nothing in use, Reserved the pages mapped).
func TestExpandableResetDuringConcurrentAllocs(t *testing.T) {
	sd := openSimT(t, addressOnlySim(512*units.MiB))
	e := newExpandableT(t, sd, alloc.ExpandableConfig{})
	const workers, rounds = 8, 300
	var wg sync.WaitGroup
	errc := make(chan error, workers)
	report := func(err error) { // the first error of each worker; the rest are dropped
		select {
		case errc <- err:
		default:
		}
	}
	var resets atomic.Int32
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var held []device.Ptr
			s, err := sd.NewStream()
			if err != nil {
				report(err)
				return
			}
			for i := range rounds {
				if w == 0 && i%100 == 50 {
					if err := sd.Reset(); err != nil {
						report(err)
						return
					}
					resets.Add(1)
				}
				if s2, err := sd.NewStream(); err == nil && errors.Is(streamErr(s), device.ErrInvalidated) {
					s = s2 // a stream from before a reset is gone: take a new one
				} else if err == nil {
					s2.Close()
				}
				n := uint64(1+(w*7+i*13)%40) * 256 * units.KiB
				p, err := e.Alloc(n, s)
				switch {
				case err == nil:
					held = append(held, p)
				case !errors.Is(err, device.ErrInvalidated):
					report(fmt.Errorf("Alloc(%d): %w; want success or ErrInvalidated", n, err))
				}
				if len(held) > 4 {
					if err := e.Free(held[0], s); err != nil && !errors.Is(err, device.ErrInvalidated) {
						report(fmt.Errorf("Free: %w", err))
					}
					held = held[1:]
				}
			}
			for _, p := range held {
				if err := e.Free(p, s); err != nil && !errors.Is(err, device.ErrInvalidated) {
					report(fmt.Errorf("Free: %w", err))
				}
			}
			_ = s.Close()
		}()
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Error(err)
	}
	if cerr := e.CheckInvariants(); cerr != nil {
		t.Error(cerr)
	}
	if st := e.Stats(); st.InUse != 0 || st.Reserved != e.PageStats().Mapped*e.PageStats().Page {
		t.Errorf("after %d resets: %+v, %d pages mapped", resets.Load(), st, e.PageStats().Mapped)
	}
	if err := e.Close(); err != nil {
		t.Error(err)
	}
}

// streamErr is what a stream says of itself.
func streamErr(s device.Stream) error {
	_, err := s.Query()
	return err
}
