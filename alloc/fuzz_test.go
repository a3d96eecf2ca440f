package alloc_test

import (
	"bytes"
	"testing"

	"github.com/vramkit/vram/alloc"
	"github.com/vramkit/vram/alloc/alloctest"
	"github.com/vramkit/vram/device"
	"github.com/vramkit/vram/internal/units"
	"github.com/vramkit/vram/trace"
)

// seeds start every fuzz target: alloc-heavy, free-heavy, trims, refused
// frees, large requests that run the 256 MiB device out of memory,
// blocks freed on a stream held busy, and device resets.
var seeds = [][]byte{
	{},
	{0, 0, 1, 1, 0, 2, 4, 5},
	{0x10, 0x00, 0xff, 0x21, 0x10, 0x00, 0x04, 0x15, 0x06, 0x07},
	{3, 0x7f, 0xff, 3, 0x7f, 0xff, 3, 0x7f, 0xff, 4, 4, 4, 6},
	{0, 1, 0, 0x10, 1, 0, 0x20, 1, 0, 0x14, 0x24, 0x04, 0x37, 0x06},
	{0x03, 0xff, 0xff, 0x00, 0x00, 0x10, 0x07, 0x05},
	// Hold stream 1; 1 KiB on it, freed there behind the hold; 1 KiB on
	// stream 2; release.
	{0x1e, 0x10, 0x00, 0x0f, 0x14, 0x20, 0x00, 0x0f, 0x1e},
	// Hold stream 1; two 96 MiB blocks on it, freed there; two more on
	// stream 2, which only the freed memory can hold; release.
	{0x1e, 0x13, 0x2f, 0xff, 0x13, 0x2f, 0xff, 0x14, 0x14, 0x23, 0x2f, 0xff, 0x23, 0x2f, 0xff, 0x1e},
	// A block on stream 0 and one on stream 1, one freed (cached); reset
	// the device; a block on each stream made since; trim.
	{0x00, 0x01, 0x00, 0x10, 0x02, 0x00, 0x14, 0xc6, 0x00, 0x01, 0x00, 0x10, 0x02, 0x00, 0x06},
	// Hold stream 1; 1 MiB on it, freed there behind the hold, and 1 MiB
	// live on stream 2; reset (which releases the hold); 1 MiB on stream
	// 2, then reset again with it live.
	{0x1e, 0x13, 0x00, 0x7f, 0x14, 0x23, 0x00, 0x7f, 0xd6, 0x23, 0x00, 0x7f, 0xe6},
}

func fuzzAllocator(f *testing.F, newAlloc alloctest.Factory) {
	for _, s := range seeds {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) > 4096 {
			data = data[:4096]
		}
		alloctest.Ops(t, newAlloc, data)
	})
}

func FuzzDirect(f *testing.F) {
	fuzzAllocator(f, func(t *testing.T, dev device.Device) alloc.Allocator { return alloc.NewDirect(dev) })
}

func FuzzAsyncPool(f *testing.F) {
	fuzzAllocator(f, func(t *testing.T, dev device.Device) alloc.Allocator {
		return newAsyncT(t, dev, alloc.AsyncConfig{})
	})
}

func FuzzAsyncPoolReleaseAtSync(f *testing.F) {
	fuzzAllocator(f, func(t *testing.T, dev device.Device) alloc.Allocator {
		return newAsyncT(t, dev, alloc.AsyncConfig{ReleaseAtSync: true})
	})
}

// FuzzLimit caps below the device, so that both the cap and the device
// refuse allocations.
func FuzzLimit(f *testing.F) {
	fuzzAllocator(f, func(t *testing.T, dev device.Device) alloc.Allocator {
		return alloc.NewLimit(newAsyncT(t, dev, alloc.AsyncConfig{}), 96*units.MiB)
	})
}

func FuzzLimitDirect(f *testing.F) {
	fuzzAllocator(f, func(t *testing.T, dev device.Device) alloc.Allocator {
		return alloc.NewLimit(alloc.NewDirect(dev), 64*units.MiB)
	})
}

// FuzzTrace runs the sequences through Trace(Limit(Pool)) and reads the
// log back: every line parses, every free matches a live allocation
// (never a pointer allocated twice without a free between), and the log
// counts the calls that succeeded.
func FuzzTrace(f *testing.F) {
	for _, s := range seeds {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) > 4096 {
			data = data[:4096]
		}
		var log bytes.Buffer
		var tr *alloc.Trace
		alloctest.Ops(t, func(t *testing.T, dev device.Device) alloc.Allocator {
			tr = alloc.NewTrace(alloc.NewLimit(newPoolT(t, dev), 96*units.MiB), &log)
			return tr
		}, data)
		events, err := trace.Read(&log)
		if err != nil {
			t.Fatalf("reading the log back: %v", err)
		}
		sum := trace.Summarize(events)
		st := tr.Stats()
		if sum.UnmatchedFrees != 0 || sum.Reallocs != 0 || sum.BlocksAtEnd != 0 ||
			uint64(sum.Allocs) != st.Allocs || uint64(sum.Frees) != st.Frees {
			t.Fatalf("log %+v disagrees with the calls made (%+v)", sum, st)
		}
	})
}
