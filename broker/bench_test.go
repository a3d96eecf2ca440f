package broker

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// reportQuantiles reports the median and 99th percentile of ds in µs.
func reportQuantiles(b *testing.B, prefix string, ds []time.Duration) {
	if len(ds) == 0 {
		return
	}
	slices.Sort(ds)
	q := func(p float64) float64 { return float64(ds[int(p*float64(len(ds)-1))].Nanoseconds()) / 1e3 }
	b.ReportMetric(q(0.5), prefix+"µs-median")
	b.ReportMetric(q(0.99), prefix+"µs-p99")
}

// BenchmarkAcquireRelease: one lease acquired and released over the
// socket, each a round trip of the client library to the broker.
func BenchmarkAcquireRelease(b *testing.B) {
	_, path := startServer(b, oneDevice(80*GiB))
	c := dial(b, path)
	ctx := context.Background()
	ds := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for range b.N {
		start := time.Now()
		l, err := c.Acquire(ctx, LeaseOptions{Name: "bench", Proportion: 0.5})
		if err != nil {
			b.Fatal(err)
		}
		if err := l.Release(ctx); err != nil {
			b.Fatal(err)
		}
		ds = append(ds, time.Since(start))
	}
	b.StopTimer()
	reportQuantiles(b, "", ds)
}

// BenchmarkClaimToAck: a borrower holds 7 of 8 GiB; the other lease
// claims its guaranteed 4 GiB. Measured: from the claim's call to the
// borrower's acknowledgement returning (ack), and to the claim returning
// granted (claim). The borrower acknowledges as soon as it is told, as a
// batch between chunks would: the figures are the broker's part, to which
// a batch adds at most one chunk's time.
func BenchmarkClaimToAck(b *testing.B) {
	_, path := startServer(b, oneDevice(8*GiB))
	cb, cc := dial(b, path), dial(b, path)
	ctx := context.Background()
	borrower := acquire(b, cb, LeaseOptions{Name: "borrower", Proportion: 0.5})
	claimant := acquire(b, cc, LeaseOptions{Name: "claimant", Proportion: 0.5})
	acked := make(chan time.Time, 1)
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		for {
			changed := borrower.Changed()
			if sh := borrower.Budget().Shrink; sh != nil {
				if err := borrower.Report(ctx, sh.Bytes); err == nil {
					acked <- time.Now()
				}
			}
			select {
			case <-changed:
			case <-stop:
				return
			}
		}
	}()
	var toAck, toGrant []time.Duration
	b.ResetTimer()
	for range b.N {
		b.StopTimer()
		if _, err := claimant.Claim(ctx, 0); err != nil {
			b.Fatal(err)
		}
		if _, err := borrower.Claim(ctx, 7*GiB); err != nil {
			b.Fatal(err)
		}
		if err := borrower.Report(ctx, 7*GiB); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		start := time.Now()
		if got, err := claimant.Claim(ctx, 4*GiB); err != nil || got.Limit != 4*GiB {
			b.Fatalf("claim: %+v, %v", got, err)
		}
		toGrant = append(toGrant, time.Since(start))
		toAck = append(toAck, (<-acked).Sub(start))
	}
	b.StopTimer()
	reportQuantiles(b, "ack-", toAck)
	reportQuantiles(b, "claim-", toGrant)
}

// procStats are what the kernel counts of a process: its CPU time (user
// and system, /proc/PID/stat, at the clock tick: 10 ms at USER_HZ 100),
// its system calls that read and write (/proc/PID/io: syscr, syscw; a
// futex or an epoll_wait is neither) and its threads' context switches
// (/proc/PID/task/*/status: a thread that slept and was woken, or was
// preempted).
type procStats struct {
	cpu                     time.Duration
	reads, writes, switches uint64
}

func readProcStats(b *testing.B, pid int) procStats {
	b.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		b.Skipf("no /proc: %v", err)
	}
	// The fields after the command's closing parenthesis: utime and stime
	// are the 12th and 13th (fields 14 and 15 of the whole line).
	f := strings.Fields(string(data[bytes.LastIndexByte(data, ')')+2:]))
	ut, _ := strconv.ParseUint(f[11], 10, 64)
	st, _ := strconv.ParseUint(f[12], 10, 64)
	ps := procStats{cpu: time.Duration(ut+st) * 10 * time.Millisecond}
	io, err := os.ReadFile(fmt.Sprintf("/proc/%d/io", pid))
	if err != nil {
		b.Skipf("no /proc/PID/io: %v", err)
	}
	ps.reads, ps.writes = procField(io, "syscr:"), procField(io, "syscw:")
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/status", pid))
	for _, t := range tasks {
		if data, err := os.ReadFile(t); err == nil {
			ps.switches += procField(data, "voluntary_ctxt_switches:") + procField(data, "nonvoluntary_ctxt_switches:")
		}
	}
	return ps
}

