//go:build linux

package sim_test

// Shared devices across real processes: the test binary runs itself
// again as a helper (TestMain sees helperEnv and runs helperMain), and
// the helpers and the test open one shared device.

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/vramkit/vram/device"
	"github.com/vramkit/vram/device/sim"
)

const (
	helperEnv     = "VRAM_SIM_TEST_HELPER"  // the helper's mode
	helperSpec    = "VRAM_SIM_TEST_SPEC"    // the device it opens
	helperWitness = "VRAM_SIM_TEST_WITNESS" // a file of shared counters (contend, cycle)
	helperArg     = "VRAM_SIM_TEST_ARG"     // a number the mode reads
)

// helperMain is the helper process: it opens the device of helperSpec
// and does what its mode says, reporting on stdout.
func helperMain(mode string) int {
	spec := os.Getenv(helperSpec)
	arg, _ := strconv.Atoi(os.Getenv(helperArg))
	switch mode {
	case "serve":
		return serve(spec)
	case "hammer":
		return hammer(spec)
	case "contend":
		return contend(spec, time.Duration(arg)*time.Millisecond)
	case "cycle":
		return cycle(spec, arg)
	case "lock":
		return holdLock(spec)
	case "open":
		d := openHelper(spec)
		fmt.Println("opened")
		d.Close()
		return 0
	}
	fmt.Println("err unknown mode", mode)
	return 2
}

func openHelper(spec string) *sim.Device {
	d, err := device.Open(spec)
	if err != nil {
		fmt.Println("err", err)
		os.Exit(1)
	}
	return d.(*sim.Device)
}

// serve answers one line per command: "malloc N" (ok, oom or err),
// "free" (frees all), "meminfo" (free N), "exit".
func serve(spec string) int {
	d := openHelper(spec)
	fmt.Println("ready")
	var held []device.Ptr
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		cmd, arg, _ := strings.Cut(in.Text(), " ")
		switch cmd {
		case "malloc":
			n, _ := strconv.ParseUint(arg, 10, 64)
			p, err := d.Malloc(n)
			switch {
			case err == nil:
				held = append(held, p)
				fmt.Println("ok")
			case errors.Is(err, device.ErrOutOfMemory):
				fmt.Println("oom")
			default:
				fmt.Println("err", err)
			}
		case "free":
			for _, p := range held {
				if err := d.Free(p); err != nil {
					fmt.Println("err", err)
				}
			}
			held = held[:0]
			fmt.Println("ok")
		case "meminfo":
			free, _, err := d.MemInfo()
			fmt.Println("free", free, err)
		case "exit":
			d.Close()
			return 0
		}
	}
	d.Close()
	return 0
}

// hammer allocates and frees at random in every way a device holds
// memory, until it is killed.
func hammer(spec string) int {
	d := openHelper(spec)
	s := d.DefaultStream()
	var mallocs, asyncs []device.Ptr
	var phys []device.PhysMem
	for i := 0; ; i++ {
		if i == 100 {
			fmt.Println("ready")
		}
		n := uint64(1+rand.IntN(32)) * sim.DefaultGranularity
		switch rand.IntN(6) {
		case 0:
			if p, err := d.Malloc(n); err == nil {
				mallocs = append(mallocs, p)
			}
		case 1:
			if p, err := d.MallocAsync(n, s); err == nil {
				asyncs = append(asyncs, p)
			}
		case 2:
			if h, err := d.CreatePhysical(n); err == nil {
				phys = append(phys, h)
			}
		case 3:
			if len(mallocs) > 0 {
				d.Free(mallocs[len(mallocs)-1])
				mallocs = mallocs[:len(mallocs)-1]
			}
		case 4:
			if len(asyncs) > 0 {
				d.FreeAsync(asyncs[len(asyncs)-1], s)
				asyncs = asyncs[:len(asyncs)-1]
				d.Synchronize()
			}
		case 5:
			if len(phys) > 0 {
				d.ReleasePhysical(phys[len(phys)-1])
				phys = phys[:len(phys)-1]
			}
		}
	}
}

