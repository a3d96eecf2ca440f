package capi

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"go.uber.org/goleak"

	"github.com/vramkit/vram"
	"github.com/vramkit/vram/alloc"
	"github.com/vramkit/vram/device"
	"github.com/vramkit/vram/internal/gate"
)

// TestMain fails the tests if a simulated device's stream goroutine
// outlives them (a manager not shut, a key's stream not closed).
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const MiB = 1 << 20

// open opens a manager on a fresh simulator and closes it at the end.
func open(t *testing.T, r *Registry, spec string, capBytes uint64) *Manager {
	t.Helper()
	m, err := r.Open(Options{Spec: spec, Cap: capBytes})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if _, err := r.Get(m.Handle()); err == nil {
			if err := r.Close(m.Handle()); err != nil {
				t.Errorf("close at cleanup: %v", err)
			}
		}
	})
	return m
}

func stats(t *testing.T, m *Manager) Stats {
	t.Helper()
	st, err := m.Stats()
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func TestRegistry(t *testing.T) {
	var r Registry
	m := open(t, &r, "sim:vram=64MiB", 0)
	if m.Handle() <= 0 || m.Ordinal() != 0 {
		t.Fatalf("handle %d, ordinal %d; want > 0 and 0", m.Handle(), m.Ordinal())
	}
	if got, err := r.Get(m.Handle()); err != nil || got != m {
		t.Errorf("Get(%d) = %v, %v", m.Handle(), got, err)
	}
	if got, err := r.ForDevice(0); err != nil || got != m {
		t.Errorf("ForDevice(0) = %v, %v", got, err)
	}
	// One manager, one budget, per device ordinal.
	if _, err := r.Open(Options{Spec: "sim:vram=32MiB"}); !errors.Is(err, ErrBusy) {
		t.Errorf("a second manager on device 0 = %v; want ErrBusy", err)
	}
	m1 := open(t, &r, "sim:vram=32MiB,ordinal=1", 0)
	if got, _ := r.ForDevice(1); got != m1 || m1.Handle() == m.Handle() {
		t.Errorf("ForDevice(1) = %v; want the manager on ordinal 1 (handle %d)", got, m1.Handle())
	}
	if all := r.All(); len(all) != 2 || all[0] != m || all[1] != m1 {
		t.Errorf("All = %v; want both, by handle", all)
	}
	for name, tc := range map[string]struct {
		err  error
		call func() error
	}{
		"unknown handle":      {ErrNoManager, func() error { _, err := r.Get(99); return err }},
		"no manager on dev 3": {ErrNoManager, func() error { _, err := r.ForDevice(3); return err }},
		"close unknown":       {ErrNoManager, func() error { return r.Close(99) }},
		"bad spec":            {device.ErrBadSpec, func() error { _, err := r.Open(Options{Spec: "nosuch:0"}); return err }},
	} {
		if err := tc.call(); !errors.Is(err, tc.err) {
			t.Errorf("%s: %v; want %v", name, err, tc.err)
		}
	}
	h := m.Handle()
	if err := r.Close(h); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Get(h); !errors.Is(err, ErrNoManager) {
		t.Errorf("Get after Close = %v; want ErrNoManager", err)
	}
	if _, err := m.Alloc(SourceC, MiB, 0); !errors.Is(err, ErrClosed) {
		t.Errorf("Alloc on a closed manager = %v; want ErrClosed", err)
	}
	// Handles are never reused: a stale one cannot reach a newer manager.
	m2 := open(t, &r, "sim:vram=64MiB", 0)
	if m2.Handle() == h {
		t.Errorf("a new manager reused handle %d", h)
	}
}

func TestAsyncKindRefused(t *testing.T) {
	t.Setenv("VRAM_ALLOC_CONF", "kind:async")
	var r Registry
	if _, err := r.Open(Options{Spec: "sim:vram=64MiB"}); !errors.Is(err, device.ErrInvalidValue) || !strings.Contains(err.Error(), "async") {
		t.Errorf("Open with kind:async = %v; want ErrInvalidValue naming async", err)
	}
	t.Setenv("VRAM_ALLOC_CONF", "kind:direct,limit:4MiB")
	m := open(t, &r, "sim:vram=64MiB", 0)
	if st := stats(t, m); st.Allocator != "direct" || st.Cap != 4*MiB {
		t.Errorf("with kind:direct,limit:4MiB: allocator %q, cap %d; want direct and 4 MiB", st.Allocator, st.Cap)
	}
}

// TestStatsNameTheServedAllocator: the stats name the allocator that
// serves, as every other report does (the registry's one name): the pool
// kind on the simulator, which maps pages, is served by expandable.
func TestStatsNameTheServedAllocator(t *testing.T) {
	t.Setenv("VRAM_ALLOC_CONF", "")
	var r Registry
	m := open(t, &r, "sim:vram=64MiB", 0)
	if st := stats(t, m); st.Allocator != alloc.NameExpandable {
		t.Errorf("stats name allocator %q; want %q, the allocator that serves the pool kind here", st.Allocator, alloc.NameExpandable)
	}
}

// TestBooks allocates through each source and checks every figure: the
// frameworks' books count bytes as asked, the allocator's as it spends
// them.
func TestBooks(t *testing.T) {
	var r Registry
	m := open(t, &r, "sim:vram=64MiB", 0)
	sizes := map[Source]uint64{SourceC: 1000, SourceTorch: 3 * MiB, SourceCuPy: 5 * MiB, SourceNumba: 12345}
	ptrs := map[Source]device.Ptr{}
	for src, n := range sizes {
		p, err := m.Alloc(src, n, 0)
		if err != nil {
			t.Fatal(err)
		}
		ptrs[src] = p
	}
	st := stats(t, m)
	var asked uint64
	for _, sb := range st.Sources {
		var src Source
		for s := range NumSources {
			if s.String() == sb.Source {
				src = s
			}
		}
		if sb.InUse != sizes[src] || sb.PeakInUse != sizes[src] || sb.Allocs != 1 || sb.Frees != 0 {
			t.Errorf("%s: %+v; want %d in use and at peak, 1 alloc", sb.Source, sb.Books, sizes[src])
		}
		asked += sb.InUse
	}
	if st.Allocs != 4 || st.InUse < asked || st.Reserved < st.InUse || st.Backend != "sim" || st.DeviceTotal != 64*MiB {
		t.Errorf("stats %+v; want 4 allocs, at least %d in use", st, asked)
	}
	if err := m.Free(ptrs[SourceTorch], sizes[SourceTorch], 0); err != nil {
		t.Fatal(err)
	}
	st = stats(t, m)
	if b := st.Sources[SourceTorch]; b.InUse != 0 || b.PeakInUse != 3*MiB || b.Frees != 1 {
		t.Errorf("torch after its free: %+v; want 0 in use, peak 3 MiB, 1 free", b)
	}
	if err := m.ResetPeaks(); err != nil {
		t.Fatal(err)
	}
	st = stats(t, m)
	if b := st.Sources[SourceTorch]; b.PeakInUse != 0 {
		t.Errorf("torch's peak after ResetPeaks = %d; want 0", b.PeakInUse)
	}
	if st.PeakInUse != st.InUse {
		t.Errorf("allocator peak after ResetPeaks = %d; want the %d in use", st.PeakInUse, st.InUse)
	}
	for src, p := range ptrs {
		if src != SourceTorch {
			if err := m.Free(p, 0, 0); err != nil { // 0: size not checked
				t.Fatal(err)
			}
		}
	}
	if err := m.Trim(); err != nil {
		t.Fatal(err)
	}
	if st := stats(t, m); st.InUse != 0 || st.Reserved != 0 {
		t.Errorf("after every free and a trim: %d in use, %d reserved; want 0 and 0", st.InUse, st.Reserved)
	}
	rep, err := m.Report()
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"vram manager", "framework", "torch", "cupy", "numba", "allocs"} {
		if !strings.Contains(rep, want) {
			t.Errorf("report lacks %q:\n%s", want, rep)
		}
	}
}

