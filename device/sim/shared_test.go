//go:build linux

package sim_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/vramkit/vram/device"
	"github.com/vramkit/vram/device/devicetest"
	"github.com/vramkit/vram/device/sim"
)

// sharedCfg is a 1 GiB shared device of name in dir with a 32 MiB
// context and no bytes behind its addresses.
func sharedCfg(dir, name string) sim.Config {
	return sim.Config{TotalBytes: GiB, ContextBytes: 32 * MiB, AddressOnly: true, Shared: name, SharedDir: dir}
}

var sharedSeq atomic.Int64

// TestSharedConformance runs the device suite on shared devices, each
// alone on its ledger: sharing must not change what one Device does.
func TestSharedConformance(t *testing.T) {
	dir := t.TempDir()
	devicetest.Run(t, func(t *testing.T) device.Device {
		name := fmt.Sprintf("conf%d", sharedSeq.Add(1))
		d, err := sim.New(sim.Config{TotalBytes: 256 * MiB, Shared: name, SharedDir: dir})
		check(t, err)
		return d
	})
}

// TestSharedSeesOneMemory: what one Device of a name takes, in any of the
// ways a device holds memory, is missing from the other's free memory,
// to the byte, and comes back when released.
func TestSharedSeesOneMemory(t *testing.T) {
	tests := map[string]struct {
		take func(t *testing.T, d *sim.Device) (release func())
		held uint64 // bytes the device then holds beyond its context
	}{
		"malloc rounds to the granularity": {
			take: func(t *testing.T, d *sim.Device) func() {
				p := get[device.Ptr](t)(d.Malloc(100*MiB + 1))
				return func() { check(t, d.Free(p)) }
			},
			held: 102 * MiB, // 100 MiB + 1 B rounded up to 2 MiB pages
		},
		"async pool reserve": {
			take: func(t *testing.T, d *sim.Device) func() {
				s := d.DefaultStream()
				p := get[device.Ptr](t)(d.MallocAsync(60*MiB, s))
				return func() {
					check(t, d.FreeAsync(p, s))
					check(t, d.Synchronize()) // threshold 0: the segment goes back
				}
			},
			held: 60 * MiB,
		},
		"physical memory": {
			take: func(t *testing.T, d *sim.Device) func() {
				h := get[device.PhysMem](t)(d.CreatePhysical(40 * MiB))
				return func() { check(t, d.ReleasePhysical(h)) }
			},
			held: 40 * MiB,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			a := newSim(t, sharedCfg(dir, "one"))
			b := newSim(t, sharedCfg(dir, "one"))
			start := GiB - 64*MiB // two contexts of 32 MiB
			for _, d := range []*sim.Device{a, b} {
				if got := freeMem(t, d); got != start {
					t.Fatalf("%v: free %d MiB with two contexts, want %d MiB", d, got/MiB, start/MiB)
				}
			}
			release := tc.take(t, a)
			for _, d := range []*sim.Device{a, b} {
				if got := freeMem(t, d); got != start-tc.held {
					t.Errorf("%v: free %d MiB after a took %d MiB, want %d MiB", d, got/MiB, tc.held/MiB, (start-tc.held)/MiB)
				}
				check(t, d.CheckInvariants())
			}
			release()
			if got := freeMem(t, b); got != start {
				t.Errorf("free %d MiB after a released, want %d MiB", got/MiB, start/MiB)
			}
		})
	}
}

// TestSharedOutOfMemory: each way of taking memory fails in the Device
// that asks past the total, naming the other clients, and leaves both as
// they were.
func TestSharedOutOfMemory(t *testing.T) {
	dir := t.TempDir()
	a := newSim(t, sharedCfg(dir, "oom"))
	b := newSim(t, sharedCfg(dir, "oom"))
	p := get[device.Ptr](t)(a.Malloc(600 * MiB)) // 1024 − 64 − 600 = 360 MiB left
	before := freeMem(t, b)
	attempts := map[string]func() error{
		"malloc":       func() error { _, err := b.Malloc(400 * MiB); return err },
		"malloc async": func() error { _, err := b.MallocAsync(400*MiB, b.DefaultStream()); return err },
		"physical":     func() error { _, err := b.CreatePhysical(400 * MiB); return err },
	}
	for name, try := range attempts {
		t.Run(name, func(t *testing.T) {
			err := try()
			wantErr(t, err, device.ErrOutOfMemory)
			if !strings.Contains(err.Error(), `other clients (1) of shared device "oom" hold 632 MiB`) {
				t.Errorf("error does not name the other client's 600 MiB + 32 MiB context: %v", err)
			}
			if got := freeMem(t, b); got != before {
				t.Errorf("free %d MiB after a failed allocation, want %d MiB", got/MiB, before/MiB)
			}
			check(t, b.CheckInvariants())
		})
	}
	check(t, a.Free(p))
	q := get[device.Ptr](t)(b.Malloc(400 * MiB))
	check(t, b.Free(q))
}