// witness maps the file of helperWitness: word 0 counts holders of the
// contended allocation, word 1 sums the bytes all helpers hold.
func witness() (holders, held *atomic.Int64) {
	f, err := os.OpenFile(os.Getenv(helperWitness), os.O_RDWR, 0)
	if err != nil {
		fmt.Println("err", err)
		os.Exit(1)
	}
	mem, err := syscall.Mmap(int(f.Fd()), 0, 4096, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
	if err != nil {
		fmt.Println("err", err)
		os.Exit(1)
	}
	return (*atomic.Int64)(unsafe.Pointer(&mem[0])), (*atomic.Int64)(unsafe.Pointer(&mem[8]))
}

// contend waits for "go", then for d asks for 600 MiB again and again,
// holding it a moment when it gets it; the witness counts holders, which
// must never be two. It reports "done ok=N oom=N both=N".
func contend(spec string, d time.Duration) int {
	dev := openHelper(spec)
	defer dev.Close()
	holders, _ := witness()
	fmt.Println("ready")
	in := bufio.NewScanner(os.Stdin)
	in.Scan()
	var ok, oom, both int
	for end := time.Now().Add(d); time.Now().Before(end); {
		p, err := dev.Malloc(600 * MiB)
		if err != nil {
			if !errors.Is(err, device.ErrOutOfMemory) {
				fmt.Println("err", err)
				return 1
			}
			oom++
			continue
		}
		ok++
		if holders.Add(1) != 1 {
			both++
		}
		runtime.Gosched()
		holders.Add(-1)
		if err := dev.Free(p); err != nil {
			fmt.Println("err", err)
			return 1
		}
	}
	fmt.Printf("done ok=%d oom=%d both=%d\n", ok, oom, both)
	return 0
}

// cycle opens the device n times, each time allocating a random size and
// closing; the witness sums the bytes held by all helpers (added once
// taken, subtracted before given back), which must never pass the total.
// It reports "done opens=N over=N".
func cycle(spec string, n int) int {
	_, held := witness()
	fmt.Println("ready")
	opens, over := 0, 0
	for range n {
		d, err := device.Open(spec)
		if err != nil {
			if errors.Is(err, device.ErrOutOfMemory) {
				continue // no room for a context just now
			}
			fmt.Println("err", err)
			return 1
		}
		opens++
		dev := d.(*sim.Device)
		ctx := int64(dev.Info().ContextBytes)
		_, total, _ := dev.MemInfo()
		if held.Add(ctx) > int64(total) {
			over++
		}
		size := uint64(1+rand.IntN(64)) * sim.DefaultGranularity
		if p, err := dev.Malloc(size); err == nil {
			if held.Add(int64(size)) > int64(total) {
				over++
			}
			held.Add(-int64(size))
			dev.Free(p)
		}
		held.Add(-ctx)
		if err := dev.Close(); err != nil {
			fmt.Println("err", err)
			return 1
		}
	}
	fmt.Printf("done opens=%d over=%d\n", opens, over)
	return 0
}

// holdLock takes the lock of the ledger file named by spec and holds it
// until killed, as a process that dies inside an update does.
func holdLock(path string) int {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err == nil {
		err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX)
	}
	if err != nil {
		fmt.Println("err", err)
		return 1
	}
	fmt.Println("ready")
	io.Copy(io.Discard, os.Stdin)
	return 0
}

// child is a helper process.
type child struct {
	t      *testing.T
	cmd    *exec.Cmd
	in     io.WriteCloser
	out    *bufio.Scanner
	waited bool
}

// startChild runs a helper of mode on spec and waits for its "ready".
func startChild(t *testing.T, mode, spec string, env ...string) *child {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), append([]string{helperEnv + "=" + mode, helperSpec + "=" + spec}, env...)...)
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	check(t, err)
	out, err := cmd.StdoutPipe()
	check(t, err)
	check(t, cmd.Start())
	c := &child{t: t, cmd: cmd, in: in, out: bufio.NewScanner(out)}
	t.Cleanup(func() {
		if !c.waited {
			c.cmd.Process.Kill()
			c.wait()
		}
	})
	if got := c.recv(); got != "ready" {
		t.Fatalf("helper %s: %q, want ready", mode, got)
	}
	return c
}

