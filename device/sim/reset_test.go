package sim_test

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/vramkit/vram/device"
	"github.com/vramkit/vram/device/sim"
)

// After Reset returns, no work from before it touches host memory: the
// recovery recipe of docs/library.md (reset, then reuse the host buffers) relies on
// it. Reset used to return at once while a running operation went on
// writing into a host buffer.
func TestResetWaitsForRunningWork(t *testing.T) {
	d := newSim(t, sim.Config{TotalBytes: 64 * MiB})
	host := make([]byte, 64)
	p := get[device.Ptr](t)(d.Malloc(64))
	s := get[device.Stream](t)(d.NewStream())
	started, gate := make(chan struct{}), make(chan struct{})
	var wrote atomic.Bool
	check(t, d.LaunchFunc(s, 1, func(device.View, int, int) error {
		close(started)
		<-gate
		for i := range host { // pre-reset work writing host memory
			host[i] = 1
		}
		wrote.Store(true)
		return nil
	}))
	check(t, d.CopyDtoH(host, p, s)) // queued: dropped by the reset
	<-started
	go func() {
		time.Sleep(20 * time.Millisecond)
		close(gate)
	}()
	check(t, d.Reset())
	if !wrote.Load() {
		t.Fatalf("Reset returned while an operation from before it still ran")
	}
	for i, v := range host {
		if v != 1 {
			t.Fatalf("host byte %d = %d: the queued copy ran after the reset", i, v)
		}
	}
	wantErr(t, s.Close(), device.ErrInvalidated)
}
