package vram

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vramkit/vram/internal/meminfo"
	"github.com/vramkit/vram/internal/units"
)

// newHostManager is a manager on a simulator with host options o and the
// RAM available reported as avail, logging at debug level to log (if not
// nil).
func newHostManager(t *testing.T, o HostOptions, avail uint64, log ...*logBuf) *Manager {
	t.Helper()
	if o.SpillDir == "" {
		o.SpillDir = t.TempDir()
	}
	opts := []Option{WithHostOptions(o)}
	if len(log) > 0 {
		opts = append(opts, WithLogger(slog.New(slog.NewTextHandler(log[0], &slog.HandlerOptions{Level: slog.LevelDebug}))))
	}
	m, err := New(newSim(t, 64*units.MiB), opts...)
	if err != nil {
		t.Fatal(err)
	}
	m.host.avail = func() (uint64, bool) { return avail + meminfo.RAM()/16, true }
	t.Cleanup(func() { m.Close() })
	return m
}

// TestHostLadderRungs makes one array per case with the limits set low
// and checks the rung, the reason, the counts while it lives and that
// freeing it takes exactly its bytes off again (and removes its file).
func TestHostLadderRungs(t *testing.T) {
	const mib = units.MiB
	tests := map[string]struct {
		o      HostOptions
		avail  uint64
		bytes  uint64
		force  HostRung
		want   HostRung
		reason string
	}{
		"under the pinned limit":     {HostOptions{PinnedLimit: mib}, 1 << 40, mib / 2, RungAuto, RungPinned, "of the pinned limit"},
		"over the pinned limit":      {HostOptions{PinnedLimit: mib, Limit: 8 * mib}, 1 << 40, 2 * mib, RungAuto, RungPageable, "over the pinned limit"},
		"over the host limit":        {HostOptions{PinnedLimit: mib, Limit: 8 * mib}, 1 << 40, 9 * mib, RungAuto, RungFile, "of the host limit 8 MiB in use"},
		"over the RAM available":     {HostOptions{PinnedLimit: mib}, 3 * mib, 4 * mib, RungAuto, RungFile, "RAM headroom 3 MiB"},
		"pinned over its limit":      {HostOptions{PinnedLimit: mib}, 3 * mib, 2 * mib, RungAuto, RungPageable, "over the pinned limit"},
		"forced pinned, over limits": {HostOptions{PinnedLimit: mib, Limit: mib}, 1 << 40, 2 * mib, RungPinned, RungPinned, "forced"},
		"forced file, small":         {HostOptions{}, 1 << 40, 4096, RungFile, RungFile, "forced"},
		"forced pageable":            {HostOptions{}, 1 << 40, 4096, RungPageable, RungPageable, "forced"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			log := &logBuf{}
			m := newHostManager(t, tc.o, tc.avail, log)
			h, err := m.Host().Alloc([]int{int(tc.bytes / 8)}, Float64, HostArrayOptions{Rung: tc.force})
			if err != nil {
				t.Fatal(err)
			}
			p := h.Placement()
			if p.Rung != tc.want || p.Forced != (tc.force != RungAuto) || !strings.Contains(p.Reason, tc.reason) {
				t.Fatalf("placement %+v: want rung %v saying %q", p, tc.want, tc.reason)
			}
			if l := log.String(); !strings.Contains(l, "level=DEBUG msg=\"vram: host array placed\"") ||
				!strings.Contains(l, "rung="+tc.want.String()) || !strings.Contains(l, tc.reason) {
				t.Errorf("debug log %q: want the placement with its rung %v and reason", l, tc.want)
			}
			got := m.Host().Stats()
			counts := map[HostRung]uint64{RungPinned: got.Pinned, RungPageable: got.Pageable, RungFile: got.File}
			if counts[tc.want] != tc.bytes || got.Pinned+got.Pageable+got.File != tc.bytes {
				t.Errorf("stats %+v: want %d bytes on the %v rung only", got, tc.bytes, tc.want)
			}
			v := h.Float64s()
			v[0], v[len(v)-1] = 1, 2
			if err := h.Free(); err != nil {
				t.Fatal(err)
			}
			if s := m.Host().Stats(); s.Pinned+s.Mapped+s.Pageable+s.File != 0 {
				t.Errorf("after Free: %+v, want nothing held", s)
			}
			if p.Rung == RungFile {
				if _, err := os.Stat(p.Path); !errors.Is(err, os.ErrNotExist) {
					t.Errorf("file %s after Free: %v, want it removed", p.Path, err)
				}
			}
		})
	}
}

