//go:build linux

package main

// `vram lease`'s COMMAND ends with vram and with its lease: vram killed
// with SIGKILL takes COMMAND with it, and a lease that ends first (another
// process releases it, a restarted broker does not take it back) stops
// COMMAND, its process group whole, with SIGTERM and then SIGKILL, and
// vram exits 1 saying why.

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// pidAlive reports whether process pid is running: not gone and not a
// zombie left for its new parent to reap.
func pidAlive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i >= 0 && i+2 < len(s) && s[i+2] != 'Z' && s[i+2] != 'X'
}

// pidsFrom reads the "NAME=PID" words of the first line of a child's
// stderr that has the first name, as the test's commands print them.
func pidsFrom(t *testing.T, c *child, names ...string) map[string]int {
	t.Helper()
	line := c.waitFor(t, names[0]+"=")
	pids := map[string]int{}
	for _, w := range strings.Fields(line) {
		if k, v, ok := strings.Cut(w, "="); ok {
			if pid, err := strconv.Atoi(v); err == nil {
				pids[k] = pid
				t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGKILL) })
			}
		}
	}
	for _, n := range names {
		if pids[n] == 0 {
			t.Fatalf("%q: no %s=PID", line, n)
		}
	}
	return pids
}

// awaitDeath waits, with the test's patience, for each process to end.
func awaitDeath(t *testing.T, what string, pids map[string]int) {
	t.Helper()
	if !poll(patience(t), func() bool {
		for _, pid := range pids {
			if pidAlive(pid) {
				return false
			}
		}
		return true
	}) {
		t.Fatalf("%s: processes %v still run", what, pids)
	}
}

// TestLeaseCommandDiesWithVram: vram lease killed with SIGKILL, whose
// lease the broker then frees for others, takes COMMAND with it.
func TestLeaseCommandDiesWithVram(t *testing.T) {
	socket := startBroker(t, "sim:vram=1GiB")
	c := startChild(t, []string{"lease", "--socket", socket, "--proportion", "0.5", "--", "sh", "-c",
		`echo cmd=$$ >&2; exec sleep 600`})
	pids := pidsFrom(t, c, "cmd")
	must(t, c.cmd.Process.Signal(syscall.SIGKILL))
	_ = c.cmd.Wait()
	awaitDeath(t, "after vram lease was killed with SIGKILL", pids)
	if !poll(patience(t), func() bool { return leases(brokerStatus(t, socket)) == 0 }) {
		t.Errorf("the killed vram lease's lease is still in the broker's table")
	}
}

// TestLeaseEndsTheCommand: a lease that ends before its COMMAND stops it:
// SIGTERM to its process group (a child it started in the background goes
// too), SIGKILL --kill-after later if it ignores SIGTERM; vram exits 1,
// saying the lease ended, never with COMMAND's status.
func TestLeaseEndsTheCommand(t *testing.T) {
	const (
		trapsTerm   = `trap 'echo got-term >&2; exit 7' TERM; sleep 600 & echo cmd=$$ bg=$! >&2; while :; do sleep 0.05; done`
		ignoresTerm = `trap '' TERM; sleep 600 & echo cmd=$$ bg=$! >&2; while :; do sleep 0.05; done`
	)
	tests := map[string]struct {
		script string
		end    func(t *testing.T, socket string, restart func())
		killed bool // by SIGKILL after the grace
		why    string
	}{
		// No other process may release a lease (docs/broker-trust.md: a
		// lease is its connection's, root's no exception): a broker that
		// comes back without the lease's device ends it.
		"not taken back, exits on SIGTERM": {script: trapsTerm, end: restarted, why: "was not taken back by the restarted broker"},
		"not taken back, ignores SIGTERM":  {script: ignoresTerm, end: restarted, killed: true, why: "was not taken back by the restarted broker"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			// Two devices; the lease is of device 1, which the broker
			// started again lacks, so that it cannot take the lease back.
			a, b := sharedSpec(t, "256MiB", ""), sharedSpec(t, "256MiB", "")
			socket := filepath.Join(t.TempDir(), "b.sock")
			b1 := startBrokerProcess(t, a+";"+b, socket)
			restart := func() {
				must(t, b1.cmd.Process.Signal(syscall.SIGKILL))
				_, _ = b1.wait(t)
				startBrokerProcess(t, a, socket)
			}
			c := startChild(t, []string{"lease", "--socket", socket, "--device", "1", "--proportion", "0.5", "--kill-after", "1s",
				"--", "sh", "-c", tc.script})
			pids := pidsFrom(t, c, "cmd", "bg")
			tc.end(t, socket, restart)
			st, stderr := c.wait(t)
			if st.ExitCode() != exitFailure || !strings.Contains(stderr, "the lease ended before sh did") ||
				!strings.Contains(stderr, tc.why) {
				t.Errorf("exit %d; want 1 and a line saying the lease ended (%s); stderr:\n%s", st.ExitCode(), tc.why, stderr)
			}
			if got := strings.Contains(stderr, "got-term"); got == tc.killed {
				t.Errorf("the command's SIGTERM trap ran: %v; stderr:\n%s", got, stderr)
			}
			if got := strings.Contains(stderr, "killed with SIGKILL"); got != tc.killed {
				t.Errorf("vram says it killed the command: %v, want %v; stderr:\n%s", got, tc.killed, stderr)
			}
			awaitDeath(t, "after the lease ended", pids)
			t.Logf("vram lease said:\n%s", stderr)
		})
	}
}

