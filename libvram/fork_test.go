//go:build unix

package main

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vramkit/vram/broker"
	"github.com/vramkit/vram/internal/brokertest"
)

// TestForkedChildDropsLease: a process that leased through libvram, from
// C or from Python (os.fork, multiprocessing), forks a child that does not exec and is killed with
// SIGKILL: its lease ends with it, while the child lives on (the child
// closed its copy of the broker connection at the fork).
func TestForkedChildDropsLease(t *testing.T) {
	lib := library(t)
	tests := map[string]func(t *testing.T, spec, socket string) *exec.Cmd{
		"C": func(t *testing.T, spec, socket string) *exec.Cmd {
			return exec.Command(compile(t, "gcc", "testdata/forklease.c", "forklease", "-ldl"), lib, spec, socket)
		},
		"Python os.fork":         forkPython(lib, "os.fork"),
		"Python multiprocessing": forkPython(lib, "multiprocessing"),
	}
	for name, command := range tests {
		t.Run(name, func(t *testing.T) {
			spec := fmt.Sprintf("sim:shared=fork%d-%s,vram=64MiB,context=0,dir=%s", os.Getpid(), strings.ReplaceAll(name, " ", "-"), t.TempDir())
			socket := brokertest.Serve(t, spec, 64<<20, 300*time.Millisecond)
			c, err := broker.Dial(context.Background(), socket)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			cmd := command(t, spec, socket)
			parent, child := startForker(t, cmd)
			if !leased(t, c, parent) {
				t.Fatalf("no lease of pid %d in the broker's table", parent)
			}
			if err := syscall.Kill(parent, syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			_ = cmd.Wait()
			// The broker ends a lease when its connection closes: at once,
			// a minute past being any machine's scheduling.
			for deadline := time.Now().Add(time.Minute); leased(t, c, parent); time.Sleep(10 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatalf("pid %d's lease is still in the broker's table a minute after it was killed, while its child %d lives", parent, child)
				}
			}
			if err := syscall.Kill(child, 0); err != nil {
				t.Errorf("the child %d ended with its parent (%v): nothing was tried", child, err)
			}
		})
	}
}

// forkPython runs testdata/forklease.py, forking by how.
func forkPython(lib, how string) func(t *testing.T, spec, socket string) *exec.Cmd {
	return func(t *testing.T, spec, socket string) *exec.Cmd {
		py, err := exec.LookPath("python3")
		if err != nil {
			t.Skip("no python3")
		}
		root, err := filepath.Abs("../python")
		if err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(py, "testdata/forklease.py", how, spec, socket)
		cmd.Env = append(os.Environ(), "VRAM_LIBRARY="+lib, "PYTHONPATH="+root, "PYTHONDONTWRITEBYTECODE=1")
		return cmd
	}
}

// startForker starts cmd and reads its "parent=PID child=PID"; both are
// killed when the test ends.
func startForker(t *testing.T, cmd *exec.Cmd) (parent, child int) {
	t.Helper()
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	if _, serr := fmt.Sscanf(line, "parent=%d child=%d", &parent, &child); err != nil || serr != nil {
		t.Fatalf("the program said %q (%v)", line, err)
	}
	t.Cleanup(func() { _ = syscall.Kill(child, syscall.SIGKILL) })
	return parent, child
}

// leased reports whether the broker lists a lease of pid.
func leased(t *testing.T, c *broker.Client, pid int) bool {
	t.Helper()
	st, err := c.Status(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range st.Devices {
		for _, l := range d.Leases {
			if int(l.PID) == pid {
				return true
			}
		}
	}
	return false
}
