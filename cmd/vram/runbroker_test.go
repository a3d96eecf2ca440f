//go:build linux

package main

// vram run --broker when its broker goes: a run whose lease is not taken
// back stops, one whose broker merely died finishes.

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// slowShared is a run of several chunks on a shared 8 MiB device whose
// copies take seconds in all, so that it is still running when its broker
// goes.
func slowShared(t *testing.T) (spec string, args []string) {
	spec = sharedSpec(t, "8MiB", "granularity=64KiB,bandwidth=4MB")
	return spec, []string{"run", "--device", spec, "--runs", "200000", "--steps", "20", "--samples", "21"}
}

// A run whose lease the broker does not take back after a restart (a
// broker of another key) stops at its next chunk, exits 1 and says why.
// (Such a run once kept its arrays and finished, while the broker granted
// their memory to another job.)
func TestRunEndsWithItsLease(t *testing.T) {
	spec, args := slowShared(t)
	socket := filepath.Join(t.TempDir(), "b.sock")
	b := startBrokerProcess(t, spec, socket)
	run := startChild(t, append(args, "--broker", socket))
	run.waitFor(t, "run the batch")
	must(t, b.cmd.Process.Signal(syscall.SIGKILL))
	_, _ = b.wait(t)
	must(t, os.Remove(socket+".key")) // the next broker cannot know the lease
	startBrokerProcess(t, spec, socket)
	st, stderr := run.wait(t)
	if st.ExitCode() != exitFailure || !strings.Contains(stderr, "the manager's budget ended") || !strings.Contains(stderr, "the broker's lease cannot cover it") {
		t.Errorf("exit %d; want 1, the run stopped for its lease:\n%s", st.ExitCode(), stderr)
	}
}

// A run whose broker dies (and is not restarted) goes on with the memory
// it holds, which no broker grants to anyone, and exits 0 verified. (Such
// a run once exited 1: its lease could not be released at the end.)
func TestRunOutlivesItsBroker(t *testing.T) {
	spec, args := slowShared(t)
	socket := filepath.Join(t.TempDir(), "b.sock")
	b := startBrokerProcess(t, spec, socket)
	run := startChild(t, append(args, "--broker", socket))
	run.waitFor(t, "run the batch")
	must(t, b.cmd.Process.Signal(syscall.SIGKILL))
	_, _ = b.wait(t)
	st, stderr := run.wait(t)
	if st.ExitCode() != exitOK {
		t.Errorf("exit %d; want 0:\n%s", st.ExitCode(), stderr)
	}
}
