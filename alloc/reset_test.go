package alloc_test

// Device resets, allocator by allocator: what the conformance suite's
// AfterReset rule cannot see from outside (a Pool's books between the
// reset and the last free, its events, an allocation the reset overtakes,
// the pinned pool's HostFree of what the reset unpinned, the adaptors'
// own tables).

import (
	"bytes"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"unsafe"

	"github.com/vramkit/vram/alloc"
	"github.com/vramkit/vram/device"
	"github.com/vramkit/vram/device/sim"
	"github.com/vramkit/vram/internal/units"
)

// TestPoolBooksAcrossReset: at the first call after a reset the pool's
// cached segments leave Reserved (counted as device frees); of a segment
// with live blocks only they stay, each until it is freed (the last
// counting the device free), each free returning ErrInvalidated; the books check out at every step, and no
// segment from before the reset is listed.
func TestPoolBooksAcrossReset(t *testing.T) {
	dev := openSimT(t, addressOnlySim(256*units.MiB))
	p := newPoolOn(t, dev)
	s := dev.DefaultStream()
	a := mustAlloc(t, p, 4096, s)         // small segment, stays live
	b := mustAlloc(t, p, 4096, s)         // same small segment, cached
	c := mustAlloc(t, p, 12*units.MiB, s) // a segment of its own, stays live
	d := mustAlloc(t, p, 2*units.MiB, s)  // a shared medium segment, cached
	for _, q := range []device.Ptr{b, d} {
		if err := p.Free(q, s); err != nil {
			t.Fatal(err)
		}
	}
	segs := p.Segments()
	size := map[device.Ptr]uint64{}
	for _, sg := range segs {
		for _, q := range []device.Ptr{a, c, d} {
			if uint64(q) >= sg.Base && uint64(q) < sg.Base+sg.Size {
				size[q] = sg.Size
			}
		}
	}
	if len(segs) != 3 || len(size) != 3 {
		t.Fatalf("before the reset: segments %+v", segs)
	}
	st0 := p.Stats()
	if err := dev.Reset(); err != nil {
		t.Fatal(err)
	}
	s = dev.DefaultStream()

	steps := []struct {
		name     string
		free     device.Ptr // 0: just Stats
		reserved uint64
		inUse    uint64
	}{
		// Only the live blocks of a segment with live blocks stay.
		{"noticed at Stats", 0, st0.InUse, st0.InUse},
		{"small block freed", a, st0.InUse - 4096, st0.InUse - 4096},
		{"large block freed", c, 0, 0},
	}
	for i, step := range steps {
		if step.free != 0 {
			if err := p.Free(step.free, s); !errors.Is(err, device.ErrInvalidated) {
				t.Errorf("%s: Free = %v; want ErrInvalidated", step.name, err)
			}
		}
		st := p.Stats()
		if st.Reserved != step.reserved || st.InUse != step.inUse {
			t.Errorf("%s: Reserved %d, InUse %d; want %d, %d", step.name, st.Reserved, st.InUse, step.reserved, step.inUse)
		}
		if want := st0.DeviceFrees + uint64(i) + 1; st.DeviceFrees != want {
			t.Errorf("%s: DeviceFrees %d; want %d", step.name, st.DeviceFrees, want)
		}
		if len(p.Segments()) != 0 {
			t.Errorf("%s: segments from before the reset listed: %+v", step.name, p.Segments())
		}
		if err := p.CheckInvariants(); err != nil {
			t.Errorf("%s: %v", step.name, err)
		}
	}
	q := mustAlloc(t, p, 4096, s)
	if st := p.Stats(); st.InUse != 4096 || st.Reserved == 0 || st.CacheHits != st0.CacheHits {
		t.Errorf("first Alloc after the reset: %+v (a cache hit from before it?)", st)
	}
	if err := p.Free(q, s); err != nil {
		t.Fatal(err)
	}
	if err := p.CheckInvariants(); err != nil {
		t.Error(err)
	}
}

