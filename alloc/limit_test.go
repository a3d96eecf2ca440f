package alloc_test

import (
	"errors"
	"io"
	"math"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/vramkit/vram/alloc"
	"github.com/vramkit/vram/device"
	"github.com/vramkit/vram/device/sim"
	"github.com/vramkit/vram/internal/units"
)

// TestLimitRefusesOverCap checks the refusal: both sentinels, the figures,
// an OOM counted, the upstream untouched.
func TestLimitRefusesOverCap(t *testing.T) {
	dev := openSimT(t, sim.Config{TotalBytes: units.GiB, AddressOnly: true})
	up := alloc.NewDirect(dev)
	l := alloc.NewLimit(up, 8*units.MiB)
	defer l.Close()
	s := dev.DefaultStream()
	p, err := l.Alloc(6*units.MiB, s)
	if err != nil {
		t.Fatal(err)
	}
	upBefore := up.Stats()
	_, err = l.Alloc(3*units.MiB, s)
	if !errors.Is(err, alloc.ErrLimit) || !errors.Is(err, device.ErrOutOfMemory) {
		t.Fatalf("over-cap Alloc: err = %v, want one wrapping alloc.ErrLimit and device.ErrOutOfMemory", err)
	}
	for _, want := range []string{"3 MiB (4 MiB as the upstream spends it)", "6 MiB in use", "cap of 8 MiB", "by 2 MiB"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	if upAfter := up.Stats(); upAfter != upBefore {
		t.Errorf("a refused Alloc reached the upstream: %+v → %+v", upBefore, upAfter)
	}
	if st := l.Stats(); st.OOMs != 1 {
		t.Errorf("Limit Stats.OOMs = %d, want 1", st.OOMs)
	}
	if l.Used() != 6*units.MiB {
		t.Errorf("Used() = %s, want 6 MiB", units.Format(l.Used()))
	}
	if err := l.Free(p, s); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Alloc(8*units.MiB, s); err != nil {
		t.Errorf("Alloc of the whole cap after freeing: %v", err)
	}
}

// TestLimitIgnoresCachedBytes: a pool's cache does not count against the
// cap, so freeing and allocating again at the cap keeps working (CuPy's
// set_limit counts the cache and refuses here).
func TestLimitIgnoresCachedBytes(t *testing.T) {
	ups := map[string]func(dev device.Device) (alloc.Allocator, error){
		"Pool": func(dev device.Device) (alloc.Allocator, error) { return alloc.NewPool(dev, alloc.PoolConfig{}) },
		"AsyncPool": func(dev device.Device) (alloc.Allocator, error) {
			return alloc.NewAsyncPool(dev, alloc.AsyncConfig{})
		},
	}
	for name, newUp := range ups {
		t.Run(name, func(t *testing.T) {
			dev := openSimT(t, sim.Config{TotalBytes: units.GiB, AddressOnly: true})
			up, err := newUp(dev)
			if err != nil {
				t.Fatal(err)
			}
			l := alloc.NewLimit(up, 4*units.MiB)
			defer l.Close()
			s := dev.DefaultStream()
			sizes := []uint64{3 * units.MiB, units.MiB, 2 * units.MiB, 4 * units.MiB, 512 * units.KiB}
			for round := range 5 {
				for _, n := range sizes {
					p, err := l.Alloc(n, s)
					if err != nil {
						t.Fatalf("round %d: Alloc(%s) with %s cached upstream: %v",
							round, units.Format(n), units.Format(l.Stats().Cached()), err)
					}
					if err := l.Free(p, s); err != nil {
						t.Fatal(err)
					}
				}
			}
			if st := l.Stats(); st.OOMs != 0 || st.Cached() == 0 {
				t.Errorf("want no refusals and something cached upstream: %+v", st)
			}
		})
	}
}

// TestLimitChargesUpstreamGranularity: blocks count as the upstream
// spends them.
func TestLimitChargesUpstreamGranularity(t *testing.T) {
	tests := map[string]struct {
		up      func(dev device.Device) alloc.Allocator
		n       uint64
		fits    int // allocations of n that fit under a 4 MiB cap
		charged uint64
	}{
		"Direct at 2 MiB": {up: func(dev device.Device) alloc.Allocator { return alloc.NewDirect(dev) }, n: 1, fits: 2, charged: 2 * units.MiB},
		"Pool at 512 B": {up: func(dev device.Device) alloc.Allocator {
			p, err := alloc.NewPool(dev, alloc.PoolConfig{})
			if err != nil {
				panic(err)
			}
			return p
		}, n: 1000, fits: 4096, charged: 1024},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			dev := openSimT(t, sim.Config{TotalBytes: units.GiB, AddressOnly: true})
			l := alloc.NewLimit(tc.up(dev), 4*units.MiB)
			defer l.Close()
			s := dev.DefaultStream()
			for i := range tc.fits {
				if _, err := l.Alloc(tc.n, s); err != nil {
					t.Fatalf("Alloc #%d of %d bytes: %v", i+1, tc.n, err)
				}
			}
			if l.Used() != uint64(tc.fits)*tc.charged {
				t.Errorf("Used() = %d, want %d", l.Used(), uint64(tc.fits)*tc.charged)
			}
			if _, err := l.Alloc(tc.n, s); !errors.Is(err, alloc.ErrLimit) {
				t.Errorf("Alloc past the cap: err = %v, want alloc.ErrLimit", err)
			}
		})
	}
}

