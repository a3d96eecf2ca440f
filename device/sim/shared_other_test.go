//go:build !linux

package sim_test

import (
	"testing"

	"github.com/vramkit/vram/device"
	"github.com/vramkit/vram/device/sim"
)

const helperEnv = "VRAM_SIM_TEST_HELPER"

// helperMain has no helpers to run: shared devices are Linux only.
func helperMain(string) int { return 2 }

// TestSharedRefused: off Linux a shared device is refused, clearly.
func TestSharedRefused(t *testing.T) {
	_, err := sim.New(sim.Config{TotalBytes: GiB, Shared: "x", SharedDir: t.TempDir()})
	wantErr(t, err, device.ErrNotSupported)
}