// TestPoolStreamsAcrossReset: an event of the pool's from before a reset
// (in flight on the default stream, whose handle outlives the reset, or
// kept for recycling) neither lets a block freed on a stream still busy
// after the reset go to another stream early, nor keeps it from going
// there once the stream has finished; and the events that replaced it are
// closed with the pool.
func TestPoolStreamsAcrossReset(t *testing.T) {
	tests := map[string]func(t *testing.T, dev *sim.Device, p *alloc.Pool){
		// The default stream's first free records an event at the free,
		// left in flight.
		"event in flight": func(t *testing.T, dev *sim.Device, p *alloc.Pool) {
			s := dev.DefaultStream()
			if err := p.Free(mustAlloc(t, p, units.MiB, s), s); err != nil {
				t.Fatal(err)
			}
		},
		// A miss on another stream finds that event complete and keeps
		// it as a spare, for the default stream's next free to take (no
		// free follows to take it before the reset).
		"spare event": func(t *testing.T, dev *sim.Device, p *alloc.Pool) {
			s := dev.DefaultStream()
			if err := p.Free(mustAlloc(t, p, units.MiB, s), s); err != nil {
				t.Fatal(err)
			}
			if err := s.Synchronize(); err != nil {
				t.Fatal(err)
			}
			mustAlloc(t, p, 2*units.MiB, newStreamT(t, dev))
		},
	}
	for name, before := range tests {
		t.Run(name, func(t *testing.T) {
			dev := openSimT(t, sim.Config{TotalBytes: 256 * units.MiB}) // backed: runs the kernel that holds a stream
			p := newPoolOn(t, dev)
			before(t, dev, p)
			if err := dev.Reset(); err != nil {
				t.Fatal(err)
			}
			s, other := dev.DefaultStream(), newStreamT(t, dev)

			// 12 MiB blocks get segments of their own, so that only the
			// block freed can serve the next request from the cache.
			const n = 12 * units.MiB
			release := busy(t, dev, s)
			q := mustAlloc(t, p, n, s)
			if err := p.Free(q, s); err != nil {
				t.Fatal(err)
			}
			r := mustAlloc(t, p, n, other)
			if r == q {
				t.Fatalf("a block freed on a stream still busy after the reset was handed to another stream")
			}
			release()
			if err := p.Free(r, other); err != nil {
				t.Fatal(err)
			}
			if err := dev.Synchronize(); err != nil {
				t.Fatal(err)
			}
			if err := p.Trim(); err != nil {
				t.Fatal(err)
			}

			for round := range 3 {
				q := mustAlloc(t, p, n, s)
				if err := p.Free(q, s); err != nil {
					t.Fatal(err)
				}
				if err := s.Synchronize(); err != nil {
					t.Fatal(err)
				}
				before := p.Stats()
				r := mustAlloc(t, p, n, other)
				if st := p.Stats(); st.DeviceAllocs != before.DeviceAllocs || r != q {
					t.Fatalf("round %d: a block freed on a finished stream after the reset was not reused on another: got %v, freed %v, device allocations %d → %d",
						round, r, q, before.DeviceAllocs, st.DeviceAllocs)
				}
				if err := p.Free(r, other); err != nil {
					t.Fatal(err)
				}
				if err := other.Synchronize(); err != nil {
					t.Fatal(err)
				}
			}
			if err := p.CheckInvariants(); err != nil {
				t.Error(err)
			}
			if err := p.Close(); err != nil {
				t.Fatalf("Close: %v", err)
			}
			if lr := dev.Leaks(); lr.Events != 0 {
				t.Errorf("after Close the device has %d events left: %v", lr.Events, lr)
			}
		})
	}
}

// resetDuring is a simulated device that resets itself during the next
// Malloc or HostAlloc once armed: before the call (which then hands out
// memory of the new generation) or after it (memory of the old one).
type resetDuring struct {
	*sim.Device
	before bool
	armed  atomic.Bool
}

func (d *resetDuring) around(call func() error) error {
	armed := d.armed.CompareAndSwap(true, false)
	if armed && d.before {
		if err := d.Reset(); err != nil {
			return err
		}
	}
	err := call()
	if armed && !d.before {
		if rerr := d.Reset(); rerr != nil {
			return rerr
		}
	}
	return err
}

func (d *resetDuring) Malloc(n uint64) (p device.Ptr, err error) {
	err = d.around(func() error { p, err = d.Device.Malloc(n); return err })
	return p, err
}

func (d *resetDuring) HostAlloc(n uint64, mapped bool) (b device.HostBuffer, err error) {
	err = d.around(func() error { b, err = d.Device.HostAlloc(n, mapped); return err })
	return b, err
}