// TestHostFileRung writes a file-backed array, reads it back through a
// second mapping and with numpy (when there is one), and checks the file
// goes with the array unless kept, and comes back on reopening if kept.
func TestHostFileRung(t *testing.T) {
	for _, keep := range []bool{false, true} {
		t.Run(fmt.Sprintf("keep %v", keep), func(t *testing.T) {
			dir := t.TempDir()
			t.Setenv(SpillDirEnv, dir) // the option is empty: the variable says where
			m, err := New(newSim(t, 64*units.MiB), WithHostOptions(HostOptions{Limit: 4096}))
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			h, err := m.Host().Alloc([]int{3, 1000}, Int32, HostArrayOptions{Keep: keep, Name: "traj"})
			if err != nil {
				t.Fatal(err)
			}
			p := h.Placement()
			if p.Rung != RungFile || filepath.Dir(p.Path) != dir || !strings.HasPrefix(filepath.Base(p.Path), "traj-") || h.Memory() != Pageable {
				t.Fatalf("placement %+v, memory %v: want a file in %s, pageable to the device", p, h.Memory(), dir)
			}
			for i, v := range h.Int32s() {
				h.Int32s()[i] = int32(i) * 3
				_ = v
			}
			again, err := m.Host().Open(p.Path, false)
			if err != nil {
				t.Fatal(err)
			}
			if s := again.Shape(); again.DType() != Int32 || len(s) != 2 || s[0] != 3 || s[1] != 1000 || again.Int32s()[2999] != 2999*3 {
				t.Fatalf("reopened: %v, last %d", again, again.Int32s()[2999])
			}
			must(t, again.Free())
			if _, err := os.Stat(p.Path); err != nil {
				t.Fatalf("freeing a reopened array removed its file: %v", err)
			}
			numpyCheck(t, p.Path, "a.shape == (3, 1000) and a.dtype == np.int32 and int(a[2, 999]) == 8997")
			must(t, h.Free())
			_, err = os.Stat(p.Path)
			if keep != (err == nil) {
				t.Fatalf("after Free, keep %v: stat %v", keep, err)
			}
			if !keep {
				return
			}
			back, err := m.Host().Open(p.Path, true)
			if err != nil {
				t.Fatal(err)
			}
			defer back.Free()
			if back.Int32s()[1234] != 1234*3 || back.Placement().Path != p.Path {
				t.Errorf("kept file reopened: element 1234 = %d, placement %+v", back.Int32s()[1234], back.Placement())
			}
		})
	}
}

// numpyCheck has numpy load path (plainly and memory-mapped) and assert
// cond about it (a); it skips, saying why, where there is no numpy.
func numpyCheck(t *testing.T, path, cond string) {
	t.Helper()
	py := ""
	for _, p := range []string{"/usr/bin/python3", "python3"} {
		if exec.Command(p, "-c", "import numpy").Run() == nil {
			py = p
			break
		}
	}
	if py == "" {
		t.Log("numpy check skipped: no python3 with numpy (apt-get install -y python3-numpy)")
		return
	}
	script := fmt.Sprintf("import sys, numpy as np\nfor mode in (None, 'r'):\n    a = np.load(sys.argv[1], mmap_mode=mode)\n    assert %s, (a.shape, a.dtype)\n", cond)
	if out, err := exec.Command(py, "-c", script, path).CombinedOutput(); err != nil {
		t.Fatalf("numpy on %s: %v\n%s", path, err, out)
	}
}