// TestCap: an allocation past the cap is refused before the device is
// asked, whichever framework makes it, and the report at the refusal is
// kept.
func TestCap(t *testing.T) {
	var r Registry
	m := open(t, &r, "sim:vram=64MiB", 8*MiB)
	p, err := m.Alloc(SourceTorch, 6*MiB, 0)
	if err != nil {
		t.Fatal(err)
	}
	before := stats(t, m)
	if before.Cap != 8*MiB || before.CapUsed < 6*MiB {
		t.Fatalf("cap %d, used %d; want 8 MiB and at least 6 MiB", before.Cap, before.CapUsed)
	}
	if rep, _ := m.OOMReport(); rep != "" {
		t.Errorf("OOMReport before any refusal = %q; want empty", rep)
	}
	for _, src := range []Source{SourceCuPy, SourceNumba} {
		if _, err := m.Alloc(src, 4*MiB, Unordered); !errors.Is(err, device.ErrOutOfMemory) || !strings.Contains(err.Error(), "cap") {
			t.Errorf("%s: 4 MiB past the cap = %v; want ErrOutOfMemory naming the cap", src, err)
		}
	}
	after := stats(t, m)
	if after.DeviceAllocs != before.DeviceAllocs || after.DeviceFree != before.DeviceFree || after.Reserved != before.Reserved {
		t.Errorf("the refusals reached the device: device allocs %d → %d, free %d → %d",
			before.DeviceAllocs, after.DeviceAllocs, before.DeviceFree, after.DeviceFree)
	}
	if after.OOMs != before.OOMs+2 || after.Sources[SourceCuPy].OOMs != 1 || after.Sources[SourceNumba].OOMs != 1 {
		t.Errorf("OOMs %d → %d, cupy %d, numba %d; want 2 more, one each", before.OOMs, after.OOMs,
			after.Sources[SourceCuPy].OOMs, after.Sources[SourceNumba].OOMs)
	}
	rep, err := m.OOMReport()
	if err != nil || !strings.Contains(rep, "cap") || !strings.Contains(rep, "manager:") {
		t.Errorf("OOMReport = %q, %v; want the manager's report with its cap", rep, err)
	}
	if err := m.Free(p, 6*MiB, 0); err != nil {
		t.Fatal(err)
	}
	q, err := m.Alloc(SourceCuPy, 4*MiB, Unordered)
	if err != nil {
		t.Fatalf("4 MiB once the 6 MiB are freed: %v", err)
	}
	if err := m.Free(q, 4*MiB, Unordered); err != nil {
		t.Fatal(err)
	}
}