func (c *child) pid() int { return c.cmd.Process.Pid }

func (c *child) send(line string) {
	c.t.Helper()
	if _, err := io.WriteString(c.in, line+"\n"); err != nil {
		c.t.Fatalf("helper %d: %v", c.pid(), err)
	}
}

func (c *child) recv() string {
	c.t.Helper()
	if !c.out.Scan() {
		c.t.Fatalf("helper %d ended: %v", c.pid(), c.out.Err())
	}
	return c.out.Text()
}

func (c *child) ask(line string) string {
	c.t.Helper()
	c.send(line)
	return c.recv()
}

// wait closes the helper's stdin and reaps it.
func (c *child) wait() error {
	c.waited = true
	c.in.Close()
	return c.cmd.Wait()
}

// witnessFile makes a file of zeroed shared counters for the helpers.
func witnessFile(t *testing.T) string {
	path := filepath.Join(t.TempDir(), "witness")
	check(t, os.WriteFile(path, make([]byte, 4096), 0o600))
	return path
}

func procSpec(dir, name string) string {
	return "sim:shared=" + name + ",dir=" + dir + ",vram=1GiB,context=0,backed=false"
}

// TestSharedAcrossProcesses: allocations in one process show in the
// other's MemInfo, both ways, and a process past the total fails.
func TestSharedAcrossProcesses(t *testing.T) {
	dir := t.TempDir()
	spec := procSpec(dir, "cross")
	c := startChild(t, "serve", spec)
	d := get[device.Device](t)(device.Open(spec))
	defer d.Close()
	if got := c.ask("malloc " + fmt.Sprint(300*MiB)); got != "ok" {
		t.Fatalf("helper's malloc: %s", got)
	}
	if got := freeMem(t, d.(*sim.Device)); got != GiB-300*MiB {
		t.Errorf("free %d MiB here after the helper took 300 MiB, want 724 MiB", got/MiB)
	}
	_, err := d.Malloc(800 * MiB)
	wantErr(t, err, device.ErrOutOfMemory)
	p := get[device.Ptr](t)(d.Malloc(500 * MiB))
	if got, want := c.ask("meminfo"), fmt.Sprintf("free %d <nil>", GiB-800*MiB); got != want {
		t.Errorf("helper's meminfo: %q, want %q", got, want)
	}
	if got := c.ask("malloc " + fmt.Sprint(300*MiB)); got != "oom" {
		t.Errorf("helper's malloc past the total: %s, want oom", got)
	}
	c.send("exit")
	check(t, c.wait())
	if got := freeMem(t, d.(*sim.Device)); got != GiB-500*MiB {
		t.Errorf("free %d MiB after the helper closed, want 524 MiB", got/MiB)
	}
	check(t, d.Free(p))
}

// TestSharedRace: two processes ask for 600 MiB of a 1 GiB device at
// once, round after round: exactly one gets it each round.
func TestSharedRace(t *testing.T) {
	dir := t.TempDir()
	spec := procSpec(dir, "race")
	a, b := startChild(t, "serve", spec), startChild(t, "serve", spec)
	wins := map[*child]int{}
	const rounds = 40
	ask := "malloc " + fmt.Sprint(600*MiB)
	for r := range rounds {
		a.send(ask)
		b.send(ask)
		ra, rb := a.recv(), b.recv()
		switch {
		case ra == "ok" && rb == "oom":
			wins[a]++
		case ra == "oom" && rb == "ok":
			wins[b]++
		default:
			t.Fatalf("round %d: %q and %q, want one ok and one oom", r, ra, rb)
		}
		for _, c := range []*child{a, b} {
			if got := c.ask("free"); got != "ok" {
				t.Fatalf("round %d: free: %s", r, got)
			}
		}
	}
	t.Logf("wins: %d and %d of %d rounds", wins[a], wins[b], rounds)
}