// TestAdaptorsUpstream: each adaptor exposes what it wraps, its
// granularity and its Stats.
func TestAdaptorsUpstream(t *testing.T) {
	adaptors := map[string]func(up alloc.Allocator) alloc.Adaptor{
		"Limit": func(up alloc.Allocator) alloc.Adaptor { return alloc.NewLimit(up, units.GiB) },
		"Trace": func(up alloc.Allocator) alloc.Adaptor { return alloc.NewTrace(up, io.Discard) },
	}
	for name, wrap := range adaptors {
		t.Run(name, func(t *testing.T) {
			dev := openSimT(t, sim.Config{TotalBytes: 64 * units.MiB, AddressOnly: true})
			d := alloc.NewDirect(dev)
			a := wrap(d)
			defer a.Close()
			if a.Upstream() != alloc.Allocator(d) {
				t.Errorf("Upstream() = %v, want the Direct it wraps", a.Upstream())
			}
			if g := a.(alloc.Granular).Granularity(); g != d.Granularity() {
				t.Errorf("Granularity() = %d, want the upstream's %d", g, d.Granularity())
			}
			if _, err := a.Alloc(units.MiB, dev.DefaultStream()); err != nil {
				t.Fatal(err)
			}
			if l, ok := a.(*alloc.Limit); ok && l.Cap() != units.GiB {
				t.Errorf("Cap() = %d, want 1 GiB", l.Cap())
			}
			if a.Stats() != d.Stats() {
				t.Errorf("Stats() = %+v, want the upstream's %+v", a.Stats(), d.Stats())
			}
		})
	}
}

// TestLimitFailedCallsChangeNothing: a call the Limit or its upstream
// refuses leaves the bytes charged and the live table as they were.
func TestLimitFailedCallsChangeNothing(t *testing.T) {
	tests := map[string]struct {
		call func(l *alloc.Limit, s device.Stream, live device.Ptr) error
		want error
	}{
		"over the cap": {
			call: func(l *alloc.Limit, s device.Stream, _ device.Ptr) error {
				_, err := l.Alloc(60*units.MiB, s)
				return err
			},
			want: alloc.ErrLimit,
		},
		"device out of memory under the cap": {
			call: func(l *alloc.Limit, s device.Stream, _ device.Ptr) error {
				_, err := l.Alloc(40*units.MiB, s)
				return err
			},
			want: device.ErrOutOfMemory,
		},
		"a request too large to round": {
			call: func(l *alloc.Limit, s device.Stream, _ device.Ptr) error {
				_, err := l.Alloc(math.MaxUint64, s)
				return err
			},
			want: device.ErrOutOfMemory,
		},
		"free of a pointer it did not hand out": {
			call: func(l *alloc.Limit, s device.Stream, live device.Ptr) error { return l.Free(live+512, s) },
			want: alloc.ErrUnknownPointer,
		},
		"free the upstream refuses": {
			call: func(l *alloc.Limit, s device.Stream, live device.Ptr) error { return l.Free(live, nil) },
			want: device.ErrInvalidValue,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			dev := openSimT(t, sim.Config{TotalBytes: 64 * units.MiB, AddressOnly: true, NoContext: true})
			p, err := alloc.NewPool(dev, alloc.PoolConfig{})
			if err != nil {
				t.Fatal(err)
			}
			l := alloc.NewLimit(p, 56*units.MiB)
			defer l.Close()
			s := dev.DefaultStream()
			live, err := l.Alloc(30*units.MiB, s)
			if err != nil {
				t.Fatal(err)
			}
			used := l.Used()
			if err := tc.call(l, s, live); !errors.Is(err, tc.want) {
				t.Fatalf("err = %v, want %v", err, tc.want)
			}
			if l.Used() != used {
				t.Errorf("Used() %d → %d after a failed call", used, l.Used())
			}
			// The live block is still the Limit's: freeing it gives its
			// bytes back.
			if err := l.Free(live, s); err != nil {
				t.Fatalf("Free of the live block after the failed call: %v", err)
			}
			if l.Used() != 0 {
				t.Errorf("Used() = %d after freeing everything", l.Used())
			}
		})
	}
}

// gated wraps an allocator so that a test can hold an Alloc or Free inside
// the upstream call (once armed) while it closes the adaptor around it.
type gated struct {
	alloc.Allocator
	armed   atomic.Bool
	entered chan struct{} // receives when a call is held
	release chan struct{} // closed to let held calls go on
}

func newGated(up alloc.Allocator) *gated {
	return &gated{Allocator: up, entered: make(chan struct{}, 1), release: make(chan struct{})}
}

func (g *gated) wait() {
	if g.armed.Load() {
		g.entered <- struct{}{}
		<-g.release
	}
}

