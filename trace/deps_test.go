package trace_test

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// TestNoSimulatorDependency: package trace replays on whatever device its
// caller's DeviceFactory makes, and depends on no backend.
func TestNoSimulatorDependency(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").Output()
	if err != nil {
		t.Skipf("go list -deps: %v", err)
	}
	deps := strings.Fields(string(out))
	if !slices.Contains(deps, "github.com/vramkit/vram/device") {
		t.Fatalf("go list -deps gave %q, without package device", deps)
	}
	for _, backend := range []string{"github.com/vramkit/vram/device/sim", "github.com/vramkit/vram/device/cuda"} {
		if slices.Contains(deps, backend) {
			t.Errorf("package trace depends on %s", backend)
		}
	}
}
