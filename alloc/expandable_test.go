package alloc_test

import (
	"errors"
	"io"
	"slices"
	"strings"
	"testing"

	"github.com/vramkit/vram/alloc"
	"github.com/vramkit/vram/alloc/alloctest"
	"github.com/vramkit/vram/device"
	"github.com/vramkit/vram/device/sim"
	"github.com/vramkit/vram/internal/units"
)

// newExpandableT makes an Expandable or stops the test.
func newExpandableT(t *testing.T, dev device.Device, cfg alloc.ExpandableConfig) *alloc.Expandable {
	t.Helper()
	e, err := alloc.NewExpandable(dev, cfg)
	if err != nil {
		t.Fatalf("NewExpandable: %v", err)
	}
	return e
}

// The conformance suite, the huge-request test and every adaptor run on
// Expandable as on Pool.
func init() {
	factories["Expandable"] = func(t *testing.T, dev device.Device) alloc.Allocator {
		return newExpandableT(t, dev, alloc.ExpandableConfig{})
	}
	factories["Expandable/KeepMapped"] = func(t *testing.T, dev device.Device) alloc.Allocator {
		return newExpandableT(t, dev, alloc.ExpandableConfig{KeepMapped: true})
	}
	factories["Limit(Expandable)"] = func(t *testing.T, dev device.Device) alloc.Allocator {
		return alloc.NewLimit(newExpandableT(t, dev, alloc.ExpandableConfig{}), 1<<40)
	}
	factories["Trace(Expandable)"] = func(t *testing.T, dev device.Device) alloc.Allocator {
		return alloc.NewTrace(newExpandableT(t, dev, alloc.ExpandableConfig{}), io.Discard)
	}
}

func FuzzExpandable(f *testing.F) {
	fuzzAllocator(f, func(t *testing.T, dev device.Device) alloc.Allocator {
		return newExpandableT(t, dev, alloc.ExpandableConfig{})
	})
}

// expEnv is an Expandable on a fresh address-only simulator.
type expEnv struct {
	dev *sim.Device
	e   *alloc.Expandable
}

func newExpEnv(t *testing.T, total uint64, cfg alloc.ExpandableConfig) expEnv {
	t.Helper()
	dev := openSimT(t, sim.Config{TotalBytes: total, AddressOnly: true, NoContext: true})
	e := newExpandableT(t, dev, cfg)
	t.Cleanup(func() {
		if err := e.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
		if u := dev.VMUsage(); u.Mapped != 0 || u.Reserved != 0 {
			t.Errorf("after Close the device still has %+v", u)
		}
	})
	return expEnv{dev, e}
}

func (v expEnv) alloc(t *testing.T, n uint64, s device.Stream) device.Ptr {
	t.Helper()
	p, err := v.e.Alloc(n, s)
	if err != nil {
		t.Fatalf("Alloc(%s): %v", units.Format(n), err)
	}
	return p
}

func (v expEnv) free(t *testing.T, p device.Ptr, s device.Stream) {
	t.Helper()
	if err := v.e.Free(p, s); err != nil {
		t.Fatalf("Free(%v): %v", p, err)
	}
}

// TestExpandableGrowsItsFreeTail: a request that does not fit maps only
// the pages that, with the free space at the range's end, make it fit,
// and its block starts in that free space.
func TestExpandableGrowsItsFreeTail(t *testing.T) {
	v := newExpEnv(t, units.GiB, alloc.ExpandableConfig{})
	s := v.dev.DefaultStream()
	a := v.alloc(t, 3*units.MiB, s) // two pages; 1 MiB free at the end
	b := v.alloc(t, 5*units.MiB, s) // 1 MiB free + two more pages
	if b != a.Add(3*units.MiB) {
		t.Errorf("the 5 MiB block is at %v; want it right after the 3 MiB one, at %v", b, a.Add(3*units.MiB))
	}
	if ps := v.e.PageStats(); ps.Mapped != 4 || ps.Maps != 4 {
		t.Errorf("PageStats = %+v; want 4 pages mapped by 4 maps", ps)
	}
	if st := v.e.Stats(); st.Reserved != 8*units.MiB || st.InUse != 8*units.MiB {
		t.Errorf("Stats = %+v; want 8 MiB reserved and in use", st)
	}
	v.free(t, a, s)
	v.free(t, b, s)
}

