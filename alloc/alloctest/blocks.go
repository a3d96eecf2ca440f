package alloctest

import (
	"fmt"
	"slices"
	"sync"

	"github.com/vramkit/vram/device"
)

// Alignment is the least alignment every allocator must give, in bytes
// (cudaMalloc's own guarantee is 256).
const Alignment = 256

// blocks tracks live allocations as address intervals, so that a new one
// that overlaps a live one, or is misaligned, is caught at once. Safe for
// concurrent use.
type blocks struct {
	mu     sync.Mutex               // protects the fields below
	starts []uint64                 // start addresses of live blocks, sorted
	size   map[uint64]uint64        // start → bytes asked for
	stream map[uint64]device.Stream // start → stream of its last use
	bytes  uint64                   // bytes asked for by live blocks
}

func newBlocks() *blocks {
	return &blocks{size: make(map[uint64]uint64), stream: make(map[uint64]device.Stream)}
}

// add records a new live block [p, p+n) used on s; it reports an error if
// p is zero or misaligned, or the block overlaps a live one.
func (b *blocks) add(p device.Ptr, n uint64, s device.Stream) error {
	start := uint64(p)
	if start == 0 {
		return fmt.Errorf("allocation of %d bytes returned the zero pointer", n)
	}
	if start%Alignment != 0 {
		return fmt.Errorf("allocation of %d bytes at %v is not aligned to %d bytes", n, p, Alignment)
	}
	if start+n < start {
		return fmt.Errorf("allocation of %d bytes at %v wraps the address space", n, p)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	i, found := slices.BinarySearch(b.starts, start)
	if found {
		return fmt.Errorf("allocation of %d bytes at %v: that address is already live (%d bytes)", n, p, b.size[start])
	}
	if i > 0 {
		prev := b.starts[i-1]
		if prev+b.size[prev] > start {
			return fmt.Errorf("allocation [%v, +%d) overlaps live block [%v, +%d)", p, n, device.Ptr(prev), b.size[prev])
		}
	}
	if i < len(b.starts) {
		next := b.starts[i]
		if start+n > next {
			return fmt.Errorf("allocation [%v, +%d) overlaps live block [%v, +%d)", p, n, device.Ptr(next), b.size[next])
		}
	}
	b.starts = slices.Insert(b.starts, i, start)
	b.size[start] = n
	b.stream[start] = s
	b.bytes += n
	return nil
}

// remove forgets a live block and returns its size.
func (b *blocks) remove(p device.Ptr) (uint64, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	start := uint64(p)
	i, found := slices.BinarySearch(b.starts, start)
	if !found {
		return 0, false
	}
	n := b.size[start]
	b.starts = slices.Delete(b.starts, i, i+1)
	delete(b.size, start)
	delete(b.stream, start)
	b.bytes -= n
	return n, true
}

// len is the number of live blocks.
func (b *blocks) len() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.starts)
}

// liveBytes is the bytes asked for by live blocks.
func (b *blocks) liveBytes() uint64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.bytes
}

// at returns the i-th live block in address order.
func (b *blocks) at(i int) (device.Ptr, uint64, device.Stream) {
	b.mu.Lock()
	defer b.mu.Unlock()
	start := b.starts[i]
	return device.Ptr(start), b.size[start], b.stream[start]
}