func (g *gated) Alloc(n uint64, s device.Stream) (device.Ptr, error) {
	g.wait()
	return g.Allocator.Alloc(n, s)
}

func (g *gated) Free(p device.Ptr, s device.Stream) error {
	g.wait()
	return g.Allocator.Free(p, s)
}

// TestAdaptorsCloseDuringCall: Close while an Alloc or Free is inside the
// upstream (which Close closes, so the call fails there) must neither
// panic nor leave the adaptor's books wrapped around.
func TestAdaptorsCloseDuringCall(t *testing.T) {
	adaptors := map[string]func(up alloc.Allocator) alloc.Adaptor{
		"Limit": func(up alloc.Allocator) alloc.Adaptor { return alloc.NewLimit(up, 32*units.MiB) },
		"Trace": func(up alloc.Allocator) alloc.Adaptor { return alloc.NewTrace(up, io.Discard) },
	}
	calls := map[string]func(a alloc.Allocator, s device.Stream, live device.Ptr) error{
		"alloc": func(a alloc.Allocator, s device.Stream, _ device.Ptr) error {
			_, err := a.Alloc(units.MiB, s)
			return err
		},
		"free": func(a alloc.Allocator, s device.Stream, live device.Ptr) error { return a.Free(live, s) },
	}
	for aname, wrap := range adaptors {
		for cname, call := range calls {
			t.Run(aname+"/"+cname, func(t *testing.T) {
				dev := openSimT(t, sim.Config{TotalBytes: 64 * units.MiB, AddressOnly: true})
				p, err := alloc.NewPool(dev, alloc.PoolConfig{})
				if err != nil {
					t.Fatal(err)
				}
				g := newGated(p)
				a := wrap(g)
				s := dev.DefaultStream()
				live, err := a.Alloc(units.MiB, s)
				if err != nil {
					t.Fatal(err)
				}
				g.armed.Store(true)

				done := make(chan error, 1)
				go func() { done <- call(a, s, live) }()
				<-g.entered
				if err := a.Close(); err != nil {
					t.Fatalf("Close: %v", err)
				}
				close(g.release)
				if err := <-done; !errors.Is(err, alloc.ErrClosed) {
					t.Errorf("call across Close: err = %v, want alloc.ErrClosed", err)
				}
				if l, ok := a.(*alloc.Limit); ok && l.Used() != 0 {
					t.Errorf("Used() = %d after Close", l.Used())
				}
				if err := a.Close(); err != nil {
					t.Errorf("second Close: %v", err)
				}
			})
		}
	}
}

// TestLimitSetCapAndAdopt: a cap lowered below the bytes in use frees
// nothing and refuses until frees bring them under it; NoCap lets the
// upstream's room through; an adopted pointer is charged and released
// by its Free through the Limit.
func TestLimitSetCapAndAdopt(t *testing.T) {
	dev := openSimT(t, sim.Config{TotalBytes: units.GiB, AddressOnly: true})
	up := alloc.NewDirect(dev)
	s := dev.DefaultStream()
	before, err := up.Alloc(4*units.MiB, s) // made before the Limit wraps up
	if err != nil {
		t.Fatal(err)
	}
	l := alloc.NewLimit(up, 16*units.MiB)
	defer l.Close()
	l.Adopt(before, 4*units.MiB)
	l.Adopt(before, 4*units.MiB) // twice: counted once
	p, err := l.Alloc(6*units.MiB, s)
	if err != nil {
		t.Fatal(err)
	}
	if l.Used() != 10*units.MiB || l.Room() != 6*units.MiB {
		t.Fatalf("used %s, room %s; want 10 MiB (4 adopted + 6) and 6 MiB", units.Format(l.Used()), units.Format(l.Room()))
	}
	l.SetCap(8 * units.MiB) // below the bytes in use
	if l.Cap() != 8*units.MiB || l.Room() != 0 || l.Used() != 10*units.MiB {
		t.Fatalf("after SetCap(8 MiB): cap %s, room %s, used %s; want 8 MiB, 0, 10 MiB (nothing freed)",
			units.Format(l.Cap()), units.Format(l.Room()), units.Format(l.Used()))
	}
	if _, err := l.Alloc(units.MiB, s); !errors.Is(err, alloc.ErrLimit) {
		t.Fatalf("Alloc over a lowered cap: %v, want ErrLimit", err)
	}
	if err := l.Free(before, s); err != nil { // the adopted pointer goes back through the Limit
		t.Fatal(err)
	}
	if l.Used() != 6*units.MiB || l.Room() != 2*units.MiB {
		t.Fatalf("after freeing the adopted 4 MiB: used %s, room %s; want 6 and 2 MiB", units.Format(l.Used()), units.Format(l.Room()))
	}
	l.SetCap(alloc.NoCap)
	if l.Room() != math.MaxUint64 || l.Report().Cap != 0 {
		t.Errorf("NoCap: room %d, report cap %d; want the upstream's room (none) and no cap reported", l.Room(), l.Report().Cap)
	}
	if err := l.Free(p, s); err != nil {
		t.Fatal(err)
	}
}