// TestGrowthOvertakenByReset: a reset during a pool's device allocation
// leaves it unable to tell which side of the reset the new memory is
// from. The pool gives it back, and the Alloc fails with ErrInvalidated,
// counting nothing; the next Alloc works, and after Close nothing is left
// on the device. Likewise when the device call itself fails with the reset
// (the simulator's injected reset).
func TestGrowthOvertakenByReset(t *testing.T) {
	tests := map[string]struct {
		before, inject bool
	}{
		"reset before the device call": {before: true},
		"reset after the device call":  {before: false},
		"device call fails with it":    {inject: true},
	}
	kinds := map[string]func(t *testing.T, dev device.Device, s device.Stream) (alloc.Stats, error){
		"Pool": func(t *testing.T, dev device.Device, s device.Stream) (alloc.Stats, error) {
			p := newPoolOn(t, dev)
			_, err := p.Alloc(units.MiB, s)
			if err == nil {
				return p.Stats(), nil
			}
			if cerr := p.CheckInvariants(); cerr != nil {
				t.Error(cerr)
			}
			st := p.Stats()
			q := mustAlloc(t, p, units.MiB, dev.DefaultStream())
			return st, errors.Join(err, p.Free(q, dev.DefaultStream()), p.Close())
		},
		"PinnedPool": func(t *testing.T, dev device.Device, s device.Stream) (alloc.Stats, error) {
			p := newPinnedT(t, dev, alloc.PinnedConfig{})
			_, err := p.Alloc(units.MiB, s)
			if err == nil {
				return p.Stats(), nil
			}
			st := p.Stats()
			pinnedFree(t, p, pinnedAlloc(t, p, units.MiB, dev.DefaultStream()), dev.DefaultStream())
			return st, errors.Join(err, p.Close())
		},
	}
	for kind, run := range kinds {
		for name, tc := range tests {
			t.Run(kind+"/"+name, func(t *testing.T) {
				sd := openSimT(t, addressOnlySim(64*units.MiB))
				d := &resetDuring{Device: sd, before: tc.before}
				if tc.inject {
					sd.Faults().ResetAt(sim.OpAlloc, 1)
				} else {
					d.armed.Store(true)
				}
				st, err := run(t, d, d.DefaultStream())
				if !errors.Is(err, device.ErrInvalidated) {
					t.Fatalf("Alloc across a reset: %v; want an error wrapping device.ErrInvalidated", err)
				}
				if st.Allocs != 0 || st.DeviceAllocs != 0 || st.InUse != 0 || st.Reserved != 0 {
					t.Errorf("the failed Alloc counted: %+v", st)
				}
				if lr := sd.Leaks(); !lr.Empty() {
					t.Errorf("left on the device after Close: %v", lr)
				}
			})
		}
	}
}

// hostFreeLog is a simulated device that records each pinned buffer
// HostAlloc made (numbered: the simulator, as a driver may, can hand a
// later buffer the address of one freed) and how many times HostFree was
// called on it (whatever it returned).
type hostFreeLog struct {
	*sim.Device
	mu    sync.Mutex
	seq   int
	at    map[*byte]int // an address → the buffer made there last
	freed map[int]int   // a buffer → its HostFree calls
}

func newHostFreeLog(d *sim.Device) *hostFreeLog {
	return &hostFreeLog{Device: d, at: map[*byte]int{}, freed: map[int]int{}}
}

func (d *hostFreeLog) HostAlloc(n uint64, mapped bool) (device.HostBuffer, error) {
	b, err := d.Device.HostAlloc(n, mapped)
	if err == nil {
		d.mu.Lock()
		d.seq++
		d.at[unsafe.SliceData(b.Data)] = d.seq
		d.mu.Unlock()
	}
	return b, err
}

func (d *hostFreeLog) HostFree(b device.HostBuffer) error {
	d.mu.Lock()
	d.freed[d.at[unsafe.SliceData(b.Data)]]++
	d.mu.Unlock()
	return d.Device.HostFree(b)
}

// id is the buffer made last at b's address: call it while b is held.
func (d *hostFreeLog) id(b device.HostBuffer) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.at[unsafe.SliceData(b.Data)]
}

func (d *hostFreeLog) count(id int) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.freed[id]
}

