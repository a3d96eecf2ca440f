package alloc

import (
	"sync"
	"testing"
)

func TestCountersAddUp(t *testing.T) {
	var c counters
	c.onDeviceAlloc(4096)
	c.onAlloc(1024, false)
	c.onAlloc(2048, true)
	c.onFree(1024)
	c.onRetry()
	c.onOOM()
	want := Stats{
		InUse: 2048, PeakInUse: 3072, Reserved: 4096, PeakReserved: 4096,
		Allocs: 2, Frees: 1, CacheHits: 1, DeviceAllocs: 1, Retries: 1, OOMs: 1,
	}
	if got := c.stats(); got != want {
		t.Errorf("stats = %+v, want %+v", got, want)
	}
	c.onDeviceFree(4096)
	c.resetPeaks()
	got := c.stats()
	// Reserved is raised to InUse in a snapshot: never below it.
	if got.Reserved != 2048 || got.PeakInUse != 2048 || got.DeviceFrees != 1 {
		t.Errorf("after a device free and resetPeaks: %+v", got)
	}
	c.setReserved(1 << 20)
	if got := c.stats(); got.Reserved != 1<<20 || got.PeakReserved != 1<<20 || got.DeviceAllocs != 1 {
		t.Errorf("after setReserved(1 MiB): %+v", got)
	}
}

// TestCountersPeakUnderConcurrency: goroutines that each hold at most k
// bytes at once can never push the peak past goroutines·k, and the peak
// is at least k.
func TestCountersPeakUnderConcurrency(t *testing.T) {
	var c counters
	const goroutines, rounds, k = 8, 2000, 3
	var wg sync.WaitGroup
	for range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range rounds {
				for range k {
					c.onAlloc(1, false)
				}
				for range k {
					c.onFree(1)
				}
			}
		}()
	}
	wg.Wait()
	st := c.stats()
	if st.InUse != 0 || st.Allocs != goroutines*rounds*k || st.Frees != st.Allocs {
		t.Errorf("stats = %+v", st)
	}
	if st.PeakInUse < k || st.PeakInUse > goroutines*k {
		t.Errorf("PeakInUse = %d, want between %d and %d", st.PeakInUse, k, goroutines*k)
	}
}

func BenchmarkCountersAllocFree(b *testing.B) {
	var c counters
	b.ReportAllocs()
	for b.Loop() {
		c.onAlloc(512, true)
		c.onFree(512)
	}
}
