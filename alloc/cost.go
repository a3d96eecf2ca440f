package alloc

// What a batch of allocations costs: the device bytes an allocator takes
// for a set of requests, stated by the allocator (Coster) so that a
// planner asks once instead of trying and planning again.
//
// An allocator that rounds finer than the device's page (Pool, AsyncPool:
// 512 B; the device: 2 MiB) gets its memory as segments of whole pages.
// Allocated with AllocExact, a request larger than the allocator's
// small-request size takes at most its bytes rounded up to a page; small
// requests share segments: when a new one is needed, every earlier one
// holds more than a page less the small-request size x (no small request
// is larger), so K = ⌊S/(page − x)⌋ + 1 pages hold them all (S their
// bytes; used only where x ≤ page/2, which keeps the cost monotone), and they
// never take more than each rounded up to a page (PageCost). The bound
// holds whatever free blocks the allocator caches (a request placed there
// opens no segment).

import (
	"math"

	"github.com/vramkit/vram/internal/units"
)

// Coster is an allocator that states what allocations will cost it.
// Optional, found by type assertion: Pool, AsyncPool and Direct implement
// it, and every adaptor in this package (Limit, Trace) forwards it. An
// adaptor written elsewhere should forward it too, or the manager falls
// back to assuming the worst and trying.
type Coster interface {
	// Cost returns the device bytes that allocating one array of each of
	// sizes (bytes asked for, allocated with AllocExact, in any order)
	// takes from the device's free memory at most; ok is false when the
	// allocator cannot say (an adaptor over one that does not). The cost
	// is non-decreasing in every size.
	Cost(sizes []uint64) (bytes uint64, ok bool)
	// Room returns the bytes, as the allocator charges them (rounded to
	// its Granularity), that the caps in its chain still let it hand out:
	// a Limit's cap less what it counts in use. math.MaxUint64 when
	// nothing caps it.
	Room() uint64
}

// PageCost is Cost for an allocator that rounds each request to gran
// bytes and takes its memory from the device in pages of page bytes,
// requests of at most small bytes (after rounding) sharing pages (see
// the file overview). With page ≤ gran the allocator rounds to whole
// pages itself, and the cost is the rounded sizes' sum. Figures that
// pass 2⁶⁴−1 saturate there.
func PageCost(sizes []uint64, gran, page, small uint64) uint64 {
	gran = max(gran, 1)
	if page <= gran {
		var sum uint64
		for _, s := range sizes {
			sum = satAdd(sum, roundTo(s, gran))
		}
		return sum
	}
	var cost, own, sum, n uint64
	for _, s := range sizes {
		r := roundTo(s, gran)
		p := roundTo(r, page)
		if r <= small {
			own, sum, n = satAdd(own, p), satAdd(sum, r), n+1
			continue
		}
		cost = satAdd(cost, p)
	}
	if n > 0 {
		shared := own
		// The bound takes small, not the largest request present, for x:
		// a request that grows past small leaves the shared pages (S and
		// so K fall by at most one page when small ≤ page/2) and takes a
		// page of its own, so the cost never falls as a size grows, as
		// Coster promises. With the largest request present instead, a
		// few requests growing past small could lower x enough to cost
		// less than before.
		if small <= page/2 {
			if k := sum/(page-small) + 1; k < n {
				shared = min(shared, max(satMul(k, page), sum))
			}
		}
		cost = satAdd(cost, shared)
	}
	return cost
}

// roundTo rounds n up to a multiple of g ≥ 1, saturating.
func roundTo(n, g uint64) uint64 {
	if r := n % g; r != 0 {
		return satAdd(n, g-r)
	}
	return n
}

func satAdd(a, b uint64) uint64 { return units.SatAdd(a, b) }

func satMul(a, b uint64) uint64 { return units.SatMul(a, b) }

// costOf forwards Cost to a when it is a Coster.
func costOf(a Allocator, sizes []uint64) (uint64, bool) {
	if c, ok := a.(Coster); ok {
		return c.Cost(sizes)
	}
	return 0, false
}

// roomOf forwards Room to a when it is a Coster (MaxUint64 otherwise).
func roomOf(a Allocator) uint64 {
	if c, ok := a.(Coster); ok {
		return c.Room()
	}
	return math.MaxUint64
}