// TestExpandableCarvesTheEndThatFreesPages: an allocation that splits a
// free block takes the end of it that leaves more whole pages free, so
// that Trim (or a growth past the high-water mark) can unmap them. Pages
// are 2 MiB; a is [0, 2), the freed block [2, 7.5) and c [7.5, 9.5) MiB,
// five pages mapped.
func TestExpandableCarvesTheEndThatFreesPages(t *testing.T) {
	cases := map[string]struct {
		size   uint64 // bytes asked for in the freed block
		at     uint64 // where the block is handed out, from a
		mapped uint64 // pages mapped after Trim
	}{
		// At the back, [6.25, 7.5), the rest [2, 6.25) holds pages [2, 6);
		// at the front the rest [3.25, 7.5) would hold [4, 6) only.
		"1.25 MiB at the back": {5 * units.MiB / 4, 25 * units.MiB / 4, 3},
		// At the back, [4.25, 7.5), the rest keeps [2, 4); at the front
		// the rest [5.25, 7.5) holds no whole page.
		"3.25 MiB at the back": {13 * units.MiB / 4, 17 * units.MiB / 4, 4},
		// Either rest, [6.5, 7.5) or [2, 3), holds no whole page, and c
		// follows: the back, the rest beside a.
		"4.5 MiB at the back": {9 * units.MiB / 2, 3 * units.MiB, 5},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			// Every block in one range: 1.25 MiB is a large request here.
			v := newExpEnv(t, units.GiB, alloc.ExpandableConfig{SmallSize: 64 * units.KiB})
			s := v.dev.DefaultStream()
			a := v.alloc(t, 2*units.MiB, s)
			f := v.alloc(t, 11*units.MiB/2, s)
			cc := v.alloc(t, 2*units.MiB, s)
			if ps := v.e.PageStats(); ps.Mapped != 5 {
				t.Fatalf("PageStats = %+v; want 5 pages mapped", ps)
			}
			v.free(t, f, s)
			g := v.alloc(t, c.size, s)
			if g != a.Add(c.at) {
				t.Errorf("the block is at %v; want %v, %s past the first", g, a.Add(c.at), units.Format(c.at))
			}
			if err := v.e.Trim(); err != nil {
				t.Fatal(err)
			}
			if ps := v.e.PageStats(); ps.Mapped != c.mapped {
				t.Errorf("after Trim %d pages mapped; want %d", ps.Mapped, c.mapped)
			}
			if err := v.e.CheckInvariants(); err != nil {
				t.Error(err)
			}
			for _, p := range []device.Ptr{a, g, cc} {
				v.free(t, p, s)
			}
		})
	}
}

