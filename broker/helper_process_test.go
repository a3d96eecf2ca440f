package broker

// The test binary doubles as a leaseholder or a broker in a child
// process, for the tests that kill one (kill -9) or need another uid.

import (
	"bufio"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

const helperEnv = "VRAM_BROKER_TEST_HELPER"

// helperMain runs the child's part when the environment asks for it, and
// reports whether it did.
func helperMain() bool {
	mode := os.Getenv(helperEnv)
	if mode == "" {
		return false
	}
	socket := os.Getenv("VRAM_BROKER_TEST_SOCKET")
	ctx := context.Background()
	fail := func(err error) { fmt.Println("error:", err); os.Exit(1) }
	switch mode {
	case "hold": // acquire a lease, say its id, wait to be killed
		c, err := Dial(ctx, socket, WithLogger(quiet))
		if err != nil {
			fail(err)
		}
		l, err := c.Acquire(ctx, LeaseOptions{Name: "child", Proportion: 0.5})
		if err != nil {
			fail(err)
		}
		fmt.Println("lease", l.ID())
		select {}
	case "release": // try to release someone else's lease
		c, err := Dial(ctx, socket, WithLogger(quiet))
		if err != nil {
			fail(err)
		}
		id, _ := strconv.ParseUint(os.Getenv("VRAM_BROKER_TEST_LEASE"), 16, 64)
		other := &Lease{c: c, id: id, changed: make(chan struct{})}
		err = other.Release(ctx)
		fmt.Println("release:", err, is(err, ErrPermission))
		err = other.Change(ctx, 0.1, 0)
		fmt.Println("change:", err, is(err, ErrPermission))
		_, err = c.Status(ctx)
		fmt.Println("status:", err)
		_ = c.Close()
	case "dial": // dial, say how it went, and hang up
		ctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		c, err := Dial(ctx, socket, WithLogger(quiet))
		if err != nil {
			fail(err)
		}
		fmt.Println("dialed")
		_ = c.Close()
	case "broker": // serve a broker until killed; its key survives a restart
		cfg := oneDevice(8 * GiB)
		cfg.Logger, cfg.KeyFile = quiet, DefaultKeyFile(socket)
		if d, err := time.ParseDuration(os.Getenv("VRAM_BROKER_TEST_RECLAIM")); err == nil {
			cfg.ReclaimTimeout = d
		}
		s, err := NewServer(cfg)
		if err != nil {
			fail(err)
		}
		ln, err := Listen(socket, 0o600, -1)
		if err != nil {
			fail(err)
		}
		fmt.Println("serving")
		go answerMallocs()
		_ = s.Serve(ln)
	case "chaos": // TestChaosTwoUsers' client
		seed, _ := strconv.ParseUint(os.Getenv("VRAM_BROKER_TEST_SEED"), 10, 64)
		if err := chaosClient(socket, os.Getenv("VRAM_BROKER_TEST_MARK"), rand.New(rand.NewPCG(seed, 34)), 120); err != nil {
			fail(err)
		}
		fmt.Println("done")
	case "pairs": // BenchmarkConcurrentProcesses' client
		pairs, err := strconv.Atoi(os.Getenv("VRAM_BROKER_TEST_PAIRS"))
		if err != nil {
			pairs = 50
		}
		if err := pairsClient(socket, pairs); err != nil {
			fail(err)
		}
	case "random": // TestRandomProcesses' client: random requests, then exit
		seed, _ := strconv.ParseUint(os.Getenv("VRAM_BROKER_TEST_SEED"), 10, 64)
		if err := randomClient(socket, rand.New(rand.NewPCG(seed, 7)), 40); err != nil {
			fail(err)
		}
		fmt.Println("done")
	default:
		fail(fmt.Errorf("unknown helper mode %q", mode))
	}
	return true
}

// answerMallocs prints the process's heap allocations so far
// ("mallocs N") at each SIGUSR1, for the benchmarks.
func answerMallocs() {
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGUSR1)
	for range sig {
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		fmt.Println("mallocs", ms.Mallocs)
	}
}

// child starts the test binary in helper mode and returns it with its
// first line of output.
func child(t *testing.T, mode string, env []string, setup func(*exec.Cmd)) (*exec.Cmd, string) {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, "-test.run=^$")
	cmd.Env = append(append(os.Environ(), helperEnv+"="+mode), env...)
	cmd.Stderr = os.Stderr
	if setup != nil {
		setup(cmd)
	}
	return cmd, firstLine(t, cmd, mode)
}

// firstLine starts cmd, the test binary in helper mode, stops it when the
// test ends, and returns its first line of output (the "release" helper's
// whole output, once it has ended).
func firstLine(t *testing.T, cmd *exec.Cmd, mode string) string {
	t.Helper()
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	lines := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		var all []string
		for sc.Scan() {
			all = append(all, sc.Text())
			if mode != "release" {
				lines <- sc.Text()
				for sc.Scan() {
				}
				return
			}
		}
		lines <- strings.Join(all, "\n")
	}()
	select {
	case line := <-lines:
		return line
	case <-time.After(60 * time.Second):
		t.Fatalf("helper %s (%s) said nothing in 60s", mode, cmd.Path)
	}
	return ""
}
