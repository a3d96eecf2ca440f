package alloc_test

// Only the bytes freed on a stream wait for its event (streamorder.go): a
// free merges its block with the shared free space beside it, but the
// block's pending span stays the freed bytes, and another stream's miss
// takes the rest back before it grows. Streams are held busy without a
// timer (alloctest.StreamRules), and every allocation is checked against
// the last uses still pending on other streams.

import (
	"sync/atomic"
	"testing"

	"github.com/vramkit/vram/alloc"
	"github.com/vramkit/vram/alloc/alloctest"
	"github.com/vramkit/vram/device"
	"github.com/vramkit/vram/device/sim"
	"github.com/vramkit/vram/internal/units"
)

// blockLister is an allocator whose free blocks a test can list (Pool,
// Expandable: streamorder_export_test.go).
type blockLister interface {
	alloc.Allocator
	FreeBlocks() []alloc.FreeBlock
}

// pendingEnv is an allocator on a StreamRules device, with streams S and T.
type pendingEnv struct {
	rules *alloctest.StreamRules
	a     blockLister
	S, T  device.Stream
	from  map[device.Ptr]device.Stream // live blocks: the stream each was allocated on
}

func newPendingEnv(t *testing.T, mk func(t *testing.T, dev device.Device) blockLister) *pendingEnv {
	t.Helper()
	rules := alloctest.NewStreamRules(t, sim.Config{TotalBytes: 256 * mib, NoContext: true})
	dev := rules.Device()
	t.Cleanup(func() {
		if err := dev.Close(); err != nil {
			t.Errorf("device Close: %v", err)
		}
	})
	v := &pendingEnv{rules: rules, S: newStreamT(t, dev), T: newStreamT(t, dev), from: map[device.Ptr]device.Stream{}}
	v.a = mk(t, dev)
	t.Cleanup(func() {
		if err := v.a.Close(); err != nil {
			t.Errorf("allocator Close: %v", err)
		}
	})
	t.Cleanup(rules.ReleaseAll) // before the allocator and the streams close
	return v
}

// alloc allocates n bytes on s, checked against the pending last uses.
func (v *pendingEnv) alloc(t *testing.T, n uint64, s device.Stream) device.Ptr {
	t.Helper()
	p := mustAlloc(t, v.a, n, s)
	v.rules.Allocated(t, p, n, s)
	v.from[p] = s
	return p
}

// free frees the n-byte block p on s, its last use enqueued there.
func (v *pendingEnv) free(t *testing.T, p device.Ptr, n uint64, s device.Stream) {
	t.Helper()
	v.rules.BeforeFree(t, p, n, v.from[p], s)
	delete(v.from, p)
	if err := v.a.Free(p, s); err != nil {
		t.Fatal(err)
	}
}

// ownedBy lists the free blocks s owns.
func (v *pendingEnv) ownedBy(s device.Stream) []alloc.FreeBlock {
	var out []alloc.FreeBlock
	for _, b := range v.a.FreeBlocks() {
		if b.Owned && b.Stream == s.Handle() {
			out = append(out, b)
		}
	}
	return out
}

// pendingAllocators are the strategies that merge freed blocks.
var pendingAllocators = map[string]func(t *testing.T, dev device.Device) blockLister{
	"pool": func(t *testing.T, dev device.Device) blockLister {
		p, err := alloc.NewPool(dev, alloc.PoolConfig{})
		if err != nil {
			t.Fatal(err)
		}
		return p
	},
	"expandable": func(t *testing.T, dev device.Device) blockLister {
		return newExpandableT(t, dev, alloc.ExpandableConfig{})
	},
}