// TestSharedPoolGivesBackItsOwn: a pool growth that does not fit gives
// back the pool's own empty segments first, as on a private device, and
// then fits beside the other process's memory.
func TestSharedPoolGivesBackItsOwn(t *testing.T) {
	dir := t.TempDir()
	a := newSim(t, sharedCfg(dir, "pool"))
	b := newSim(t, sharedCfg(dir, "pool"))
	s := b.DefaultStream()
	check(t, b.SetReleaseThreshold(GiB)) // keep empty segments
	p := get[device.Ptr](t)(b.MallocAsync(400*MiB, s))
	check(t, b.FreeAsync(p, s))
	check(t, b.Synchronize())
	q := get[device.Ptr](t)(a.Malloc(300 * MiB)) // 1024 − 64 − 400 − 300 = 260 MiB free
	// 500 MiB needs a new segment: only after b drops its empty 400 MiB one.
	p = get[device.Ptr](t)(b.MallocAsync(500*MiB, s))
	if reserved, _, err := b.PoolUsage(); err != nil || reserved != 500*MiB {
		t.Errorf("pool reserves %d MiB (%v), want 500 MiB (the empty segment given back)", reserved/MiB, err)
	}
	if got := freeMem(t, a); got != 160*MiB {
		t.Errorf("free %d MiB, want 1024 − 64 − 300 − 500 = 160 MiB", got/MiB)
	}
	check(t, b.FreeAsync(p, s))
	check(t, a.Free(q))
	check(t, b.TrimPool(0))
}

// TestSharedContentionInProcess: two Devices of one name in one process,
// each file lock its own, allocate and free 600 MiB of 1 GiB from
// goroutines as fast as they can: never both hold it.
func TestSharedContentionInProcess(t *testing.T) {
	dir := t.TempDir()
	cfg := sharedCfg(dir, "inproc")
	cfg.NoContext = true
	var holders, both, granted atomic.Int64
	done := make(chan error, 2)
	for range 2 {
		d := newSim(t, cfg)
		go func() {
			for range 2000 {
				p, err := d.Malloc(600 * MiB)
				if errors.Is(err, device.ErrOutOfMemory) {
					continue
				}
				if err != nil {
					done <- err
					return
				}
				granted.Add(1)
				if holders.Add(1) != 1 {
					both.Add(1)
				}
				holders.Add(-1)
				if err := d.Free(p); err != nil {
					done <- err
					return
				}
			}
			done <- nil
		}()
	}
	check(t, <-done)
	check(t, <-done)
	if both.Load() != 0 || granted.Load() == 0 {
		t.Errorf("%d of %d grants overlapped another; want none, and some grants", both.Load(), granted.Load())
	}
}

// TestSharedContextCounts: every Device pays its context; one that does
// not fit fails to open with ErrOutOfMemory.
func TestSharedContextCounts(t *testing.T) {
	dir := t.TempDir()
	cfg := sim.Config{TotalBytes: 64 * MiB, ContextBytes: 24 * MiB, AddressOnly: true, Shared: "ctx", SharedDir: dir}
	a := newSim(t, cfg)
	newSim(t, cfg)
	if got := freeMem(t, a); got != 16*MiB {
		t.Errorf("free %d MiB with two 24 MiB contexts of 64 MiB, want 16 MiB", got/MiB)
	}
	d, err := sim.New(cfg)
	if err == nil {
		d.Close()
		t.Fatal("a third 24 MiB context opened on a 64 MiB device with 16 MiB free")
	}
	wantErr(t, err, device.ErrOutOfMemory)
	// context=0 observes without taking anything.
	watcher := cfg
	watcher.NoContext = true
	w := newSim(t, watcher)
	if got := freeMem(t, w); got != 16*MiB {
		t.Errorf("a context-less watcher sees free %d MiB, want 16 MiB", got/MiB)
	}
}

