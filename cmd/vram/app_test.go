package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"go.uber.org/goleak"

	"github.com/vramkit/vram/device"
)

// mainArgsEnv, set in a child process's environment, makes the test
// binary run main with these arguments (separated by newlines) instead of
// the tests: how the signal tests run the real command.
const mainArgsEnv = "VRAM_TEST_MAIN_ARGS"

func TestMain(m *testing.M) {
	if leaseHolderMain() { // leaseholder_test.go
		return
	}
	if args, ok := os.LookupEnv(mainArgsEnv); ok {
		os.Args = append([]string{"vram"}, strings.Split(args, "\n")...)
		main()
	}
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
		"run: allocator":  {[]string{"run", "--allocator", "foo"}, []string{`--allocator "foo": want direct (or default), pool (or cupy), async`}},
		"replay: no file": {[]string{"replay"}, []string{"vram replay needs at least one TRACE.csv"}},
		"run: out's dir":  {[]string{"run", "--out", "/nonexistent-vram-dir/x.npy"}, []string{"--out: write /nonexistent-vram-dir/x.npy: make its directory first (mkdir -p /nonexistent-vram-dir)"}},
		"extra argument":  {[]string{"info", "extra"}, []string{`vram info takes no arguments, but was given ["extra"]`}},
		"empty device":    {[]string{"info", "--device", " "}, []string{"--device is empty"}},
		"unknown backend": {[]string{"info", "--device", "tpu:0"}, []string{`backend "tpu"`, "bad device spec"}},
		"plan: two files": {[]string{"plan", "a.json", "b.json"}, []string{"vram plan takes at most 1 request set FILE", `["a.json" "b.json"]`}},
		"plan: buffers 4": {[]string{"plan", "--buffers", "4"}, []string{"--buffers 4: want 1, or up to 3"}},
		"plan: budget":    {[]string{"plan", "--budget", "lots"}, []string{`--budget "lots"`}},
		"plan: allocator": {[]string{"plan", "--allocator", "slab"}, []string{`--allocator "slab"`, "direct (or default), pool (or cupy), async"}},
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

// TestHugeDeviceSpec: a --device or $VRAM_DEVICE of a megabyte is a usage
// error of a few hundred bytes that quotes it once, clipped (and the
// option at fault once).
func TestHugeDeviceSpec(t *testing.T) {
	huge := "sim:vram=1GiB," + strings.Repeat("a", 1<<20)
	for name, env := range map[string]bool{"--device": false, "$VRAM_DEVICE": true} {
		t.Run(name, func(t *testing.T) {
			args := []string{"info", "--device", huge}
			if env {
				t.Setenv(device.EnvDevice, huge)
				args = []string{"info"}
			}
			_, stderr, code := cli(t, "", args...)
			if code != exitUsage || len(stderr) > 600 || !strings.Contains(stderr, name+` "sim:vram=1GiB,aaa`) ||
				strings.Count(stderr, "sim:vram=1GiB,") != 1 {
				t.Errorf("exit %d, %d bytes of stderr (%.300s…); want exit 2 and a short error quoting the spec once", code, len(stderr), stderr)
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

// TestCheckSpec checks that the backends linked into vram read the specs
// --device takes (device.ParseSpec, as every command that uses one does).
func TestCheckSpec(t *testing.T) {
	tests := map[string]struct {
		spec string
		want string // "" for a good spec, else a substring of the error
	}{
		"auto":             {"auto", ""},
		"auto, sim option": {"auto:vram=1GiB", ""},
		"sim":              {"sim", ""},
		"sim options":      {"sim:vram=8GiB,backed=false", ""},
		"cuda":             {"cuda", ""},
		"cuda 1":           {"cuda:1", ""},
		"upper case":       {"SIM", ""},
		"no backend":       {":1", "no backend name"},
		"unknown":          {"bogus", `unknown backend "bogus"`},
		"unknown, opts":    {"tpu:0", `unknown backend "tpu"`},
		"bad sim option":   {"sim:colour=red", `unknown sim option "colour"`},
		"bad auto option":  {"auto:vram=lots", "sim option vram"},
		"cuda, not number": {"cuda:first", `cuda device "first": want a device number`},
		"cuda, negative":   {"cuda:-1", `cuda device "-1"`},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			_, err := device.ParseSpec(tc.spec)
			if tc.want == "" {
				if err != nil {
					t.Errorf("ParseSpec(%q) = %v, want nil", tc.spec, err)
				}
				return
			}
			if !errors.Is(err, device.ErrBadSpec) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("ParseSpec(%q) = %v, want an error wrapping ErrBadSpec containing %q", tc.spec, err, tc.want)
			}
		})
	}
}

// TestDeviceSpecCheckedEverywhere checks that a malformed device spec is
// a usage error also for the commands that do not open a device, and that
// the message names where the spec came from: the flag, or $VRAM_DEVICE.
func TestDeviceSpecCheckedEverywhere(t *testing.T) {
	const planInput = `{"budget": "64MiB", "granularity": 512,
		"requests": {"c": {"x": {"shape": [10, 1000], "dtype": "float32", "chunk_axis": 1}}}}`
	tests := map[string]struct {
		env   string
		stdin string
		args  []string
		want  string
	}{
		"replay, flag":      {"", "", []string{"replay", "--device", "bogus", smallTrace}, `--device "bogus": unknown backend "bogus"`},
		"replay, env":       {"bogus", "", []string{"replay", smallTrace}, `$VRAM_DEVICE "bogus": unknown backend "bogus"`},
		"plan, flag":        {"", planInput, []string{"plan", "--device", "bogus"}, `--device "bogus": unknown backend`},
		"plan, env":         {"sim:vram=lots", planInput, []string{"plan"}, `$VRAM_DEVICE "sim:vram=lots": sim option vram`},
		"info, cuda number": {"", "", []string{"info", "--device", "cuda:x"}, `--device "cuda:x": cuda device "x"`},
		"bench, env":        {"tpu", "", []string{"bench", "--time", "1ms"}, `$VRAM_DEVICE "tpu"`},
		"broker, env":       {"bogus", "", []string{"broker", "--socket", "/nonexistent/vram.sock"}, `$VRAM_DEVICE "bogus": unknown backend`},
		"flag beats env":    {"sim", "", []string{"info", "--device", "bogus"}, `--device "bogus"`},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Setenv(device.EnvDevice, tc.env)
			stdout, stderr, code := cli(t, tc.stdin, tc.args...)
			if code != exitUsage || stdout != "" {
				t.Errorf("exit %d, stdout %q; want exit %d and nothing on stdout", code, stdout, exitUsage)
			}
			if !strings.Contains(stderr, tc.want) {
				t.Errorf("stderr does not contain %q:\n%s", tc.want, stderr)
			}
		})
	}
}

// TestHelpWithBadEnvDevice checks that help, --version and a bare vram
// do not trip over a bad $VRAM_DEVICE they never use.
func TestHelpWithBadEnvDevice(t *testing.T) {
	t.Setenv(device.EnvDevice, "bogus")
	tests := map[string]struct {
		args []string
		code int
		want string // in stdout for exit 0, else stderr
	}{
		"help run":    {[]string{"help", "run"}, exitOK, "vram run [flags]"},
		"run --help":  {[]string{"run", "--help"}, exitOK, "vram run [flags]"},
		"--version":   {[]string{"--version"}, exitOK, "vram version"},
		"no command":  {nil, exitUsage, "missing command"},
		"completion":  {[]string{"completion", "bash"}, exitOK, "bash completion"},
		"the command": {[]string{"info"}, exitUsage, `$VRAM_DEVICE "bogus"`},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			stdout, stderr, code := cli(t, "", tc.args...)
			got := stdout
			if tc.code != exitOK {
				got = stderr
			}
			if code != tc.code || !strings.Contains(got, tc.want) {
				t.Errorf("exit %d, want %d with %q; stdout:\n%s\nstderr:\n%s", code, tc.code, tc.want, stdout, stderr)
			}
		})
	}
}