// TestStagingPool checks reuse, growth within the limits, the blocking
// acquire (woken by a release, stopped by its context) and the refusal
// of what can never fit.
func TestStagingPool(t *testing.T) {
	const mib = units.MiB
	const limit = 2*mib + mib/2
	m := newHostManager(t, HostOptions{PinnedLimit: 8 * mib, Limit: limit}, 1<<40)
	p := m.Host().Staging()
	ctx := context.Background()
	if r := p.Room(); r != limit {
		t.Fatalf("an empty pool's Room() = %s, want the host limit %s", units.Format(r), units.Format(limit))
	}
	a, err := p.Acquire(ctx, mib)
	must(t, err)
	b, err := p.Acquire(ctx, mib)
	must(t, err)
	if r := p.Room(); r != limit-2*mib {
		t.Fatalf("Room() with 2 MiB in use = %s, want %s", units.Format(r), units.Format(limit-2*mib))
	}
	if !a.Pinned() || len(a.Bytes()) != int(mib) {
		t.Fatalf("buffer of %d bytes, pinned %v", len(a.Bytes()), a.Pinned())
	}
	if c, err := p.TryAcquire(2 * mib); c != nil || err != nil {
		t.Fatalf("TryAcquire past the host limit: %v, %v; want nothing", c, err)
	}
	short, cancel := context.WithTimeout(ctx, 30*time.Millisecond)
	defer cancel()
	if _, err := p.Acquire(short, 2*mib); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a full pool's Acquire with a deadline: %v, want DeadlineExceeded", err)
	}
	var wg sync.WaitGroup
	var got *StagingBuffer
	wg.Add(1)
	go func() {
		defer wg.Done()
		got, err = p.Acquire(ctx, mib)
	}()
	for p.Stats().Waits < 2 { // the second Acquire waits (a fixed sleep once judged that, and a loaded machine missed it)
		runtime.Gosched()
	}
	a.Release()
	wg.Wait()
	must(t, err)
	if st := p.Stats(); st.Grows != 2 || st.Reuses != 1 || st.Buffers != 2 || st.Bytes != 2*mib || st.Waits < 2 {
		t.Errorf("stats %+v: want 2 grown, 1 reused, 2 held (2 MiB), at least 2 waits", st)
	}
	got.Release()
	b.Release()
	if r := p.Room(); r != limit {
		t.Errorf("Room() with every buffer idle = %s, want %s (idle buffers give way)", units.Format(r), units.Format(limit))
	}
	// 4 MiB never fits a 2.5 MiB limit: refused at once, nothing in use.
	if _, err := p.AcquireSet(ctx, []uint64{2 * mib, 2 * mib}); !errors.Is(err, ErrOutOfMemory) {
		t.Fatalf("AcquireSet of 4 MiB under a 2.5 MiB limit: %v, want ErrOutOfMemory", err)
	}
	// A set that fits once an idle buffer gives way.
	set, err := p.AcquireSet(ctx, []uint64{mib, mib + mib/2})
	must(t, err)
	for _, s := range set {
		s.Release()
	}
	if st := p.Stats(); st.Bytes != limit || st.Trims != 1 {
		t.Errorf("stats %+v: want 2.5 MiB held after trimming one idle buffer", st)
	}
	must(t, p.Trim())
	if s := m.Host().Stats(); s.Staging != 0 {
		t.Errorf("after Trim: %+v", s)
	}
}

// TestHostLadderPinnedCache checks that a freed pinned array, cached by
// the pinned pool for the next one, counts against the limits and gives
// way when a new array needs its room.
func TestHostLadderPinnedCache(t *testing.T) {
	const mib = units.MiB
	m := newHostManager(t, HostOptions{PinnedLimit: mib}, 1<<40)
	a, err := m.Host().Alloc([]int{int(mib / 2)}, Uint8, HostArrayOptions{})
	must(t, err)
	must(t, a.Free())
	if s := m.Host().Stats(); s.Pinned != 0 || s.PinnedCached < mib/2 || s.RAM() != s.PinnedCached {
		t.Fatalf("after freeing a pinned array: %+v, want it cached and counted in RAM", s)
	}
	b, err := m.Host().Alloc([]int{int(mib * 3 / 4)}, Uint8, HostArrayOptions{})
	must(t, err)
	defer b.Free()
	if s := m.Host().Stats(); b.Placement().Rung != RungPinned || s.Pinned != mib*3/4 || s.Pinned+s.PinnedCached > mib {
		t.Errorf("placement %+v, stats %+v: want the cache trimmed and the array pinned within the limit", b.Placement(), s)
	}
}

// TestHostPlacementString checks that a placement prints as its rung, its
// file and its reason, not as a struct.
func TestHostPlacementString(t *testing.T) {
	tests := map[string]struct {
		p    HostPlacement
		want string
	}{
		"pinned":    {HostPlacement{Rung: RungPinned, Reason: "fits"}, "pinned: fits"},
		"kept file": {HostPlacement{Rung: RungFile, Path: "/s/a.npy", Keep: true, Reason: "over the limit"}, "file /s/a.npy (kept): over the limit"},
		"file":      {HostPlacement{Rung: RungFile, Path: "/s/a.npy"}, "file /s/a.npy"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if got := fmt.Sprint(tc.p); got != tc.want {
				t.Errorf("%#v prints %q, want %q", tc.p, got, tc.want)
			}
		})
	}
}
