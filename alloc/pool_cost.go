package alloc

// Costs of the allocators in this package (see cost.go).

import "math"

// Cost is PageCost with the pool's granularity, the device's page and the
// pool's SmallSize: requests up to SmallSize share small segments, larger
// ones get, through AllocExact, a segment of their bytes rounded up to a
// page at most. ok is always true.
func (p *Pool) Cost(sizes []uint64) (uint64, bool) {
	return PageCost(sizes, p.Granularity(), p.dev.Info().Granularity, p.Config().SmallSize), true
}

// Room is math.MaxUint64: a Pool has no cap of its own.
func (p *Pool) Room() uint64 { return math.MaxUint64 }

// Cost is PageCost for the device's stream-ordered pool: requests rounded
// to PoolGranularity, pages of the device's granularity, requests of up
// to half a page sharing pages. ok is always true.
func (a *AsyncPool) Cost(sizes []uint64) (uint64, bool) {
	page := a.dev.Info().Granularity
	return PageCost(sizes, PoolGranularity, page, page/2), true
}

// Room is math.MaxUint64: an AsyncPool has no cap of its own.
func (a *AsyncPool) Room() uint64 { return math.MaxUint64 }

// Cost is the sizes rounded up to the device's page, summed: Direct
// takes each from the device on its own. ok is always true.
func (d *Direct) Cost(sizes []uint64) (uint64, bool) {
	return PageCost(sizes, d.Granularity(), d.Granularity(), 0), true
}

// Room is math.MaxUint64: Direct has no cap of its own.
func (d *Direct) Room() uint64 { return math.MaxUint64 }