// TestExpandableLeavesSubPageRestBesideHole: when the rest of a split
// free block can hold no whole page, it stays beside the hole the block
// borders, so that a growth into the hole joins it. Pages are 2 MiB; a is
// [0, 2), the freed block [2, 7.5) and c [7.5, 10) MiB; Trim unmaps
// [2, 6), leaving the free block [6, 7.5) after the hole; or, freeing the
// tail instead, a free block [2, 4) before the range's end hole.
func TestExpandableLeavesSubPageRestBesideHole(t *testing.T) {
	cases := map[string]struct {
		tail   bool   // free the range's tail rather than a block between a and c
		at     uint64 // where 1 MiB is handed out, from a
		mapped uint64 // pages at the peak, once 4.5 MiB is asked for too
	}{
		// At the back, [6.5, 7.5), the rest [6, 6.5) joins the hole's two
		// pages for 4.5 MiB: five pages in all. At the front the rest
		// [7, 7.5) would be cut off, and 4.5 MiB take three fresh pages
		// after c.
		"after a hole: the back": {false, 13 * units.MiB / 2, 5},
		// Before the end hole: the front, [2, 3), the rest [3, 4) joining
		// the growth for 4.5 MiB, which maps two pages: four in all. At the
		// back the rest [2, 3) would be cut off, and 4.5 MiB take three.
		"before a hole: the front": {true, 2 * units.MiB, 4},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			// Every block in one range: 1 MiB is a large request here.
			v := newExpEnv(t, units.GiB, alloc.ExpandableConfig{SmallSize: 64 * units.KiB})
			s := v.dev.DefaultStream()
			a := v.alloc(t, 2*units.MiB, s)
			live := []device.Ptr{a}
			if c.tail {
				v.free(t, v.alloc(t, 2*units.MiB, s), s)
			} else {
				f := v.alloc(t, 11*units.MiB/2, s)
				live = append(live, v.alloc(t, 5*units.MiB/2, s))
				v.free(t, f, s)
				if err := v.e.Trim(); err != nil {
					t.Fatal(err)
				}
			}
			g := v.alloc(t, units.MiB, s)
			if g != a.Add(c.at) {
				t.Errorf("1 MiB is at %v; want %v, %s past a", g, a.Add(c.at), units.Format(c.at))
			}
			live = append(live, g, v.alloc(t, 9*units.MiB/2, s))
			if ps := v.e.PageStats(); ps.PeakMapped != c.mapped {
				t.Errorf("PageStats = %+v; want %d pages at the peak", ps, c.mapped)
			}
			if err := v.e.CheckInvariants(); err != nil {
				t.Error(err)
			}
			for _, p := range live {
				v.free(t, p, s)
			}
		})
	}
}

// TestExpandableSmallClassIsUnderAPage: by default every request under a
// page is of the small class, so blocks just over 1 MiB, freed among live
// blocks of two pages, leave holes that requests of half a MiB fill, not
// holes of a range they cannot use while a range of their own grows.
func TestExpandableSmallClassIsUnderAPage(t *testing.T) {
	v := newExpEnv(t, units.GiB, alloc.ExpandableConfig{})
	if got := v.e.Config().SmallSize; got != 2*units.MiB-512 {
		t.Errorf("default SmallSize %d; want a page less 512 bytes", got)
	}
	s := v.dev.DefaultStream()
	var live, holes []device.Ptr
	for range 8 {
		live = append(live, v.alloc(t, 2*units.MiB+64*units.KiB, s))
		holes = append(holes, v.alloc(t, units.MiB+32*units.KiB, s))
	}
	for _, p := range holes {
		v.free(t, p, s)
	}
	for range 16 {
		live = append(live, v.alloc(t, units.MiB/2, s))
	}
	// The peak is all 16 blocks live: 8 × 3.09375 MiB, 13 pages.
	if ps := v.e.PageStats(); ps.PeakMapped > 14 {
		t.Errorf("PageStats = %+v; want at most 14 pages at the peak, a page above the 13 its live bytes need", ps)
	}
	for _, p := range live {
		v.free(t, p, s)
	}
}

