//go:build linux

package main

import (
	"path/filepath"
	"strings"
	"testing"
)

// vram broker refuses a device another broker of its user serves, naming
// that broker, and a list naming one device twice: exit 1, one line. (Two
// brokers, or one listing a device twice, once promised 96 MiB of 64.)
func TestBrokerOneDeviceOneBroker(t *testing.T) {
	spec := sharedSpec(t, "64MiB", "backed=false")
	startBroker(t, spec)
	lockDir := filepath.Join(t.TempDir(), "locks")
	for name, tc := range map[string]struct {
		devices string
		lockDir []string
		want    string
	}{
		"served already": {spec, nil, "is served by another broker already (pid "},
		"listed twice":   {spec + ";" + spec, []string{"--lock-dir", lockDir}, "devices 0 and 1 are the same device"},
	} {
		t.Run(name, func(t *testing.T) {
			args := append([]string{"broker", "--devices", tc.devices, "--socket", filepath.Join(t.TempDir(), "b.sock")}, tc.lockDir...)
			_, stderr, code := cli(t, "", args...)
			if code != exitFailure || !strings.Contains(stderr, tc.want) || strings.Count(strings.TrimSpace(stderr), "\n") != 0 {
				t.Errorf("exit %d; want 1 and one line saying %q:\n%s", code, tc.want, stderr)
			}
		})
	}
}
