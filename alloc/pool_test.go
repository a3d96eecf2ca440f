package alloc_test

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"

	"github.com/vramkit/vram/alloc"
	"github.com/vramkit/vram/alloc/alloctest"
	"github.com/vramkit/vram/device"
	"github.com/vramkit/vram/device/sim"
	"github.com/vramkit/vram/internal/units"
)

const (
	kib = units.KiB
	mib = units.MiB
)

// poolEnv is a Pool on a fresh simulated device whose context takes no
// memory, so the device's used memory is the pool's.
type poolEnv struct {
	dev  *sim.Device
	p    *alloc.Pool
	free uint64 // device free memory before the pool
}

func newPoolEnv(t *testing.T, scfg sim.Config, cfg alloc.PoolConfig) *poolEnv {
	t.Helper()
	scfg.NoContext = true
	dev := openSimT(t, scfg)
	free, _, err := dev.MemInfo()
	if err != nil {
		t.Fatal(err)
	}
	p, err := alloc.NewPool(dev, cfg)
	if err != nil {
		t.Fatalf("NewPool: %v", err)
	}
	t.Cleanup(func() {
		if err := p.Close(); err != nil {
			t.Errorf("pool Close: %v", err)
		}
	})
	return &poolEnv{dev: dev, p: p, free: free}
}

// addressOnly is a simulated device of total bytes with no backing memory.
func addressOnlySim(total uint64) sim.Config {
	return sim.Config{TotalBytes: total, AddressOnly: true}
}

func (e *poolEnv) alloc(t *testing.T, n uint64, s device.Stream) device.Ptr {
	t.Helper()
	p, err := e.p.Alloc(n, s)
	if err != nil {
		t.Fatalf("Alloc(%d): %v", n, err)
	}
	return p
}

func (e *poolEnv) release(t *testing.T, p device.Ptr, s device.Stream) {
	t.Helper()
	if err := e.p.Free(p, s); err != nil {
		t.Fatalf("Free(%v): %v", p, err)
	}
}

// used is the device memory the pool holds, by the device's account.
func (e *poolEnv) used(t *testing.T) uint64 {
	t.Helper()
	free, _, err := e.dev.MemInfo()
	if err != nil {
		t.Fatal(err)
	}
	return e.free - free
}

// check verifies the pool's books and that Reserved is what the device
// says the pool holds.
func (e *poolEnv) check(t *testing.T) alloc.Stats {
	t.Helper()
	if err := e.p.CheckInvariants(); err != nil {
		t.Fatalf("invariants: %v", err)
	}
	st := e.p.Stats()
	if used := e.used(t); used != st.Reserved {
		t.Fatalf("Stats.Reserved = %d, device says the pool holds %d", st.Reserved, used)
	}
	return st
}