// TestExpandableLargeRequestsUseSmallRanges: a large request that its own
// range would serve only by taking the pages mapped past their high-water
// mark and past the waste target (a page over the pages the live bytes
// need, or 3 % more) takes its stream's small range's free space instead
// where that maps fewer pages; under the target it stays in its range.
// Pages are 2 MiB. The large range holds a [0, 3), b and c [5.1, 8) MiB,
// b freed: 2.1 MiB, no whole page in it; the small range holds small.
func TestExpandableLargeRequestsUseSmallRanges(t *testing.T) {
	cases := map[string]struct {
		first uint64   // a large block allocated first (0: none)
		small []uint64 // small blocks
		free  []int    // the small blocks freed
		n     uint64   // the large request
		// where the request goes: after small[after], or before
		// small[before], or after c (both -1)
		after, before int
		peak          uint64 // pages at the peak
	}{
		// 2.6 MiB in the large range would map two pages (seven in all,
		// the target six); in the small range it takes the 1.9 MiB free
		// after the small block and one page more.
		"grows in the small range": {0, []uint64{100 * units.KiB}, nil, 2*units.MiB + 600*units.KiB, 0, -1, 6},
		// Small blocks 1 and 2 freed leave [1.5, 3.84) MiB free, no whole
		// page in it: 2.2 MiB take its back, before block 3, mapping
		// nothing (the large range would map two pages, nine in all).
		"takes a small range's cached block": {0, []uint64{1536 * units.KiB, 1200 * units.KiB, 1200 * units.KiB, 1100 * units.KiB}, []int{1, 2},
			2*units.MiB + 200*units.KiB, -1, 3, 7},
		// With 200 MiB live before them, the large range's growth stays
		// within 3 %: the request follows c.
		"not under the target": {200 * units.MiB, []uint64{100 * units.KiB}, nil, 2*units.MiB + 600*units.KiB, -1, -1, 107},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			v := newExpEnv(t, units.GiB, alloc.ExpandableConfig{})
			s := v.dev.DefaultStream()
			var live []device.Ptr
			if c.first > 0 {
				live = append(live, v.alloc(t, c.first, s))
			}
			a := v.alloc(t, 3*units.MiB, s)
			b := v.alloc(t, 2*units.MiB+100*units.KiB, s)
			cc := v.alloc(t, 2*units.MiB+900*units.KiB, s)
			v.free(t, b, s)
			live = append(live, a, cc)
			var small []device.Ptr
			for _, n := range c.small {
				small = append(small, v.alloc(t, n, s))
			}
			for i, p := range small {
				if slices.Contains(c.free, i) {
					v.free(t, p, s)
				} else {
					live = append(live, p)
				}
			}
			want := cc + device.Ptr(2*units.MiB+900*units.KiB)
			switch {
			case c.after >= 0:
				want = small[c.after] + device.Ptr(c.small[c.after])
			case c.before >= 0:
				want = small[c.before] - device.Ptr(c.n)
			}
			g := v.alloc(t, c.n, s)
			if g != want {
				t.Errorf("%s is at %v; want %v", units.Format(c.n), g, want)
			}
			if ps := v.e.PageStats(); ps.PeakMapped != c.peak {
				t.Errorf("PageStats = %+v; want %d pages at the peak", ps, c.peak)
			}
			if err := v.e.CheckInvariants(); err != nil {
				t.Error(err)
			}
			for _, p := range append(live, g) {
				v.free(t, p, s)
			}
		})
	}
}

// TestExpandableSmallRequestsFillDeadGaps: a small request that no free
// block of its class fits takes a dead gap of the large range: a free
// block too small for any large request, holding no whole page, between
// two live blocks, whose pages those blocks pin anyway; any other free
// block of the large range it leaves, and its own range grows. Pages are
// 2 MiB. The large range holds a [0, 3), g [3, 5.5) and c from 5.5 MiB,
// and four pages are mapped; g is freed or not, and 2.25 MiB may take the
// back of g's block, leaving [3, 3.25) free between a and that block.
func TestExpandableSmallRequestsFillDeadGaps(t *testing.T) {
	cases := map[string]struct {
		c       uint64 // c's size: 2.5 MiB ends at a page, 2.25 MiB leaves [7.75, 8) free before the range's hole
		freeG   bool   // g freed
		refill  bool   // then 2.25 MiB allocated, from the back of g's block
		gap     bool   // 128 KiB goes to the back of the gap [3, 3.25)
		mapped  uint64 // pages at the peak
		comment string
	}{
		"a dead gap":                 {c: 5 * units.MiB / 2, freeG: true, refill: true, gap: true, mapped: 4},
		"a block large requests fit": {c: 5 * units.MiB / 2, freeG: true, mapped: 5, comment: "[3, 5.5) is 2.5 MiB"},
		"beside a hole, not a block": {c: 9 * units.MiB / 4, mapped: 5, comment: "[7.75, 8) borders the range's unmapped pages"},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			v := newExpEnv(t, units.GiB, alloc.ExpandableConfig{})
			s := v.dev.DefaultStream()
			a := v.alloc(t, 3*units.MiB, s)
			g := v.alloc(t, 5*units.MiB/2, s)
			live := []device.Ptr{a, v.alloc(t, c.c, s)}
			if c.freeG {
				v.free(t, g, s)
			} else {
				live = append(live, g)
			}
			if c.refill {
				if l := v.alloc(t, 9*units.MiB/4, s); l != a.Add(13*units.MiB/4) {
					t.Fatalf("2.25 MiB is at %v; want the back of g's block, %v", l, a.Add(13*units.MiB/4))
				} else {
					live = append(live, l)
				}
			}
			p := v.alloc(t, 128*units.KiB, s)
			inGap := p == a.Add(3*units.MiB+128*units.KiB)
			if inGap != c.gap {
				t.Errorf("128 KiB is at %v (a at %v): in the gap %v; want %v %s", p, a, inGap, c.gap, c.comment)
			}
			if ps := v.e.PageStats(); ps.PeakMapped != c.mapped {
				t.Errorf("PageStats = %+v; want %d pages at the peak", ps, c.mapped)
			}
			if err := v.e.CheckInvariants(); err != nil {
				t.Error(err)
			}
			for _, q := range append(live, p) {
				v.free(t, q, s)
			}
			if err := v.e.CheckInvariants(); err != nil {
				t.Error(err)
			}
		})
	}
}

