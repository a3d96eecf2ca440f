package vram

import (
	"testing"

	"github.com/vramkit/vram/internal/units"
)

// TestStagingReuseOrReplace: a set of buffers takes idle ones that hold
// its sizes, and gives up those that waste the most for new ones of its
// sizes when the limit leaves no room otherwise (a re-cut to shorter
// chunks and more slots). The arithmetic, under a 10 MiB limit with one
// 6 MiB buffer idle:
//   - one of 5 MiB: the idle 6 MiB serves it; nothing made;
//   - two of 5 MiB: 6 + 5 = 11 MiB > 10; the 6 MiB goes, two of 5 are
//     made (10 MiB);
//   - three of 3 MiB: 6 + 3 + 3 = 12 > 10; the 6 MiB goes: 9 MiB made;
//   - two of 7 MiB: 14 MiB never fits: none.
func TestStagingReuseOrReplace(t *testing.T) {
	const mib = units.MiB
	tests := map[string]struct {
		sizes      []uint64
		ok         bool
		made, held uint64 // bytes made by the set; held by the pool after
	}{
		"one, reused":           {sizes: []uint64{5 * mib}, ok: true, made: 0, held: 6 * mib},
		"two, replaced":         {sizes: []uint64{5 * mib, 5 * mib}, ok: true, made: 10 * mib, held: 10 * mib},
		"three small, replaced": {sizes: []uint64{3 * mib, 3 * mib, 3 * mib}, ok: true, made: 9 * mib, held: 9 * mib},
		"never fits":            {sizes: []uint64{7 * mib, 7 * mib}, ok: false, made: 0, held: 6 * mib},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			m := newHostManager(t, HostOptions{PinnedLimit: 64 * mib, Limit: 10 * mib}, 1<<40)
			p := m.Host().Staging()
			old, err := p.TryAcquireSet([]uint64{6 * mib})
			must(t, err)
			old[0].Release()
			before := p.Stats().Made
			set, err := p.TryAcquireSet(tc.sizes)
			must(t, err)
			if (set != nil) != tc.ok {
				t.Fatalf("TryAcquireSet(%v) = %d buffers; want a set: %v", tc.sizes, len(set), tc.ok)
			}
			for i, b := range set {
				if uint64(len(b.Bytes())) < tc.sizes[i] {
					t.Errorf("buffer %d holds %d bytes, fewer than its %d", i, len(b.Bytes()), tc.sizes[i])
				}
				b.Release()
			}
			st := p.Stats()
			if made := st.Made - before; made != tc.made || st.Bytes != tc.held {
				t.Errorf("made %s, the pool holds %s; want %s made, %s held", units.Format(made), units.Format(st.Bytes),
					units.Format(tc.made), units.Format(tc.held))
			}
			if st.Bytes > 10*mib || st.Idle != st.Bytes || (st.Made > 0) != (st.MakeTime > 0) {
				t.Errorf("stats %+v: want at most the 10 MiB limit held, all of it idle, a time for what was made", st)
			}
		})
	}
}