// procField is the number after name in a /proc file of "name value"
// lines, or 0.
func procField(data []byte, name string) uint64 {
	for line := range strings.Lines(string(data)) {
		if v, ok := strings.CutPrefix(line, name); ok {
			n, _ := strconv.ParseUint(strings.TrimSpace(v), 10, 64)
			return n
		}
	}
	return 0
}

// report reports what the process did from s0 to s, per op of n, its
// metrics' names prefixed with who.
func (s procStats) report(b *testing.B, who string, s0 procStats, n int) {
	per := func(v uint64) float64 { return float64(v) / float64(n) }
	b.ReportMetric(float64((s.cpu-s0.cpu).Microseconds())/float64(n), who+"-cpu-µs/op")
	b.ReportMetric(per(s.reads-s0.reads), who+"-reads/op")
	b.ReportMetric(per(s.writes-s0.writes), who+"-writes/op")
	b.ReportMetric(per(s.switches-s0.switches), who+"-switches/op")
}

// brokerChild is a broker served by a child process (the test binary).
type brokerChild struct {
	cmd *exec.Cmd
	out *bufio.Reader
}

// childBroker serves a broker in a child process (the test binary) on a
// new socket, until the benchmark ends.
func childBroker(b *testing.B) (*brokerChild, string) {
	b.Helper()
	path := socketPath(b)
	exe, err := os.Executable()
	if err != nil {
		b.Fatal(err)
	}
	cmd := exec.Command(exe, "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"=broker", "VRAM_BROKER_TEST_SOCKET="+path)
	out, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	bc := &brokerChild{cmd: cmd, out: bufio.NewReader(out)}
	if line, err := bc.out.ReadString('\n'); err != nil || line != "serving\n" {
		b.Fatalf("the broker said %q, %v", line, err)
	}
	return bc, path
}

// mallocs is how many heap allocations the broker has made
// (runtime.MemStats.Mallocs): it answers a SIGUSR1 with the figure.
func (bc *brokerChild) mallocs(b *testing.B) uint64 {
	b.Helper()
	if err := bc.cmd.Process.Signal(syscall.SIGUSR1); err != nil {
		b.Fatal(err)
	}
	line, err := bc.out.ReadString('\n')
	n, perr := strconv.ParseUint(strings.TrimPrefix(strings.TrimSpace(line), "mallocs "), 10, 64)
	if err != nil || perr != nil {
		b.Fatalf("the broker said %q, %v", line, err)
	}
	return n
}

// BenchmarkBrokerCPU: what a lease acquired and released by one client
// costs the broker, a process of its own: its CPU time, system calls,
// context switches and heap allocations per pair; and the client's (this
// process's) CPU, system calls and context switches. B/op and allocs/op
// are the client's.
func BenchmarkBrokerCPU(b *testing.B) {
	bc, path := childBroker(b)
	c := dial(b, path)
	ctx := context.Background()
	pair := func() {
		l, err := c.Acquire(ctx, LeaseOptions{Name: "bench", Proportion: 0.5})
		if err != nil {
			b.Fatal(err)
		}
		if err := l.Release(ctx); err != nil {
			b.Fatal(err)
		}
	}
	for range 200 {
		pair() // warm
	}
	broker, self := bc.cmd.Process.Pid, os.Getpid()
	m0 := bc.mallocs(b)
	b0, c0 := readProcStats(b, broker), readProcStats(b, self)
	b.ResetTimer()
	for range b.N {
		pair()
	}
	b.StopTimer()
	bs, cs := readProcStats(b, broker), readProcStats(b, self)
	m := bc.mallocs(b) - m0
	bs.report(b, "broker", b0, b.N)
	cs.report(b, "client", c0, b.N)
	b.ReportMetric(float64(m)/float64(b.N), "broker-allocs/op")
}

// BenchmarkConcurrentProcesses: 64 client processes (the test binary)
// acquire and release leases of a broker in a process of its own at
// once, each pair timed; the median and 99th percentile of all, the
// broker's CPU per pair and its share of the run's two cores. In
// "start-up" the processes start and dial while others run their pairs,
// as jobs do; in "dialed" every process has started and dialed before
// any pair (what is left is the pairs' own contention).
func BenchmarkConcurrentProcesses(b *testing.B) {
	for _, barrier := range []bool{false, true} {
		b.Run(map[bool]string{false: "start-up", true: "dialed"}[barrier], func(b *testing.B) {
			bc, path := childBroker(b)
			var all []time.Duration
			var wall, cpu time.Duration
			for range b.N {
				ds, w, c := runPairProcesses(b, bc, path, 64, barrier)
				all, wall, cpu = append(all, ds...), wall+w, cpu+c
			}
			reportQuantiles(b, "pair-", all)
			b.ReportMetric(float64(cpu.Microseconds())/float64(len(all)), "broker-cpu-µs/pair")
			b.ReportMetric(100*float64(cpu)/float64(2*wall), "broker-%-of-2-cores")
		})
	}
}

// runPairProcesses runs procs pairsClient processes of the broker bc
// serves on path and returns every pair's time, and the wall time and the
// broker's CPU time from the first pair that may start to the last
// process's end. With barrier, pairs start once every process has dialed
// (its dial is not counted).
func runPairProcesses(b *testing.B, bc *brokerChild, path string, procs int, barrier bool) (pairs []time.Duration, wall, cpu time.Duration) {
	exe, err := os.Executable()
	if err != nil {
		b.Fatal(err)
	}
	cmds, outs, gates := make([]*exec.Cmd, procs), make([]*bufio.Reader, procs), make([]io.WriteCloser, procs)
	start, b0 := time.Now(), readProcStats(b, bc.cmd.Process.Pid)
	for i := range procs {
		cmd := exec.Command(exe, "-test.run=^$")
		cmd.Env = append(os.Environ(), helperEnv+"=pairs", "VRAM_BROKER_TEST_SOCKET="+path, fmt.Sprintf("VRAM_BROKER_TEST_BARRIER=%t", barrier))
		cmd.Stderr = os.Stderr
		out, err1 := cmd.StdoutPipe()
		gate, err2 := cmd.StdinPipe()
		if err := cmp.Or(err1, err2, cmd.Start()); err != nil {
			b.Fatal(err)
		}
		cmds[i], outs[i], gates[i] = cmd, bufio.NewReader(out), gate
	}
	if barrier {
		for i, out := range outs {
			if line, err := out.ReadString('\n'); line != "ready\n" {
				b.Fatalf("process %d said %q, %v", i, line, err)
			}
		}
		start, b0 = time.Now(), readProcStats(b, bc.cmd.Process.Pid)
	}
	for _, g := range gates {
		_ = g.Close() // go
	}
	for i, cmd := range cmds {
		text, err := io.ReadAll(outs[i])
		if err := cmp.Or(err, cmd.Wait()); err != nil {
			b.Fatalf("process %d: %v: %s", i, err, text)
		}
		for _, f := range strings.Fields(string(text)) {
			ns, err := strconv.ParseInt(f, 10, 64)
			if err != nil {
				b.Fatalf("process %d said %q", i, text)
			}
			pairs = append(pairs, time.Duration(ns))
		}
	}
	return pairs, time.Since(start), readProcStats(b, bc.cmd.Process.Pid).cpu - b0.cpu
}

// pairsClient is BenchmarkConcurrentProcesses' process: it dials, then
// acquires and releases pairs leases, printing each pair's time in ns;
// with a barrier, it says it is ready once dialed and waits for its
// standard input to end before the first pair.
func pairsClient(socket string, pairs int) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := Dial(ctx, socket, WithLogger(quiet))
	if err != nil {
		return err
	}
	defer c.Close()
	if os.Getenv("VRAM_BROKER_TEST_BARRIER") == "true" {
		fmt.Println("ready")
		_, _ = io.Copy(io.Discard, os.Stdin) // until the benchmark says go
	}
	for range pairs {
		start := time.Now()
		l, err := c.Acquire(ctx, LeaseOptions{Name: "pair", Proportion: 0.01})
		if err != nil {
			return err
		}
		if err := l.Release(ctx); err != nil {
			return err
		}
		fmt.Println(time.Since(start).Nanoseconds())
	}
	return nil
}