// TestEnvDeviceNamedInRunErrors checks that run blames $VRAM_DEVICE, not
// --device, for a spec that came from the environment.
func TestEnvDeviceNamedInRunErrors(t *testing.T) {
	tests := map[string]struct {
		env  string
		args []string
		want string
		not  string
	}{
		"sized twice, env": {"sim:vram=1GiB", []string{"run", "--vram", "512MiB"},
			`$VRAM_DEVICE "sim:vram=1GiB" sizes the device and so does --vram 512MiB`, "--device"},
		"sized twice, flag": {"", []string{"run", "--device", "sim:vram=1GiB", "--vram", "512MiB"},
			`--device "sim:vram=1GiB" sizes the device`, "VRAM_DEVICE"},
		"bad sim, env": {"sim:vram=1MiB", []string{"run", "--runs", "10", "--steps", "2"},
			`$VRAM_DEVICE "sim:vram=1MiB": open "sim:vram=1MiB"`, "--device"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Setenv(device.EnvDevice, tc.env)
			_, stderr, code := cli(t, "", tc.args...)
			if code != exitUsage {
				t.Errorf("exit %d, want %d; stderr:\n%s", code, exitUsage, stderr)
			}
			if !strings.Contains(stderr, tc.want) || strings.Contains(stderr, tc.not) {
				t.Errorf("stderr should contain %q and not %q:\n%s", tc.want, tc.not, stderr)
			}
		})
	}
}

