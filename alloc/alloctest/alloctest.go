package alloctest

import (
	"errors"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/vramkit/vram/alloc"
	"github.com/vramkit/vram/device"
	"github.com/vramkit/vram/device/sim"
	"github.com/vramkit/vram/internal/units"
)

// Factory makes the allocator under test on dev, a fresh device that the
// suite closes after the allocator. It may call t.Fatal and register
// cleanups, but must not close dev. The allocator must own all it holds:
// its Close gives everything back to dev.
type Factory func(t *testing.T, dev device.Device) alloc.Allocator

// Run holds the allocator made by newAlloc to the Allocator contract, each
// rule a subtest on a fresh simulated device sized for it:
//
//   - Alignment: every pointer is non-zero and aligned to 256 bytes.
//   - NoOverlap: over a long random alloc/free sequence no two live
//     blocks overlap.
//   - Stats: the counters add up (allocations, frees, bytes in use and
//     reserved, peaks and their reset, reserved never above what the
//     device gave), and a zero-byte Alloc is refused.
//   - Streams: free on another stream than the allocation, reuse on the
//     same stream, and memory freed on a busy stream is not handed to
//     another stream before that stream's work is done, while the free
//     space beside it stays usable on every stream (on a device that
//     can hold a stream busy: one that runs Go kernels, or loads PTX and
//     maps host memory).
//   - OutOfMemory: a request the device cannot hold fails with an error
//     wrapping device.ErrOutOfMemory, is counted in OOMs, changes nothing
//     else, and the allocator stays usable, also after filling the device.
//   - UnknownPointer: Free of a pointer the allocator did not hand out
//     (interior, foreign, zero, already freed) fails with
//     alloc.ErrUnknownPointer and changes nothing.
//   - Trim: with nothing live, Trim after a device synchronization gives
//     every byte back to the device.
//   - Close: gives every byte back (live or cached); later calls fail
//     with alloc.ErrClosed.
//   - Concurrent: goroutines on their own streams allocating and freeing
//     at once (run it under -race).
//   - AfterReset: the device reset contract of alloc.Allocator. Across a
//     device Reset with blocks live and cached, allocations after the
//     reset are new memory the reset device accepts (copies to it
//     succeed); Free of a pointer from before it returns an error wrapping
//     device.ErrInvalidated and takes the pointer back; the counters
//     then count only memory from after the reset, Trim gives it all
//     back, and Close after another reset returns nil with InUse and
//     Reserved at zero. The devices here keep contents (copies), and the
//     suite resets them three times.
func Run(t *testing.T, newAlloc Factory) {
	t.Helper()
	run(t, simTarget, newAlloc)
}

// RunOn is Run on devices made by open instead of simulators: each subtest
// calls open once for a fresh device, which the suite closes when the
// subtest ends (after the allocator). It is how a real backend's
// allocators are held to the contract — the CUDA backend's tests run
// RunOn with cuda.Open for Direct, Pool and AsyncPool.
//
// Every rule of Run applies, sized from the device rather than fixed:
// OutOfMemory asks for twice the device's total memory and fills the
// device in blocks of a 64th of it (at least 4 MiB), so it takes all of
// the device's free memory for a moment; Streams' busy-stream check skips,
// saying why, on a device that cannot hold a stream busy (an address-only
// one, or a driver that does not really run kernels). AfterReset resets
// the device three times (on CUDA the primary context, which every Device of
// the process on that GPU shares). The other subtests need about 1 GiB
// free. Byte counts come from the device's MemInfo, so
// nothing else may allocate on the device while the suite runs. Before
// each subtest measures the device's free memory, a device that is not
// the simulator is warmed up (a stream made and closed, a small
// allocation, the stream-ordered pool synchronized and trimmed), so that
// memory the driver takes lazily on first use is not counted against the
// allocator.
func RunOn(t *testing.T, open func(t *testing.T) device.Device, newAlloc Factory) {
	t.Helper()
	run(t, target{open: func(t *testing.T, _ sim.Config) device.Device { return open(t) }}, newAlloc)
}