// TestExpandableHighWaterMark: a growth that would take the mapped bytes
// past their high-water mark first unmaps whole free pages; with
// KeepMapped it does not, and the peak is higher.
func TestExpandableHighWaterMark(t *testing.T) {
	cases := map[string]struct {
		cfg                  alloc.ExpandableConfig
		peak, mapped, unmaps uint64
	}{
		"default":    {alloc.ExpandableConfig{}, 12, 12, 5},
		"KeepMapped": {alloc.ExpandableConfig{KeepMapped: true}, 17, 17, 0},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			v := newExpEnv(t, units.GiB, c.cfg)
			s := v.dev.DefaultStream()
			// Pages 0–4, page 5, pages 6–10: 11 pages, the high-water mark.
			a := v.alloc(t, 10*units.MiB, s)
			b := v.alloc(t, 2*units.MiB, s)
			cc := v.alloc(t, 10*units.MiB, s)
			v.free(t, a, s)
			if err := s.Synchronize(); err != nil {
				t.Fatal(err)
			}
			d := v.alloc(t, 12*units.MiB, s) // fits nowhere: six more pages
			ps := v.e.PageStats()
			if ps.PeakMapped != c.peak || ps.Mapped != c.mapped || ps.Unmaps != c.unmaps {
				t.Errorf("PageStats = %+v; want peak %d, mapped %d, unmaps %d", ps, c.peak, c.mapped, c.unmaps)
			}
			if free, total, _ := v.dev.MemInfo(); total-free != c.mapped*2*units.MiB {
				t.Errorf("the device has %s in use; want the %d pages mapped", units.Format(total-free), c.mapped)
			}
			for _, p := range []device.Ptr{b, cc, d} {
				v.free(t, p, s)
			}
		})
	}
}

// TestExpandableTrim: Trim unmaps every whole free page, those freed on a
// stream whose work is not known done included (it waits for it), and
// keeps the pages live blocks touch.
func TestExpandableTrim(t *testing.T) {
	v := newExpEnv(t, units.GiB, alloc.ExpandableConfig{})
	s, err := v.dev.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	a := v.alloc(t, 9*units.MiB, s)
	b := v.alloc(t, 3*units.MiB, s) // [9, 12) MiB: pages 4 and 5
	v.free(t, a, s)
	if err := v.e.Trim(); err != nil {
		t.Fatal(err)
	}
	// Pages 0–3 are wholly free; page 4 holds the start of b.
	if ps := v.e.PageStats(); ps.Mapped != 2 || ps.Unmaps != 4 {
		t.Errorf("after Trim PageStats = %+v; want 2 pages mapped, 4 unmapped", ps)
	}
	if st := v.e.Stats(); st.Reserved != 4*units.MiB {
		t.Errorf("after Trim Reserved = %s; want 4 MiB", units.Format(st.Reserved))
	}
	// The unmapped pages map again for the next request that needs them.
	c := v.alloc(t, 8*units.MiB, s)
	if c != a {
		t.Errorf("8 MiB went to %v; want the unmapped pages at %v", c, a)
	}
	v.free(t, b, s)
	v.free(t, c, s)
}