// TestErrorPrefixOnce checks that a library error, wrapped by package
// batch, is printed with the prefix once (the simulator's backing cap
// refuses a 64 GiB page at the first copy); prefix_test.go runs the other
// paths.
func TestErrorPrefixOnce(t *testing.T) {
	_, stderr, code := cli(t, "", "run", "--device", "sim:granularity=64GiB,vram=256GiB", "--runs", "10", "--steps", "1")
	if code != exitFailure || !strings.Contains(stderr, "\nvram: batch: ") || strings.Contains(stderr, "vram: vram:") {
		t.Errorf("exit %d, stderr %q: want exit %d and one \"vram: \" prefix", code, stderr, exitFailure)
	}
}

// TestCommandsCheckTheSpec: the command tree is the one list of commands.
// Every command in it that vram registered checks the device spec before
// it runs, unless it says it has no use for one (merge, broker status,
// lease); the help and completion commands cobra adds do not.
func TestCommandsCheckTheSpec(t *testing.T) {
	root := (&app{}).rootCommand()
	root.InitDefaultHelpCmd()
	root.InitDefaultCompletionCmd()
	noSpec := map[string]bool{"vram merge": true, "vram broker status": true, "vram lease": true}
	cobras := map[string]bool{"vram help": true, "vram completion": true, "vram completion bash": true,
		"vram completion zsh": true, "vram completion fish": true, "vram completion powershell": true}
	var walk func(c *cobra.Command)
	seen := 0
	walk = func(c *cobra.Command) {
		for _, sub := range c.Commands() {
			path := sub.CommandPath()
			_, own := sub.Annotations[annOwn]
			switch {
			case cobras[path] && (own || checksSpec(sub)):
				t.Errorf("%s is cobra's, but vram treats it as its own", path)
			case !cobras[path] && !own:
				t.Errorf("%s is not marked as vram's own command", path)
			case !cobras[path] && checksSpec(sub) == noSpec[path]:
				t.Errorf("%s: checks the spec %v; want %v", path, checksSpec(sub), !noSpec[path])
			}
			seen++
			walk(sub)
		}
	}
	walk(root)
	if checksSpec(root) || seen < len(noSpec)+len(cobras)+6 {
		t.Errorf("the root checks the spec (%v), or the tree has only %d commands", checksSpec(root), seen)
	}
}

// TestNoSpecCommandsIgnoreEnvDevice: the commands with no use for --device
// run (and fail, here, for their own reasons) whatever $VRAM_DEVICE says.
func TestNoSpecCommandsIgnoreEnvDevice(t *testing.T) {
	t.Setenv(device.EnvDevice, "bogus")
	sock := filepath.Join(t.TempDir(), "none.sock")
	for name, args := range map[string][]string{
		"merge":         {"merge"},
		"broker status": {"broker", "status", "--socket", sock},
		"lease":         {"lease", "--bytes", "1MiB", "--socket", sock, "--", "true"},
	} {
		t.Run(name, func(t *testing.T) {
			_, stderr, code := cli(t, "", args...)
			if code == exitOK || strings.Contains(stderr, device.EnvDevice) {
				t.Errorf("exit %d, stderr %q; want it to fail for its own reason, not $%s", code, stderr, device.EnvDevice)
			}
		})
	}
}