func run(t *testing.T, tg target, newAlloc Factory) {
	t.Helper()
	tests := map[string]func(t *testing.T, tg target, newAlloc Factory){
		"Alignment":      testAlignment,
		"NoOverlap":      testNoOverlap,
		"Stats":          testStats,
		"Streams":        testStreams,
		"OutOfMemory":    testOutOfMemory,
		"UnknownPointer": testUnknownPointer,
		"Trim":           testTrim,
		"Close":          testClose,
		"Concurrent":     testConcurrent,
		"AfterReset":     testAfterReset,
	}
	for name, test := range tests {
		t.Run(name, func(t *testing.T) { test(t, tg, newAlloc) })
	}
}

// target is where the subtests get their devices: fresh simulators made
// to each subtest's configuration (Run), or devices from the caller
// (RunOn), which ignore it.
type target struct {
	open func(t *testing.T, cfg sim.Config) device.Device
	sim  bool // devices are simulators made to cfg
}

var simTarget = target{
	sim: true,
	open: func(t *testing.T, cfg sim.Config) device.Device {
		t.Helper()
		d, err := sim.New(cfg)
		if err != nil {
			t.Fatalf("sim.New(%+v): %v", cfg, err)
		}
		return d
	},
}

// env is one subtest's device and allocator.
type env struct {
	dev       device.Device
	a         alloc.Allocator
	startFree uint64 // device free bytes before the allocator was made
	live      *blocks
}

// setup makes a device (a simulator made to cfg, or the caller's) and the
// allocator on it. The device is closed at the end of the test, after the
// allocator.
func setup(t *testing.T, tg target, newAlloc Factory, cfg sim.Config) *env {
	t.Helper()
	dev := tg.open(t, cfg)
	if dev == nil {
		t.Fatal("open returned a nil device")
	}
	t.Cleanup(func() {
		if err := dev.Close(); err != nil {
			t.Errorf("close device: %v", err)
		}
	})
	if !tg.sim {
		warmUp(t, dev)
	}
	free, _, err := dev.MemInfo()
	if err != nil {
		t.Fatalf("MemInfo: %v", err)
	}
	a := newAlloc(t, dev)
	e := &env{dev: dev, a: a, startFree: free, live: newBlocks()}
	t.Cleanup(func() { _ = a.Close() })
	return e
}