// TestSharedResetAndClose: a Reset gives back everything but the context;
// a Close with memory still allocated reports the leak and gives back
// everything.
func TestSharedResetAndClose(t *testing.T) {
	dir := t.TempDir()
	a, err := sim.New(sharedCfg(dir, "reset"))
	check(t, err)
	b := newSim(t, sharedCfg(dir, "reset"))
	get[device.Ptr](t)(a.Malloc(200 * MiB))
	check(t, a.Reset())
	if got := freeMem(t, b); got != GiB-64*MiB {
		t.Errorf("free %d MiB after a's Reset, want %d MiB", got/MiB, (GiB-64*MiB)/MiB)
	}
	check(t, a.CheckInvariants())
	get[device.Ptr](t)(a.Malloc(100 * MiB))
	var leak *sim.LeakError
	if err := a.Close(); !errors.As(err, &leak) {
		t.Fatalf("Close with 100 MiB allocated: %v, want a *LeakError", err)
	}
	if got := freeMem(t, b); got != GiB-32*MiB {
		t.Errorf("free %d MiB after a's Close, want %d MiB", got/MiB, (GiB-32*MiB)/MiB)
	}
	u := get[sim.SharedUsage](t)(b.SharedUsage())
	if len(u.Clients) != 1 || !u.Clients[0].Self || u.Used != 32*MiB {
		t.Errorf("usage after a's Close: %+v, want b alone holding its 32 MiB context", u)
	}
}

// TestSharedMismatch: a Device that disagrees on the size or granularity
// is refused while the device is in use, naming both figures, and takes
// the ledger over once nobody uses it.
func TestSharedMismatch(t *testing.T) {
	tests := map[string]struct {
		cfg  func(c sim.Config) sim.Config
		want []string
	}{
		"total": {
			cfg:  func(c sim.Config) sim.Config { c.TotalBytes = 2 * GiB; return c },
			want: []string{"1 GiB device", "asks for 2 GiB", "vram=1073741824"},
		},
		"granularity": {
			cfg:  func(c sim.Config) sim.Config { c.Granularity = 64 << 10; return c },
			want: []string{"2 MiB granularity", "at 64 KiB", "granularity=2097152"},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			a, err := sim.New(sharedCfg(dir, "mm"))
			check(t, err)
			other := tc.cfg(sharedCfg(dir, "mm"))
			_, err = sim.New(other)
			wantErr(t, err, sim.ErrSharedMismatch)
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error does not say %q: %v", w, err)
				}
			}
			check(t, a.Close())
			b := newSim(t, other) // nobody uses it now
			if _, total, _ := b.MemInfo(); total != other.TotalBytes {
				t.Errorf("taken over with total %d, want %d", total, other.TotalBytes)
			}
		})
	}
}

// TestSharedSlotsFull: SharedSlotCount Devices fit; the next is refused
// until one closes.
func TestSharedSlotsFull(t *testing.T) {
	dir := t.TempDir()
	cfg := sharedCfg(dir, "full")
	cfg.NoContext = true
	devs := make([]*sim.Device, sim.SharedSlotCount)
	for i := range devs {
		devs[i] = newSim(t, cfg)
	}
	_, err := sim.New(cfg)
	wantErr(t, err, sim.ErrSharedFull)
	if !strings.Contains(err.Error(), "all 256 slots") || !strings.Contains(err.Error(), fmt.Sprint(os.Getpid())) {
		t.Errorf("error does not say how many slots and whose: %v", err)
	}
	check(t, devs[17].Close())
	newSim(t, cfg)
}

// TestSharedSpec: shared= and dir= through device.Open, and the names
// and combinations refused.
func TestSharedSpec(t *testing.T) {
	dir := t.TempDir()
	d, err := device.Open("sim:shared=jobs,dir=" + dir + ",vram=1GiB,backed=false")
	check(t, err)
	if _, err := os.Stat(filepath.Join(dir, "jobs"+sim.LedgerSuffix)); err != nil {
		t.Errorf("no ledger where the spec says: %v", err)
	}
	if s := fmt.Sprint(d); !strings.Contains(s, `shared "jobs"`) {
		t.Errorf("String() = %q, want it to name the shared device", s)
	}
	if id, want := d.Info().ID, "sim:shared=jobs,dir="+dir; id != want {
		t.Errorf("Info().ID = %q, want %q (the name and the directory chosen)", id, want)
	}
	check(t, d.Close())
	if id := newSim(t, sim.Config{}).Info().ID; id != "" {
		t.Errorf("a private device's Info().ID = %q, want \"\" (no other process sees it)", id)
	}

	bad := map[string]string{
		"empty name":     "shared=",
		"path separator": "shared=a/b",
		"parent":         "shared=..",
		"hidden":         "shared=.x",
		"space":          "shared=a b",
		"too long":       "shared=" + strings.Repeat("n", sim.MaxSharedName+1),
		"dir alone":      "dir=" + dir,
	}
	for name, spec := range bad {
		t.Run(name, func(t *testing.T) {
			_, err := sim.ParseSpec(spec)
			wantErr(t, err, device.ErrBadSpec)
		})
	}
	_, err = sim.New(sim.Config{Shared: "../x"})
	wantErr(t, err, device.ErrInvalidValue)
	_, err = sim.New(sim.Config{SharedDir: dir})
	wantErr(t, err, device.ErrInvalidValue)
}