func (e *poolEnv) stream(t *testing.T) device.Stream {
	t.Helper()
	s, err := e.dev.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func TestPoolRoundsAndSplits(t *testing.T) {
	tests := map[string]struct {
		sizes   []uint64
		offsets []uint64 // from the first block
		inUse   uint64
	}{
		"512-byte rounding": {
			sizes:   []uint64{1, 512, 513, 1000},
			offsets: []uint64{0, 512, 1024, 2048},
			inUse:   512 + 512 + 1024 + 1024,
		},
		"exact multiples": {
			sizes:   []uint64{4 * kib, 8 * kib, 512},
			offsets: []uint64{0, 4 * kib, 12 * kib},
			inUse:   12*kib + 512,
		},
		"a block as large as a small segment's remainder": {
			sizes:   []uint64{mib, mib},
			offsets: []uint64{0, mib},
			inUse:   2 * mib,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			e := newPoolEnv(t, addressOnlySim(256*mib), alloc.PoolConfig{})
			s := e.dev.DefaultStream()
			var first device.Ptr
			for i, n := range tc.sizes {
				p := e.alloc(t, n, s)
				if i == 0 {
					first = p
				}
				if got := uint64(p - first); got != tc.offsets[i] {
					t.Errorf("block %d (%d bytes) at offset %d, want %d", i, n, got, tc.offsets[i])
				}
				if p%alloc.PoolGranularity != 0 {
					t.Errorf("block %d at %v: not %d-aligned", i, p, alloc.PoolGranularity)
				}
			}
			st := e.check(t)
			if st.InUse != tc.inUse || st.DeviceAllocs != 1 || st.CacheHits != uint64(len(tc.sizes)-1) {
				t.Errorf("stats %+v: want InUse %d, one device allocation, %d cache hits", st, tc.inUse, len(tc.sizes)-1)
			}
			if segs := e.p.Segments(); len(segs) != 1 || segs[0].Blocks != len(tc.sizes)+boolInt(tc.inUse < segs[0].Size) {
				t.Errorf("segments %+v: want one, split into the blocks and a free tail", segs)
			}
		})
	}
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

func TestPoolCoalesces(t *testing.T) {
	for _, order := range []string{"ABC", "CBA", "BAC", "ACB", "CAB", "BCA"} {
		t.Run(order, func(t *testing.T) {
			e := newPoolEnv(t, addressOnlySim(256*mib), alloc.PoolConfig{})
			s := e.dev.DefaultStream()
			blk := map[byte]device.Ptr{}
			for _, c := range []byte("ABC") {
				blk[c] = e.alloc(t, 64*kib, s)
			}
			guard := e.alloc(t, 64*kib, s) // keeps the run from merging with the tail
			for i := range len(order) {
				e.release(t, blk[order[i]], s)
			}
			segs := e.p.Segments()
			if len(segs) != 1 || segs[0].Blocks != 3 || segs[0].Free != 2 {
				t.Fatalf("segments %+v: want [free run, guard, free tail]", segs)
			}
			// The three merged into one 192 KiB hole, the best fit.
			if p := e.alloc(t, 192*kib, s); p != blk['A'] {
				t.Errorf("192 KiB at %v, want the merged hole at %v", p, blk['A'])
			}
			e.release(t, guard, s)
			e.check(t)
		})
	}
	t.Run("everything back to one block", func(t *testing.T) {
		e := newPoolEnv(t, addressOnlySim(256*mib), alloc.PoolConfig{})
		s := e.dev.DefaultStream()
		r := rand.New(rand.NewPCG(1, 2))
		var ps []device.Ptr
		for range 100 {
			ps = append(ps, e.alloc(t, 512*(1+r.Uint64N(64)), s))
		}
		r.Shuffle(len(ps), func(i, j int) { ps[i], ps[j] = ps[j], ps[i] })
		for _, p := range ps {
			e.release(t, p, s)
		}
		for _, seg := range e.p.Segments() {
			if seg.Blocks != 1 || seg.Free != 1 {
				t.Errorf("segment %+v: want one free block after freeing everything", seg)
			}
		}
		e.check(t)
	})
}

func TestPoolBestFit(t *testing.T) {
	// Holes of 3, 1 and 2 KiB (in address order), each followed by a live
	// guard block, then the segment's large free tail.
	holes := []uint64{3 * kib, 1 * kib, 2 * kib}
	tests := map[string]struct {
		n    uint64
		hole int // index into holes; -1 for the tail
	}{
		"exact 1 KiB":       {n: 1 * kib, hole: 1},
		"1.5 KiB takes 2":   {n: 1536, hole: 2},
		"2 KiB exact":       {n: 2 * kib, hole: 2},
		"2.5 KiB takes 3":   {n: 2560, hole: 0},
		"512 B takes 1":     {n: 512, hole: 1},
		"4 KiB takes tail":  {n: 4 * kib, hole: -1},
		"3 KiB exact first": {n: 3 * kib, hole: 0},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			e := newPoolEnv(t, addressOnlySim(256*mib), alloc.PoolConfig{})
			s := e.dev.DefaultStream()
			var at []device.Ptr
			for _, h := range holes {
				at = append(at, e.alloc(t, h, s))
				e.alloc(t, 512, s) // guard
			}
			tail := e.alloc(t, 512, s)
			e.release(t, tail, s)
			for _, p := range at {
				e.release(t, p, s)
			}
			want := tail
			if tc.hole >= 0 {
				want = at[tc.hole]
			}
			if p := e.alloc(t, tc.n, s); p != want {
				t.Errorf("Alloc(%d) at %v, want %v", tc.n, p, want)
			}
			e.check(t)
		})
	}
}

// busy blocks stream s behind a kernel until the returned function is
// called.
func busy(t *testing.T, dev *sim.Device, s device.Stream) (release func()) {
	t.Helper()
	gate := make(chan struct{})
	if err := dev.LaunchFunc(s, 1, func(device.View, int, int) error { <-gate; return nil }); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	release = func() {
		once.Do(func() {
			close(gate)
			if err := s.Synchronize(); err != nil {
				t.Error(err)
			}
		})
	}
	t.Cleanup(release)
	return release
}

