package main

import (
	"bytes"
	"context"
	"os"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// cli runs one command line in-process with stdin as its input and
// returns what it printed and its exit status.
func cli(t *testing.T, stdin string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	var out, errb bytes.Buffer
	code = runContext(context.Background(), args, strings.NewReader(stdin), &out, &errb)
	return out.String(), errb.String(), code
}

func TestUsageErrors(t *testing.T) {
	tests := map[string]struct {
		args []string
		want []string // substrings of stderr
	}{
		"no command":      {nil, []string{"missing command", "info", "plan", "run", "replay"}},
		"unknown command": {[]string{"inof"}, []string{`unknown command "inof"`, `did you mean "info"?`}},
		"unknown flag":    {[]string{"info", "--colour"}, []string{"unknown flag: --colour", "vram info --help"}},
		"bad flag value":  {[]string{"plan", "--buffers", "two"}, []string{`--buffers "two": want a whole number (default 0)`}},
		"bad duration":    {[]string{"bench", "--time", "5"}, []string{`--time "5": want a duration such as 200ms`}},
		"bad bool":        {[]string{"run", "--double-buffer=maybe"}, []string{`--double-buffer "maybe": want true or false`}},
		"negative seed":   {[]string{"run", "--seed", "-1"}, []string{`--seed "-1": want a whole number of at least 0`}},
		"negative runs":   {[]string{"run", "--runs", "-5"}, []string{"--runs -5: want 1 to"}},
		"run: allocator":  {[]string{"run", "--allocator", "foo"}, []string{`--allocator "foo": want one of direct, pool, async`}},
		"replay: no file": {[]string{"replay"}, []string{"vram replay needs at least one TRACE.csv"}},
		"extra argument":  {[]string{"info", "extra"}, []string{`vram info takes no arguments, but was given ["extra"]`}},
		"empty device":    {[]string{"info", "--device", " "}, []string{"--device is empty"}},
		"unknown backend": {[]string{"info", "--device", "tpu:0"}, []string{`backend "tpu"`, "bad device spec"}},
		"plan: two files": {[]string{"plan", "a.json", "b.json"}, []string{"vram plan takes at most 1 request set FILE", `["a.json" "b.json"]`}},
		"plan: buffers 3": {[]string{"plan", "--buffers", "3"}, []string{"--buffers 3: want 1, or 2"}},
		"plan: budget":    {[]string{"plan", "--budget", "lots"}, []string{`--budget "lots"`}},
		"plan: allocator": {[]string{"plan", "--allocator", "slab"}, []string{`--allocator "slab"`, "direct, pool, async"}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			stdout, stderr, code := cli(t, "", tc.args...)
			if code != exitUsage {
				t.Errorf("exit %d, want %d; stderr:\n%s", code, exitUsage, stderr)
			}
			if stdout != "" {
				t.Errorf("stdout not empty on a usage error:\n%s", stdout)
			}
			for _, w := range tc.want {
				if !strings.Contains(stderr, w) {
					t.Errorf("stderr does not contain %q:\n%s", w, stderr)
				}
			}
			if !strings.Contains(stderr, "--help' for usage") {
				t.Errorf("stderr does not point at --help:\n%s", stderr)
			}
		})
	}
}

func TestHelpAndVersion(t *testing.T) {
	tests := map[string]struct {
		args []string
		want []string
	}{
		"root help":  {[]string{"--help"}, []string{"Available Commands:", "info", "plan", "replay", "run", "--device", "--json"}},
		"plan help":  {[]string{"plan", "--help"}, []string{"vram plan [FILE]", "--budget", "chunk_axis"}},
		"help cmd":   {[]string{"help", "info"}, []string{"vram info [flags]"}},
		"version":    {[]string{"--version"}, []string{"vram version"}},
		"root usage": {[]string{"-h"}, []string{"vram [command]"}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			stdout, stderr, code := cli(t, "", tc.args...)
			if code != exitOK {
				t.Fatalf("exit %d; stderr:\n%s", code, stderr)
			}
			for _, w := range tc.want {
				if !strings.Contains(stdout, w) {
					t.Errorf("stdout does not contain %q:\n%s", w, stdout)
				}
			}
		})
	}
}

func TestDeviceDefaultFromEnvironment(t *testing.T) {
	t.Setenv("VRAM_DEVICE", "nosuch:1")
	_, stderr, code := cli(t, "", "info")
	if code != exitUsage || !strings.Contains(stderr, `"nosuch:1"`) {
		t.Errorf("with VRAM_DEVICE=nosuch:1: exit %d, stderr %q; want exit 2 naming the spec", code, stderr)
	}
}

func TestVerboseLogsOnStderr(t *testing.T) {
	stdout, stderr, code := cli(t, "", "-v", "--json", "info", "--device", "sim")
	if code != exitOK {
		t.Fatalf("exit %d; stderr:\n%s", code, stderr)
	}
	if !strings.Contains(stderr, "level=DEBUG") {
		t.Errorf("-v wrote no debug log on stderr:\n%s", stderr)
	}
	if strings.Contains(stdout, "level=") {
		t.Errorf("logs leaked onto stdout:\n%s", stdout)
	}
}

func TestIsTerminal(t *testing.T) {
	if isTerminal(&bytes.Buffer{}) {
		t.Error("a buffer is not a terminal")
	}
	f, err := os.CreateTemp(t.TempDir(), "out")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if isTerminal(f) {
		t.Error("a regular file is not a terminal")
	}
	a := &app{stderr: f}
	if _, ok := a.progress(10, "x").(noProgress); !ok {
		t.Error("progress on a file drew a bar")
	}
}

// TestRunWrapper checks the entry point main's tests and tools use: the
// process's stdin, the given stdout and stderr, the exit status back.
func TestRunWrapper(t *testing.T) {
	var out, errb bytes.Buffer
	if code := run([]string{"--version"}, &out, &errb); code != exitOK || !strings.Contains(out.String(), "vram version") {
		t.Errorf("run --version: exit %d, stdout %q, stderr %q", code, out.String(), errb.String())
	}
	out.Reset()
	errb.Reset()
	if code := run([]string{"nosuch"}, &out, &errb); code != exitUsage || out.Len() != 0 || !strings.Contains(errb.String(), "nosuch") {
		t.Errorf("run nosuch: exit %d, stdout %q, stderr %q", code, out.String(), errb.String())
	}
}