// TestSharedDirs: $VRAM_SIM_DIR moves the ledger; without it the default
// directory is the user's own, 0700, and the file 0600.
func TestSharedDirs(t *testing.T) {
	env := t.TempDir()
	t.Setenv(sim.EnvSharedDir, env)
	d := newSim(t, sim.Config{TotalBytes: GiB, AddressOnly: true, Shared: "env"})
	if _, err := os.Stat(filepath.Join(env, "env"+sim.LedgerSuffix)); err != nil {
		t.Errorf("$%s not followed: %v", sim.EnvSharedDir, err)
	}
	check(t, d.Close())

	t.Setenv(sim.EnvSharedDir, "")
	name := fmt.Sprintf("dirtest-%d", os.Getpid())
	d = newSim(t, sim.Config{TotalBytes: GiB, AddressOnly: true, Shared: name})
	if id := d.Info().ID; id != "sim:shared="+name {
		t.Errorf("Info().ID in the default directory = %q, want sim:shared=%s", id, name)
	}
	path := sim.SharedLedgerPath("", name)
	t.Cleanup(func() { os.Remove(path) })
	if dir := filepath.Dir(path); dir != sim.DefaultSharedDir() {
		t.Errorf("ledger in %s, want the default %s", dir, sim.DefaultSharedDir())
	}
	for p, want := range map[string]os.FileMode{filepath.Dir(path): 0o700, path: 0o600} {
		fi, err := os.Lstat(p)
		check(t, err)
		if fi.Mode().Perm() != want {
			t.Errorf("%s has mode %v, want %v", p, fi.Mode().Perm(), want)
		}
		if uid := fi.Sys().(*syscall.Stat_t).Uid; int(uid) != os.Getuid() {
			t.Errorf("%s belongs to uid %d, not this user's %d", p, uid, os.Getuid())
		}
	}
	check(t, d.Close())
}

// TestSharedRefusesOtherFiles: a file at the ledger's path that is not a
// ledger of this version is refused and left as it was; one never
// finished (all zeros) is made again.
func TestSharedRefusesOtherFiles(t *testing.T) {
	valid := func(t *testing.T) []byte { // a real ledger's bytes
		dir := t.TempDir()
		d, err := sim.New(sharedCfg(dir, "v"))
		check(t, err)
		check(t, d.Close())
		return get[[]byte](t)(os.ReadFile(filepath.Join(dir, "v"+sim.LedgerSuffix)))
	}
	edit := func(at int, b ...byte) func(t *testing.T) []byte {
		return func(t *testing.T) []byte {
			v := valid(t)
			copy(v[at:], b)
			return v
		}
	}
	tests := map[string]struct {
		content func(t *testing.T) []byte
		ok      bool
	}{
		"a user's text":        {content: func(*testing.T) []byte { return []byte("my notes\n") }},
		"another magic":        {content: edit(0, 'X')},
		"another version":      {content: edit(8, 9)},
		"another slot count":   {content: edit(12, 7)},
		"granularity not 2^k":  {content: edit(24, 3)},
		"reserved bytes set":   {content: edit(60, 1)},
		"truncated":            {content: func(t *testing.T) []byte { return valid(t)[:100] }},
		"longer":               {content: func(t *testing.T) []byte { return append(valid(t), 0) }},
		"empty":                {content: func(*testing.T) []byte { return nil }, ok: true},
		"zeros, half made":     {content: func(*testing.T) []byte { return make([]byte, 4096) }, ok: true},
		"zeros, sized":         {content: func(*testing.T) []byte { return make([]byte, sim.LedgerFileSize) }, ok: true},
		"valid, left by a run": {content: valid, ok: true},
		"magic zeroed, a take-over cut short": {content: func(t *testing.T) []byte {
			v := valid(t)
			clear(v[:8])
			v[16] ^= 0xff // a total half written
			v[64] = 1     // a claimed slot left
			return v
		}, ok: true},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "f"+sim.LedgerSuffix)
			content := tc.content(t)
			check(t, os.WriteFile(path, content, 0o600))
			d, err := sim.New(sharedCfg(dir, "f"))
			if tc.ok {
				check(t, err)
				if got := freeMem(t, d); got != GiB-32*MiB {
					t.Errorf("free %d MiB, want %d MiB", got/MiB, (GiB-32*MiB)/MiB)
				}
				check(t, d.Close())
				return
			}
			if err == nil {
				d.Close()
				t.Fatal("opened")
			}
			wantErr(t, err, sim.ErrBadLedger)
			if got := get[[]byte](t)(os.ReadFile(path)); string(got) != string(content) {
				t.Error("the refused file was changed")
			}
		})
	}
	t.Run("not a regular file", func(t *testing.T) {
		dir := t.TempDir()
		check(t, os.Mkdir(filepath.Join(dir, "f"+sim.LedgerSuffix), 0o700))
		_, err := sim.New(sharedCfg(dir, "f"))
		if err == nil {
			t.Fatal("a directory opened as a ledger")
		}
	})
	t.Run("symlink", func(t *testing.T) {
		dir := t.TempDir()
		target := filepath.Join(dir, "target")
		check(t, os.WriteFile(target, []byte("keep"), 0o600))
		check(t, os.Symlink(target, filepath.Join(dir, "f"+sim.LedgerSuffix)))
		if _, err := sim.New(sharedCfg(dir, "f")); !errors.Is(err, syscall.ELOOP) {
			t.Errorf("a symlinked ledger: %v, want ELOOP", err)
		}
		if got := get[[]byte](t)(os.ReadFile(target)); string(got) != "keep" {
			t.Error("the symlink's target was changed")
		}
	})
}

