package alloc_test

// When the pool records the events that let other streams reuse freed
// blocks (fence.go, "When events are recorded"): at the free, so
// that work queued on the freeing stream afterwards does not delay reuse;
// and never on the hit path of a pool used from one stream.

import (
	"testing"

	"github.com/vramkit/vram/alloc"
	"github.com/vramkit/vram/device"
	"github.com/vramkit/vram/device/sim"
)

// TestPoolRecordsEventAtFree frees a block on stream S once S's work on it
// is done, then gives S long work (held busy) and asks for the same size
// on stream T: the block must be T's, since the event that guards it was
// recorded at the free, before the long work. An event recorded later,
// at T's request, would cover the long work and make T take other memory.
func TestPoolRecordsEventAtFree(t *testing.T) {
	// Each case returns the block, live on S, that S is about to free.
	tests := map[string]func(t *testing.T, p *alloc.Pool, S, T device.Stream) device.Ptr{
		// The audit's case: the pool has seen only S when the block is
		// freed.
		"first free, before another stream is seen": func(t *testing.T, p *alloc.Pool, S, T device.Stream) device.Ptr {
			return mustAlloc(t, p, 64*kib, S)
		},
	}
	for name, setup := range tests {
		t.Run(name, func(t *testing.T) {
			dev := openSimT(t, sim.Config{TotalBytes: 256 * mib, NoContext: true})
			p := newPoolOn(t, dev)
			S, T := newStreamT(t, dev), newStreamT(t, dev)
			a := setup(t, p, S, T)
			lastUse(t, dev, a, 64*kib, 0xAA, S)
			if err := S.Synchronize(); err != nil {
				t.Fatal(err)
			}
			if err := p.Free(a, S); err != nil {
				t.Fatal(err)
			}
			busy(t, dev, S) // long work queued on S after the free
			allocs := p.Stats().DeviceAllocs
			b := mustAlloc(t, p, 64*kib, T)
			if b != a {
				t.Errorf("T got %v, want the block %v freed on S before S's later work: "+
					"the event guarding it covers work queued after the free", b, a)
			}
			if st := p.Stats(); st.DeviceAllocs != allocs {
				t.Errorf("device allocations %d → %d: T's Alloc did not reuse the freed block", allocs, st.DeviceAllocs)
			}
			if err := dev.Memset(b, 0x55, 64*kib, T); err != nil {
				t.Fatal(err)
			}
			expectBytes(t, dev, b, 64*kib, 0x55, T)
		})
	}
}

// TestPoolFreeDeviceCalls counts the event calls frees make: none on the
// hit path, with one stream or several.
func TestPoolFreeDeviceCalls(t *testing.T) {
	tests := map[string]struct {
		streams    int
		maxRecords int // per free, in the loop
	}{
		"one stream":  {streams: 1, maxRecords: 0},
		"two streams": {streams: 2, maxRecords: 0},
	}
	const pairs = 200
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			dev := &eventCounter{Device: openSimT(t, sim.Config{TotalBytes: 256 * mib, AddressOnly: true, NoContext: true})}
			p := newPoolOn(t, dev)
			var ss []device.Stream
			for range tc.streams {
				ss = append(ss, newStreamT(t, dev))
			}
			// Warm up: one block of each stream's own, freed there.
			var warm []device.Ptr
			for _, s := range ss {
				warm = append(warm, mustAlloc(t, p, 64*kib, s))
			}
			for i, s := range ss {
				if err := p.Free(warm[i], s); err != nil {
					t.Fatal(err)
				}
			}
			made, records, queries := dev.made.Load(), dev.records.Load(), dev.queries.Load()
			allocs := p.Stats().DeviceAllocs
			for i := range pairs {
				s := ss[i%len(ss)]
				q := mustAlloc(t, p, 64*kib, s)
				if err := p.Free(q, s); err != nil {
					t.Fatal(err)
				}
			}
			if st := p.Stats(); st.DeviceAllocs != allocs {
				t.Fatalf("the loop made %d device allocations; want hits only", st.DeviceAllocs-allocs)
			}
			if n := dev.made.Load() - made; n != 0 {
				t.Errorf("the loop made %d events, want none (they are recycled)", n)
			}
			if n := dev.queries.Load() - queries; n != 0 {
				t.Errorf("the loop queried events %d times, want none (it never missed)", n)
			}
			if n := dev.records.Load() - records; n > int64(tc.maxRecords*pairs) {
				t.Errorf("%d frees recorded %d events, want at most %d each", pairs, n, tc.maxRecords)
			}
		})
	}
}
