//go:build linux

package main

// Leases of the node broker between real processes on one shared
// simulated device (sim:shared): the race of two processes for more than
// half of it, a leaseholder and a broker killed with SIGKILL, and a batch
// shrunk by another's claim. Each child is this test binary, as vram or
// as a leaseholder (leaseholder_test.go).

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/vramkit/vram/broker"
	"github.com/vramkit/vram/device"
)

var sharedSeq atomic.Int64

// sharedSpec is the spec of a new shared simulated device of size (and
// opts), its ledger in a directory removed when the test ends.
func sharedSpec(t *testing.T, size, opts string) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "vsh")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	spec := fmt.Sprintf("sim:shared=t%d-%d,vram=%s,dir=%s", os.Getpid(), sharedSeq.Add(1), size, dir)
	if opts != "" {
		spec += "," + opts
	}
	return spec
}

// holder is a leaseholder process.
type holder struct {
	cmd   *exec.Cmd
	in    io.WriteCloser
	lines chan string
}

// startHolder starts a leaseholder of spec under the broker on socket,
// killed when the test ends, and waits for it to be ready.
func startHolder(t *testing.T, spec, socket, name string) *holder {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), leaseHolderEnv+"="+spec+"\n"+socket+"\n"+name)
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	h := &holder{cmd: cmd, in: in, lines: make(chan string, 16)}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	go func() {
		defer close(h.lines)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			h.lines <- sc.Text()
		}
	}()
	if got := h.read(t); got != "ready" {
		t.Fatalf("leaseholder %s said %q", name, got)
	}
	return h
}

// send writes a command without waiting for its answer.
func (h *holder) send(t *testing.T, cmd string) {
	t.Helper()
	if _, err := fmt.Fprintln(h.in, cmd); err != nil {
		t.Fatal(err)
	}
}

// read is the holder's next line.
func (h *holder) read(t *testing.T) string {
	t.Helper()
	select {
	case l, ok := <-h.lines:
		if !ok {
			t.Fatal("the leaseholder ended")
		}
		return l
	case <-time.After(patience(t)):
		t.Fatalf("the leaseholder said nothing for %v", patience(t))
	}
	return ""
}

// do sends a command and returns its answer.
func (h *holder) do(t *testing.T, cmd string) string {
	t.Helper()
	h.send(t, cmd)
	return h.read(t)
}

// brokerClient dials the broker on socket for status, closed when the
// test ends.
func brokerClient(t *testing.T, socket string) *broker.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), patience(t))
	defer cancel()
	c, err := broker.Dial(ctx, socket)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func statusOf(t *testing.T, c *broker.Client) broker.Status {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), patience(t))
	defer cancel()
	st, err := c.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// leaseOfPID is the lease of pid in st.
func leaseOfPID(st broker.Status, pid int) (broker.LeaseStatus, bool) {
	for _, d := range st.Devices {
		for _, l := range d.Leases {
			if int(l.PID) == pid {
				return l, true
			}
		}
	}
	return broker.LeaseStatus{}, false
}

// poll waits up to limit (the test's patience: poll judges no time) for
// cond.
func poll(limit time.Duration, cond func() bool) bool {
	for deadline := time.Now().Add(limit); !cond(); time.Sleep(2 * time.Millisecond) {
		if time.Now().After(deadline) {
			return false
		}
	}
	return true
}

