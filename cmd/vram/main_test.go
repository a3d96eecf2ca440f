//go:build unix

package main

import (
	"bufio"
	"bytes"
	"errors"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

// slowRun is a batch job that takes several seconds: the small test batch
// with copies emulated at 1 MB/s, about a second a chunk. -v logs the plan
// before the first chunk.
var slowRun = []string{"-v", "run", "--device", "sim:bandwidth=1MB,granularity=64KiB,context=0", "--vram", "1MiB",
	"--runs", "20000", "--steps", "40", "--samples", "21"}

// child is the real vram command (the test binary running main) and its
// stderr, line by line.
type child struct {
	cmd    *exec.Cmd
	lines  chan string  // closed at the end of stderr
	stdout bytes.Buffer // what it printed, to read once it has ended
	seen   []string
}

// patience bounds a wait for what must happen (a line, an exit, a state):
// long enough for a machine whose cores are all busy, and over before the
// test binary's own deadline, so that a failure says what was awaited.
// It judges nothing: what is awaited has no time of its own to keep.
func patience(t *testing.T) time.Duration {
	if d, ok := t.Deadline(); ok {
		return max(time.Until(d)-time.Minute, time.Minute)
	}
	return 10 * time.Minute
}

// startChild starts the vram command with args, killed when the test
// ends if it has not ended by then.
func startChild(t *testing.T, args []string) *child {
	t.Helper()
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), mainArgsEnv+"="+strings.Join(args, "\n"))
	cmd.WaitDelay = time.Minute // for a process it left holding stdout
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	c := &child{cmd: cmd, lines: make(chan string, 1024)}
	cmd.Stdout = &c.stdout
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if c.cmd.ProcessState == nil { // not waited for: the test failed
			_ = c.cmd.Process.Kill()
			_ = c.cmd.Wait()
		}
	})
	go func() {
		defer close(c.lines)
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			c.lines <- sc.Text()
		}
	}()
	return c
}

// waitFor reads stderr until a line contains s, and returns that line.
func (c *child) waitFor(t *testing.T, s string) string {
	t.Helper()
	limit := patience(t)
	timeout := time.After(limit)
	for {
		select {
		case line, ok := <-c.lines:
			if !ok {
				t.Fatalf("stderr ended before %q:\n%s", s, strings.Join(c.seen, "\n"))
			}
			c.seen = append(c.seen, line)
			if strings.Contains(line, s) {
				return line
			}
		case <-timeout:
			t.Fatalf("no %q on stderr after %v:\n%s", s, limit, strings.Join(c.seen, "\n"))
		}
	}
}

// wait reads the rest of stderr and waits for the process to end.
func (c *child) wait(t *testing.T) (*os.ProcessState, string) {
	t.Helper()
	for line := range c.lines {
		c.seen = append(c.seen, line)
	}
	_ = c.cmd.Wait()
	return c.cmd.ProcessState, strings.Join(c.seen, "\n")
}

// TestInterruptStopsTheJob sends the running job one SIGINT or SIGTERM:
// it stops before its next chunk and exits 1, saying what the signal
// does and how to quit at once for that signal.
func TestInterruptStopsTheJob(t *testing.T) {
	for name, tc := range map[string]struct {
		sig       os.Signal
		want, not string
	}{
		"SIGINT":  {os.Interrupt, "vram: interrupted: stopping at the next safe point; press Ctrl-C again to quit at once", "SIGTERM"},
		"SIGTERM": {syscall.SIGTERM, "vram: SIGTERM: stopping at the next safe point, as for Ctrl-C; a second SIGTERM (or SIGKILL) quits at once", "press Ctrl-C again"},
	} {
		t.Run(name, func(t *testing.T) {
			c := startChild(t, slowRun)
			c.waitFor(t, "msg=plan")
			if err := c.cmd.Process.Signal(tc.sig); err != nil {
				t.Fatal(err)
			}
			st, stderr := c.wait(t)
			if st.ExitCode() != exitFailure || !strings.Contains(stderr, tc.want) || strings.Contains(stderr, tc.not) ||
				!strings.Contains(stderr, "interrupted before chunk") {
				t.Errorf("exit %d (%v); want exit 1, %q and the job stopped; stderr:\n%s", st.ExitCode(), st, tc.want, stderr)
			}
		})
	}
}

// TestSecondInterruptKills sends the running job two SIGINTs: the first
// asks it to stop, the second, once signals are back to their default,
// ends it at once. The job stops at its next chunk boundary, so the first
// comes once its first chunk is back, while the next one is in flight,
// and its chunks are slow (copies at 100 KB/s: seconds each, however busy
// the machine): it cannot have stopped before the second comes.
func TestSecondInterruptKills(t *testing.T) {
	args := append([]string(nil), slowRun...)
	args[3] = "sim:bandwidth=100KB,granularity=64KiB,context=0"
	c := startChild(t, args)
	c.waitFor(t, `msg="chunk done"`)
	if err := c.cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	c.waitFor(t, "press Ctrl-C again")
	if err := c.cmd.Process.Signal(os.Interrupt); err != nil && !errors.Is(err, os.ErrProcessDone) {
		t.Fatal(err)
	}
	st, stderr := c.wait(t)
	if ws, ok := st.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGINT {
		t.Fatalf("the job ended with %v; want it killed by the second SIGINT; stderr:\n%s", st, stderr)
	}
}
