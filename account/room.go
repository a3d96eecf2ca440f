package account

// Room: what the account lets its owner hold now, and why: every bound
// the allocator is under, read at one moment, for the owner to plan with.

import (
	"fmt"
	"math"

	"github.com/vramkit/vram/alloc"
)

// Room is what the account lets its owner allocate now, each bound with
// its figures. A plain value; Coster stays valid until the next Swap or
// Close.
type Room struct {
	// Free is the device's free memory, bytes. The allocator's cache is
	// not counted: a cached block may be too fragmented to serve, and
	// giving it back (Trim) waits for other streams' work.
	Free uint64
	// Held is what the allocator holds of the device, its cache
	// included (alloc.Stats.Reserved); Cached is the part of it not in
	// use. Trimming says a trim is in flight.
	Held, Cached uint64
	Trimming     bool
	// Cap is the cap's Limit's cap (alloc.NoCap without one), read
	// before CapRoom.
	Cap uint64
	// CapRoom is what the caps around the allocator (the account's, a
	// Limit in Config.Wrap's chain) still let it charge, as its
	// alloc.Coster states (math.MaxUint64: uncapped, or no statement).
	CapRoom uint64
	// Over is what the allocations are charged beyond the cap after
	// SetCap lowered it below them (CapRoom is then 0).
	Over uint64
	// Leased says a broker's lease bounds Held: Lease is what the
	// allocator may hold under it; Shrink says the broker asks it to come
	// down to Lease.
	Leased bool
	Lease  uint64
	Shrink bool
	// Granularity is the allocator's rounding unit (0 when it states
	// none, alloc.Granular); Page the device's allocation unit.
	Granularity, Page uint64
	// Coster is the allocator's statement of what allocations cost the
	// device (nil when it makes none).
	Coster alloc.Coster
	// Kind is the kind the allocator serves.
	Kind alloc.Kind
}

// Room reads the account's room now.
func (a *Account) Room() (Room, error) {
	free, _, err := a.dev.MemInfo()
	if err != nil {
		return Room{}, fmt.Errorf("read device memory: %w", err)
	}
	r := Room{Free: free, CapRoom: math.MaxUint64, Page: a.dev.Info().Granularity}
	a.mu.RLock()
	defer a.mu.RUnlock()
	if a.closed {
		return Room{}, closedErr("read the room")
	}
	r.Kind, r.Cap = a.kind, a.capNowLocked()
	if g, ok := a.al.(alloc.Granular); ok {
		r.Granularity = g.Granularity()
	}
	if c, ok := a.al.(alloc.Coster); ok {
		r.Coster, r.CapRoom = c, c.Room()
	}
	if lim := a.lim; lim != nil {
		if capBytes, used := lim.Cap(), lim.Used(); used > capBytes {
			r.Over = used - capBytes
		}
	}
	st := a.al.Stats()
	r.Held, r.Cached, r.Trimming = st.Reserved, st.Cached(), a.trimming()
	if f := a.lease; f != nil {
		b := f.budget()
		r.Leased, r.Lease, r.Shrink = true, b.Bytes, b.Shrink
	}
	return r, nil
}