// TestOneBudget: the allocator API and the client API of one manager
// count in one budget, its account's: under a cap of 8 MiB, 6 MiB a hook
// holds leave a client's unchunkable 4 MiB no room, and 4 MiB a client
// holds leave a hook's 6 MiB none; freed, each fits. (Two accounts on
// one device would each let both through.)
func TestOneBudget(t *testing.T) {
	var r Registry
	var cs Clients
	m := open(t, &r, "sim:vram=64MiB", 8*MiB)
	c := register(t, &cs, m, ClientOptions{Name: "c"})
	four := map[string]vram.ArrayRequest{"a": {Shape: []int{4 * MiB}, DType: vram.Uint8, Unchunkable: true}}

	p, err := m.Alloc(SourceTorch, 6*MiB, Unordered)
	must(t, err)
	must(t, cs.Queue(c, four))
	if rh, err := cs.Allocate(c, 0); err == nil {
		must(t, cs.ReleaseResponse(rh))
		t.Fatalf("a client's 4 MiB beside a hook's 6 MiB under a cap of 8 MiB was allocated (cap used %d)", stats(t, m).CapUsed)
	}
	must(t, m.Free(p, 6*MiB, Unordered))

	must(t, cs.Queue(c, four))
	rh, err := cs.Allocate(c, 0)
	must(t, err)
	if _, err := m.Alloc(SourceCuPy, 6*MiB, Unordered); !errors.Is(err, device.ErrOutOfMemory) {
		t.Errorf("a hook's 6 MiB beside a client's 4 MiB under a cap of 8 MiB: %v, want ErrOutOfMemory", err)
	}
	if st := stats(t, m); st.CapUsed < 4*MiB || st.Sources[SourceCuPy].InUse != 0 {
		t.Errorf("cap used %d, CuPy's books %d in use; want the client's 4 MiB counted, nothing of CuPy's", st.CapUsed, st.Sources[SourceCuPy].InUse)
	}
	must(t, cs.ReleaseResponse(rh))
	must(t, cs.Close(c))
	q, err := m.Alloc(SourceCuPy, 6*MiB, Unordered)
	must(t, err)
	must(t, m.Free(q, 6*MiB, Unordered))
}