// TestPendingFreeShedsSharedBytes: T takes a block (the allocator grows:
// a 2 MiB segment or page), S a block from the rest; S is held busy and
// frees its block, which merges with the free rest beside it, pending
// only on its own 64 KiB. T then asks for 64 KiB: it must get them from
// the rest, without growing, and S keeps only its pending bytes.
func TestPendingFreeShedsSharedBytes(t *testing.T) {
	const n = 64 * kib
	for name, mk := range pendingAllocators {
		t.Run(name, func(t *testing.T) {
			v := newPendingEnv(t, mk)
			keep := v.alloc(t, n, v.T)
			p := v.alloc(t, n, v.S)
			v.rules.Toggle(t, v.S) // hold S
			v.free(t, p, n, v.S)
			own := v.ownedBy(v.S)
			if len(own) != 1 || own[0].Size <= n || own[0].PendLo != uint64(p) || own[0].PendHi != uint64(p)+n {
				t.Fatalf("after the free on busy S, S owns %+v; want one block merged with the free rest beside it, pending on [%#x, +%d) only",
					own, uint64(p), n)
			}
			allocs := v.a.Stats().DeviceAllocs
			q := v.alloc(t, n, v.T)
			if st := v.a.Stats(); st.DeviceAllocs != allocs {
				t.Errorf("T's Alloc(%s) grew the allocator (%d → %d device allocations) beside %s of free space",
					units.Format(n), allocs, st.DeviceAllocs, units.Format(own[0].Size-n))
			}
			if own := v.ownedBy(v.S); len(own) != 1 || own[0].Addr != uint64(p) || own[0].Size != n {
				t.Errorf("after T's miss S owns %+v; want only its pending block [%#x, +%d)", own, uint64(p), n)
			}
			v.rules.Toggle(t, v.S) // release S
			v.free(t, q, n, v.T)
			v.free(t, keep, n, v.T)
		})
	}
}

// TestPendingSpanFollowsItsBytes: S takes its pending bytes back at once
// (its own stream); what it still owns then waits for nothing, and T's
// miss moves all of it to the shared set.
func TestPendingSpanFollowsItsBytes(t *testing.T) {
	const n = 64 * kib
	for name, mk := range pendingAllocators {
		t.Run(name, func(t *testing.T) {
			v := newPendingEnv(t, mk)
			keep := v.alloc(t, n, v.T)
			p := v.alloc(t, n, v.S)
			v.rules.Toggle(t, v.S)
			v.free(t, p, n, v.S)
			again := v.alloc(t, n, v.S)
			own := v.ownedBy(v.S)
			for _, b := range own {
				if b.PendLo != 0 || b.PendHi != 0 {
					t.Errorf("S took %#x (its pending block was %#x) and owns %+v; want nothing pending", uint64(again), uint64(p), own)
				}
			}
			allocs := v.a.Stats().DeviceAllocs
			q := v.alloc(t, n, v.T)
			if st := v.a.Stats(); st.DeviceAllocs != allocs {
				t.Errorf("T's Alloc(%s) grew the allocator (%d → %d device allocations) beside S's free bytes that wait for nothing",
					units.Format(n), allocs, st.DeviceAllocs)
			}
			if own := v.ownedBy(v.S); len(own) != 0 {
				t.Errorf("after T's miss S still owns %+v; want none", own)
			}
			v.rules.Toggle(t, v.S)
			v.free(t, again, n, v.S)
			v.free(t, q, n, v.T)
			v.free(t, keep, n, v.T)
		})
	}
}

// TestExpandableGrowthPagesWaitForNothing: S's growth joins its own free
// tail, pending behind busy S (1.5 MiB freed there beside 512 KiB of free
// rest, in one page); the 3 MiB request maps one page more, and the 1 MiB
// it leaves free was never used: T's 512 KiB must come from it, with no
// page mapped.
func TestExpandableGrowthPagesWaitForNothing(t *testing.T) {
	v := newPendingEnv(t, func(t *testing.T, dev device.Device) blockLister {
		return newExpandableT(t, dev, alloc.ExpandableConfig{SmallSize: 8 * mib})
	})
	e := v.a.(*alloc.Expandable)
	p := v.alloc(t, 1536*kib, v.S)
	v.rules.Toggle(t, v.S)
	v.free(t, p, 1536*kib, v.S)
	big := v.alloc(t, 3*mib, v.S)
	if ps := e.PageStats(); ps.Mapped != 2 {
		t.Fatalf("%d pages mapped for 3 MiB over S's 2 MiB free tail; want 2", ps.Mapped)
	}
	for _, b := range v.ownedBy(v.S) {
		if b.PendLo != 0 || b.PendHi != 0 {
			t.Errorf("after S's growth S owns %+v: the new page's free bytes wait for S", b)
		}
	}
	q := v.alloc(t, 512*kib, v.T)
	if ps := e.PageStats(); ps.Mapped != 2 {
		t.Errorf("T's 512 KiB mapped a page (%d mapped) beside the 1 MiB S's growth left free", ps.Mapped)
	}
	v.rules.Toggle(t, v.S)
	v.free(t, q, 512*kib, v.T)
	v.free(t, big, 3*mib, v.S)
}