// TestExpandableOutOfMemory: when the device is full, the allocator waits
// for the streams that own free blocks, unmaps every free page and retries;
// a Map that fails leaves nothing mapped behind.
func TestExpandableOutOfMemory(t *testing.T) {
	t.Run("unmaps cached pages and retries", func(t *testing.T) {
		v := newExpEnv(t, 64*units.MiB, alloc.ExpandableConfig{KeepMapped: true})
		s := v.dev.DefaultStream()
		a := v.alloc(t, 40*units.MiB, s)
		b := v.alloc(t, 2*units.MiB, s) // keeps a's pages from joining the growth
		v.free(t, a, s)
		c := v.alloc(t, 50*units.MiB+1, s) // 26 pages: not beside the 21 mapped
		// The first try runs out of memory; a's pages are unmapped and the
		// second fits.
		if st, ps := v.e.Stats(), v.e.PageStats(); st.Reserved != 54*units.MiB || ps.Mapped != 27 || ps.Unmaps < 20 {
			t.Errorf("Stats = %+v, %+v; want a's 20 pages unmapped and 27 pages (54 MiB) mapped", st, ps)
		}
		v.free(t, b, s)
		v.free(t, c, s)
	})
	t.Run("a failed map is undone", func(t *testing.T) {
		v := newExpEnv(t, 64*units.MiB, alloc.ExpandableConfig{})
		s := v.dev.DefaultStream()
		v.dev.Faults().FailMapAt(2) // the second page of the first growth
		a := v.alloc(t, 5*units.MiB, s)
		ps := v.e.PageStats()
		if ps.Mapped != 3 || ps.Maps != 4 || ps.Unmaps != 1 {
			t.Errorf("PageStats = %+v; want the failed growth's one page unmapped, then 3 pages mapped", ps)
		}
		if u := v.dev.VMUsage(); u.Mapped != 6*units.MiB || u.Physical != 6*units.MiB {
			t.Errorf("device VMUsage = %+v; want exactly the 3 pages", u)
		}
		if st := v.e.Stats(); st.Retries != 1 || st.Reserved != 6*units.MiB {
			t.Errorf("Stats = %+v", st)
		}
		v.free(t, a, s)
	})
	t.Run("too large for the device", func(t *testing.T) {
		v := newExpEnv(t, 64*units.MiB, alloc.ExpandableConfig{})
		s := v.dev.DefaultStream()
		_, err := v.e.Alloc(65*units.MiB, s)
		if !errors.Is(err, device.ErrOutOfMemory) || !strings.Contains(err.Error(), "unmapping every free page") {
			t.Errorf("Alloc beyond the device = %v; want ErrOutOfMemory saying what was tried", err)
		}
		if u := v.dev.VMUsage(); u.Mapped != 0 || u.Physical != 0 {
			t.Errorf("a failed Alloc left %+v on the device", u)
		}
		var oom *alloc.OutOfMemoryError
		if !errors.As(err, &oom) || oom.Report().Allocator != "expandable" || oom.Report().PageSize != 2*units.MiB || oom.Report().OOMs != 1 {
			t.Errorf("the error %v carries no report of the expandable allocator's pages", err)
		}
	})
}

// TestExpandableReport: the memory report counts pages and ranges.
func TestExpandableReport(t *testing.T) {
	v := newExpEnv(t, units.GiB, alloc.ExpandableConfig{})
	s := v.dev.DefaultStream()
	a := v.alloc(t, 5*units.MiB, s)
	b := v.alloc(t, 4*units.KiB, s) // the small class's range
	r := v.e.Report()
	if r.Pages != 4 || r.PeakPages != 4 || r.PageSize != 2*units.MiB || r.Segments != 2 || r.Cached() != units.MiB+2*units.MiB-4*units.KiB {
		t.Errorf("Report = %+v; want 4 pages in 2 ranges, 1 MiB + 2 MiB − 4 KiB cached", r)
	}
	v.free(t, a, s)
	v.free(t, b, s)
}

// noVM hides the simulator's virtual memory.
type noVM struct{ device.Device }

