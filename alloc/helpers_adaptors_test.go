package alloc_test

import (
	"testing"

	"github.com/vramkit/vram/device/sim"
)

// openSimT makes a simulated device closed when the test ends.
func openSimT(t testing.TB, cfg sim.Config) *sim.Device {
	t.Helper()
	dev, err := sim.New(cfg)
	if err != nil {
		t.Fatalf("sim.New: %v", err)
	}
	t.Cleanup(func() {
		if err := dev.Close(); err != nil {
			t.Errorf("close device: %v", err)
		}
	})
	return dev
}
