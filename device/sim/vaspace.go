package sim

// Device address space.
//
// Every simulated device (and every generation of one, after a Reset) owns
// a region of the 64-bit address space that no other ever gets: regions
// are handed out by a process-wide bump counter starting at
// 0x7f0000000000, each at least 1 TiB (16 times the device's memory when
// that is more). Because regions are never reused, a pointer tells which
// device and which generation made it, so a pointer from another device
// or from before a Reset is recognised, not mistaken for a live one.
//
// Within a region, ranges (multiples of the granularity) are handed out
// next-fit: the search starts where the last allocation ended and wraps
// around at the end. A freed range is therefore not handed out again soon,
// which keeps freed addresses recognisable as freed (use after free) for
// as long as possible, as compute-sanitizer's quarantine does. The device
// remembers which allocation a freed address belonged to for its last
// 65,536 frees; older ones are still known to be freed memory (an access
// is a use after free) because every address below the highest one ever
// handed out has been handed out. The free
// ranges live in a treap keyed by address that knows the largest free span
// of each subtree, so the search is O(log n).

import (
	"sort"
	"sync"

	"github.com/vramkit/vram/internal/units"
)

const (
	// AddressBase is where the first simulated device's addresses start.
	AddressBase uint64 = 0x7f00_0000_0000
	regionMin          = units.TiB
)

// regions is the process-wide record of address regions, so that any
// device can say which device a foreign pointer came from.
var regions struct {
	mu   sync.Mutex // protects the fields below
	next uint64     // start of the next region
	list []region   // sorted by lo (regions are handed out in order)
}

type region struct {
	lo, hi uint64
	dev    uint64 // id of the device that owns it
	gen    uint64 // generation of that device
}

// newRegion reserves a fresh address region of at least size bytes.
func newRegion(size, dev, gen uint64) region {
	r := regionMin
	for r < size {
		r <<= 1
	}
	regions.mu.Lock()
	defer regions.mu.Unlock()
	if regions.next == 0 {
		regions.next = AddressBase
	}
	rg := region{lo: regions.next, hi: regions.next + r, dev: dev, gen: gen}
	regions.next += r
	regions.list = append(regions.list, rg)
	return rg
}

// regionOf finds the region holding addr.
func regionOf(addr uint64) (region, bool) {
	regions.mu.Lock()
	defer regions.mu.Unlock()
	l := regions.list
	i := sort.Search(len(l), func(i int) bool { return l[i].hi > addr })
	if i < len(l) && l[i].lo <= addr {
		return l[i], true
	}
	return region{}, false
}

// vaSpace hands out address ranges within one region.
type vaSpace struct {
	lo, hi uint64
	cursor uint64         // next-fit position
	high   uint64         // end of the highest range ever handed out
	free   tree[struct{}] // free ranges: key = start, span = length
}

func newVASpace(rg region) *vaSpace {
	v := &vaSpace{lo: rg.lo, hi: rg.hi, cursor: rg.lo}
	v.free.insert(rg.lo, 0, rg.hi-rg.lo, struct{}{})
	return v
}

// alloc takes n bytes (n > 0, a multiple of the granularity), next-fit.
func (v *vaSpace) alloc(n uint64) (uint64, bool) {
	var start, end, at uint64
	if f := v.free.floor(v.cursor, 0); f != nil && f.k1+f.span > v.cursor && f.k1+f.span-v.cursor >= n {
		start, end, at = f.k1, f.k1+f.span, v.cursor
	} else if f := v.free.fit(v.cursor, n); f != nil {
		start, end, at = f.k1, f.k1+f.span, f.k1
	} else if f := v.free.fit(0, n); f != nil {
		start, end, at = f.k1, f.k1+f.span, f.k1
	} else {
		return 0, false
	}
	v.free.remove(start, 0)
	if at > start {
		v.free.insert(start, 0, at-start, struct{}{})
	}
	if at+n < end {
		v.free.insert(at+n, 0, end-(at+n), struct{}{})
	}
	v.cursor = at + n
	v.high = max(v.high, at+n)
	if v.cursor >= v.hi {
		v.cursor = v.lo
	}
	return at, true
}

// release gives back [a, a+n), merging it with free neighbours.
func (v *vaSpace) release(a, n uint64) {
	start, end := a, a+n
	if p := v.free.floor(a, 0); p != nil && p.k1+p.span == a {
		start = p.k1
		v.free.remove(p.k1, 0)
	}
	if nx := v.free.get(end, 0); nx != nil {
		end += nx.span
		v.free.remove(nx.k1, 0)
	}
	v.free.insert(start, 0, end-start, struct{}{})
}

// handedOut reports whether a lies below the end of the highest range ever
// handed out. Next-fit hands out [lo, cursor) without gaps until it first
// wraps, and high only grows, so every such address has belonged to some
// range: one not in use now was freed.
func (v *vaSpace) handedOut(a uint64) bool { return a >= v.lo && a < v.high }
