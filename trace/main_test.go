package trace_test

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/vramkit/vram/device/sim"
	"github.com/vramkit/vram/trace"
)

// TestMain fails the package's tests if a replay device's stream workers
// outlive them.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// simConfig is the simulator a replay of events runs on, as vram replay
// makes it: address-only, its context taking nothing, of the size
// trace.DeviceBytes gives at the simulator's granularity.
func simConfig(events []trace.Event) sim.Config {
	return sim.Config{TotalBytes: trace.DeviceBytes(events, sim.DefaultGranularity), AddressOnly: true, NoContext: true}
}

// simOf makes a fresh simulator of cfg for each replay.
func simOf(cfg sim.Config) trace.DeviceFactory { return sim.Factory(cfg) }

// simFor is simOf(simConfig(events)).
func simFor(events []trace.Event) trace.DeviceFactory { return simOf(simConfig(events)) }
