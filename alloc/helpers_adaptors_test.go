package alloc_test

import (
	"testing"

	"github.com/vramkit/vram/device/sim"
	"github.com/vramkit/vram/trace"
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

// replaySim makes the simulator a replay of events runs on, as vram
// replay does: address-only, its context taking nothing, of the size
// trace.DeviceBytes gives at the simulator's granularity.
func replaySim(events []trace.Event) trace.DeviceFactory {
	return sim.Factory(sim.Config{TotalBytes: trace.DeviceBytes(events, sim.DefaultGranularity), AddressOnly: true, NoContext: true})
}