// TestNewExpandableNeedsVirtualMemory: a device without the ability is
// refused with ErrNotSupported.
func TestNewExpandableNeedsVirtualMemory(t *testing.T) {
	dev := openSimT(t, sim.Config{TotalBytes: units.GiB, AddressOnly: true})
	if _, err := alloc.NewExpandable(noVM{dev}, alloc.ExpandableConfig{}); !errors.Is(err, device.ErrNotSupported) {
		t.Errorf("NewExpandable on a device without virtual memory = %v; want ErrNotSupported", err)
	}
}

// TestExpandableHitPathDoesNotAllocate: an Alloc and Free pair of a size
// the allocator holds free makes no heap allocation and no device call.
func TestExpandableHitPathDoesNotAllocate(t *testing.T) {
	for _, n := range []uint64{4 * units.KiB, 64 * units.MiB} {
		v := newExpEnv(t, units.GiB, alloc.ExpandableConfig{})
		s := v.dev.DefaultStream()
		v.free(t, v.alloc(t, n, s), s)
		allocs := testing.AllocsPerRun(100, func() {
			p, err := v.e.Alloc(n, s)
			if err != nil {
				t.Fatal(err)
			}
			if err := v.e.Free(p, s); err != nil {
				t.Fatal(err)
			}
		})
		if allocs != 0 {
			t.Errorf("%s: %.1f heap allocations per Alloc+Free pair, want 0", units.Format(n), allocs)
		}
		if st := v.e.Stats(); st.DeviceAllocs != 1 || st.CacheHits < 100 {
			t.Errorf("%s: %+v: want every pair served from the first growth", units.Format(n), st)
		}
	}
}