// TestPinnedPoolReleasesWhatResetUnpinned: a reset unpins every buffer,
// but the host memory stays until HostFree (on CUDA, this package's own
// mapping). The pool hands each buffer from before the reset to HostFree
// exactly once: cached ones at the first call after the reset that may
// call the device (here an Alloc; Stats only takes them off the books),
// live ones when they are freed.
func TestPinnedPoolReleasesWhatResetUnpinned(t *testing.T) {
	sd := openSimT(t, sim.Config{TotalBytes: 64 * units.MiB})
	d := newHostFreeLog(sd)
	p := newPinnedT(t, d, alloc.PinnedConfig{})
	s := d.DefaultStream()
	live := pinnedAlloc(t, p, 4096, s)
	c1, c2 := pinnedAlloc(t, p, 8192, s), pinnedAlloc(t, p, 100000, s)
	liveID, c1ID, c2ID := d.id(live), d.id(c1), d.id(c2)
	pinnedFree(t, p, c1, s)
	pinnedFree(t, p, c2, s)
	if err := d.Synchronize(); err != nil {
		t.Fatal(err)
	}
	if err := d.Reset(); err != nil {
		t.Fatal(err)
	}
	s = d.DefaultStream()
	if st := p.Stats(); st.Reserved != 4096 || st.InUse != 4096 || d.count(c1ID)+d.count(c2ID) != 0 {
		t.Errorf("Stats after the reset: %+v, cached buffers freed %d, %d times; want only the live buffer held, nothing freed yet",
			st, d.count(c1ID), d.count(c2ID))
	}
	b := pinnedAlloc(t, p, 8192, s)
	bID := d.id(b)
	if bID == c1ID || d.count(c1ID) != 1 || d.count(c2ID) != 1 {
		t.Errorf("Alloc after the reset: reused %v; cached buffers freed %d, %d times; want a new buffer, each freed once",
			bID == c1ID, d.count(c1ID), d.count(c2ID))
	}
	if err := p.Free(live, s); !errors.Is(err, device.ErrInvalidated) || d.count(liveID) != 1 {
		t.Errorf("Free of the live buffer from before the reset: %v, HostFree called %d times; want ErrInvalidated, once", err, d.count(liveID))
	}
	pinnedFree(t, p, b, s)
	if err := p.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	for name, id := range map[string]int{"live": liveID, "cached": c1ID, "other cached": c2ID, "new": bID} {
		if n := d.count(id); n != 1 {
			t.Errorf("%s buffer: HostFree called %d times; want once", name, n)
		}
	}
	if lr := sd.Leaks(); lr.HostBuffers != 0 {
		t.Errorf("left pinned: %v", lr)
	}
}

// TestAsyncPoolFreeOnStreamFromBeforeReset: a pointer allocated after a
// reset and freed naming a stream from before it (whose work went with
// the reset) is freed all the same, on the default stream.
func TestAsyncPoolFreeOnStreamFromBeforeReset(t *testing.T) {
	dev := openSimT(t, addressOnlySim(64*units.MiB))
	a := newAsyncT(t, dev, alloc.AsyncConfig{})
	defer a.Close()
	old := newStreamT(t, dev)
	if err := dev.Reset(); err != nil {
		t.Fatal(err)
	}
	p := mustAlloc(t, a, units.MiB, dev.DefaultStream())
	if err := a.Free(p, old); err != nil {
		t.Fatalf("Free on a stream from before the reset: %v", err)
	}
	if st := a.Stats(); st.InUse != 0 || st.Frees != 1 {
		t.Errorf("after the free: %+v", st)
	}
	if lr := dev.Leaks(); lr.AsyncAllocs != 0 {
		t.Errorf("left on the device: %v", lr)
	}
}

// TestAdaptorsAcrossReset: when the upstream takes back a pointer lost to
// a reset (its Free wrapping ErrInvalidated), Limit releases its bytes
// from Used and Trace keeps the free in its log, not logging the pointer
// as allocated again.
func TestAdaptorsAcrossReset(t *testing.T) {
	ups := map[string]func(t *testing.T, dev device.Device) alloc.Allocator{
		"Direct":    func(t *testing.T, dev device.Device) alloc.Allocator { return alloc.NewDirect(dev) },
		"Pool":      func(t *testing.T, dev device.Device) alloc.Allocator { return newPoolT(t, dev) },
		"AsyncPool": func(t *testing.T, dev device.Device) alloc.Allocator { return newAsyncT(t, dev, alloc.AsyncConfig{}) },
	}
	for name, up := range ups {
		t.Run(name, func(t *testing.T) {
			dev := openSimT(t, addressOnlySim(64*units.MiB))
			var log bytes.Buffer
			l := alloc.NewLimit(up(t, dev), 16*units.MiB)
			tr := alloc.NewTrace(l, &log)
			s := dev.DefaultStream()
			p := mustAlloc(t, tr, 4*units.MiB, s)
			if err := dev.Reset(); err != nil {
				t.Fatal(err)
			}
			s = dev.DefaultStream()
			if err := tr.Free(p, s); !errors.Is(err, device.ErrInvalidated) {
				t.Fatalf("Free after the reset: %v; want ErrInvalidated", err)
			}
			if l.Used() != 0 {
				t.Errorf("Limit.Used = %d after its only pointer was taken back", l.Used())
			}
			if err := tr.Free(p, s); !errors.Is(err, alloc.ErrUnknownPointer) {
				t.Errorf("second Free: %v; want ErrUnknownPointer", err)
			}
			// The whole cap is there again.
			q := mustAlloc(t, tr, 16*units.MiB, s)
			if err := tr.Free(q, s); err != nil {
				t.Fatal(err)
			}
			if err := tr.Close(); err != nil {
				t.Fatalf("Close: %v", err)
			}
			var actions []string
			for _, line := range parseTraceLog(t, log.String()) {
				actions = append(actions, line.action)
			}
			if got, want := strings.Join(actions, ","), "allocate,free,allocate,free"; got != want {
				t.Errorf("trace actions %s; want %s", got, want)
			}
		})
	}
}

