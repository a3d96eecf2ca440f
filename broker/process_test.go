package broker

import (
	"os"
	"os/exec"
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
// start the child as nobody.
func TestOtherUIDIsRefused(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root, to run a child process as another uid")
	}
	s, path := startServer(t, oneDevice(8*GiB))
	c := dial(t, path)
	l := acquire(t, c, LeaseOptions{Name: "mine", Proportion: 0.5})
	// nobody must reach the socket and run the test binary.
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "vbuid")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	bin := dir + "/broker.test"
	data, err := os.ReadFile(exe)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, data, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{dir, strings.TrimSuffix(path, "/b.sock")} {
		if err := os.Chmod(p, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(path, 0o666); err != nil { // for the test only: Listen refuses such a mode
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"=release", "VRAM_BROKER_TEST_SOCKET="+path, "VRAM_BROKER_TEST_LEASE="+l.ID())
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
	for _, want := range []string{"release: release \"mine\"", "true\nchange:", "true\nstatus: <nil>", "uid 65534", "may not"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("the child's output lacks %q:\n%s", want, out)
		}
	}
	if _, ok := leaseOf(s.Status(), l.ID()); !ok || l.Budget().Share != 0.5 {
		t.Errorf("another uid's release or change took effect: %+v", l.Budget())
	}
}
