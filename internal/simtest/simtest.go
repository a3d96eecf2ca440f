// Package simtest makes simulated devices for tests: one per test,
// closed when the test ends, and the test failed if anything is left on
// it. Every package's tests share it, the simulator's own among them, so
// that none writes it again.
package simtest

import (
	"errors"
	"testing"

	"github.com/vramkit/vram/device"
	"github.com/vramkit/vram/device/sim"
)

// New makes a simulated device of total bytes with no context (mod
// changes the rest of its configuration), and closes it when t ends,
// failing t if anything is left on it: memory, pinned buffers, streams.
// A device the test closed itself is left as it is.
func New(t testing.TB, total uint64, mod ...func(*sim.Config)) *sim.Device {
	t.Helper()
	cfg := sim.Config{TotalBytes: total, NoContext: true}
	for _, f := range mod {
		f(&cfg)
	}
	dev, err := sim.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if r := dev.Leaks(); !r.Empty() {
			t.Errorf("device left with: %s", r)
		}
		if err := dev.Close(); err != nil && !errors.Is(err, device.ErrClosed) {
			t.Errorf("close device: %v", err)
		}
	})
	return dev
}
