package alloc_test

import (
	"bytes"
	"errors"
	"math"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/vramkit/vram/alloc"
	"github.com/vramkit/vram/device"
	"github.com/vramkit/vram/device/sim"
)

// TestPoolReportLayout builds known layouts and checks every figure of the
// report: with the defaults, a request of at most 1 MiB takes a 2 MiB
// small segment, one of 12 MiB a segment of its own.
func TestPoolReportLayout(t *testing.T) {
	type op struct {
		n    uint64 // allocate n bytes; 0: free the allocation at index free
		free int
	}
	al := func(n uint64) op { return op{n: n} }
	fr := func(i int) op { return op{free: i} }
	tests := map[string]struct {
		ops  []op
		trim bool
		want alloc.MemoryReport // Allocator, Stats.Allocs etc. are not compared
		frag float64
	}{
		"empty": {},
		"one small block": {
			ops:  []op{al(512 * kib)},
			want: alloc.MemoryReport{LargestFree: 1536 * kib, FreeBlocks: 1, Segments: 1, PeakSegments: 1},
		},
		"two holes between live blocks": {
			// a b c d fill the small segment; a and c freed: two holes
			// of 512 KiB, still the default stream's.
			ops:  []op{al(512 * kib), al(512 * kib), al(512 * kib), al(512 * kib), fr(0), fr(2)},
			want: alloc.MemoryReport{LargestFree: 512 * kib, FreeBlocks: 2, Pending: mib, Segments: 1, PeakSegments: 1},
			frag: 0.5,
		},
		"neighbours coalesce": {
			ops:  []op{al(512 * kib), al(512 * kib), al(512 * kib), al(512 * kib), fr(0), fr(1)},
			want: alloc.MemoryReport{LargestFree: mib, FreeBlocks: 1, Pending: mib, Segments: 1, PeakSegments: 1},
		},
		"a small hole beside a large free segment": {
			ops:  []op{al(512 * kib), al(12 * mib), fr(1)},
			want: alloc.MemoryReport{LargestFree: 12 * mib, FreeBlocks: 2, Pending: 12 * mib, Segments: 2, PeakSegments: 2},
			frag: 1 - 12.0/13.5,
		},
		"trimmed: the peak stays": {
			ops:  []op{al(12 * mib), al(12 * mib), fr(0), fr(1)},
			trim: true,
			want: alloc.MemoryReport{PeakSegments: 2},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			e := newPoolEnv(t, addressOnlySim(256*mib), alloc.PoolConfig{})
			s := e.dev.DefaultStream()
			var ptrs []device.Ptr
			for _, o := range tc.ops {
				if o.n > 0 {
					ptrs = append(ptrs, e.alloc(t, o.n, s))
				} else {
					e.release(t, ptrs[o.free], s)
				}
			}
			if tc.trim {
				if err := e.p.Trim(); err != nil {
					t.Fatal(err)
				}
			}
			st := e.check(t)
			r := e.p.Report()
			if r.Allocator != "pool" || !r.Layout || r.Stats != st {
				t.Errorf("report %q, layout %v, stats %+v: want pool, true and the pool's Stats %+v", r.Allocator, r.Layout, r.Stats, st)
			}
			got := alloc.MemoryReport{LargestFree: r.LargestFree, FreeBlocks: r.FreeBlocks, Pending: r.Pending,
				Segments: r.Segments, PeakSegments: r.PeakSegments}
			if got != tc.want {
				t.Errorf("layout %+v, want %+v", got, tc.want)
			}
			if f := r.Fragmentation(); math.Abs(f-tc.frag) > 1e-9 {
				t.Errorf("Fragmentation() = %v, want %v (cached %d, largest %d)", f, tc.frag, r.Cached(), r.LargestFree)
			}
			if !strings.Contains(r.String(), "largest free block") {
				t.Errorf("String() does not show the largest free block:\n%s", r)
			}
		})
	}
}

func TestReportPeakSegmentsReset(t *testing.T) {
	e := newPoolEnv(t, addressOnlySim(256*mib), alloc.PoolConfig{})
	s := e.dev.DefaultStream()
	a, b := e.alloc(t, 12*mib, s), e.alloc(t, 12*mib, s)
	e.release(t, a, s)
	if err := e.p.Trim(); err != nil {
		t.Fatal(err)
	}
	if r := e.p.Report(); r.Segments != 1 || r.PeakSegments != 2 {
		t.Fatalf("segments %d, peak %d: want 1 and 2", r.Segments, r.PeakSegments)
	}
	e.p.ResetPeaks()
	if r := e.p.Report(); r.PeakSegments != 1 {
		t.Errorf("after ResetPeaks: peak segments %d, want 1", r.PeakSegments)
	}
	e.release(t, b, s)
}