// The race: two processes on a shared 1 GiB device ask for 600 MiB each
// at the same moment, 30 rounds. Never do both get it, and no allocator
// ever meets the device's out of memory: every refusal is the broker's,
// before the device is asked.
func TestLeaseRaceBetweenProcesses(t *testing.T) {
	spec := sharedSpec(t, "1GiB", "backed=false")
	socket := startBroker(t, spec)
	a, b := startHolder(t, spec, socket, "a"), startHolder(t, spec, socket, "b")
	c := brokerClient(t, socket)
	givenBack := func() bool {
		for _, l := range statusOf(t, c).Devices[0].Leases {
			if l.Limit > l.Context || l.Held != 0 { // a limit counts the context
				return false
			}
		}
		return true
	}
	const ask = "alloc 629145600 500ms" // 600 MiB; the loser waits half a second for the winner to shrink
	winners := 0
	for round := range 30 {
		a.send(t, ask)
		b.send(t, ask)
		ra, rb := a.read(t), b.read(t)
		for _, r := range []string{ra, rb} {
			if strings.HasPrefix(r, "oom") {
				t.Errorf("round %d: the device ran out of memory inside a lease: %s", round, r)
			}
		}
		switch {
		case ra == "ok" && rb == "ok":
			t.Errorf("round %d: both processes hold 600 MiB of a 1 GiB device", round)
		case ra == "ok" || rb == "ok":
			winners++
		default:
			t.Logf("round %d: neither: %s; %s", round, ra, rb)
		}
		for _, h := range []*holder{a, b} {
			if got := h.do(t, "free"); got != "freed" {
				t.Fatalf("round %d: free: %q", round, got)
			}
		}
		// Each round starts with both leases given back, nothing held.
		if !poll(patience(t), givenBack) {
			t.Fatalf("round %d: the leases are not given back: %+v", round, statusOf(t, c))
		}
	}
	if winners == 0 {
		t.Error("no round had a winner: the race never ran")
	}
	t.Logf("%d of 30 rounds had one winner", winners)
}

// A leaseholder killed with SIGKILL has its lease and its slot of the
// shared device's ledger reclaimed: the broker's table loses it and the
// ledger's free memory is what it was before the holder came.
func TestKilledLeaseholderIsReclaimed(t *testing.T) {
	spec := sharedSpec(t, "1GiB", "backed=false")
	socket := startBroker(t, spec)
	c := brokerClient(t, socket)
	probe, err := device.Open(spec) // this process's view of the shared memory
	if err != nil {
		t.Fatal(err)
	}
	defer probe.Close()
	free := func() uint64 { f, _, err := probe.MemInfo(); must(t, err); return f }
	base := free()
	h := startHolder(t, spec, socket, "victim")
	if got := h.do(t, "alloc 419430400 10s"); got != "ok" {
		t.Fatalf("400 MiB: %s", got)
	}
	pid := h.cmd.Process.Pid
	if !poll(patience(t), func() bool { l, ok := leaseOfPID(statusOf(t, c), pid); return ok && l.Held >= 400<<20 }) {
		t.Fatalf("the broker never saw the holder's 400 MiB: %+v", statusOf(t, c))
	}
	if f := free(); f > base-400<<20 {
		t.Fatalf("the ledger shows %d B free with 400 MiB held, %d B before", f, base)
	}
	start := time.Now()
	must(t, h.cmd.Process.Signal(syscall.SIGKILL))
	if !poll(patience(t), func() bool { _, ok := leaseOfPID(statusOf(t, c), pid); return !ok && free() == base }) {
		t.Fatalf("lease still there or the ledger's %d B free, not %d", free(), base)
	}
	t.Logf("lease and ledger slot reclaimed %v after the kill", time.Since(start))
}

// startBrokerProcess runs `vram broker` of spec on socket in a child
// process and waits for it to serve.
func startBrokerProcess(t *testing.T, spec, socket string) *child {
	t.Helper()
	b := startChild(t, []string{"broker", "--devices", spec, "--socket", socket, "--reclaim-timeout", "2s"})
	t.Cleanup(func() { // ended and waited for, so that no goroutine of exec outlives the test
		_ = b.cmd.Process.Kill()
		for range b.lines {
		}
		_ = b.cmd.Wait()
	})
	b.waitFor(t, "serving")
	return b
}

