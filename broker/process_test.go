package broker

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// A leaseholder killed with SIGKILL loses its lease: the kernel closes
// its socket, and the broker's connection ends with it. How soon is a
// figure (under a second; BENCHMARKS.md), logged here; the test waits up
// to ten seconds, a bound against a hang, not a judgement of speed.
func TestKill9ReleasesTheLease(t *testing.T) {
	s, path := startServer(t, oneDevice(8*GiB))
	cmd, line := child(t, "hold", []string{"VRAM_BROKER_TEST_SOCKET=" + path}, nil)
	id, ok := strings.CutPrefix(line, "lease ")
	if !ok {
		t.Fatalf("the child said %q", line)
	}
	l, found := leaseOf(s.Status(), id)
	if !found || l.PID != uint32(cmd.Process.Pid) {
		t.Fatalf("the child's lease %+v (found %v), want pid %d", l, found, cmd.Process.Pid)
	}
	start := time.Now()
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if !waitFor(10*time.Second, func() bool { _, ok := leaseOf(s.Status(), id); return !ok }) {
		t.Fatalf("the lease of a killed process is still there after %v", time.Since(start))
	}
	t.Logf("lease gone %v after the kill", time.Since(start))
}

// A broker killed with SIGKILL and started again is rejoined by its
// clients: the new table has the same leases, what they hold and their
// limits, each once.
func TestBrokerRestartIsRejoined(t *testing.T) {
	path := socketPath(t)
	env := []string{"VRAM_BROKER_TEST_SOCKET=" + path}
	b1, line := child(t, "broker", env, nil)
	if line != "serving" {
		t.Fatalf("the broker said %q", line)
	}
	c1, c2 := dial(t, path), dial(t, path)
	c := acquire(t, c2, LeaseOptions{Name: "c", Proportion: 0.5})
	a := acquire(t, c1, LeaseOptions{Name: "a", Proportion: 0.25})
	b := acquire(t, c1, LeaseOptions{Name: "b"})
	for l, held := range map[*Lease]uint64{a: GiB, b: 512 * MiB, c: 3 * GiB} {
		if err := l.Report(ctxT(t), held); err != nil {
			t.Fatal(err)
		}
	}
	before, err := c1.Status(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := b1.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = b1.Wait()
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("a killed broker leaves its socket behind: %v", err)
	}
	_, line = child(t, "broker", env, nil) // removes the stale socket
	if line != "serving" {
		t.Fatalf("the second broker said %q", line)
	}
	if !waitFor(20*time.Second, func() bool { return c1.Rejoins() == 1 && c2.Rejoins() == 1 }) {
		t.Fatalf("rejoins: %d, %d", c1.Rejoins(), c2.Rejoins())
	}
	after, err := c2.Status(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	if after.Broker == before.Broker {
		t.Fatal("the status comes from the same broker instance")
	}
	if len(after.Devices[0].Leases) != 3 {
		t.Fatalf("leases after the restart: %+v", after.Devices[0].Leases)
	}
	for _, l := range before.Devices[0].Leases {
		n, ok := leaseOf(after, l.ID)
		if !ok || n.Held != l.Held || n.Limit != l.Limit || n.Guaranteed != l.Guaranteed || n.PID != l.PID {
			t.Errorf("lease %s after the restart %+v, before %+v", l.ID, n, l)
		}
	}
	// The leases work on the new broker.
	if err := a.Report(ctxT(t), 2*GiB); err != nil {
		t.Fatal(err)
	}
	if err := c.Release(ctxT(t)); err != nil {
		t.Fatal(err)
	}
}

// A process of another uid may not change or release someone's lease,
// but may read the status; the broker keeps serving. It needs root, to
// start the child as a second user.
func TestOtherUIDIsRefused(t *testing.T) {
	uid, gid := otherUser(t)
	s, path := startSharedServer(t, oneDevice(8*GiB), gid)
	c := dial(t, path)
	l := acquire(t, c, LeaseOptions{Name: "mine", Proportion: 0.5})
	_, out := asUser(t, publicExe(t), uid, gid, "release", []string{"VRAM_BROKER_TEST_SOCKET=" + path, "VRAM_BROKER_TEST_LEASE=" + l.ID()}, true)
	for _, want := range []string{"release: release \"mine\"", "true\nchange:", "true\nstatus: <nil>", "another connection's", "only the connection that acquired a lease may release it"} {
		if !strings.Contains(out, want) {
			t.Errorf("the child's output lacks %q:\n%s", want, out)
		}
	}
	if _, ok := leaseOf(s.Status(), l.ID()); !ok || l.Budget().Share != 0.5 {
		t.Errorf("another uid's release or change took effect: %+v", l.Budget())
	}
}

// A broker that stops answering (SIGSTOP) fails a client's calls with
// ErrUnavailable once the broker's deadline and the call timeout pass,
// rather than hang them; the client carries on when the broker does.
// The context given to Dial bounds Dial alone: cancelled at once, it
// leaves the client's stream be. (A vram run once sat in set-up for a
// minute, its Watch stream torn down with Dial's context and its claim
// without a deadline.)
func TestStoppedBrokerFailsCalls(t *testing.T) {
	path := socketPath(t)
	b, line := child(t, "broker", []string{"VRAM_BROKER_TEST_SOCKET=" + path, "VRAM_BROKER_TEST_RECLAIM=200ms"}, nil)
	if line != "serving" {
		t.Fatalf("the broker said %q", line)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	c, err := Dial(ctx, path, WithLogger(quiet), WithCallTimeout(500*time.Millisecond))
	cancel() // bounds Dial alone
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	l := acquire(t, c, LeaseOptions{Name: "stopped", Proportion: 0.5})
	if err := b.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	defer b.Process.Signal(syscall.SIGCONT)
	waitStopped(t, b.Process.Pid)
	for name, call := range map[string]func() error{
		"claim":  func() error { _, err := l.Claim(context.Background(), 6*GiB); return err },
		"report": func() error { return l.Report(context.Background(), GiB) },
		"status": func() error { _, err := c.Status(context.Background()); return err },
	} {
		done := make(chan error, 1)
		go func() { done <- call() }()
		select {
		case err := <-done:
			if !is(err, ErrUnavailable) || !strings.Contains(err.Error(), "no answer from the broker on "+path) {
				t.Errorf("%s with the broker stopped: %v, want ErrUnavailable", name, err)
			}
		case <-time.After(2 * time.Minute):
			t.Fatalf("%s with the broker stopped hangs", name)
		}
	}
	if err := b.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	if err := l.Report(ctxT(t), GiB); err != nil {
		t.Errorf("a report once the broker goes on: %v", err)
	}
	if n := c.Rejoins(); n != 0 {
		t.Errorf("the client rejoined %d times: its connection was lost", n)
	}
}

// A lease released while the broker is gone is released (the broker
// ended it with the connection) and is not taken back by a broker that
// comes later; the client closes without an error. (A vram run whose
// broker died before it ended once exited 1.)
func TestReleaseAfterTheBrokerDied(t *testing.T) {
	path := socketPath(t)
	env := []string{"VRAM_BROKER_TEST_SOCKET=" + path}
	b, _ := child(t, "broker", env, nil)
	c := dial(t, path)
	l := acquire(t, c, LeaseOptions{Name: "orphan", Proportion: 0.5})
	keep := acquire(t, c, LeaseOptions{Name: "kept", Proportion: 0.25})
	if err := b.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = b.Wait()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := l.Release(ctx); err != nil {
		t.Errorf("release with the broker gone: %v", err)
	}
	if ctx.Err() != nil {
		t.Error("the release waited for its context to end")
	}
	if !is(l.Err(), ErrReleased) {
		t.Errorf("the released lease's Err: %v", l.Err())
	}
	_, line := child(t, "broker", env, nil)
	if line != "serving" {
		t.Fatalf("the second broker said %q", line)
	}
	if !waitFor(30*time.Second, func() bool { return c.Rejoins() == 1 }) {
		t.Fatal("the client did not rejoin the new broker")
	}
	st, err := c.Status(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := leaseOf(st, l.ID()); ok {
		t.Error("the released lease was taken back")
	}
	if _, ok := leaseOf(st, keep.ID()); !ok {
		t.Error("the kept lease was not taken back")
	}
	if err := c.Close(); err != nil {
		t.Errorf("close: %v", err)
	}
}

// waitStopped returns once every thread of process pid is stopped (state
// T in /proc): a SIGSTOP is delivered to each thread as it next enters
// the kernel, and on a busy machine a thread may still answer a call
// after kill returns.
func waitStopped(t *testing.T, pid int) {
	t.Helper()
	dir := fmt.Sprintf("/proc/%d/task", pid)
	for start := time.Now(); ; time.Sleep(time.Millisecond) {
		tasks, err := os.ReadDir(dir)
		if err != nil {
			t.Fatalf("the broker's threads: %v", err)
		}
		stopped := len(tasks) > 0
		for _, task := range tasks {
			stat, err := os.ReadFile(filepath.Join(dir, task.Name(), "stat"))
			// The state follows the command's closing parenthesis.
			if i := bytes.LastIndexByte(stat, ')'); err != nil || i < 0 || i+2 >= len(stat) || stat[i+2] != 'T' {
				stopped = false
				break
			}
		}
		if stopped {
			return
		}
		if time.Since(start) > 2*time.Minute {
			t.Fatalf("the broker (pid %d) did not stop within 2 minutes of SIGSTOP", pid)
		}
	}
}