// warmStream makes a real device take the memory it takes lazily for a
// stream.
func warmStream(t *testing.T, dev device.Device) {
	t.Helper()
	s, err := dev.NewStream()
	if err != nil {
		t.Fatalf("warm-up: NewStream: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("warm-up: closing the stream: %v", err)
	}
}

// warmUp makes a real device take the memory a driver takes lazily — for
// a stream, for the first allocation, for the first memset and copies (the
// driver's internal modules), for the stream-ordered pool — and gives back
// what the pool still reserves from earlier tests, so that free memory
// measured afterwards moves only with the allocator (and the streams a
// test makes, which env.newStream leaves out).
func warmUp(t *testing.T, dev device.Device) {
	t.Helper()
	warmStream(t, dev)
	p, err := dev.Malloc(Alignment)
	if err != nil {
		t.Fatalf("warm-up: Malloc: %v", err)
	}
	if dev.Info().Backed {
		ds, b := dev.DefaultStream(), make([]byte, 8)
		err = dev.Memset(p, 0, 8, ds)
		if err == nil {
			err = dev.CopyHtoD(p, b, ds)
		}
		if err == nil {
			err = dev.CopyDtoH(b, p, ds)
		}
		if err == nil {
			err = ds.Synchronize()
		}
		if err != nil {
			t.Fatalf("warm-up: a memset and copies: %v", err)
		}
	}
	if err := dev.Free(p); err != nil {
		t.Fatalf("warm-up: Free: %v", err)
	}
	if aa, ok := dev.(device.AsyncAllocator); ok {
		s := dev.DefaultStream()
		if p, err := aa.MallocAsync(Alignment, s); err == nil {
			if err := aa.FreeAsync(p, s); err != nil {
				t.Fatalf("warm-up: FreeAsync: %v", err)
			}
		}
		if err := dev.Synchronize(); err != nil {
			t.Fatalf("warm-up: Synchronize: %v", err)
		}
		if err := aa.TrimPool(0); err != nil && !errors.Is(err, device.ErrNotSupported) {
			t.Fatalf("warm-up: TrimPool: %v", err)
		}
	}
	if err := dev.Synchronize(); err != nil {
		t.Fatalf("warm-up: Synchronize: %v", err)
	}
}

// addressOnly is a device of total bytes that keeps no contents.
func addressOnly(total uint64) sim.Config {
	return sim.Config{TotalBytes: total, AddressOnly: true}
}

// alloc allocates n bytes on s, checks the block and tracks it.
func (e *env) alloc(t *testing.T, n uint64, s device.Stream) device.Ptr {
	t.Helper()
	p, err := e.a.Alloc(n, s)
	if err != nil {
		t.Fatalf("Alloc(%s) on stream %d: %v", units.Format(n), s.Handle(), err)
	}
	if err := e.live.add(p, n, s); err != nil {
		t.Fatal(err)
	}
	return p
}

// free frees p on s and stops tracking it.
func (e *env) free(t *testing.T, p device.Ptr, s device.Stream) {
	t.Helper()
	if _, ok := e.live.remove(p); !ok {
		t.Fatalf("test bug: free of untracked %v", p)
	}
	if err := e.a.Free(p, s); err != nil {
		t.Fatalf("Free(%v) on stream %d: %v", p, s.Handle(), err)
	}
}

// freeAll frees every tracked block on the stream it was last used on.
func (e *env) freeAll(t *testing.T) {
	t.Helper()
	for e.live.len() > 0 {
		p, _, s := e.live.at(0)
		e.free(t, p, s)
	}
}

// used is the device memory taken since before the allocator was made.
func (e *env) used(t *testing.T) uint64 {
	t.Helper()
	free, _, err := e.dev.MemInfo()
	if err != nil {
		t.Fatalf("MemInfo: %v", err)
	}
	if free > e.startFree {
		t.Fatalf("device has %d bytes free, more than the %d it had before the allocator", free, e.startFree)
	}
	return e.startFree - free
}

// checkStats checks the invariants that hold at any quiet moment.
func (e *env) checkStats(t *testing.T) alloc.Stats {
	t.Helper()
	st := e.a.Stats()
	if st.InUse < e.live.liveBytes() {
		t.Errorf("Stats.InUse = %d, below the %d bytes live", st.InUse, e.live.liveBytes())
	}
	if st.Reserved < st.InUse {
		t.Errorf("Stats.Reserved = %d < InUse = %d", st.Reserved, st.InUse)
	}
	if st.PeakInUse < st.InUse || st.PeakReserved < st.Reserved {
		t.Errorf("peaks below current values: %+v", st)
	}
	if st.Allocs < st.Frees || st.Allocs-st.Frees != uint64(e.live.len()) {
		t.Errorf("Stats.Allocs − Frees = %d − %d, want %d live", st.Allocs, st.Frees, e.live.len())
	}
	if st.CacheHits > st.Allocs {
		t.Errorf("Stats.CacheHits = %d > Allocs = %d", st.CacheHits, st.Allocs)
	}
	if used := e.used(t); st.Reserved > used {
		t.Errorf("Stats.Reserved = %d, more than the %d bytes the device gave", st.Reserved, used)
	}
	return st
}

func testAlignment(t *testing.T, tg target, newAlloc Factory) {
	e := setup(t, tg, newAlloc, addressOnly(1*units.GiB))
	s := e.dev.DefaultStream()
	for _, n := range []uint64{1, 8, 255, 256, 257, 511, 512, 513, 4095, 4096, 65537, units.MiB + 1, 3*units.MiB + 7} {
		e.alloc(t, n, s) // checks alignment and overlap
	}
	e.checkStats(t)
	e.freeAll(t)
	e.checkStats(t)
}

// randomSize is log-uniform-ish over 1 B … 4 MiB, with round sizes often.
func randomSize(r *rand.Rand) uint64 {
	switch r.IntN(4) {
	case 0:
		return uint64(1+r.IntN(1024)) * 512 // multiples of the pool's rounding
	case 1:
		return uint64(1 + r.IntN(1024))
	default:
		return 1 + r.Uint64N(uint64(1)<<(8+r.IntN(15)))
	}
}

func testNoOverlap(t *testing.T, tg target, newAlloc Factory) {
	e := setup(t, tg, newAlloc, addressOnly(4*units.GiB))
	s1, err := e.dev.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	defer s1.Close()
	streams := []device.Stream{e.dev.DefaultStream(), s1}
	r := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < 3000; i++ {
		pAlloc := 0.7
		if e.live.len() > 64 {
			pAlloc = 0.3
		}
		if e.live.len() == 0 || r.Float64() < pAlloc {
			e.alloc(t, randomSize(r), streams[r.IntN(2)])
		} else {
			p, _, _ := e.live.at(r.IntN(e.live.len()))
			e.free(t, p, streams[r.IntN(2)])
		}
		if i%500 == 0 {
			e.checkStats(t)
		}
	}
	e.freeAll(t)
	if st := e.checkStats(t); st.InUse != 0 {
		t.Errorf("Stats.InUse = %d after freeing everything", st.InUse)
	}
}

func testStats(t *testing.T, tg target, newAlloc Factory) {
	e := setup(t, tg, newAlloc, addressOnly(1*units.GiB))
	s := e.dev.DefaultStream()
	before := e.a.Stats()
	if _, err := e.a.Alloc(0, s); err == nil {
		t.Errorf("Alloc(0) succeeded")
	}
	if st := e.a.Stats(); st.Allocs != before.Allocs || st.InUse != before.InUse {
		t.Errorf("Alloc(0) changed Stats: %+v → %+v", before, st)
	}
	gran := uint64(1)
	if g, ok := e.a.(alloc.Granular); ok {
		gran = max(g.Granularity(), 1)
	}
	sizes := []uint64{100, 512, 4096, 10000, units.MiB, 3 * units.MiB}
	var sum, rounded uint64
	var ptrs []device.Ptr
	for i, n := range sizes {
		ptrs = append(ptrs, e.alloc(t, n, s))
		sum += n
		r, _ := units.RoundUp(n, gran)
		rounded += r
		st := e.checkStats(t)
		if st.Allocs != uint64(i+1) {
			t.Errorf("after %d allocs Stats.Allocs = %d", i+1, st.Allocs)
		}
		if st.InUse < rounded {
			t.Errorf("after %d allocs of %d bytes (%d at granularity %d) Stats.InUse = %d",
				i+1, sum, rounded, gran, st.InUse)
		}
		if st.Reserved == 0 || st.PeakReserved == 0 {
			t.Errorf("nothing reserved with %d bytes live: %+v", sum, st)
		}
	}
	peak := e.a.Stats().InUse
	for i, p := range ptrs {
		e.free(t, p, s)
		st := e.checkStats(t)
		if st.Frees != uint64(i+1) {
			t.Errorf("after %d frees Stats.Frees = %d", i+1, st.Frees)
		}
		if st.PeakInUse < peak {
			t.Errorf("Stats.PeakInUse = %d fell below the %d once in use", st.PeakInUse, peak)
		}
	}
	st := e.checkStats(t)
	if st.InUse != 0 {
		t.Errorf("Stats.InUse = %d with nothing live", st.InUse)
	}
	if st.DeviceFrees > st.DeviceAllocs {
		t.Errorf("Stats.DeviceFrees = %d > DeviceAllocs = %d", st.DeviceFrees, st.DeviceAllocs)
	}
	if st.OOMs != 0 || st.Retries != 0 {
		t.Errorf("OOMs or retries with memory to spare: %+v", st)
	}
	if r, ok := e.a.(alloc.PeakResetter); ok {
		r.ResetPeaks()
		st := e.a.Stats()
		if st.PeakInUse != st.InUse || st.PeakReserved != st.Reserved {
			t.Errorf("after ResetPeaks: %+v", st)
		}
		p := e.alloc(t, 8192, s)
		if st := e.a.Stats(); st.PeakInUse < st.InUse || st.PeakInUse == 0 {
			t.Errorf("peak not raised after ResetPeaks and an alloc: %+v", st)
		}
		e.free(t, p, s)
	}
}

func testStreams(t *testing.T, tg target, newAlloc Factory) {
	t.Run("FreeOnAnotherStream", func(t *testing.T) {
		e := setup(t, tg, newAlloc, addressOnly(1*units.GiB))
		s1, s2 := e.newStream(t), e.newStream(t)
		for _, n := range []uint64{512, 100000, 2 * units.MiB} {
			p := e.alloc(t, n, s1)
			e.free(t, p, s2)
			q := e.alloc(t, n, s2)
			e.free(t, q, s1)
			r := e.alloc(t, n, s1) // may reuse either block
			e.free(t, r, s1)
			e.checkStats(t)
		}
	})
	t.Run("SameStreamReuse", func(t *testing.T) {
		e := setup(t, tg, newAlloc, addressOnly(1*units.GiB))
		s := e.newStream(t)
		for range 100 {
			p := e.alloc(t, 4096, s)
			e.free(t, p, s)
		}
		st := e.checkStats(t)
		if st.Allocs != 100 || st.Frees != 100 || st.InUse != 0 {
			t.Errorf("after 100 alloc/free pairs: %+v", st)
		}
	})
	t.Run("NoReuseBeforeStreamWork", testCrossStreamSafety(tg, newAlloc))
	t.Run("PendingFreeFencesOnlyItself", testPendingFree(tg, newAlloc))
}

func newStream(t *testing.T, dev device.Device) device.Stream {
	t.Helper()
	s, err := dev.NewStream()
	if err != nil {
		t.Fatalf("NewStream: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// newStream makes a stream for the test and leaves out of the allocator's
// count the device memory the driver takes for it (a real driver gives
// each stream resources of its own; the simulator takes none).
func (e *env) newStream(t *testing.T) device.Stream {
	t.Helper()
	before, _, err := e.dev.MemInfo()
	if err != nil {
		t.Fatalf("MemInfo: %v", err)
	}
	s := newStream(t, e.dev)
	after, _, err := e.dev.MemInfo()
	if err != nil {
		t.Fatalf("MemInfo: %v", err)
	}
	if after < before {
		e.startFree -= before - after
	}
	return s
}

// testCrossStreamSafety frees a block on a stream that will still write
// it for a while — the stream is held busy, and a memset of the block is
// queued behind the hold — then allocates on another stream (and on the
// same one) and sets the new block there. If the allocator handed the
// block to the other stream before the first stream's work finished, the
// late write shows through: the new owner's bytes must all be its own.
func testCrossStreamSafety(tg target, newAlloc Factory) func(t *testing.T) {
	return func(t *testing.T) {
		e := setup(t, tg, newAlloc, sim.Config{TotalBytes: 256 * units.MiB})
		s1, s2 := e.newStream(t), e.newStream(t)
		h := newHolder(t, e.dev) // skips when the device cannot hold a stream
		const n = 64 << 10
		cases := map[string]device.Stream{"other stream": s2, "same stream": s1}
		for name, next := range cases {
			for round := range 3 {
				p := e.alloc(t, n, s1)
				h.hold(t, s1, 20*time.Millisecond)
				if err := e.dev.Memset(p, 0xAA, n, s1); err != nil {
					t.Fatalf("Memset behind the held stream: %v", err)
				}
				e.free(t, p, s1)
				q := e.alloc(t, n, next)
				if err := e.dev.Memset(q, 0x55, n, next); err != nil {
					t.Fatalf("Memset: %v", err)
				}
				if err := e.dev.Synchronize(); err != nil {
					t.Fatalf("Synchronize: %v", err)
				}
				got := make([]byte, n)
				if err := e.dev.CopyDtoH(got, q, next); err != nil {
					t.Fatalf("CopyDtoH: %v", err)
				}
				if err := next.Synchronize(); err != nil {
					t.Fatalf("Synchronize: %v", err)
				}
				for i, b := range got {
					if b != 0x55 {
						t.Fatalf("%s, round %d: byte %d of the new block (%v, old block %v) is %#x: "+
							"the old stream's write landed after the block was handed out again",
							name, round, i, q, p, b)
					}
				}
				e.free(t, q, next)
			}
		}
		e.checkStats(t)
	}
}

// testOutOfMemory asks for more than the device holds, then fills the
// device. On the simulator the device is 64 MiB; on a caller's device the
// sizes follow its total memory.
func testOutOfMemory(t *testing.T, tg target, newAlloc Factory) {
	e := setup(t, tg, newAlloc, addressOnly(64*units.MiB))
	_, total, err := e.dev.MemInfo()
	if err != nil {
		t.Fatalf("MemInfo: %v", err)
	}
	huge := max(1*units.GiB, 2*total)
	block, _ := units.RoundUp(max(4*units.MiB, total/64), 2*units.MiB)
	s := e.dev.DefaultStream()
	keep := e.alloc(t, 4096, s)
	before := e.a.Stats()
	_, err = e.a.Alloc(huge, s)
	if !errors.Is(err, device.ErrOutOfMemory) {
		t.Fatalf("Alloc(%s) on a %s device: err = %v, want one wrapping device.ErrOutOfMemory",
			units.Format(huge), units.Format(total), err)
	}
	after := e.a.Stats()
	if after.OOMs != before.OOMs+1 {
		t.Errorf("Stats.OOMs went %d → %d over one failed Alloc", before.OOMs, after.OOMs)
	}
	if after.InUse != before.InUse || after.Allocs != before.Allocs {
		t.Errorf("a failed Alloc changed Stats: %+v → %+v", before, after)
	}
	e.checkStats(t)

	// Still usable, and can fill the device and recover.
	p := e.alloc(t, units.MiB, s)
	e.free(t, p, s)
	var filled bool
	for range 2*total/block + 2 {
		p, err := e.a.Alloc(block, s)
		if err != nil {
			if !errors.Is(err, device.ErrOutOfMemory) {
				t.Fatalf("filling the device: %v, want an error wrapping device.ErrOutOfMemory", err)
			}
			filled = true
			break
		}
		if err := e.live.add(p, block, s); err != nil {
			t.Fatal(err)
		}
	}
	if !filled {
		t.Fatalf("allocated %d blocks of %s on a %s device without running out",
			e.live.len(), units.Format(block), units.Format(total))
	}
	e.checkStats(t)
	e.freeAll(t)
	keep = e.alloc(t, block, s)
	e.free(t, keep, s)
	e.checkStats(t)
}

func testUnknownPointer(t *testing.T, tg target, newAlloc Factory) {
	e := setup(t, tg, newAlloc, addressOnly(1*units.GiB))
	s := e.dev.DefaultStream()
	p := e.alloc(t, 4096, s)
	other := e.alloc(t, 100000, s)
	foreign, err := e.dev.Malloc(4096)
	if err != nil {
		t.Fatalf("device Malloc: %v", err)
	}
	defer func() { _ = e.dev.Free(foreign) }()
	before := e.a.Stats()
	bad := map[string]device.Ptr{
		"interior": p + Alignment,
		"past end": other + 200000,
		"zero":     0,
		"foreign":  foreign,
		"wild":     device.Ptr(0xdead_0000_0000),
	}
	for name, q := range bad {
		if err := e.a.Free(q, s); !errors.Is(err, alloc.ErrUnknownPointer) {
			t.Errorf("Free(%s pointer %v): err = %v, want alloc.ErrUnknownPointer", name, q, err)
		}
	}
	if after := e.a.Stats(); after != before {
		t.Errorf("refused Frees changed Stats: %+v → %+v", before, after)
	}
	e.free(t, p, s)
	before = e.a.Stats()
	if err := e.a.Free(p, s); !errors.Is(err, alloc.ErrUnknownPointer) {
		t.Errorf("second Free(%v): err = %v, want alloc.ErrUnknownPointer", p, err)
	}
	if after := e.a.Stats(); after != before {
		t.Errorf("a double Free changed Stats: %+v → %+v", before, after)
	}
	e.free(t, other, s)
	e.checkStats(t)
}

func testTrim(t *testing.T, tg target, newAlloc Factory) {
	e := setup(t, tg, newAlloc, addressOnly(1*units.GiB))
	s1, s2 := e.dev.DefaultStream(), e.newStream(t)
	r := rand.New(rand.NewPCG(3, 4))
	for round := range 3 {
		for i := range 40 {
			s := s1
			if i%2 == 1 {
				s = s2
			}
			e.alloc(t, randomSize(r), s)
		}
		e.freeAll(t)
		if err := e.dev.Synchronize(); err != nil {
			t.Fatal(err)
		}
		if err := e.a.Trim(); err != nil {
			t.Fatalf("Trim: %v", err)
		}
		st := e.checkStats(t)
		if st.Reserved != 0 {
			t.Errorf("round %d: Stats.Reserved = %d after Trim with nothing live", round, st.Reserved)
		}
		if used := e.used(t); used != 0 {
			t.Errorf("round %d: device still gives %d bytes to the allocator after Trim with nothing live", round, used)
		}
	}
}

func testClose(t *testing.T, tg target, newAlloc Factory) {
	e := setup(t, tg, newAlloc, addressOnly(1*units.GiB))
	s1, s2 := e.dev.DefaultStream(), e.newStream(t)
	r := rand.New(rand.NewPCG(5, 6))
	var keep device.Ptr
	for i := range 60 {
		s := s1
		if i%3 == 0 {
			s = s2
		}
		p := e.alloc(t, randomSize(r), s)
		if i%2 == 0 {
			e.free(t, p, s)
		} else {
			keep = p
		}
	}
	if err := e.a.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if used := e.used(t); used != 0 {
		t.Errorf("after Close the device still gives %d bytes to the allocator", used)
	}
	if _, err := e.a.Alloc(4096, s1); !errors.Is(err, alloc.ErrClosed) {
		t.Errorf("Alloc after Close: err = %v, want alloc.ErrClosed", err)
	}
	if err := e.a.Free(keep, s1); !errors.Is(err, alloc.ErrClosed) {
		t.Errorf("Free after Close: err = %v, want alloc.ErrClosed", err)
	}
	if err := e.a.Close(); err != nil && !errors.Is(err, alloc.ErrClosed) {
		t.Errorf("second Close: %v", err)
	}
	_ = e.a.Stats() // must not panic
}

func testConcurrent(t *testing.T, tg target, newAlloc Factory) {
	e := setup(t, tg, newAlloc, addressOnly(4*units.GiB))
	const goroutines, ops = 4, 400
	streams := []device.Stream{e.dev.DefaultStream()}
	for range goroutines - 1 {
		streams = append(streams, e.newStream(t))
	}
	var wg sync.WaitGroup
	errs := make(chan error, goroutines)
	for g := range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(g), 7))
			s := streams[g]
			var mine []device.Ptr
			for i := 0; i < ops; i++ {
				if len(mine) == 0 || (len(mine) < 16 && r.IntN(2) == 0) {
					n := randomSize(r)
					p, err := e.a.Alloc(n, s)
					if err != nil {
						errs <- err
						return
					}
					if err := e.live.add(p, n, s); err != nil {
						errs <- err
						return
					}
					mine = append(mine, p)
					continue
				}
				k := r.IntN(len(mine))
				p := mine[k]
				mine = append(mine[:k], mine[k+1:]...)
				e.live.remove(p)
				if err := e.a.Free(p, s); err != nil {
					errs <- err
					return
				}
				if i%50 == 0 {
					_ = e.a.Stats()
				}
			}
			for _, p := range mine {
				e.live.remove(p)
				if err := e.a.Free(p, s); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	st := e.checkStats(t)
	if st.InUse != 0 || st.Allocs != st.Frees {
		t.Errorf("after every goroutine freed everything: %+v", st)
	}
}