// A broker killed with SIGKILL and started again is rejoined by the
// managers leasing from it: the new table has each process once, holding
// what its allocator holds.
func TestRestartedBrokerIsRejoinedByProcesses(t *testing.T) {
	spec := sharedSpec(t, "1GiB", "backed=false")
	socket := filepath.Join(t.TempDir(), "b.sock")
	b1 := startBrokerProcess(t, spec, socket)
	hs := []*holder{startHolder(t, spec, socket, "a"), startHolder(t, spec, socket, "b")}
	for i, h := range hs {
		if got := h.do(t, fmt.Sprintf("alloc %d 10s", (i+1)*200<<20)); got != "ok" {
			t.Fatalf("holder %d: %s", i, got)
		}
	}
	c := brokerClient(t, socket)
	matches := func(st broker.Status) bool {
		if len(st.Devices[0].Leases) != len(hs) {
			return false
		}
		for _, h := range hs {
			held, _ := strconv.ParseUint(h.do(t, "held"), 10, 64)
			if l, ok := leaseOfPID(st, h.cmd.Process.Pid); !ok || l.Held != held {
				return false
			}
		}
		return true
	}
	if !poll(patience(t), func() bool { return matches(statusOf(t, c)) }) {
		t.Fatalf("the first broker's table does not match its clients: %+v", statusOf(t, c))
	}
	before := statusOf(t, c).Broker
	must(t, b1.cmd.Process.Signal(syscall.SIGKILL))
	_, _ = b1.wait(t)
	startBrokerProcess(t, spec, socket)
	var st broker.Status
	if !poll(patience(t), func() bool { st = statusOf(t, c); return st.Broker != before && matches(st) }) {
		t.Fatalf("the restarted broker's table does not match its clients: %+v", st)
	}
	// The leases work on the new broker: a free is given back to it.
	if got := hs[1].do(t, "free"); got != "freed" {
		t.Fatal(got)
	}
	if !poll(patience(t), func() bool { st = statusOf(t, c); return matches(st) }) {
		t.Errorf("after a free the new broker's table does not match: %+v", st)
	}
}

// shrinkRun is what the reclaim test reads of a vram run's report.
type shrinkRun struct {
	Runs     int         `json:"runs"`
	Batch    float64     `json:"batch_seconds"`
	Verified bool        `json:"verified"`
	Chunks   int         `json:"chunks_run"`
	Recuts   []recutJSON `json:"recuts"`
	Lease    *leaseJSON  `json:"lease"`
	Stats    statsJSON   `json:"allocator_stats"`
}

// Cooperative reclaim: a batch borrowing most of a shared device is
// running when a second job claims its guaranteed half. The first shrinks
// its chunks at a chunk boundary, both finish, and both results are
// byte-identical to the same runs made alone on a private device. Copies
// are emulated at 80 MB/s, so that a chunk takes most of a second.
//
// Nothing is judged by time: the first job is stopped (SIGSTOP) as it
// begins its batch, the second started, and the first resumed only once
// the broker shows the second's claim waiting for its memory; the
// broker's reclaim deadline is past any run's time, so that the claim can
// only be granted by the first job shrinking.
func TestBatchShrinksForAClaim(t *testing.T) {
	const opts = "granularity=64KiB,bandwidth=80MB"
	spec := sharedSpec(t, "64MiB", opts)
	socket := startBrokerReclaim(t, spec, "1h")
	dir := t.TempDir()
	batchA := []string{"--runs", "200000", "--steps", "100", "--samples", "101"}
	batchB := []string{"--runs", "30000", "--steps", "100", "--samples", "101"}
	alone := func(name string, args []string) []byte {
		out := filepath.Join(dir, name+"-alone.npy")
		_, stderr, code := cli(t, "", append([]string{"run", "--device", "sim:vram=64MiB," + opts, "--out", out}, args...)...)
		if code != exitOK {
			t.Fatalf("%s alone: exit %d:\n%s", name, code, stderr)
		}
		data, err := os.ReadFile(out)
		must(t, err)
		return data
	}
	wantA, wantB := alone("a", batchA), alone("b", batchB)
	run := func(name string, args []string) *child {
		return startChild(t, append([]string{"--json", "run", "--device", spec, "--socket", socket,
			"--out", filepath.Join(dir, name+".npy")}, args...))
	}
	a := run("a", batchA)
	a.waitFor(t, "run the batch") // a begins its chunks, on most of the device
	must(t, a.cmd.Process.Signal(syscall.SIGSTOP))
	b := run("b", batchB)
	c := brokerClient(t, socket)
	if !poll(patience(t), func() bool { return len(statusOf(t, c).Devices[0].Claims) > 0 }) {
		t.Fatalf("b's claim never waited for a's memory: %+v", statusOf(t, c))
	}
	must(t, a.cmd.Process.Signal(syscall.SIGCONT))
	ra, rb := finishedRun(t, "a", a), finishedRun(t, "b", b)
	for name, want := range map[string][]byte{"a": wantA, "b": wantB} {
		got, err := os.ReadFile(filepath.Join(dir, name+".npy"))
		must(t, err)
		if !bytes.Equal(got, want) {
			t.Errorf("%s's result under the broker differs from its run alone", name)
		}
	}
	shrink, ok := shrinkRecut(ra)
	if !ok || ra.Lease.Shrinks == 0 {
		t.Fatalf("a did not shrink for b's claim: recuts %+v, lease %+v; b's lease %+v", ra.Recuts, ra.Lease, rb.Lease)
	}
	if shrink.ArraysTo >= shrink.ArraysFrom {
		t.Errorf("a's arrays after the shrink: %d runs, before %d", shrink.ArraysTo, shrink.ArraysFrom)
	}
	t.Logf("a shrank at chunk %d (%d → %d runs), %.3f s after the request (it was stopped for part of it); b waited %.3f s",
		shrink.Chunk, shrink.ArraysFrom, shrink.ArraysTo, ra.Lease.ShrinkAckSeconds, rb.Lease.ClaimWaitSeconds)
}

