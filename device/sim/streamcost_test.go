package sim_test

import (
	"runtime"
	"testing"

	"github.com/vramkit/vram/device"
	"github.com/vramkit/vram/device/sim"
)

// NewStream and Close cost O(1) however many streams are open: they once
// rebuilt a list of every stream, so a replay of a log with n streams
// took O(n²) time and memory. Measured in bytes allocated (exact, not
// timed), and a stream never given work holds no goroutine.
func TestStreamCostIndependentOfOpenStreams(t *testing.T) {
	d := newSim(t, sim.Config{TotalBytes: 64 * MiB})
	const open, pairs = 20000, 200
	before := runtime.NumGoroutine()
	streams := make([]device.Stream, 0, open)
	for range open {
		streams = append(streams, get[device.Stream](t)(d.NewStream()))
	}
	if g := runtime.NumGoroutine() - before; g > 100 {
		t.Errorf("%d idle streams hold %d goroutines; want none until a stream is given work", open, g)
	}
	var m0, m1 runtime.MemStats
	runtime.ReadMemStats(&m0)
	for range pairs {
		s := get[device.Stream](t)(d.NewStream())
		check(t, s.Close())
	}
	runtime.ReadMemStats(&m1)
	// A list of open streams rebuilt at each call is 2 × 8 B × 20,000 per
	// pair; what a stream itself needs is well under 4 KiB.
	if per := (m1.TotalAlloc - m0.TotalAlloc) / pairs; per > 4<<10 {
		t.Errorf("NewStream+Close with %d streams open allocate %d bytes a pair; want a cost that does not grow with open streams", open, per)
	}
	// Free waits for streams with unfinished work only, and still for all
	// of those.
	p := get[device.Ptr](t)(d.Malloc(64))
	busy := streams[open/2]
	gate := make(chan struct{})
	ran := false
	check(t, d.LaunchFunc(busy, 1, func(device.View, int, int) error { <-gate; ran = true; return nil }))
	go close(gate)
	check(t, d.Free(p))
	if !ran {
		t.Errorf("Free returned before the work queued on a busy stream finished")
	}
	for _, s := range streams {
		check(t, s.Close())
	}
}