// TestPoolStaleSegmentLeavesReserved: after a reset, a segment that still
// holds a live block keeps only that block in Reserved; its cached rest
// is gone at once, so Cached is 0, a growth after the reset does not
// take PeakReserved past the device, and an out-of-memory error reports
// no cache that the reset took.
func TestPoolStaleSegmentLeavesReserved(t *testing.T) {
	tests := map[string]struct {
		total  uint64
		blocks uint64 // allocated before the reset; all but the first freed
		size   uint64
		after  uint64 // allocated after the reset (0: none)
	}{
		"small segment":  {total: 64 * units.MiB, blocks: 2, size: units.MiB},
		"medium segment": {total: 40 * units.MiB, blocks: 4, size: 8 * units.MiB, after: 30 * units.MiB},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			dev := openSimT(t, sim.Config{TotalBytes: tc.total, NoContext: true, AddressOnly: true})
			p := newPoolOn(t, dev)
			s := newStreamT(t, dev)
			var bs []device.Ptr
			for range tc.blocks {
				bs = append(bs, mustAlloc(t, p, tc.size, s))
			}
			for _, b := range bs[1:] {
				if err := p.Free(b, s); err != nil {
					t.Fatal(err)
				}
			}
			if err := dev.Synchronize(); err != nil {
				t.Fatal(err)
			}
			if st := p.Stats(); st.Cached() == 0 {
				t.Fatalf("before the reset: nothing cached: %+v", st)
			}
			if err := dev.Reset(); err != nil {
				t.Fatal(err)
			}
			st := p.Stats()
			if st.Reserved != tc.size || st.InUse != tc.size || st.Cached() != 0 {
				t.Errorf("after the reset: Reserved %d, InUse %d, Cached %d; want %d, %d, 0 (the live block only)",
					st.Reserved, st.InUse, st.Cached(), tc.size, tc.size)
			}
			if err := p.CheckInvariants(); err != nil {
				t.Error(err)
			}
			T := newStreamT(t, dev)
			if tc.after != 0 {
				x := mustAlloc(t, p, tc.after, T)
				if st := p.Stats(); st.PeakReserved > tc.total {
					t.Errorf("PeakReserved %d exceeds the device's %d bytes: %+v", st.PeakReserved, tc.total, st)
				}
				_, err := p.Alloc(tc.total-tc.after+units.MiB, T)
				if !errors.Is(err, device.ErrOutOfMemory) {
					t.Fatalf("Alloc past the device: err = %v, want ErrOutOfMemory", err)
				}
				if !strings.Contains(err.Error(), "(0 B cached") {
					t.Errorf("error %q reports cache the reset took", err)
				}
				if err := p.Free(x, T); err != nil {
					t.Fatal(err)
				}
			}
			before := p.Stats()
			if err := p.Free(bs[0], T); !errors.Is(err, device.ErrInvalidated) {
				t.Errorf("Free of the block from before the reset = %v; want ErrInvalidated", err)
			}
			st = p.Stats()
			if st.Reserved != before.Reserved-tc.size || st.InUse != before.InUse-tc.size || st.DeviceFrees != before.DeviceFrees+1 {
				t.Errorf("after the last free from before the reset: %+v; want %d fewer bytes reserved and in use than %+v, and one more device free",
					st, tc.size, before)
			}
			if err := p.CheckInvariants(); err != nil {
				t.Error(err)
			}
		})
	}
}