func TestPoolCrossStreamReuse(t *testing.T) {
	tests := map[string]uint64{
		"small block":       4 * kib,
		"own-segment block": 12 * mib,
		"medium block":      3 * mib,
	}
	for name, n := range tests {
		t.Run(name, func(t *testing.T) {
			e := newPoolEnv(t, sim.Config{TotalBytes: 256 * mib}, alloc.PoolConfig{})
			s1, s2, s3 := e.stream(t), e.stream(t), e.stream(t)
			release := busy(t, e.dev, s1)

			p := e.alloc(t, n, s1)
			e.release(t, p, s1)
			// The same stream may reuse it at once: its work is ordered.
			if q := e.alloc(t, n, s1); q != p {
				t.Errorf("same stream: Alloc at %v, want the block just freed at %v", q, p)
			}
			e.release(t, p, s1)
			allocsBefore := e.p.Stats().DeviceAllocs

			// Another stream must not get it while s1's work is pending.
			q := e.alloc(t, n, s2)
			if q < p+device.Ptr(n) && p < q+device.Ptr(n) {
				t.Fatalf("stream 2 got %v, overlapping %v freed on busy stream 1", q, p)
			}
			e.release(t, q, s2)
			e.check(t)

			// Once s1's work is done, both blocks are reusable on a third
			// stream without a device allocation.
			release()
			allocsMid := e.p.Stats().DeviceAllocs
			got := map[device.Ptr]bool{}
			for range 2 {
				got[e.alloc(t, n, s3)] = true
			}
			if !got[p] {
				t.Errorf("after stream 1 finished, stream 3 got %v; want the block freed on stream 1 (%v) among them", got, p)
			}
			st := e.check(t)
			if st.DeviceAllocs != allocsMid {
				t.Errorf("device allocations %d → %d: the freed blocks were not reused", allocsMid, st.DeviceAllocs)
			}
			if allocsMid <= allocsBefore && n >= 12*mib {
				t.Errorf("stream 2 made no device allocation while stream 1 was busy")
			}
		})
	}
}

func TestPoolOutOfMemory(t *testing.T) {
	t.Run("trims its cache and retries", func(t *testing.T) {
		tests := map[string]struct {
			cfg    alloc.PoolConfig
			inject func(*sim.Device)
		}{
			"device full of cache": {cfg: alloc.PoolConfig{KeepCache: true}},
			"injected failure":     {inject: func(d *sim.Device) { d.Faults().OOMAtAlloc(1) }},
		}
		for name, tc := range tests {
			t.Run(name, func(t *testing.T) {
				e := newPoolEnv(t, addressOnlySim(64*mib), tc.cfg)
				s := e.dev.DefaultStream()
				a, b := e.alloc(t, 24*mib, s), e.alloc(t, 24*mib, s)
				e.release(t, a, s)
				e.release(t, b, s)
				if tc.inject != nil {
					tc.inject(e.dev)
				}
				e.alloc(t, 40*mib, s)
				st := e.check(t)
				if st.Retries != 1 || st.DeviceFrees != 2 || st.OOMs != 0 || st.Reserved != 40*mib {
					t.Errorf("stats %+v: want one retry after giving back both cached segments", st)
				}
			})
		}
	})
	t.Run("error says what there is", func(t *testing.T) {
		e := newPoolEnv(t, addressOnlySim(64*mib), alloc.PoolConfig{})
		s := e.dev.DefaultStream()
		e.alloc(t, 24*mib, s)
		e.alloc(t, 4*kib, s)
		before := e.check(t)
		_, err := e.p.Alloc(40*mib, s)
		if !errors.Is(err, device.ErrOutOfMemory) {
			t.Fatalf("Alloc(40 MiB) on a full device: err = %v, want ErrOutOfMemory", err)
		}
		for _, want := range []string{
			"alloc of 40 MiB", "24 MiB allocated", "26 MiB reserved", "2 MiB cached",
			"largest free block 2 MiB", "the device has 38 MiB of 64 MiB free",
		} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("error %q does not say %q", err, want)
			}
		}
		after := e.check(t)
		if after.OOMs != before.OOMs+1 || after.Retries != before.Retries+1 || after.InUse != before.InUse || after.Reserved != before.Reserved {
			t.Errorf("stats %+v → %+v: want one OOM and one retry, nothing else changed", before, after)
		}
	})
	t.Run("a request too large to round", func(t *testing.T) {
		e := newPoolEnv(t, addressOnlySim(64*mib), alloc.PoolConfig{})
		_, err := e.p.Alloc(math.MaxUint64, e.dev.DefaultStream())
		if !errors.Is(err, device.ErrOutOfMemory) {
			t.Errorf("Alloc(MaxUint64): err = %v, want ErrOutOfMemory", err)
		}
	})
}