// TestSharedContention: two processes allocate and free 600 MiB of a
// 1 GiB device as fast as they can at the same time; a counter in shared
// memory that each raises while it holds the memory never reaches two.
func TestSharedContention(t *testing.T) {
	sim.RetryTimed(t, func() string {
		dir := t.TempDir()
		spec := procSpec(dir, "contend")
		w := witnessFile(t)
		env := []string{helperWitness + "=" + w, helperArg + "=300"}
		cs := []*child{startChild(t, "contend", spec, env...), startChild(t, "contend", spec, env...)}
		for _, c := range cs {
			c.send("go")
		}
		var ok, oom int
		for _, c := range cs {
			line := c.recv()
			var o, m, both int
			if _, err := fmt.Sscanf(line, "done ok=%d oom=%d both=%d", &o, &m, &both); err != nil {
				t.Fatalf("helper %d: %q", c.pid(), line)
			}
			if both != 0 {
				t.Errorf("helper %d held 600 MiB while the other did, %d times", c.pid(), both)
			}
			check(t, c.wait())
			ok, oom = ok+o, oom+m
		}
		t.Logf("%d allocations granted, %d refused", ok, oom)
		if ok == 0 || oom == 0 {
			return fmt.Sprintf("the helpers did not contend (%d granted, %d refused)", ok, oom)
		}
		return ""
	})
}

// TestSharedKilledProcess: a process killed with SIGKILL while it holds
// memory loses its slot to the next reader within a second (MemInfo
// sweeps every sweepEvery), zombie or reaped.
func TestSharedKilledProcess(t *testing.T) {
	dir := t.TempDir()
	spec := procSpec(dir, "kill")
	d := get[device.Device](t)(device.Open(spec)).(*sim.Device)
	defer d.Close()
	sim.RetryTimed(t, func() string {
		c := startChild(t, "serve", spec)
		if got := c.ask("malloc " + fmt.Sprint(300*MiB)); got != "ok" {
			t.Fatalf("helper's malloc: %s", got)
		}
		if got := freeMem(t, d); got != GiB-300*MiB {
			t.Fatalf("free %d MiB while the helper holds 300 MiB, want 724 MiB", got/MiB)
		}
		check(t, c.cmd.Process.Signal(syscall.SIGKILL))
		waitDead(t, c.pid()) // a zombie now: not reaped
		dead := time.Now()
		for freeMem(t, d) != GiB {
			if time.Since(dead) > time.Second {
				c.wait()
				return fmt.Sprintf("the killed helper's 300 MiB still counted %v after it died", time.Since(dead))
			}
			time.Sleep(5 * time.Millisecond)
		}
		t.Logf("slot dropped %v after the helper died (a zombie)", time.Since(dead))
		c.wait()
		u := get[sim.SharedUsage](t)(d.SharedUsage())
		if len(u.Clients) != 1 || !u.Clients[0].Self {
			t.Errorf("clients after the kill: %+v, want this process alone", u.Clients)
		}
		return ""
	})
}

// TestSharedAllocationSweeps: an allocation that does not fit beside a
// dead process's memory looks for the dead first, and fits.
func TestSharedAllocationSweeps(t *testing.T) {
	dir := t.TempDir()
	spec := procSpec(dir, "allocsweep")
	d := get[device.Device](t)(device.Open(spec)).(*sim.Device)
	defer d.Close()
	c := startChild(t, "serve", spec)
	if got := c.ask("malloc " + fmt.Sprint(600*MiB)); got != "ok" {
		t.Fatalf("helper's malloc: %s", got)
	}
	_, err := d.Malloc(600 * MiB)
	wantErr(t, err, device.ErrOutOfMemory)
	check(t, c.cmd.Process.Signal(syscall.SIGKILL))
	waitDead(t, c.pid())
	p := get[device.Ptr](t)(d.Malloc(600 * MiB)) // no MemInfo between
	check(t, d.Free(p))
	c.wait()
}

