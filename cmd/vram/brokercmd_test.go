//go:build linux

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vramkit/vram/broker"
)

// startBroker runs `vram broker` in-process on a new socket until the
// test ends, with a reclaim deadline of 2 s.
func startBroker(t *testing.T, devices string) string {
	t.Helper()
	return startBrokerReclaim(t, devices, "2s")
}

// startBrokerReclaim is startBroker with a reclaim deadline of reclaim.
func startBrokerReclaim(t *testing.T, devices, reclaim string) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "vbc")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	socket := filepath.Join(dir, "b.sock")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int, 1)
	var stderr bytes.Buffer
	go func() {
		done <- runContext(ctx, []string{"broker", "--devices", devices, "--socket", socket, "--reclaim-timeout", reclaim}, strings.NewReader(""), &bytes.Buffer{}, &stderr)
	}()
	t.Cleanup(func() {
		cancel()
		if code := <-done; code != exitOK {
			t.Errorf("vram broker exited %d:\n%s", code, stderr.String())
		}
	})
	deadline := time.Now().Add(patience(t))
	for {
		c, err := broker.Dial(ctx, socket)
		if err == nil {
			_ = c.Close()
			return socket
		}
		if time.Now().After(deadline) {
			t.Fatalf("vram broker does not answer: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func brokerStatus(t *testing.T, socket string) broker.Status {
	t.Helper()
	stdout, stderr, code := cli(t, "", "broker", "status", "--socket", socket, "--json")
	if code != exitOK {
		t.Fatalf("vram broker status: exit %d:\n%s", code, stderr)
	}
	var st broker.Status
	if err := json.Unmarshal([]byte(stdout), &st); err != nil {
		t.Fatalf("status --json: %v:\n%s", err, stdout)
	}
	return st
}

func leases(st broker.Status) int {
	n := 0
	for _, d := range st.Devices {
		n += len(d.Leases)
	}
	return n
}

// `vram lease --bytes 1GiB -- env` sets each framework's limit to the
// lease less the context, and the lease is gone when env exits.
func TestLeaseSetsTheFrameworksLimits(t *testing.T) {
	socket := startBroker(t, "sim:vram=4GiB")
	t.Setenv("VRAM_BROKER", socket) // not passed on: a vram inside would lease the same memory again
	stdout, stderr, code := cli(t, "", "lease", "--socket", socket, "--bytes", "1GiB", "--", "env")
	if code != exitOK {
		t.Fatalf("exit %d:\n%s", code, stderr)
	}
	// A 4 GiB simulator's context is 128 MiB: 896 MiB are the command's.
	const bytes = 896 << 20
	for _, want := range []string{
		"VRAM_ALLOC_CONF=limit:" + strconv.Itoa(bytes),
		"CUPY_GPU_MEMORY_LIMIT=" + strconv.Itoa(bytes),
		"XLA_PYTHON_CLIENT_MEM_FRACTION=0.2187",
		"TF_FORCE_GPU_ALLOW_GROWTH=true",
		"VRAM_LEASE_BYTES=" + strconv.Itoa(bytes),
		"VRAM_LEASE_FRACTION=0.2187",
		"VRAM_LEASE_DEVICE=0",
		"VRAM_LEASE_ID=",
	} {
		if !strings.Contains(stdout, "\n"+want) && !strings.HasPrefix(stdout, want) {
			t.Errorf("the command's environment lacks %s", want)
		}
	}
	for _, unwanted := range []string{"VRAM_BROKER=", "XLA_CLIENT_MEM_FRACTION="} { // JAX refuses its two names together
		if strings.Contains(stdout, unwanted) {
			t.Errorf("the command's environment has %s", unwanted)
		}
	}
	if n := leases(brokerStatus(t, socket)); n != 0 {
		t.Errorf("%d lease(s) left after the command exited", n)
	}
}

// The lease ends however the command ends: an exit status is passed on, a
// command killed by a signal exits 128 + the signal.
func TestLeaseEndsWithTheCommand(t *testing.T) {
	socket := startBroker(t, "sim:vram=1GiB")
	for name, tc := range map[string]struct {
		script string
		code   int
	}{
		"exit 3":  {"exit 3", 3},
		"kill -9": {"kill -9 $$", 128 + 9},
		"exit 0":  {"exit 0", 0},
	} {
		t.Run(name, func(t *testing.T) {
			_, stderr, code := cli(t, "", "lease", "--socket", socket, "--proportion", "0.5", "--", "sh", "-c", tc.script)
			if code != tc.code {
				t.Errorf("exit %d, want %d:\n%s", code, tc.code, stderr)
			}
			if n := leases(brokerStatus(t, socket)); n != 0 {
				t.Errorf("%d lease(s) left", n)
			}
		})
	}
}

// vram itself killed with SIGKILL: its connection closes and the broker
// releases the lease; a SIGTERM to vram reaches the command, whose status
// vram exits with.
func TestLeaseSignals(t *testing.T) {
	socket := startBroker(t, "sim:vram=1GiB")
	c := startChild(t, []string{"lease", "--socket", socket, "--proportion", "0.5", "--", "sh", "-c",
		`trap 'echo got-term >&2; exit 7' TERM; echo ready >&2; while :; do sleep 0.05; done`})
	c.waitFor(t, "ready")
	if n := leases(brokerStatus(t, socket)); n != 1 {
		t.Fatalf("%d leases while the command runs", n)
	}
	if err := c.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	st, stderr := c.wait(t)
	if st.ExitCode() != 7 || !strings.Contains(stderr, "got-term") {
		t.Errorf("exit %d; want 7 from the command's trap; stderr:\n%s", st.ExitCode(), stderr)
	}

	pidFile := filepath.Join(t.TempDir(), "pid")
	c = startChild(t, []string{"lease", "--socket", socket, "--proportion", "0.5", "--", "sh", "-c",
		`echo $$ > ` + pidFile + `; echo ready >&2; exec sleep 60`})
	c.waitFor(t, "ready")
	t.Cleanup(func() {
		if b, err := os.ReadFile(pidFile); err == nil {
			if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	})
	if err := c.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = c.cmd.Wait() // not c.wait: the orphaned sleep holds stderr open
	if !poll(patience(t), func() bool { return leases(brokerStatus(t, socket)) == 0 }) {
		t.Fatal("the lease of a killed vram lease is still there")
	}
}

func TestBrokerStatusText(t *testing.T) {
	socket := startBroker(t, "sim:vram=1GiB;sim:vram=2GiB")
	c, err := broker.Dial(context.Background(), socket)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Acquire(context.Background(), broker.LeaseOptions{Device: 1, Name: "train", Proportion: 0.25}); err != nil {
		t.Fatal(err)
	}
	stdout, stderr, code := cli(t, "", "broker", "status", "--socket", socket)
	if code != exitOK {
		t.Fatalf("exit %d:\n%s", code, stderr)
	}
	for _, want := range []string{"device 0  sim:vram=1GiB", "no leases", "device 1  sim:vram=2GiB", `"train"`, "25%", "512 MiB", strconv.Itoa(os.Getpid())} {
		if !strings.Contains(stdout, want) {
			t.Errorf("status lacks %q:\n%s", want, stdout)
		}
	}
}

func TestLeaseUsageErrors(t *testing.T) {
	socket := startBroker(t, "sim:vram=1GiB")
	for name, tc := range map[string]struct {
		args []string
		want string
	}{
		"neither":      {[]string{"--", "true"}, "give --proportion P or --bytes N"},
		"both":         {[]string{"--proportion", "0.5", "--bytes", "1MiB", "--", "true"}, "give --proportion P or --bytes N"},
		"no command":   {[]string{"--bytes", "100MiB"}, "needs a COMMAND"},
		"too small":    {[]string{"--bytes", "1MiB", "--", "true"}, "no more than the 32 MiB a process's context takes"},
		"too large":    {[]string{"--bytes", "2GiB", "--", "true"}, "more than device 0's 1 GiB"},
		"bad device":   {[]string{"--bytes", "100MiB", "--device", "3", "--", "true"}, `vram: --device: name one of the broker's devices, 0 or sim:vram=1GiB: it has no device "3"`},
		"bad size":     {[]string{"--bytes", "lots", "--", "true"}, `--bytes "lots"`},
		"bad fraction": {[]string{"--proportion", "1.5", "--", "true"}, "--proportion 1.5: want 0 < P ≤ 1"},
		// As a pod's Downward API gives it when the annotation is missing.
		"empty size": {[]string{"--bytes", "", "--", "true"}, "--bytes is empty: want a size such as 8GiB (from Kubernetes: is the pod's vramkit.github.io/gpu-memory annotation set?"},
	} {
		t.Run(name, func(t *testing.T) {
			_, stderr, code := cli(t, "", append([]string{"lease", "--socket", socket}, tc.args...)...)
			if code != exitUsage || !strings.Contains(stderr, tc.want) {
				t.Errorf("exit %d, want %d saying %q:\n%s", code, exitUsage, tc.want, stderr)
			}
		})
	}
	_, stderr, code := cli(t, "", "broker", "--socket-mode", "0666", "--socket", socket+".x")
	if code != exitUsage || !strings.Contains(stderr, "--socket-mode \"0666\"") {
		t.Errorf("broker --socket-mode 0666: exit %d:\n%s", code, stderr)
	}
	_, stderr, code = cli(t, "", "lease", "--socket", socket+".none", "--bytes", "100MiB", "--", "true")
	if code != exitFailure || !strings.Contains(stderr, "start vram broker") || strings.Count(stderr, "broker:") != 1 {
		t.Errorf("lease with no broker: exit %d, want one line saying to start vram broker, broker: once:\n%s", code, stderr)
	}
	_, stderr, code = cli(t, "", "broker", "--socket", socket, "--devices", "sim")
	if code != exitFailure || !strings.Contains(stderr, "a broker already serves") {
		t.Errorf("a second broker on the socket: exit %d:\n%s", code, stderr)
	}
}

func TestAllocConfLimit(t *testing.T) {
	for conf, want := range map[string]string{
		"":                                  "limit:1000",
		"kind:pool":                         "kind:pool,limit:1000",
		"kind:async,limit:8GiB":             "kind:async,limit:1000",
		"limit:500,expandable:true":         "expandable:true,limit:500",
		"LIMIT:2000,release_threshold:1GiB": "release_threshold:1GiB,limit:1000",
	} {
		if got := allocConfLimit(conf, 1000); got != want {
			t.Errorf("allocConfLimit(%q) = %q, want %q", conf, got, want)
		}
	}
}