func TestFragmentationDefinition(t *testing.T) {
	tests := map[string]struct {
		r    alloc.MemoryReport
		want float64
	}{
		"nothing cached":    {r: alloc.MemoryReport{Layout: true, Stats: alloc.Stats{InUse: 4, Reserved: 4}}, want: 0},
		"one piece":         {r: alloc.MemoryReport{Layout: true, Stats: alloc.Stats{Reserved: 8}, LargestFree: 8}, want: 0},
		"quarter usable":    {r: alloc.MemoryReport{Layout: true, Stats: alloc.Stats{InUse: 4, Reserved: 12}, LargestFree: 2}, want: 0.75},
		"layout not known":  {r: alloc.MemoryReport{Stats: alloc.Stats{Reserved: 8}}, want: 0},
		"live blocks ahead": {r: alloc.MemoryReport{Layout: true, Stats: alloc.Stats{InUse: 2, Reserved: 6}, LargestFree: 1}, want: 0.75},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if got := tc.r.Fragmentation(); got != tc.want {
				t.Errorf("Fragmentation() = %v, want %v", got, tc.want)
			}
		})
	}
}

// oomCase is an allocator and a call that fails for want of memory.
type oomCase struct {
	make  func(t *testing.T, dev *sim.Device) alloc.Allocator
	n     uint64 // bytes to ask for
	name  string // the report's Allocator
	limit bool   // refused by a Limit: the report has its cap
}

