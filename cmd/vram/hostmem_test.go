package main

import (
	"bytes"
	"context"
	"runtime"
	"strings"
	"testing"
)

// TestRunRefusesBatchBiggerThanHostMemory checks that run compares the
// host memory a batch needs with what is available before it allocates,
// and refuses a batch that would not fit as a usage error naming both.
func TestRunRefusesBatchBiggerThanHostMemory(t *testing.T) {
	tests := map[string]struct {
		avail uint64
		args  []string
		code  int
		want  []string
	}{
		// 1,000,000 runs × (28 + 41 × 8) bytes = 339.5 MiB of host
		// arrays, and up to 256 MiB more for the backed simulator.
		"too big": {100 << 20, []string{"--runs", "1000000", "--steps", "40"}, exitUsage,
			[]string{"--runs 1000000 with 41 samples a run needs 595.5 MiB of host memory",
				"339.5 MiB of host arrays and up to 256 MiB for the simulator's device memory",
				"but only 100 MiB is available (test)", "lower --runs or --samples/--steps"}},
		// 100,000 runs: 33.9 MiB of host arrays, as much again on a
		// backed simulator, none on an address-only one.
		"backed device counted": {40 << 20, []string{"--device", "sim:vram=256MiB", "--runs", "100000", "--steps", "40"}, exitUsage,
			[]string{"needs 67.9 MiB of host memory"}},
		"address-only device not counted": {40 << 20, []string{"--device", "sim:backed=false,vram=256MiB", "--runs", "100000", "--steps", "40"}, exitFailure,
			[]string{"not supported"}},
		"fits": {64 << 20, []string{"--device", "sim:vram=8MiB", "--runs", "1000", "--steps", "40"}, exitOK, nil},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			var out, errb bytes.Buffer
			a := &app{ctx: context.Background(), stdin: strings.NewReader(""), stdout: &out, stderr: &errb,
				hostMem: func() (uint64, string, bool) { return tc.avail, "test", true }}
			code := a.execute(append([]string{"run", "--json"}, tc.args...))
			if code != tc.code {
				t.Errorf("exit %d, want %d; stderr:\n%s", code, tc.code, errb.String())
			}
			for _, w := range tc.want {
				if !strings.Contains(errb.String(), w) {
					t.Errorf("stderr does not contain %q:\n%s", w, errb.String())
				}
			}
		})
	}
}

// TestRunRefusesBatchBiggerThanThisMachine asks for a batch of 17 TB of
// host arrays with the machine's real figures: a usage error, not an
// attempt that the kernel or the Go runtime would kill.
func TestRunRefusesBatchBiggerThanThisMachine(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("host memory is read from /proc/meminfo, on Linux only")
	}
	_, stderr, code := cli(t, "", "run", "--device", "sim", "--runs", "2147483647", "--steps", "1000")
	named := strings.Contains(stderr, "MemAvailable") || strings.Contains(stderr, "the cgroup limit")
	if code != exitUsage || !strings.Contains(stderr, "lower --runs or --samples/--steps") || !named {
		t.Errorf("exit %d; want %d and a message naming the host memory; stderr:\n%s", code, exitUsage, stderr)
	}
}