func TestPoolRejectsBadCalls(t *testing.T) {
	e := newPoolEnv(t, addressOnlySim(64*mib), alloc.PoolConfig{})
	s := e.dev.DefaultStream()
	live := e.alloc(t, 4*kib, s)
	freed := e.alloc(t, 4*kib, s)
	e.release(t, freed, s)
	before := e.check(t)
	tests := map[string]struct {
		call func() error
		want error
	}{
		"alloc of zero bytes":              {func() error { _, err := e.p.Alloc(0, s); return err }, device.ErrInvalidValue},
		"alloc on nil stream":              {func() error { _, err := e.p.Alloc(1, nil); return err }, device.ErrInvalidValue},
		"free on nil stream":               {func() error { return e.p.Free(live, nil) }, device.ErrInvalidValue},
		"free of a pointer inside a block": {func() error { return e.p.Free(live+512, s) }, alloc.ErrUnknownPointer},
		"double free":                      {func() error { return e.p.Free(freed, s) }, alloc.ErrUnknownPointer},
		"free of zero":                     {func() error { return e.p.Free(0, s) }, alloc.ErrUnknownPointer},
		"free of a foreign pointer":        {func() error { return e.p.Free(1<<50, s) }, alloc.ErrUnknownPointer},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if err := tc.call(); !errors.Is(err, tc.want) {
				t.Errorf("err = %v, want %v", err, tc.want)
			}
			if after := e.check(t); after != before {
				t.Errorf("stats changed: %+v → %+v", before, after)
			}
		})
	}
}

func TestPoolConfig(t *testing.T) {
	tests := map[string]struct {
		cfg alloc.PoolConfig
		ok  bool
	}{
		"zero value":                     {ok: true},
		"custom":                         {cfg: alloc.PoolConfig{SmallSize: 256 * kib, SmallSegment: 4 * mib, LargeSize: 32 * mib}, ok: true},
		"small segment below small size": {cfg: alloc.PoolConfig{SmallSize: 4 * mib, SmallSegment: 2 * mib}},
		"large size not above small":     {cfg: alloc.PoolConfig{SmallSize: 16 * mib, SmallSegment: 16 * mib, LargeSize: 8 * mib}},
		"max medium below medium":        {cfg: alloc.PoolConfig{MediumSegment: 64 * mib, MaxMediumSegment: 32 * mib}},
	}
	dev := openSimT(t, addressOnlySim(64*mib))
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			p, err := alloc.NewPool(dev, tc.cfg)
			if tc.ok != (err == nil) {
				t.Fatalf("NewPool: err = %v, want ok %v", err, tc.ok)
			}
			if err != nil {
				if !errors.Is(err, device.ErrInvalidValue) {
					t.Errorf("err = %v, want ErrInvalidValue", err)
				}
				return
			}
			if c := p.Config(); c.SmallSize == 0 || c.LargeSize <= c.SmallSize || c.GrowthDivisor == 0 {
				t.Errorf("Config() = %+v: defaults not filled", c)
			}
			if p.Granularity() != 512 {
				t.Errorf("Granularity() = %d", p.Granularity())
			}
			p.Close()
		})
	}
	if _, err := alloc.NewPool(nil, alloc.PoolConfig{}); !errors.Is(err, device.ErrInvalidValue) {
		t.Errorf("NewPool(nil): err = %v", err)
	}
}

func TestPoolStatsAndPeaks(t *testing.T) {
	e := newPoolEnv(t, addressOnlySim(256*mib), alloc.PoolConfig{})
	s := e.dev.DefaultStream()
	a := e.alloc(t, 1000, s)   // 1 KiB, new small segment
	b := e.alloc(t, 12*mib, s) // own segment
	e.release(t, a, s)         // cached
	c := e.alloc(t, 512, s)    // hit
	st := e.check(t)
	want := alloc.Stats{
		InUse: 12*mib + 512, PeakInUse: 12*mib + 1024, Reserved: 14 * mib, PeakReserved: 14 * mib,
		Allocs: 3, Frees: 1, CacheHits: 1, DeviceAllocs: 2,
	}
	if st != want {
		t.Errorf("Stats = %+v\nwant    %+v", st, want)
	}
	e.release(t, b, s)
	e.p.ResetPeaks()
	if st := e.p.Stats(); st.PeakInUse != 512 || st.PeakReserved != 14*mib {
		t.Errorf("after ResetPeaks: %+v", st)
	}
	e.release(t, c, s)
	if err := e.p.Trim(); err != nil {
		t.Fatal(err)
	}
	if st := e.check(t); st.Reserved != 0 || st.DeviceFrees != 2 || st.Cached() != 0 {
		t.Errorf("after Trim: %+v", st)
	}
}

