package alloc_test

import (
	"cmp"
	"errors"
	"slices"
	"testing"

	"github.com/vramkit/vram/alloc"
	"github.com/vramkit/vram/alloc/alloctest"
	"github.com/vramkit/vram/device"
	"github.com/vramkit/vram/device/sim"
)

// poolSeeds are inline seed inputs for the Pool fuzz targets: runs of
// small, medium and large allocations on three streams, interleaved frees,
// trims and syncs, streams held busy while blocks are freed on them, and
// device resets.
var poolSeeds = [][]byte{
	{},
	{0, 1, 2, 4, 0, 6},
	{0, 10, 0, 0, 200, 1, 0, 9, 9, 4, 0, 4, 0, 4, 1, 6},
	{1, 0xff, 0xff, 2, 0x80, 0x10, 3, 0x40, 0x33, 5, 1, 5, 0, 5, 2, 7, 6, 0, 1, 2},
	{0, 0x81, 1, 0, 0x82, 2, 0, 0xc3, 7, 4, 1, 4, 0, 0, 0x41, 3, 6, 7, 4, 0},
	[]byte("the quick brown fox jumps over the lazy dog, many times over and over"),
	// Hold stream 1; a medium block on it, freed there; the same size on
	// stream 2 and on stream 1; release.
	{0x1e, 0x12, 0x00, 0x10, 0x14, 0x00, 0x22, 0x00, 0x10, 0x12, 0x00, 0x10, 0x1e},
	// Hold streams 1 and 2; fill the device with large blocks on 1, free
	// them there, ask on 2 (the pool must wait for stream 1 before it
	// may give up), release.
	{0x1e, 0x2e, 0x13, 0xff, 0xff, 0x13, 0xff, 0xff, 0x13, 0xff, 0xff, 0x13, 0xff, 0xff, 0x13, 0xff, 0xff,
		0x14, 0, 0x14, 0, 0x14, 0, 0x23, 0xff, 0xff, 0x23, 0xff, 0xff, 0x1e, 0x2e},
	// Small, medium and large blocks, one freed (cached); reset the
	// device; the same sizes again, one freed; hold stream 1 with a block
	// freed behind the hold; reset again.
	{0, 0, 10, 2, 0x10, 0, 3, 0, 5, 4, 1, 0xc6, 0, 0, 10, 2, 0x10, 0, 3, 0, 5, 4, 0,
		0x1e, 0x10, 0, 64, 0x14, 1, 0xd6},
}

// FuzzPool runs byte strings as sequences of Pool calls (and device
// resets) on a small simulated device and checks after every call that no two live blocks
// overlap, that every live block lies in a segment the pool holds, that
// InUse is the sum of the live blocks' rounded sizes and Reserved the sum
// of the segments and the device's own count, that no block is handed to
// a stream before the last use of its bytes on another stream has run
// (calls hold streams busy: alloctest.StreamRules), and, at the end, that
// freeing everything and trimming gives the device back all its memory.
func FuzzPool(f *testing.F) {
	for _, s := range poolSeeds {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, ops []byte) {
		fuzzPoolOps(t, ops, alloc.PoolConfig{})
	})
}

// FuzzPoolKeepCache is FuzzPool for a pool that keeps its cache.
func FuzzPoolKeepCache(f *testing.F) {
	for _, s := range poolSeeds {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, ops []byte) {
		fuzzPoolOps(t, ops, alloc.PoolConfig{KeepCache: true})
	})
}

type liveBlock struct {
	p device.Ptr
	n uint64
	s device.Stream // allocated on
}