// BenchmarkExpandableHit measures the cache-hit path, as BenchmarkPoolHit.
func BenchmarkExpandableHit(b *testing.B) {
	for _, n := range hitSizes {
		b.Run(units.Format(n), func(b *testing.B) {
			dev := openSimT(b, sim.Config{TotalBytes: 16 * units.GiB, AddressOnly: true, NoContext: true})
			e, err := alloc.NewExpandable(dev, alloc.ExpandableConfig{})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { e.Close() })
			s := dev.DefaultStream()
			warm, err := e.Alloc(n, s)
			if err != nil {
				b.Fatal(err)
			}
			if err := e.Free(warm, s); err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			for b.Loop() {
				p, err := e.Alloc(n, s)
				if err != nil {
					b.Fatal(err)
				}
				if err := e.Free(p, s); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// TestExpandableChurnBudget: a workload made to thrash — each round frees
// a large block between small live ones and asks for a larger one, which
// fits nowhere but past the high-water mark — unmaps before growths at
// most one page per two of the peak, so that maps and unmaps stay within
// three times the pages at the peak.
func TestExpandableChurnBudget(t *testing.T) {
	// SmallSize 1 MiB: the pins below are of the large class, as the big
	// blocks whose pages they pin.
	v := newExpEnv(t, 64*units.GiB, alloc.ExpandableConfig{SmallSize: units.MiB})
	s := v.dev.DefaultStream()
	var pins []device.Ptr
	big := v.alloc(t, 8*units.MiB, s)
	for i := range 200 {
		pins = append(pins, v.alloc(t, units.MiB+512, s)) // large class: pins the page after big
		v.free(t, big, s)
		big = v.alloc(t, uint64(10+i%3*2)*units.MiB, s)
	}
	ps := v.e.PageStats()
	if ps.GrowthUnmaps > ps.PeakMapped/2 {
		t.Errorf("%d pages unmapped before growths, over the budget of half the %d at the peak", ps.GrowthUnmaps, ps.PeakMapped)
	}
	if ps.GrowthUnmaps < ps.PeakMapped/2-8 {
		t.Errorf("PageStats = %+v: the workload should have spent the churn budget", ps)
	}
	if calls, bound := ps.Maps+ps.Unmaps+ps.Mapped, 3*ps.PeakMapped; calls > bound {
		t.Errorf("%d map and unmap calls (counting the unmaps Close will make); want at most %d", calls, bound)
	}
	v.free(t, big, s)
	for _, p := range pins {
		v.free(t, p, s)
	}
}

// checked is an Expandable that checks its books after every call.
type checked struct {
	*alloc.Expandable
	t *testing.T
}

func (c checked) check() {
	c.t.Helper()
	if err := c.CheckInvariants(); err != nil {
		c.t.Fatal(err)
	}
}

func (c checked) Alloc(n uint64, s device.Stream) (device.Ptr, error) {
	p, err := c.Expandable.Alloc(n, s)
	c.check()
	return p, err
}

func (c checked) Free(p device.Ptr, s device.Stream) error {
	err := c.Expandable.Free(p, s)
	c.check()
	return err
}

func (c checked) Trim() error {
	err := c.Expandable.Trim()
	c.check()
	return err
}

// FuzzExpandableInvariants runs the fuzz operations (allocations on three
// streams, frees, trims, streams held busy, device resets) and checks
// Expandable's books after every call: ranges tiled, holes whole unmapped
// pages, blocks mapped, Reserved the pages mapped.
func FuzzExpandableInvariants(f *testing.F) {
	for _, s := range append(append([][]byte{}, seeds...), poolSeeds...) {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) > 1024 {
			data = data[:1024]
		}
		alloctest.Ops(t, func(t *testing.T, dev device.Device) alloc.Allocator {
			return checked{newExpandableT(t, dev, alloc.ExpandableConfig{}), t}
		}, data)
	})
}

// TestExpandableReleaseThreshold: Trim keeps up to ReleaseThreshold bytes
// of cached pages mapped and unmaps the rest.
func TestExpandableReleaseThreshold(t *testing.T) {
	cases := map[string]struct {
		keep   uint64
		mapped uint64 // pages after Trim
	}{
		"all":          {0, 1},
		"6 MiB":        {6 * units.MiB, 4},
		"5 MiB":        {5 * units.MiB, 3},
		"more than it": {units.GiB, 11},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			v := newExpEnv(t, units.GiB, alloc.ExpandableConfig{ReleaseThreshold: c.keep})
			s := v.dev.DefaultStream()
			a := v.alloc(t, 20*units.MiB, s)
			b := v.alloc(t, 2*units.MiB, s)
			v.free(t, a, s)
			if err := v.e.Trim(); err != nil {
				t.Fatal(err)
			}
			if ps := v.e.PageStats(); ps.Mapped != c.mapped {
				t.Errorf("after Trim %d pages mapped; want %d", ps.Mapped, c.mapped)
			}
			v.free(t, b, s)
		})
	}
}

// TestExpandableRanges: each stream that needs memory while the others'
// blocks are live gets a range; when address space runs short a range is
// reserved at the size asked; Trim frees the ranges left with nothing
// mapped, so streams that come and go do not use address space up.
func TestExpandableRanges(t *testing.T) {
	// 600 GiB ranges: the simulator's 1 TiB of addresses holds one.
	v := newExpEnv(t, 64*units.MiB, alloc.ExpandableConfig{Reserve: 600 * units.GiB})
	var ps []device.Ptr
	var ss []device.Stream
	for range 3 {
		s, err := v.dev.NewStream()
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		ss = append(ss, s)
		ps = append(ps, v.alloc(t, 4*units.MiB, s))
	}
	if st := v.e.PageStats(); st.Reservation != 3 {
		t.Errorf("%d ranges reserved for three streams; want 3", st.Reservation)
	}
	if u := v.dev.VMUsage(); u.Reserved != 600*units.GiB+2*4*units.MiB {
		t.Errorf("%d bytes reserved; want one 600 GiB range and two of the 4 MiB asked", u.Reserved)
	}
	for i, p := range ps {
		v.free(t, p, ss[i])
	}
	if err := v.e.Trim(); err != nil {
		t.Fatal(err)
	}
	if u := v.dev.VMUsage(); u.Reserved != 0 || u.Mapped != 0 {
		t.Errorf("after freeing everything and Trim the device has %+v; want nothing reserved", u)
	}
	p := v.alloc(t, 4*units.MiB, ss[0]) // and the allocator goes on
	v.free(t, p, ss[0])
}
