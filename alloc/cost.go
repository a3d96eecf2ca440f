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
// holds more than a page less the largest small request x, so
// K = ⌊S/(page − x)⌋ + 1 pages hold them all (S their bytes), and they
// never take more than each rounded up to a page (PageCost). The bound
// holds whatever free blocks the allocator caches (a request placed there
// opens no segment).

import (
	"math"
	"math/bits"
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
	var cost, own, sum, largest, n uint64
	for _, s := range sizes {
		r := roundTo(s, gran)
		p := roundTo(r, page)
		if r <= small {
			own, sum, largest, n = satAdd(own, p), satAdd(sum, r), max(largest, r), n+1
			continue
		}
		cost = satAdd(cost, p)
	}
	if n > 0 {
		shared := own
		if largest < page {
			if k := sum/(page-largest) + 1; k < n {
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

func satAdd(a, b uint64) uint64 {
	s, carry := bits.Add64(a, b, 0)
	if carry != 0 {
		return math.MaxUint64
	}
	return s
}

func satMul(a, b uint64) uint64 {
	hi, lo := bits.Mul64(a, b)
	if hi != 0 {
		return math.MaxUint64
	}
	return lo
}

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