func fuzzPoolOps(t *testing.T, ops []byte, cfg alloc.PoolConfig) {
	// Every call is checked against the whole pool, so a long input costs
	// its length squared; a few hundred calls reach every state that
	// matters on a small device.
	if len(ops) > 1024 {
		ops = ops[:1024]
	}
	rules := alloctest.NewStreamRules(t, sim.Config{TotalBytes: 160 * mib, NoContext: true})
	dev := rules.Device()
	defer dev.Close()
	free0, _, _ := dev.MemInfo()
	p, err := alloc.NewPool(dev, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	streams := []device.Stream{dev.DefaultStream()}
	for range 2 {
		s, err := dev.NewStream()
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		streams = append(streams, s)
	}
	defer rules.ReleaseAll() // before the streams close, should the test stop while one is held
	var live []liveBlock
	next := func() byte {
		if len(ops) == 0 {
			return 0
		}
		b := ops[0]
		ops = ops[1:]
		return b
	}
	check := func(what string) {
		t.Helper()
		if err := p.CheckInvariants(); err != nil {
			t.Fatalf("after %s: %v", what, err)
		}
		st := p.Stats()
		var inUse uint64
		sorted := slices.Clone(live)
		slices.SortFunc(sorted, func(a, b liveBlock) int { return cmp.Compare(a.p, b.p) })
		segs := p.Segments()
		for i, b := range sorted {
			inUse += (b.n + 511) &^ 511
			if i > 0 && sorted[i-1].p+device.Ptr(sorted[i-1].n) > b.p {
				t.Fatalf("after %s: live blocks %v (+%d) and %v overlap", what, sorted[i-1].p, sorted[i-1].n, b.p)
			}
			in := false
			for _, s := range segs {
				in = in || uint64(b.p) >= s.Base && uint64(b.p)+b.n <= s.Base+s.Size
			}
			if !in {
				t.Fatalf("after %s: live block %v (+%d) lies in no segment of %+v", what, b.p, b.n, segs)
			}
		}
		free, _, _ := dev.MemInfo()
		if st.InUse != inUse || st.Reserved != free0-free || st.InUse > st.Reserved {
			t.Fatalf("after %s: InUse %d (live blocks %d), Reserved %d (device %d)", what, st.InUse, inUse, st.Reserved, free0-free)
		}
	}
	for len(ops) > 0 {
		op := next()
		s := streams[int(op>>4)%len(streams)]
		switch op % 8 {
		case 0, 1, 2, 3:
			v := uint64(next())<<8 | uint64(next())
			var n uint64
			switch op % 4 {
			case 0, 1: // small
				n = 1 + v%(64*kib)
			case 2: // medium
				n = mib + v*150
			case 3: // large
				n = 10*mib + v*512
			}
			before := p.Stats()
			allocate := p.Alloc
			if op&8 != 0 { // bit 3: the exact-growth path
				allocate = p.AllocExact
			}
			ptr, err := allocate(n, s)
			if err != nil {
				if !errors.Is(err, device.ErrOutOfMemory) {
					t.Fatalf("Alloc(%d, exact %v): %v", n, op&8 != 0, err)
				}
				if after := p.Stats(); after.InUse != before.InUse || after.OOMs != before.OOMs+1 {
					t.Fatalf("failed Alloc changed the pool: %+v → %+v", before, after)
				}
				check("a failed alloc")
				continue
			}
			rules.Allocated(t, ptr, (n+511)&^511, s)
			live = append(live, liveBlock{ptr, n, s})
			check("alloc")
		case 4, 5:
			if len(live) == 0 {
				continue
			}
			i := int(next()) % len(live)
			rules.BeforeFree(t, live[i].p, (live[i].n+511)&^511, live[i].s, s)
			if err := p.Free(live[i].p, s); err != nil {
				t.Fatalf("Free(%v): %v", live[i].p, err)
			}
			live[i] = live[len(live)-1]
			live = live[:len(live)-1]
			check("free")
		case 6:
			if op&8 != 0 { // hold the stream busy, or release it
				rules.Toggle(t, s)
				continue
			}
			if op >= 0xc0 { // reset the device, work queued and blocks live
				streams, free0 = resetPoolFuzz(t, dev, p, live)
				live = nil
				check("a reset and freeing the blocks from before it")
				continue
			}
			if err := p.Trim(); err != nil {
				t.Fatalf("Trim: %v", err)
			}
			check("trim")
		case 7:
			if op&0x40 != 0 {
				p.ResetPeaks()
			} else {
				rules.ReleaseAll() // s may wait for a held stream
				if err := s.Synchronize(); err != nil {
					t.Fatal(err)
				}
			}
			check("sync")
		}
	}
	rules.ReleaseAll()
	for _, b := range live {
		if err := p.Free(b.p, streams[int(b.p>>9)%len(streams)]); err != nil {
			t.Fatalf("Free(%v): %v", b.p, err)
		}
	}
	live = nil
	if err := p.Trim(); err != nil {
		t.Fatal(err)
	}
	check("freeing everything and Trim")
	if free, _, _ := dev.MemInfo(); free != free0 {
		t.Fatalf("device has %d bytes free after freeing everything and Trim, %d at the start", free, free0)
	}
	if st := p.Stats(); st.Reserved != 0 || st.DeviceFrees != st.DeviceAllocs {
		t.Fatalf("after freeing everything and Trim: %+v", st)
	}
}

// resetPoolFuzz resets dev (the stream rules release their holds; work
// still queued goes with the reset) under pool p, frees every block of
// live, from before the reset (each Free must fail with
// device.ErrInvalidated and take its block back, leaving nothing in
// InUse or Reserved), and returns three streams made since and the
// device's free bytes.
func resetPoolFuzz(t *testing.T, dev device.Device, p *alloc.Pool, live []liveBlock) ([]device.Stream, uint64) {
	t.Helper()
	if err := dev.Reset(); err != nil {
		t.Fatalf("Reset: %v", err)
	}
	free0, _, _ := dev.MemInfo()
	streams := []device.Stream{dev.DefaultStream()}
	for range 2 {
		s, err := dev.NewStream()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close() })
		streams = append(streams, s)
	}
	for i, b := range live {
		if err := p.Free(b.p, streams[i%len(streams)]); !errors.Is(err, device.ErrInvalidated) {
			t.Fatalf("Free(%v) of a block from before the reset: err = %v, want one wrapping device.ErrInvalidated", b.p, err)
		}
	}
	if st := p.Stats(); st.InUse != 0 || st.Reserved != 0 || st.Frees != st.Allocs {
		t.Fatalf("with every block from before the reset freed: %+v", st)
	}
	return streams, free0
}