func TestBadCalls(t *testing.T) {
	var r Registry
	m := open(t, &r, "sim:vram=64MiB", 0)
	p, err := m.Alloc(SourceC, MiB, 0)
	if err != nil {
		t.Fatal(err)
	}
	for name, tc := range map[string]struct {
		err  error
		call func() error
	}{
		"alloc of 0 bytes":    {device.ErrInvalidValue, func() error { _, err := m.Alloc(SourceC, 0, 0); return err }},
		"alloc for source 9":  {device.ErrInvalidValue, func() error { _, err := m.Alloc(Source(9), MiB, 0); return err }},
		"free of a stranger":  {ErrBadPointer, func() error { return m.Free(p+4096, 0, 0) }},
		"free of nil":         {ErrBadPointer, func() error { return m.Free(0, 0, 0) }},
		"free with a size ≠":  {ErrBadPointer, func() error { return m.Free(p, 2*MiB, 0) }},
		"alloc past the dev":  {device.ErrOutOfMemory, func() error { _, err := m.Alloc(SourceC, 1<<40, 0); return err }},
		"close with one live": {ErrBusy, func() error { return r.Close(m.Handle()) }},
	} {
		if err := tc.call(); !errors.Is(err, tc.err) {
			t.Errorf("%s: %v; want %v", name, err, tc.err)
		}
	}
	if _, err := ParseSource(int(NumSources)); !errors.Is(err, device.ErrInvalidValue) {
		t.Errorf("ParseSource(%d) = %v", NumSources, err)
	}
	// The refused calls changed nothing: p is live with its size.
	if st := stats(t, m); st.Sources[SourceC].InUse != MiB || st.Frees != 0 {
		t.Errorf("after refused calls: %+v", st.Sources[SourceC])
	}
	if err := m.Free(p, MiB, 0); err != nil {
		t.Fatal(err)
	}
	if err := m.Free(p, MiB, 0); !errors.Is(err, ErrBadPointer) {
		t.Errorf("double free = %v; want ErrBadPointer", err)
	}
}

// TestAllocErrorNamesTheStream: a refused allocation names its stream
// as a person reads it, never the all-ones handle's value.
func TestAllocErrorNamesTheStream(t *testing.T) {
	var r Registry
	m := open(t, &r, "sim:vram=64MiB", 0)
	for name, tc := range map[string]struct {
		h    uintptr
		want string
	}{
		"unordered":  {Unordered, "alloc of 1 TiB for cupy on no stream (VRAM_STREAM_UNORDERED): "},
		"default":    {0, "alloc of 1 TiB for cupy on the default stream: "},
		"per thread": {perThreadStream, "alloc of 1 TiB for cupy on the per-thread default stream: "},
		"a key":      {0x100, "alloc of 1 TiB for cupy on stream 0x100: "},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := m.Alloc(SourceCuPy, 1<<40, tc.h)
			if !errors.Is(err, device.ErrOutOfMemory) || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "0xffffffff") {
				t.Errorf("Alloc = %v; want ErrOutOfMemory saying %q", err, tc.want)
			}
		})
	}
}

