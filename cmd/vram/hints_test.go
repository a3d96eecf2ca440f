package main

import (
	"strings"
	"testing"

	"github.com/vramkit/vram"
)

// TestRunFitHintNamesTheBound: a batch that cannot fit says what to
// change on the command line by what bounds it: the simulator's memory
// (--vram), or the cap $VRAM_ALLOC_CONF gave (not --vram, which would not
// help).
func TestRunFitHintNamesTheBound(t *testing.T) {
	tests := map[string]struct {
		env     string
		args    []string
		want    string
		notWant string
	}{
		"the device": {args: []string{"--vram", "2MiB", "--runs", "10", "--samples", "400001", "--steps", "400000", "--dt", "0.0001"},
			want: "give the simulator more than its 2 MiB (--vram)"},
		"VRAM_ALLOC_CONF's cap": {env: "limit:1KiB", want: `raise the limit in $VRAM_ALLOC_CONF ("limit:1KiB")`, notWant: "(--vram)"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Setenv("VRAM_ALLOC_CONF", tc.env)
			_, stderr, code := cli(t, "", append([]string{"run", "--device", "sim"}, tc.args...)...)
			if code != exitFailure || !strings.Contains(stderr, tc.want) || (tc.notWant != "" && strings.Contains(stderr, tc.notWant)) {
				t.Errorf("exit %d, stderr:\n%s\nwant exit %d saying %q (and not %q)", code, stderr, exitFailure, tc.want, tc.notWant)
			}
		})
	}
}

// TestRunErrorsUseTheCommandsWords: failures of vram run name the
// command's flags and variables, never the library's option names.
func TestRunErrorsUseTheCommandsWords(t *testing.T) {
	library := []string{"HostOptions", "WithCap", "SpillDir", "WithBuffers", "HostArrayOptions"}
	small := append([]string{"run"}, smallRun...)
	tests := map[string]struct {
		env  map[string]string
		args []string
		want string
	}{
		"staging that does not fit": {args: append(small, "--runs", "100000", "--host-mem", "100B"), want: "raise --host-mem"},
		"a cap that does not fit":   {env: map[string]string{"VRAM_ALLOC_CONF": "limit:1KiB"}, args: small, want: "$VRAM_ALLOC_CONF"},
		"no spill directory": {env: map[string]string{"VRAM_SPILL_DIR": "/nonexistent/spill"}, args: append(small, "--runs", "100000", "--host-mem", "2MiB"),
			want: "$VRAM_SPILL_DIR"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			_, stderr, code := cli(t, "", tc.args...)
			if code != exitFailure || !strings.Contains(stderr, tc.want) {
				t.Fatalf("exit %d, stderr:\n%s\nwant exit %d saying %q", code, stderr, exitFailure, tc.want)
			}
			for _, w := range library {
				if strings.Contains(stderr, w) {
					t.Errorf("stderr names the library's %s:\n%s", w, stderr)
				}
			}
		})
	}
}

// TestRunDoesNotWarnOfChunking: a batch many times the device, what vram
// run is for, is chunked without the library's warning that the requests
// are many times the memory (-v still logs it, at debug level).
func TestRunDoesNotWarnOfChunking(t *testing.T) {
	args := []string{"run", "--device", "sim:granularity=64KiB,context=0", "--vram", "1MiB", "--runs", "200000", "--steps", "40", "--samples", "21"}
	_, stderr, code := cli(t, "", args...)
	if code != exitOK || strings.Contains(stderr, "20 times") || strings.Contains(stderr, "WARN") {
		t.Errorf("exit %d; stderr:\n%s\nwant no warning", code, stderr)
	}
	_, stderr, code = cli(t, "", append([]string{"-v"}, args...)...)
	if code != exitOK || !strings.Contains(stderr, `level=DEBUG msg="`+vram.RequestWarning+`"`) {
		t.Errorf("with -v: exit %d; stderr:\n%s\nwant the warning at debug level", code, stderr)
	}
}
