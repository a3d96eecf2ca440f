package main

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/vramkit/vram/device"
)

func TestBench(t *testing.T) {
	t.Setenv(device.EnvDevice, "") // bench's own address-only simulator
	stdout, stderr, code := cli(t, "", "bench", "--json", "--time", "2ms", "--allocator", "direct,pool")
	if code != exitOK {
		t.Fatalf("exit %d; stderr:\n%s", code, stderr)
	}
	var rows []benchRow
	if err := json.Unmarshal([]byte(stdout), &rows); err != nil {
		t.Fatalf("stdout is not a JSON array: %v\n%s", err, stdout)
	}
	if len(rows) != 8 {
		t.Fatalf("%d rows, want 4 cases × 2 allocators", len(rows))
	}
	for _, r := range rows {
		if r.Ops <= 0 || r.NsPerOp <= 0 {
			t.Errorf("%s %s: %d ops at %v ns", r.Allocator, r.Case, r.Ops, r.NsPerOp)
		}
		switch {
		case r.Case == "mixed" && (r.PeakLiveBytes == 0 || r.ReservedOverLive < 1):
			t.Errorf("%s mixed: peak live %d, reserved/live %v; want a peak and a ratio ≥ 1", r.Allocator, r.PeakLiveBytes, r.ReservedOverLive)
		case r.Allocator == "pool" && strings.HasPrefix(r.Case, "pair") && r.DeviceAllocs != 1:
			t.Errorf("pool %s: %d device allocations; a pool serves repeated pairs from one", r.Case, r.DeviceAllocs)
		case r.Allocator == "direct" && strings.HasPrefix(r.Case, "pair") && r.DeviceAllocs*2 != uint64(r.Ops):
			t.Errorf("direct %s: %d device allocations for %d ops; want one per pair", r.Case, r.DeviceAllocs, r.Ops)
		}
	}
}

func TestBenchText(t *testing.T) {
	t.Setenv(device.EnvDevice, "")
	stdout, stderr, code := cli(t, "", "bench", "--time", "1ms", "--allocator", "async")
	if code != exitOK {
		t.Fatalf("exit %d; stderr:\n%s", code, stderr)
	}
	for _, w := range []string{"NS/OP", "async", "pair 4KiB", "pair 64MiB", "mixed"} {
		if !strings.Contains(stdout, w) {
			t.Errorf("output does not contain %q:\n%s", w, stdout)
		}
	}
	if _, stderr, code := cli(t, "", "bench", "--time", "0s"); code != exitUsage || !strings.Contains(stderr, "--time 0s") {
		t.Errorf("--time 0s: exit %d, stderr %q; want a usage error", code, stderr)
	}
}

// A case too big for the device is reported as skipped; the others run.
// The device comes from --device or, as for every command, $VRAM_DEVICE
// (bench's own 64 GiB simulator would fit every case).
func TestBenchSkipsCasesThatDoNotFit(t *testing.T) {
	const small = "sim:vram=64MiB,backed=false"
	tests := map[string]struct {
		env  string
		args []string
	}{
		"--device":     {"", []string{"--device", small}},
		"$VRAM_DEVICE": {small, nil},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Setenv(device.EnvDevice, tc.env)
			args := append([]string{"bench", "--json", "--time", "2ms", "--allocator", "pool"}, tc.args...)
			stdout, stderr, code := cli(t, "", args...)
			if code != exitOK {
				t.Fatalf("exit %d; stderr:\n%s", code, stderr)
			}
			var rows []benchRow
			if err := json.Unmarshal([]byte(stdout), &rows); err != nil {
				t.Fatalf("stdout is not a JSON array: %v\n%s", err, stdout)
			}
			ran, skipped := 0, map[string]bool{}
			for _, r := range rows {
				if r.Skipped != "" {
					skipped[r.Case] = true
				} else if r.Ops > 0 {
					ran++
				}
			}
			if !skipped["pair 64MiB"] || ran < 2 {
				t.Errorf("rows %+v: want pair 64MiB skipped and the small pairs run", rows)
			}
		})
	}
}