// waitDead waits until process pid has exited (a zombie or gone).
func waitDead(t *testing.T, pid int) {
	t.Helper()
	for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(time.Millisecond) {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			return
		}
		if i := strings.LastIndexByte(string(b), ')'); i >= 0 && strings.HasPrefix(string(b[i+1:]), " Z") {
			return
		}
	}
	t.Fatalf("process %d did not die", pid)
}

// TestSharedKilledMidUpdate: processes killed at random moments while
// they allocate and free in every way leave a ledger that holds nothing
// of theirs and a lock nobody holds: the whole device can be had again.
func TestSharedKilledMidUpdate(t *testing.T) {
	dir := t.TempDir()
	spec := procSpec(dir, "midkill")
	var cs []*child
	for range 6 {
		cs = append(cs, startChild(t, "hammer", spec))
	}
	for _, c := range cs {
		time.Sleep(time.Duration(rand.IntN(20)) * time.Millisecond)
		check(t, c.cmd.Process.Signal(syscall.SIGKILL))
	}
	for _, c := range cs {
		c.wait()
	}
	d := get[device.Device](t)(device.Open(spec)).(*sim.Device)
	defer d.Close()
	u := get[sim.SharedUsage](t)(d.SharedUsage())
	if len(u.Clients) != 1 || u.Used != 0 {
		t.Errorf("after the kills: %d clients holding %d bytes, want this one holding nothing: %+v", len(u.Clients), u.Used, u.Clients)
	}
	p := get[device.Ptr](t)(d.Malloc(GiB))
	check(t, d.Free(p))
}

// TestSharedManyProcesses: processes open, allocate and close, more
// opens in all than there are slots; the bytes they hold together never
// pass the total, and at the end no slot is left.
func TestSharedManyProcesses(t *testing.T) {
	dir := t.TempDir()
	spec := "sim:shared=many,dir=" + dir + ",vram=256MiB,context=8MiB,backed=false"
	w := witnessFile(t)
	const procs, each = 12, 25 // 300 opens > 256 slots
	var cs []*child
	for range procs {
		cs = append(cs, startChild(t, "cycle", spec, helperWitness+"="+w, helperArg+"="+fmt.Sprint(each)))
	}
	opens := 0
	for _, c := range cs {
		line := c.recv()
		var n, over int
		if _, err := fmt.Sscanf(line, "done opens=%d over=%d", &n, &over); err != nil {
			t.Fatalf("helper %d: %q", c.pid(), line)
		}
		if over != 0 {
			t.Errorf("helper %d saw the bytes held pass the total %d times", c.pid(), over)
		}
		opens += n
		check(t, c.wait())
	}
	if opens <= sim.SharedSlotCount {
		t.Errorf("%d opens succeeded, want more than the %d slots (slots are reused)", opens, sim.SharedSlotCount)
	}
	d := get[device.Device](t)(device.Open(spec)).(*sim.Device)
	defer d.Close()
	u := get[sim.SharedUsage](t)(d.SharedUsage())
	if len(u.Clients) != 1 || u.Used != 8*MiB {
		t.Errorf("at the end: %+v, want this process alone with its 8 MiB context", u)
	}
}

// TestSharedLockHolderKilled: a process killed while it holds the
// ledger's lock does not keep it: while it lives an allocation waits and
// fails with ErrLedgerBusy; once it is dead the next one succeeds.
func TestSharedLockHolderKilled(t *testing.T) {
	dir := t.TempDir()
	d := get[device.Device](t)(device.Open(procSpec(dir, "locked"))).(*sim.Device)
	defer d.Close()
	c := startChild(t, "lock", sim.SharedLedgerPath(dir, "locked"))
	sim.SetLockWait(t, 100*time.Millisecond)
	_, err := d.Malloc(MiB)
	wantErr(t, err, sim.ErrLedgerBusy)
	check(t, c.cmd.Process.Signal(syscall.SIGKILL))
	waitDead(t, c.pid())
	sim.SetLockWait(t, 10*time.Second)
	p := get[device.Ptr](t)(d.Malloc(MiB))
	check(t, d.Free(p))
	c.wait()
}