// finishedRun waits for a vram run and reads its report: verified, no
// allocator out of memory, with a lease.
func finishedRun(t *testing.T, name string, c *child) shrinkRun {
	t.Helper()
	st, stderr := c.wait(t)
	if st.ExitCode() != exitOK {
		t.Fatalf("%s: exit %d:\n%s", name, st.ExitCode(), stderr)
	}
	var r shrinkRun
	if err := json.Unmarshal(c.stdout.Bytes(), &r); err != nil {
		t.Fatalf("%s's report: %v:\n%s", name, err, c.stdout.String())
	}
	if !r.Verified || r.Lease == nil || r.Stats.OOMs != 0 {
		t.Fatalf("%s: verified %v, lease %+v, %d out of memory", name, r.Verified, r.Lease, r.Stats.OOMs)
	}
	return r
}

// shrinkRecut is the re-plan that answered the broker's request to
// shrink, if the run made one.
func shrinkRecut(r shrinkRun) (recutJSON, bool) {
	for _, rc := range r.Recuts {
		if strings.Contains(rc.Why, "shrink") {
			return rc, true
		}
	}
	return recutJSON{}, false
}

// TestDevicesUnderTheBroker: `vram run --devices --socket` gives each
// device's manager its own lease of that device from the broker, and
// the report (text and --json) has each device's lease.
func TestDevicesUnderTheBroker(t *testing.T) {
	a, b := sharedSpec(t, "256MiB", ""), sharedSpec(t, "256MiB", "")
	devices := a + ";" + b
	socket := startBroker(t, devices)
	args := []string{"run", "--socket", socket, "--devices", devices, "--runs", "50000", "--steps", "50", "--samples", "51"}
	stdout, stderr, code := cli(t, "", args...)
	if code != exitOK {
		t.Fatalf("exit %d:\n%s", code, stderr)
	}
	for i := range 2 {
		if want := fmt.Sprintf("lease %-3d    lease ", i); !strings.Contains(stdout, want) {
			t.Errorf("the report lacks device %d's lease (%q):\n%s", i, want, stdout)
		}
	}
	stdout, stderr, code = cli(t, "", append([]string{"--json"}, args...)...)
	if code != exitOK {
		t.Fatalf("--json: exit %d:\n%s", code, stderr)
	}
	var r struct {
		Devices []struct {
			Lease *leaseJSON `json:"lease"`
		} `json:"devices"`
	}
	if err := json.Unmarshal([]byte(stdout), &r); err != nil {
		t.Fatalf("--json: %v:\n%s", err, stdout)
	}
	if len(r.Devices) != 2 {
		t.Fatalf("--json: %d devices, want 2", len(r.Devices))
	}
	for i, d := range r.Devices {
		if d.Lease == nil || d.Lease.Bytes == 0 || d.Lease.Claims == 0 || !strings.Contains(d.Lease.ID, fmt.Sprintf("broker device %d", i)) {
			t.Errorf("device %d's lease %+v: want one of broker device %d that claimed memory", i, d.Lease, i)
		}
	}
}