// TestSharedLockBusy: a lock held past lockWait fails an allocation with
// ErrLedgerBusy (nothing taken); MemInfo needs no lock; once the lock is
// free the allocation succeeds.
func TestSharedLockBusy(t *testing.T) {
	dir := t.TempDir()
	d := newSim(t, sharedCfg(dir, "busy"))
	f, err := os.OpenFile(filepath.Join(dir, "busy"+sim.LedgerSuffix), os.O_RDWR, 0)
	check(t, err)
	defer f.Close()
	check(t, syscall.Flock(int(f.Fd()), syscall.LOCK_EX))
	sim.SetLockWait(t, 50*time.Millisecond)
	_, err = d.Malloc(MiB)
	wantErr(t, err, sim.ErrLedgerBusy)
	if got := freeMem(t, d); got != GiB-32*MiB {
		t.Errorf("free %d MiB after a failed Malloc, want %d MiB", got/MiB, (GiB-32*MiB)/MiB)
	}
	check(t, syscall.Flock(int(f.Fd()), syscall.LOCK_UN))
	p := get[device.Ptr](t)(d.Malloc(MiB))
	check(t, d.Free(p))
}

// TestSharedUsagePrivate: SharedUsage of a private device says so.
func TestSharedUsagePrivate(t *testing.T) {
	d := newSim(t, sim.Config{TotalBytes: GiB, AddressOnly: true})
	_, err := d.SharedUsage()
	wantErr(t, err, device.ErrNotSupported)
}

// BenchmarkSharedMallocFree is one Malloc(1 MiB) + Free pair on a private
// device and on shared ones with other clients holding slots (each
// allocation sums every slot under the ledger's file lock).
func BenchmarkSharedMallocFree(b *testing.B) {
	for _, clients := range []int{0, 1, 16, 255} {
		name := fmt.Sprintf("shared/others=%d", clients)
		if clients == 0 {
			name = "private"
		}
		b.Run(name, func(b *testing.B) {
			dir := b.TempDir()
			cfg := sim.Config{TotalBytes: 1 << 40, AddressOnly: true}
			if clients > 0 {
				cfg.Shared, cfg.SharedDir = "bench", dir
				for range clients {
					newSim(b, cfg)
				}
			}
			d := newSim(b, cfg)
			b.ReportAllocs()
			for b.Loop() {
				p, err := d.Malloc(MiB)
				if err != nil {
					b.Fatal(err)
				}
				if err := d.Free(p); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkSharedMemInfo is one MemInfo on a private device and on a
// shared one with 16 other clients (a lock-free sum of the slots; a
// sweep of /proc every sweepEvery).
func BenchmarkSharedMemInfo(b *testing.B) {
	for _, shared := range []bool{false, true} {
		b.Run(map[bool]string{false: "private", true: "shared/others=16"}[shared], func(b *testing.B) {
			cfg := sim.Config{TotalBytes: 1 << 40, AddressOnly: true}
			if shared {
				cfg.Shared, cfg.SharedDir = "bench", b.TempDir()
				for range 16 {
					newSim(b, cfg)
				}
			}
			d := newSim(b, cfg)
			for b.Loop() {
				if _, _, err := d.MemInfo(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