// gatedMap is a device whose next Map, once armed, waits until the test
// lets it go: a growth is then in flight, its lock released, while the
// test makes other calls.
type gatedMap struct {
	vmDevice
	armed   chan struct{} // closed by the test to arm; the next Map takes it
	mapping chan struct{} // closed when the armed Map has begun
	proceed chan struct{} // closed by the test to let it map
	taken   atomic.Bool
}

type vmDevice interface {
	device.Device
	device.VirtualMemory
}

func (d *gatedMap) Map(p device.Ptr, n uint64, h device.PhysMem) error {
	select {
	case <-d.armed:
		if d.taken.CompareAndSwap(false, true) {
			close(d.mapping)
			<-d.proceed
		}
	default:
	}
	return d.vmDevice.Map(p, n, h)
}

// TestExpandableGrowthKeepsItsStream: a growth that joins a block its
// stream freed (pending: the stream is busy) holds that block out of the
// free index while it maps; a fence round by another stream meanwhile
// must not forget the stream (it owns no block in the index then), else
// the block's bytes the request leaves free would come back shared, and
// another stream could have them before the busy stream's work is done.
func TestExpandableGrowthKeepsItsStream(t *testing.T) {
	g := &gatedMap{armed: make(chan struct{}), mapping: make(chan struct{}), proceed: make(chan struct{})}
	var U device.Stream
	v := newPendingEnv(t, func(t *testing.T, dev device.Device) blockLister {
		g.vmDevice = dev.(vmDevice)
		U = newStreamT(t, dev)
		return newExpandableT(t, g, alloc.ExpandableConfig{SmallSize: 8 * mib})
	})
	e := v.a.(*alloc.Expandable)
	// S's range: [a1 | a2 | a3 | 1 MiB free], then a1's page unmapped.
	a1, a2, a3 := v.alloc(t, 2*mib, v.S), v.alloc(t, 2*mib, v.S), v.alloc(t, mib, v.S)
	v.free(t, a1, 2*mib, v.S)
	if err := e.Trim(); err != nil {
		t.Fatal(err)
	}
	u := v.alloc(t, 1536*kib, U) // U's range
	v.rules.Toggle(t, U)
	v.free(t, u, 1536*kib, U) // U owns a block, pending
	v.rules.Toggle(t, v.S)
	v.free(t, a2, 2*mib, v.S) // S's only block, pending, after the hole
	// S's 3 MiB: one page mapped into the hole, joining a2, which the
	// growth holds meanwhile; 1 MiB of a2 stays free, pending on S.
	close(g.armed)
	var big device.Ptr
	var bigErr error
	done := make(chan struct{})
	go func() {
		defer close(done)
		big, bigErr = v.a.Alloc(3*mib, v.S)
	}()
	<-g.mapping
	tb := v.alloc(t, 1536*kib, v.T) // a miss: a fence round over U (and S)
	close(g.proceed)
	<-done
	if bigErr != nil {
		t.Fatal(bigErr)
	}
	v.rules.Allocated(t, big, 3*mib, v.S)
	v.from[big] = v.S
	tc := v.alloc(t, mib, v.T) // must not be a2's last MiB
	v.rules.Toggle(t, v.S)
	v.rules.Toggle(t, U)
	for _, b := range []struct {
		p device.Ptr
		n uint64
	}{{tc, mib}, {tb, 1536 * kib}, {big, 3 * mib}, {a3, mib}} {
		v.free(t, b.p, b.n, v.from[b.p])
	}
	if err := e.CheckInvariants(); err != nil {
		t.Error(err)
	}
}