func TestPoolTrimAndClose(t *testing.T) {
	e := newPoolEnv(t, addressOnlySim(4*units.GiB), alloc.PoolConfig{})
	s1, s2 := e.dev.DefaultStream(), e.stream(t)
	r := rand.New(rand.NewPCG(5, 6))
	var live []device.Ptr
	var streams []device.Stream
	for i := range 200 {
		s := s1
		if i%3 == 0 {
			s = s2
		}
		live = append(live, e.alloc(t, 512+r.Uint64N(16*mib), s))
		streams = append(streams, s)
	}
	// Free half on the other stream than the one that allocated, so that
	// neighbours belong to different streams and do not merge.
	for i := 0; i < len(live); i += 2 {
		e.release(t, live[i], streams[(i+1)%len(streams)])
	}
	if err := e.p.Trim(); err != nil {
		t.Fatal(err)
	}
	half := e.check(t)
	for i := 1; i < len(live); i += 2 {
		e.release(t, live[i], streams[i])
	}
	if err := e.p.Trim(); err != nil {
		t.Fatal(err)
	}
	if st := e.check(t); st.Reserved != 0 || e.used(t) != 0 || st.DeviceFrees != st.DeviceAllocs {
		t.Errorf("after freeing everything and Trim: %+v (half way %+v), device holds %d", st, half, e.used(t))
	}

	// Close gives back live blocks too.
	for range 10 {
		e.alloc(t, 3*mib, s1)
	}
	if err := e.p.Close(); err != nil {
		t.Fatal(err)
	}
	if used := e.used(t); used != 0 {
		t.Errorf("device holds %d bytes after Close", used)
	}
	if leaks := e.dev.Leaks(); leaks.Allocs != 0 || leaks.Events != 0 {
		t.Errorf("leaks after Close (the test's own stream aside): %v", leaks)
	}
	for name, call := range map[string]func() error{
		"Alloc": func() error { _, err := e.p.Alloc(1, s1); return err },
		"Free":  func() error { return e.p.Free(live[0], s1) },
		"Trim":  e.p.Trim,
	} {
		if err := call(); !errors.Is(err, alloc.ErrClosed) {
			t.Errorf("%s after Close: err = %v, want ErrClosed", name, err)
		}
	}
	if err := e.p.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

func TestPoolConcurrent(t *testing.T) {
	e := newPoolEnv(t, addressOnlySim(2*units.GiB), alloc.PoolConfig{})
	const workers = 4
	errs := make(chan error, workers+1)
	var wg sync.WaitGroup
	for w := range workers {
		s := e.stream(t)
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(w), 7))
			var mine []device.Ptr
			for range 1500 {
				if len(mine) > 0 && r.IntN(2) == 0 {
					i := r.IntN(len(mine))
					// Free some on the default stream, to mix owners.
					fs := s
					if r.IntN(4) == 0 {
						fs = e.dev.DefaultStream()
					}
					if err := e.p.Free(mine[i], fs); err != nil {
						errs <- err
						return
					}
					mine[i] = mine[len(mine)-1]
					mine = mine[:len(mine)-1]
					continue
				}
				n := uint64(1 + r.IntN(64*1024))
				if r.IntN(8) == 0 {
					n = uint64(1+r.IntN(24)) * mib
				}
				p, err := e.p.Alloc(n, s)
				if err != nil {
					errs <- err
					return
				}
				mine = append(mine, p)
			}
			for _, p := range mine {
				if err := e.p.Free(p, s); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	stop := make(chan struct{})
	var trimmer sync.WaitGroup
	trimmer.Add(1)
	go func() {
		defer trimmer.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			if err := e.p.Trim(); err != nil {
				errs <- err
				return
			}
			if st := e.p.Stats(); st.InUse > st.Reserved || st.PeakInUse < st.InUse {
				errs <- fmt.Errorf("inconsistent stats snapshot %+v", st)
				return
			}
		}
	}()
	wg.Wait()
	close(stop)
	trimmer.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if err := e.p.Trim(); err != nil {
		t.Fatal(err)
	}
	if st := e.check(t); st.InUse != 0 || st.Reserved != 0 {
		t.Errorf("after all workers freed everything and Trim: %+v", st)
	}
}

