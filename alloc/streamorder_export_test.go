package alloc

// Test-only exports of the free index (streamorder.go).

import "sort"

// FreeBlock is one free block of a Pool or an Expandable, for tests.
type FreeBlock struct {
	Addr, Size     uint64
	Owned          bool    // in a stream's set; else shared
	Stream         uintptr // the owning stream's handle
	PendLo, PendHi uint64  // the pending span; both 0: none
}

// FreeBlocks lists the free blocks of the allocator's segments (an
// Expandable's ranges), lowest address first.
func (c *core) FreeBlocks() []FreeBlock {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []FreeBlock
	for seg := c.segs; seg != nil; seg = seg.snext {
		for b := seg.first; b != nil; b = b.next {
			if !b.free {
				continue
			}
			fb := FreeBlock{Addr: uint64(b.addr), Size: b.size, Owned: b.owner != nil,
				PendLo: uint64(b.pend.lo), PendHi: uint64(b.pend.hi)}
			if b.owner != nil {
				fb.Stream = b.owner.handle
			}
			out = append(out, fb)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Addr < out[j].Addr })
	return out
}
