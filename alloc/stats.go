package alloc

// This file is the one place where allocators count what goes into Stats.
// Allocators that keep no lock on their hot path (Direct, AsyncPool) embed
// counters, whose figures are atomics: the hot path pays a few
// uncontended atomic adds, and a peak is raised with a compare-and-swap
// only when the current value passes it, which on a steady workload is
// almost never. Pools that keep their books under their own lock (Pool,
// PinnedPool) keep a plain Stats and change it only through the Locked
// methods at the end of the file, so that a snapshot is exact. Both
// count the same events the same way.

import "sync/atomic"

// counters keeps an allocator's Stats. The zero value is ready to use and
// is safe for concurrent use. A snapshot taken while other goroutines
// allocate is not atomic as a whole: each figure is exact, but two of them
// may straddle another goroutine's call (stats raises Reserved to at least
// InUse so that Stats.Cached never underflows).
type counters struct {
	inUse        atomic.Uint64 // bytes live, after the allocator's rounding
	peakInUse    atomic.Uint64 // most bytes live since the last resetPeaks
	reserved     atomic.Uint64 // bytes held from the device
	peakReserved atomic.Uint64 // most bytes held since the last resetPeaks
	allocs       atomic.Uint64 // successful Allocs
	frees        atomic.Uint64 // Frees that took a pointer back (one lost to a device reset included)
	cacheHits    atomic.Uint64 // Allocs served without a device allocation
	deviceAllocs atomic.Uint64 // device allocations made
	deviceFrees  atomic.Uint64 // device frees made
	retries      atomic.Uint64 // allocations retried after trimming
	ooms         atomic.Uint64 // Allocs refused for want of memory
}

// raise lifts peak to at least v.
func raise(peak *atomic.Uint64, v uint64) {
	for {
		p := peak.Load()
		if v <= p || peak.CompareAndSwap(p, v) {
			return
		}
	}
}

// onAlloc counts a successful allocation of n bytes (as the allocator
// spends them); cacheHit says it was served without a device allocation.
func (c *counters) onAlloc(n uint64, cacheHit bool) {
	raise(&c.peakInUse, c.inUse.Add(n))
	c.allocs.Add(1)
	if cacheHit {
		c.cacheHits.Add(1)
	}
}

// onFree counts a free that took back n bytes (the same n onAlloc saw).
func (c *counters) onFree(n uint64) {
	c.inUse.Add(^(n - 1))
	c.frees.Add(1)
}

// onDeviceAlloc counts a device allocation that reserved n bytes.
func (c *counters) onDeviceAlloc(n uint64) {
	raise(&c.peakReserved, c.reserved.Add(n))
	c.deviceAllocs.Add(1)
}

// onDeviceFree counts a device free that released n bytes.
func (c *counters) onDeviceFree(n uint64) {
	c.reserved.Add(^(n - 1))
	c.deviceFrees.Add(1)
}

// setReserved records reserved bytes observed from outside (an allocator
// whose reservation the device keeps, such as AsyncPool's) and raises the
// peak. It counts no device call.
func (c *counters) setReserved(n uint64) {
	c.reserved.Store(n)
	raise(&c.peakReserved, n)
}

// onRetry counts an allocation retried after trimming the cache.
func (c *counters) onRetry() { c.retries.Add(1) }

// onOOM counts an allocation refused for want of memory.
func (c *counters) onOOM() { c.ooms.Add(1) }

// stats returns a snapshot.
func (c *counters) stats() Stats {
	s := Stats{
		InUse:        c.inUse.Load(),
		Reserved:     c.reserved.Load(),
		Allocs:       c.allocs.Load(),
		Frees:        c.frees.Load(),
		CacheHits:    c.cacheHits.Load(),
		DeviceAllocs: c.deviceAllocs.Load(),
		DeviceFrees:  c.deviceFrees.Load(),
		Retries:      c.retries.Load(),
		OOMs:         c.ooms.Load(),
	}
	s.PeakInUse = max(c.peakInUse.Load(), s.InUse)
	s.Reserved = max(s.Reserved, s.InUse)
	s.PeakReserved = max(c.peakReserved.Load(), s.Reserved)
	return s
}

// resetPeaks sets both peaks to the current values.
func (c *counters) resetPeaks() {
	c.peakInUse.Store(c.inUse.Load())
	c.peakReserved.Store(c.reserved.Load())
}

// The methods below keep a Stats owned by an allocator that changes it
// only under its own lock (Pool, PinnedPool); they mirror counters'.

// allocLocked counts a successful allocation of n bytes (as the allocator
// spends them); cacheHit says it was served without a device allocation.
func (s *Stats) allocLocked(n uint64, cacheHit bool) {
	s.Allocs++
	s.InUse += n
	s.PeakInUse = max(s.PeakInUse, s.InUse)
	if cacheHit {
		s.CacheHits++
	}
}

// freeLocked counts a successful free of n bytes (the same n allocLocked
// saw).
func (s *Stats) freeLocked(n uint64) {
	s.Frees++
	s.InUse -= n
}

// deviceAllocLocked counts a device allocation that reserved n bytes.
func (s *Stats) deviceAllocLocked(n uint64) {
	s.DeviceAllocs++
	s.Reserved += n
	s.PeakReserved = max(s.PeakReserved, s.Reserved)
}

// deviceFreeLocked counts a device free that released n bytes.
func (s *Stats) deviceFreeLocked(n uint64) {
	s.DeviceFrees++
	s.Reserved -= n
}

// resetPeaksLocked sets both peaks to the current values.
func (s *Stats) resetPeaksLocked() {
	s.PeakInUse, s.PeakReserved = s.InUse, s.Reserved
}