func TestPoolConformanceKeepCache(t *testing.T) {
	alloctest.Run(t, func(t *testing.T, dev device.Device) alloc.Allocator {
		p, err := alloc.NewPool(dev, alloc.PoolConfig{KeepCache: true})
		if err != nil {
			t.Fatal(err)
		}
		return p
	})
}

// TestPoolHitPathDoesNotAllocate: an Alloc and Free pair of a size the
// pool holds free makes no heap allocation (the goal; the
// benchmark measures its time), for a split block and a whole one.
func TestPoolHitPathDoesNotAllocate(t *testing.T) {
	for _, n := range []uint64{4 * kib, 64 * mib} {
		e := newPoolEnv(t, addressOnlySim(units.GiB), alloc.PoolConfig{})
		s := e.dev.DefaultStream()
		e.release(t, e.alloc(t, n, s), s)
		allocs := testing.AllocsPerRun(100, func() {
			p, err := e.p.Alloc(n, s)
			if err != nil {
				t.Fatal(err)
			}
			if err := e.p.Free(p, s); err != nil {
				t.Fatal(err)
			}
		})
		if allocs != 0 {
			t.Errorf("%s: %.1f heap allocations per Alloc+Free pair, want 0", units.Format(n), allocs)
		}
		if st := e.check(t); st.DeviceAllocs != 1 || st.CacheHits < 100 {
			t.Errorf("%s: %+v: want every pair served from the one segment", units.Format(n), st)
		}
	}
}

// TestPoolForgetsIdleStreams: a program that makes, uses and closes
// streams does not leave the pool keeping state for each of them.
func TestPoolForgetsIdleStreams(t *testing.T) {
	e := newPoolEnv(t, addressOnlySim(units.GiB), alloc.PoolConfig{})
	for range 50 {
		s, err := e.dev.NewStream()
		if err != nil {
			t.Fatal(err)
		}
		e.release(t, e.alloc(t, 4*kib, s), s)
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
	}
	// A miss on the default stream runs a fence round over the streams
	// that own free blocks; the closed ones hand their blocks over and
	// are forgotten by the next round.
	s := e.dev.DefaultStream()
	big := e.alloc(t, 4*mib, s)
	e.release(t, e.alloc(t, 2*mib, s), s)
	e.release(t, big, s)
	other := e.stream(t)
	e.release(t, e.alloc(t, 12*mib, other), other)
	e.alloc(t, 30*mib, s)
	if n := e.p.StreamStates(); n > 3 {
		t.Errorf("the pool keeps state for %d streams after 50 were closed, want at most 3", n)
	}
	e.check(t)
}

// TestPoolOutOfMemoryAdvice: the error tells fragmentation apart from a
// pool that simply holds too much live memory.
func TestPoolOutOfMemoryAdvice(t *testing.T) {
	tests := map[string]struct {
		n     uint64 // allocate blocks of n bytes...
		count int    // ...this many...
		free  bool   // ...and free every other one
		ask   uint64
		want  string
	}{
		"too much live": {n: 40 * mib, count: 1, ask: 30 * mib, want: "free; free live arrays"},
		// Medium blocks share 20 MiB segments: three of them, each
		// holding two live 5 MiB blocks between two free ones.
		"cache in pieces": {n: 5 * mib, count: 12, free: true, ask: 8 * mib, want: "the cache has the bytes but not in one piece"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			e := newPoolEnv(t, addressOnlySim(64*mib), alloc.PoolConfig{})
			s := e.dev.DefaultStream()
			var ptrs []device.Ptr
			for range tc.count {
				ptrs = append(ptrs, e.alloc(t, tc.n, s))
			}
			for i := 0; tc.free && i < len(ptrs); i += 2 {
				e.release(t, ptrs[i], s)
			}
			_, err := e.p.Alloc(tc.ask, s)
			if !errors.Is(err, device.ErrOutOfMemory) {
				t.Fatalf("Alloc(%s): err = %v, want ErrOutOfMemory", units.Format(tc.ask), err)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q does not say %q", err, tc.want)
			}
			e.check(t)
		})
	}
}
