package sim

// Device address space.
//
// Every simulated device, and every generation of one (after a Reset),
// owns a region of the address space between AddressBase and 2^63: at
// least 1 TiB, or 16 times the device's memory rounded up to a power of
// two when that is more (at most 4 PiB, since Config.TotalBytes is capped
// at MaxTotalBytes). Regions are handed out next-fit from one process-wide
// range, so an address range is handed out again only after the search
// has gone once round the whole range (about 8 million TiB): a pointer
// tells which device and which generation made it, and one from another
// device or from before a Reset is recognised, not mistaken for a live
// one.
//
// Regions are recycled: Close gives a device's regions back, and a device
// keeps the regions of its last keepGenerations generations, giving older
// ones back as it is reset again, so a process that makes and closes
// devices (or resets one) without end never runs out. The last
// keepReleased regions given back are still remembered for error
// messages (a pointer from a closed device, or from many resets ago);
// older ones are not, and a pointer into them is only "not an address of
// this device". If open devices hold the whole range, New and Reset fail
// with an error wrapping device.ErrOutOfMemory.
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
	"fmt"
	"math/bits"
	"sync"

	"github.com/vramkit/vram/device"
	"github.com/vramkit/vram/internal/units"
)

const (
	// AddressBase is where the first simulated device's addresses start.
	AddressBase uint64 = 0x7f00_0000_0000
	// addressTop is where the regions end: device addresses stay below 2^63.
	addressTop uint64 = 1 << 63
	regionMin         = units.TiB
	// keepGenerations is how many earlier generations' regions a device
	// keeps (their pointers give ErrInvalidated).
	keepGenerations = 1024
	// keepReleased is how many regions given back are remembered for
	// error messages.
	keepReleased = 1024
)

// regions is the process-wide record of address regions, so that any
// device can say which device a foreign pointer came from.
var regions struct {
	mu       sync.Mutex   // protects the fields below
	space    *vaSpace     // free ranges of [AddressBase, addressTop); nil until first used
	owned    tree[region] // regions of open devices, by lo (span: hi − lo)
	nOwned   uint64       // bytes of the owned regions
	released []region     // the last keepReleased regions given back, a ring
	relNext  int          // where the next one goes in released
}

type region struct {
	lo, hi uint64
	dev    uint64 // id of the device that owns it
	gen    uint64 // generation of that device
}

// regionSize is the size of the region of a device of total bytes: at
// least regionMin, 16 times total rounded up to a power of two.
func regionSize(total uint64) (uint64, bool) {
	hi, want := bits.Mul64(total, 16)
	if hi != 0 || want > addressTop-AddressBase {
		return 0, false
	}
	r := regionMin
	for r < want {
		r <<= 1
	}
	return r, true
}

// newRegion reserves a fresh address region for a device of total bytes.
func newRegion(total, dev, gen uint64) (region, error) {
	size, ok := regionSize(total)
	if !ok {
		return region{}, fmt.Errorf("sim: a device of %s needs more addresses than the simulator's %s: %w",
			units.Format(total), units.Format(addressTop-AddressBase), device.ErrInvalidValue)
	}
	regions.mu.Lock()
	defer regions.mu.Unlock()
	if regions.space == nil {
		regions.space = newVASpace(region{lo: AddressBase, hi: addressTop})
	}
	lo, ok := regions.space.alloc(size)
	if !ok {
		return region{}, fmt.Errorf("sim: no address region of %s is left for a device of %s: open simulated devices "+
			"hold %s of the simulator's %s of addresses; close the devices no longer in use: %w",
			units.Format(size), units.Format(total), units.Format(regions.nOwned),
			units.Format(addressTop-AddressBase), device.ErrOutOfMemory)
	}
	rg := region{lo: lo, hi: lo + size, dev: dev, gen: gen}
	regions.owned.insert(lo, 0, size, rg)
	regions.nOwned += size
	return rg, nil
}

// releaseRegions gives regions back for reuse.
func releaseRegions(rs ...region) {
	regions.mu.Lock()
	defer regions.mu.Unlock()
	for _, rg := range rs {
		if _, ok := regions.owned.remove(rg.lo, 0); !ok {
			continue
		}
		regions.nOwned -= rg.hi - rg.lo
		regions.space.release(rg.lo, rg.hi-rg.lo)
		if len(regions.released) < keepReleased {
			regions.released = append(regions.released, rg)
		} else {
			regions.released[regions.relNext] = rg
		}
		regions.relNext = (regions.relNext + 1) % keepReleased
	}
}

// regionOf finds the region holding addr: an open device's (open is
// true), or failing that the last one given back that held it.
func regionOf(addr uint64) (rg region, open, ok bool) {
	regions.mu.Lock()
	defer regions.mu.Unlock()
	if nd := regions.owned.floor(addr, 0); nd != nil && addr < nd.v.hi {
		return nd.v, true, true
	}
	rel := regions.released
	for i := range rel { // newest first
		r := rel[(regions.relNext-1-i+2*len(rel))%len(rel)]
		if addr >= r.lo && addr < r.hi {
			return r, false, true
		}
	}
	return region{}, false, false
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