func oomCases() map[string]oomCase {
	pool := func(t *testing.T, dev *sim.Device) alloc.Allocator {
		p, err := alloc.NewPool(dev, alloc.PoolConfig{})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	expandable := func(t *testing.T, dev *sim.Device) alloc.Allocator {
		return newExpandableT(t, dev, alloc.ExpandableConfig{})
	}
	return map[string]oomCase{
		"pool":        {make: pool, n: 96 * mib, name: "pool"},
		"pool, huge":  {make: pool, n: math.MaxUint64, name: "pool"},
		"direct":      {make: func(_ *testing.T, d *sim.Device) alloc.Allocator { return alloc.NewDirect(d) }, n: 96 * mib, name: "direct"},
		"direct huge": {make: func(_ *testing.T, d *sim.Device) alloc.Allocator { return alloc.NewDirect(d) }, n: math.MaxUint64, name: "direct"},
		"async": {make: func(t *testing.T, d *sim.Device) alloc.Allocator {
			a, err := alloc.NewAsyncPool(d, alloc.AsyncConfig{})
			if err != nil {
				t.Fatal(err)
			}
			return a
		}, n: 96 * mib, name: "async"},
		"limit refuses": {make: func(t *testing.T, d *sim.Device) alloc.Allocator {
			return alloc.NewLimit(pool(t, d), 8*mib)
		}, n: 16 * mib, name: "pool", limit: true},
		"limit passes the pool's": {make: func(t *testing.T, d *sim.Device) alloc.Allocator {
			return alloc.NewLimit(pool(t, d), 128*mib)
		}, n: 96 * mib, name: "pool"},
		"trace": {make: func(t *testing.T, d *sim.Device) alloc.Allocator {
			return alloc.NewTrace(pool(t, d), &bytes.Buffer{})
		}, n: 96 * mib, name: "pool"},
		"expandable":       {make: expandable, n: 96 * mib, name: "expandable"},
		"expandable, huge": {make: expandable, n: math.MaxUint64, name: "expandable"},
		"limit refuses expandable": {make: func(t *testing.T, d *sim.Device) alloc.Allocator {
			return alloc.NewLimit(expandable(t, d), 8*mib)
		}, n: 16 * mib, name: "expandable", limit: true},
	}
}

// TestOutOfMemoryCarriesReport: every allocator's out-of-memory error is
// an *OutOfMemoryError (through the adaptors too) with a report that
// counts the failure, its message stays one short line, and the observer
// sees the same error once.
func TestOutOfMemoryCarriesReport(t *testing.T) {
	for name, tc := range oomCases() {
		t.Run(name, func(t *testing.T) {
			dev := openSimT(t, sim.Config{TotalBytes: 64 * mib, AddressOnly: true, NoContext: true})
			a := tc.make(t, dev)
			defer a.Close()
			s := dev.DefaultStream()
			p, err := a.Alloc(mib, s)
			if err != nil {
				t.Fatal(err)
			}
			var seen []*alloc.OutOfMemoryError
			if !alloc.ObserveOOM(a, func(e *alloc.OutOfMemoryError) { seen = append(seen, e) }) {
				t.Fatal("not OOMObservable")
			}
			_, err = a.Alloc(tc.n, s)
			var oe *alloc.OutOfMemoryError
			if !errors.As(err, &oe) || !errors.Is(err, device.ErrOutOfMemory) {
				t.Fatalf("Alloc(%d): err = %v (%T), want an *OutOfMemoryError wrapping ErrOutOfMemory", tc.n, err, err)
			}
			r := oe.Report()
			if r.Allocator != tc.name || r.OOMs != 1 || r.InUse < mib || oe.Size != tc.n || oe.Stream != s.Handle() {
				t.Errorf("error's report %+v, size %d, stream %d: want %s with 1 OOM and 1 MiB in use, size %d on stream %d",
					r, oe.Size, oe.Stream, tc.name, tc.n, s.Handle())
			}
			if (r.Cap != 0) != tc.limit {
				t.Errorf("report cap %d: want one only when a Limit refused", r.Cap)
			}
			if msg := err.Error(); strings.Contains(msg, "\n") || strings.Contains(msg, "memory report") {
				t.Errorf("message carries the report: %q", msg)
			}
			if len(seen) != 1 || seen[0] != oe {
				t.Errorf("observer saw %d errors (%v), want this one once", len(seen), seen)
			}
			if got := alloc.ReportOf(a); got.OOMs != 1 {
				t.Errorf("ReportOf after the failure: %d OOMs, want 1", got.OOMs)
			}
			alloc.ObserveOOM(a, nil)
			if _, err := a.Alloc(tc.n, s); err == nil || len(seen) != 1 {
				t.Errorf("with the observer removed: err %v, observer calls %d, want an error and still 1", err, len(seen))
			}
			if err := a.Free(p, s); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestPinnedOutOfMemoryCarriesReport(t *testing.T) {
	dev := openSimT(t, sim.Config{TotalBytes: 64 * mib, NoContext: true})
	p, err := alloc.NewPinnedPool(dev)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	s := dev.DefaultStream()
	b, err := p.Alloc(64*kib, s)
	if err != nil {
		t.Fatal(err)
	}
	var calls atomic.Int32
	p.SetOOMObserver(func(*alloc.OutOfMemoryError) { calls.Add(1) })
	dev.Faults().OOMAbove(mib)
	_, err = p.Alloc(4*mib, s)
	var oe *alloc.OutOfMemoryError
	if !errors.As(err, &oe) {
		t.Fatalf("Alloc past the host's memory: err = %v, want an *OutOfMemoryError", err)
	}
	if r := oe.Report(); r.Allocator != "pinned" || r.OOMs != 1 || r.Segments != 1 || r.InUse != 64*kib || calls.Load() != 1 {
		t.Errorf("report %+v, observer calls %d: want pinned, 1 OOM, 1 buffer of 64 KiB, one call", r, calls.Load())
	}
	dev.Faults().Clear()
	if err := p.Free(b, s); err != nil {
		t.Fatal(err)
	}
}

// TestAdaptorsForwardReport: Limit and Trace report their upstream's
// figures (the Limit adds its cap and refusals).
func TestAdaptorsForwardReport(t *testing.T) {
	dev := openSimT(t, sim.Config{TotalBytes: 64 * mib, AddressOnly: true, NoContext: true})
	pool, err := alloc.NewPool(dev, alloc.PoolConfig{})
	if err != nil {
		t.Fatal(err)
	}
	lim := alloc.NewLimit(pool, 4*mib)
	tr := alloc.NewTrace(lim, &bytes.Buffer{})
	defer tr.Close()
	s := dev.DefaultStream()
	p, err := tr.Alloc(512*kib, s)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tr.Alloc(8*mib, s); err == nil {
		t.Fatal("Alloc past the cap succeeded")
	}
	want := pool.Report()
	want.OOMs++
	want.Cap, want.CapUsed = 4*mib, 512*kib
	for name, a := range map[string]alloc.Allocator{"limit": lim, "trace": tr} {
		if got := alloc.ReportOf(a); got != want {
			t.Errorf("%s's report\n%+v\nwant\n%+v", name, got, want)
		}
	}
	if err := tr.Free(p, s); err != nil {
		t.Fatal(err)
	}
}

// BenchmarkPoolReport: a report of a pool whose small segments hold 1,000
// free blocks between live ones.
func BenchmarkPoolReport(b *testing.B) {
	dev, err := sim.New(sim.Config{TotalBytes: 256 * mib, AddressOnly: true, NoContext: true})
	if err != nil {
		b.Fatal(err)
	}
	defer dev.Close()
	p, err := alloc.NewPool(dev, alloc.PoolConfig{})
	if err != nil {
		b.Fatal(err)
	}
	defer p.Close()
	s := dev.DefaultStream()
	var ptrs []device.Ptr
	for range 2000 {
		ptr, err := p.Alloc(4*kib, s)
		if err != nil {
			b.Fatal(err)
		}
		ptrs = append(ptrs, ptr)
	}
	for i := 0; i < len(ptrs); i += 2 {
		if err := p.Free(ptrs[i], s); err != nil {
			b.Fatal(err)
		}
	}
	if r := p.Report(); r.FreeBlocks < 1000 {
		b.Fatalf("%d free blocks, want at least 1000", r.FreeBlocks)
	}
	b.ReportAllocs()
	for b.Loop() {
		_ = p.Report()
	}
}