// TestStreamKeys: on the simulator a handle is a key with a stream of its
// own; memory freed on one key is reused on it, and the keys are bounded.
func TestStreamKeys(t *testing.T) {
	var r Registry
	m := open(t, &r, "sim:vram=64MiB", 0)
	a, err := m.stream(0x100)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := m.stream(0x200)
	a2, _ := m.stream(0x100)
	if a != a2 || a == b || a.Handle() == b.Handle() {
		t.Errorf("keys 0x100, 0x200, 0x100 gave streams %v, %v, %v; want one per key", a, b, a2)
	}
	if s, _ := m.stream(0); s != m.dev.DefaultStream() {
		t.Errorf("key 0 = %v; want the default stream", s)
	}
	if s, _ := m.allocStream(Unordered); s != m.unordered {
		t.Errorf("an unordered alloc is on %v; want the manager's own stream", s)
	}
	if s, _ := m.freeStream(Unordered); s != m.dev.DefaultStream() {
		t.Errorf("an unordered free is on %v; want the default stream", s)
	}
	for k := uintptr(1); len(m.keyed) < MaxStreamKeys; k++ {
		if _, err := m.stream(0x10000 + k); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := m.stream(0xdead0000); !errors.Is(err, device.ErrInvalidValue) {
		t.Errorf("key %d+1 = %v; want ErrInvalidValue", MaxStreamKeys, err)
	}
	if _, err := m.stream(0x100); err != nil {
		t.Errorf("a known key once the keys are full: %v", err)
	}
	p, err := m.Alloc(SourceTorch, MiB, 0x100)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Free(p, MiB, 0x100); err != nil {
		t.Fatal(err)
	}
	q, err := m.Alloc(SourceTorch, MiB, 0x100)
	if err != nil {
		t.Fatal(err)
	}
	if q != p {
		t.Errorf("a block freed on key 0x100 and asked again on it came back at %v, not %v", q, p)
	}
	if err := m.Free(q, MiB, 0x100); err != nil {
		t.Fatal(err)
	}
}

// TestConcurrent: frameworks on many goroutines and streams at once; the
// books come back to zero (run with -race).
func TestConcurrent(t *testing.T) {
	var r Registry
	m := open(t, &r, "sim:vram=256MiB", 128*MiB)
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			src, key := Source(g%int(NumSources)), uintptr(0x40*(g%3))
			if g%4 == 3 {
				key = Unordered
			}
			for i := range 200 {
				n := uint64(4096 * (1 + (g*31+i*7)%64))
				p, err := m.Alloc(src, n, key)
				if err != nil {
					errs <- fmt.Errorf("goroutine %d alloc %d: %w", g, i, err)
					return
				}
				if err := m.Free(p, n, key); err != nil {
					errs <- fmt.Errorf("goroutine %d free %d: %w", g, i, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	st := stats(t, m)
	if st.InUse != 0 || st.Allocs != 1600 || st.Frees != 1600 {
		t.Errorf("after 8×200 pairs: %d in use, %d allocs, %d frees", st.InUse, st.Allocs, st.Frees)
	}
	for _, sb := range st.Sources {
		if sb.InUse != 0 || sb.Allocs != sb.Frees || sb.Allocs != 400 {
			t.Errorf("%s: %+v; want 400 allocs, all freed", sb.Source, sb.Books)
		}
	}
}

func TestHookErrors(t *testing.T) {
	var r Registry
	m := open(t, &r, "sim:vram=64MiB", 0)
	m.NoteHookError(errors.New("vram: free of 0x10: " + strings.Repeat("x", 2000)))
	st := stats(t, m)
	rep, _ := m.Report()
	if st.HookErrors != 1 || !strings.Contains(rep, "hook errors  1") || strings.Count(rep, "x") > 600 {
		t.Errorf("hook errors %d; report:\n%s\nwant one, clipped", st.HookErrors, rep)
	}
}

// TestGateAllocFree: a cache-hit alloc/free pair of a manager opened
// without a lease makes 2 heap allocations (use's closure, one per call),
// and builds no context for a lease it does not have (that cost 4 more);
// a gate figure (package internal/gate).
func TestGateAllocFree(t *testing.T) {
	var r Registry
	m := open(t, &r, "sim:vram=1GiB", 0)
	pair := func() {
		p, err := m.Alloc(SourceC, MiB, 0x40)
		if err != nil {
			t.Fatal(err)
		}
		if err := m.Free(p, MiB, 0x40); err != nil {
			t.Fatal(err)
		}
	}
	pair() // the stream key's stream and the cached block
	n := testing.AllocsPerRun(100, pair)
	if n > 2 {
		t.Errorf("%.1f heap allocations per alloc/free pair; want at most 2", n)
	}
	gate.Record(t, gate.Figure{Name: "heap/capi/Manager.Alloc+Free 1 MiB", Value: n, Unit: "allocs/op", Better: gate.Lower})
}

// BenchmarkAllocFree is a 1 MiB alloc/free pair on one stream key, a
// cache hit, through a Manager: the Go side of the C library's path
// (libvram's harness "bench" mode times the whole path from C).
func BenchmarkAllocFree(b *testing.B) {
	var r Registry
	m, err := r.Open(Options{Spec: "sim:vram=1GiB"})
	if err != nil {
		b.Fatal(err)
	}
	defer r.Close(m.Handle())
	for b.Loop() {
		p, err := m.Alloc(SourceC, MiB, 0x40)
		if err != nil {
			b.Fatal(err)
		}
		if err := m.Free(p, MiB, 0x40); err != nil {
			b.Fatal(err)
		}
	}
}

// borrowing is a simulated device that claims device.ForeignCaller, as
// CUDA does, so that the manager's CUDA paths run here: BorrowStream
// gives a simulator stream per handle (standing for the program's
// CUstream), and KeepThread counts its calls and restores, and refuses
// while refuse is set.
type borrowing struct {
	device.Device
	mu       sync.Mutex
	streams  map[uintptr]device.Stream
	kept     int // KeepThread calls that succeeded
	restored int // restore calls
	refuse   bool
}

func (b *borrowing) BorrowStream(h uintptr) (device.Stream, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if s := b.streams[h]; s != nil {
		return s, nil
	}
	s, err := b.Device.NewStream()
	if err != nil {
		return nil, err
	}
	b.streams[h] = s
	return s, nil
}

func (b *borrowing) KeepThread() (func(), error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.refuse {
		return nil, errors.New("a second context of the GPU is current")
	}
	b.kept++
	return func() { b.mu.Lock(); b.restored++; b.mu.Unlock() }, nil
}

func (b *borrowing) Close() error {
	for _, s := range b.streams {
		s.Close()
	}
	return b.Device.Close()
}

func TestForeignCaller(t *testing.T) {
	dev, err := device.Open("sim:vram=64MiB")
	if err != nil {
		t.Fatal(err)
	}
	b := &borrowing{Device: dev, streams: map[uintptr]device.Stream{}}
	var r Registry
	m, err := r.openOn(b, Options{Spec: "sim (borrowing)"}, vram.AllocConf{})
	if err != nil {
		t.Fatal(err)
	}
	s, _ := m.allocStream(0x40)
	if want, _ := b.BorrowStream(0x40); s != want {
		t.Errorf("an allocation on handle 0x40 is on %v; want the borrowed stream %v", s, want)
	}
	if s, _ := m.allocStream(perThreadStream); s != m.unordered {
		t.Errorf("an allocation on cudaStreamPerThread is on %v; want the unordered stream", s)
	}
	if s, _ := m.freeStream(perThreadStream); s == m.unordered {
		t.Error("a free on cudaStreamPerThread went to the unordered stream; want the borrowed handle")
	}
	p, err := m.Alloc(SourceTorch, MiB, 0x40)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Free(p, MiB, 0x40); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Stats(); err != nil {
		t.Fatal(err)
	}
	if b.kept == 0 || b.kept != b.restored {
		t.Errorf("KeepThread %d times, restored %d; want every call to keep and restore the thread", b.kept, b.restored)
	}
	b.refuse = true
	if _, err := m.Alloc(SourceTorch, MiB, 0x40); err == nil || !strings.Contains(err.Error(), "second context") {
		t.Errorf("Alloc while the thread's context is refused = %v", err)
	}
	if err := r.Close(m.Handle()); err == nil {
		t.Error("Close while the thread's context is refused succeeded")
	}
	if st := m.books[SourceTorch]; st.Allocs != 1 || st.InUse != 0 {
		t.Errorf("refused calls changed the books: %+v", st)
	}
	b.refuse = false
	if err := r.Close(m.Handle()); err != nil {
		t.Fatal(err)
	}
}
