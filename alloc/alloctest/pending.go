package alloctest

import (
	"testing"

	"github.com/vramkit/vram/device/sim"
	"github.com/vramkit/vram/internal/units"
)

// testPendingFree: memory freed on a busy stream waits for that stream's
// work before another stream may have it, but only that memory: the free
// space beside it stays usable on every stream. Stream s2 takes a block
// (the allocator gets memory for it), s1 takes a block of the same size
// from what is left (where the allocator carves one stream's block from
// memory another stream's growth brought; else the rule has nothing to
// check: Direct), s1 is held busy until the test releases it (no timer)
// and frees its block; then s2 asks for the same size again. That must
// come from the free space beside s1's pending block: no growth, and no
// byte of the pending block.
func testPendingFree(tg target, newAlloc Factory) func(t *testing.T) {
	return func(t *testing.T) {
		e := setup(t, tg, newAlloc, sim.Config{TotalBytes: 256 * units.MiB})
		s1, s2 := e.newStream(t), e.newStream(t)
		h := newHolder(t, e.dev) // skips when the device cannot hold a stream
		const n = 64 << 10
		keep := e.alloc(t, n, s2)
		before := e.a.Stats()
		p := e.alloc(t, n, s1)
		if grown := e.a.Stats().Reserved; grown != before.Reserved {
			e.freeAll(t)
			t.Skipf("a %s block on a second stream grew the allocator (reserved %s → %s): it shares no free space between streams",
				units.Format(n), units.Format(before.Reserved), units.Format(grown))
		}
		release := h.holdUntil(t, s1)
		e.free(t, p, s1)
		q := e.alloc(t, n, s2)
		after := e.a.Stats()
		release()
		if q < p+n && p < q+n {
			t.Errorf("Alloc(%s) on stream %d returned %v, overlapping %v, freed on stream %d whose work up to the free had not run",
				units.Format(n), s2.Handle(), q, p, s1.Handle())
		}
		if after.Reserved > before.Reserved || after.DeviceAllocs > before.DeviceAllocs {
			t.Errorf("with a %s block freed on busy stream %d beside free space, Alloc(%s) on stream %d grew the allocator "+
				"(reserved %s → %s, device allocations %d → %d): the free space beside a pending block must stay usable on every stream",
				units.Format(n), s1.Handle(), units.Format(n), s2.Handle(), units.Format(before.Reserved), units.Format(after.Reserved),
				before.DeviceAllocs, after.DeviceAllocs)
		}
		e.free(t, q, s2)
		e.free(t, keep, s2)
		e.checkStats(t)
	}
}