// restarted ends the lease by restarting its broker without its device.
func restarted(_ *testing.T, _ string, restart func()) { restart() }

// TestLeaseFlagsCheckedFirst: flags no broker accepts are usage errors
// (exit 2) before the broker is dialled (there is none here), and a
// default name is made valid from any command's name.
func TestLeaseFlagsCheckedFirst(t *testing.T) {
	none := filepath.Join(t.TempDir(), "none.sock")
	tests := map[string]struct {
		args []string
		want string
	}{
		"proportion below the smallest share": {[]string{"--proportion", "1e-300"}, "--proportion 1e-300: want 0 < P ≤ 1, at least 1e-12"},
		"proportion over 1":                   {[]string{"--proportion", "1.5"}, "--proportion 1.5"},
		"proportion NaN":                      {[]string{"--proportion", "NaN"}, "--proportion NaN"},
		"proportion +Inf":                     {[]string{"--proportion", "+Inf"}, "--proportion +Inf"},
		"name with a tab":                     {[]string{"--proportion", "0.5", "--name", "a\tb"}, `--name "a\tb": want at most 128 bytes of printable UTF-8, such as "a?b"`},
		"name of 200 bytes":                   {[]string{"--proportion", "0.5", "--name", strings.Repeat("n", 200)}, "(200 bytes): want at most 128 bytes"},
		"kill-after 0":                        {[]string{"--proportion", "0.5", "--kill-after", "0s"}, "--kill-after 0s: want a positive duration"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			args := append(append([]string{"lease", "--socket", none}, tc.args...), "--", "true")
			_, stderr, code := cli(t, "", args...)
			if code != exitUsage || !strings.Contains(stderr, tc.want) || strings.Contains(stderr, "broker") {
				t.Errorf("exit %d; want 2 and %q before dialling; stderr:\n%s", code, tc.want, stderr)
			}
		})
	}
	for name, want := range map[string]string{
		"tab\there":               "tab?here",
		strings.Repeat("x", 200):  strings.Repeat("x", 128),
		strings.Repeat("é", 100):  strings.Repeat("é", 64),
		"bad\xffutf8":             "bad?utf8",
		"line\nbreak\x00and\x7f.": "line?break?and?.",
	} {
		if got := leaseName(name); got != want {
			t.Errorf("leaseName(%q) = %q, want %q", name, got, want)
		}
	}
}

// TestLeaseDefaultNameFromAnyCommand: a COMMAND whose name the broker
// would refuse as a lease's name runs under a lease named after it.
func TestLeaseDefaultNameFromAnyCommand(t *testing.T) {
	socket := startBroker(t, "sim:vram=1GiB")
	dir := t.TempDir()
	for name, want := range map[string]string{
		"tab\tname":              "tab?name",
		strings.Repeat("c", 200): strings.Repeat("c", 128),
	} {
		script := filepath.Join(dir, name)
		t.Run(fmt.Sprintf("%.20q", name), func(t *testing.T) {
			// The command prints the broker's status as vram broker
			// status --json would: its own lease's name.
			t.Setenv(mainArgsEnv, strings.Join([]string{"broker", "status", "--json", "--socket", socket}, "\n"))
			must(t, os.WriteFile(script, []byte("#!/bin/sh\nexec "+os.Args[0]+"\n"), 0o755))
			stdout, stderr, code := cli(t, "", "lease", "--socket", socket, "--proportion", "0.5", "--", script)
			if code != exitOK || !strings.Contains(stdout, `"name": "`+want+`"`) {
				t.Errorf("exit %d; want 0 and a lease named %q; stdout:\n%s\nstderr:\n%s", code, want, stdout, stderr)
			}
		})
	}
}
