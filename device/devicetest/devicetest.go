package devicetest

import (
	"bytes"
	"errors"
	"maps"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/vramkit/vram/device"
)

// opener makes a fresh device for one subtest.
type opener func(t *testing.T) device.Device

// waitLimit bounds every wait the suite does on the device, so that a
// backend that blocks forever fails instead of hanging.
const waitLimit = 20 * time.Second

// Run runs the whole suite against devices made by open.
func Run(t *testing.T, open func(t *testing.T) device.Device) {
	o := opener(open)
	groups := map[string]func(*testing.T, opener){
		"Info":             testInfo,
		"Accounting":       testAccounting,
		"Malloc":           testMalloc,
		"Copies":           testCopies,
		"StreamOrder":      testStreamOrder,
		"Asynchrony":       testAsynchrony,
		"Events":           testEvents,
		"StickyErrors":     testStickyErrors,
		"Kernels":          testKernels,
		"AsyncPool":        testAsyncPool,
		"HostMemory":       testHostMemory,
		"Memcheck":         testMemcheck,
		"Reset":            testReset,
		"BadInputs":        testBadInputs,
		"Closed":           testClosed,
		"Concurrency":      testConcurrency,
		"DeviceSyncAll":    testDeviceSync,
		"StreamCloseWaits": testStreamCloseWaits,
		"StridedCopies":    testStrided,
		"VirtualMemory":    testVirtualMemory,
	}
	for _, name := range sortedKeys(groups) {
		t.Run(name, func(t *testing.T) { groups[name](t, o) })
	}
}

func sortedKeys[V any](m map[string]V) []string { return slices.Sorted(maps.Keys(m)) }

// fresh opens a device that is closed when the test ends; Close must
// succeed (the suite frees everything it allocates).
func (o opener) fresh(t *testing.T) device.Device {
	t.Helper()
	d := o(t)
	if d == nil {
		t.Fatal("open returned a nil device")
	}
	t.Cleanup(func() {
		if err := d.Close(); err != nil && !errors.Is(err, device.ErrClosed) {
			t.Errorf("Close: %v", err)
		}
	})
	return d
}

func backed(t *testing.T, d device.Device) {
	t.Helper()
	if !d.Info().Backed {
		t.Skip("device is not backed (address-only): it holds no bytes to copy")
	}
}

// must returns a function that fails t on an error and passes the value
// on: must[device.Ptr](t)(d.Malloc(n)).
func must[T any](t *testing.T) func(T, error) T {
	t.Helper()
	return func(v T, err error) T {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
}

func ptr(t *testing.T) func(device.Ptr, error) device.Ptr        { return must[device.Ptr](t) }
func strm(t *testing.T) func(device.Stream, error) device.Stream { return must[device.Stream](t) }
func evt(t *testing.T) func(device.Event, error) device.Event    { return must[device.Event](t) }
func hbuf(t *testing.T) func(device.HostBuffer, error) device.HostBuffer {
	return must[device.HostBuffer](t)
}

func ok(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func isErr(t *testing.T, err, want error, what string) {
	t.Helper()
	if !errors.Is(err, want) {
		t.Fatalf("%s: got error %v, want one wrapping %q", what, err, want)
	}
	if err != nil && err.Error() == want.Error() {
		t.Errorf("%s: error %q carries no detail; wrap the sentinel with what was asked", what, err)
	}
}

// memcheckErrs are the memory checker's sentinels: each misuse must wrap
// its own and none of the others.
var memcheckErrs = []error{device.ErrOutOfBounds, device.ErrUseAfterFree, device.ErrDoubleFree,
	device.ErrInvalidated, device.ErrInvalidPointer}

// isOnly is isErr that also fails when err wraps another memcheck sentinel
// than want, so that each misuse gives a distinct error.
func isOnly(t *testing.T, err, want error, what string) {
	t.Helper()
	isErr(t, err, want, what)
	for _, other := range memcheckErrs {
		if other != want && errors.Is(err, other) {
			t.Errorf("%s: error %v wraps %q as well as %q; each misuse must give one distinct error", what, err, other, want)
		}
	}
}

func memFree(t *testing.T, d device.Device) uint64 {
	t.Helper()
	free, _, err := d.MemInfo()
	ok(t, err)
	return free
}

// cudaMemSlack is how far free memory may move on a real CUDA driver for
// reasons of the driver's own between two readings the suite expects to
// be equal: it loads internal modules lazily (the first memset, copy or
// launch of a kind) and gives streams, events and the memory pool
// resources of their own. On every other backend (the simulator) free
// memory is accounted exactly, and the suite demands it.
const cudaMemSlack = 16 << 20

// memSlack is the tolerance of d's free-memory readings: cudaMemSlack on
// CUDA, 0 elsewhere.
func memSlack(d device.Device) uint64 {
	if d.Info().Backend == "cuda" {
		return cudaMemSlack
	}
	return 0
}

// freeNear fails t when free memory got is further than memSlack(d) from
// want; what says what the reading was after.
func freeNear(t *testing.T, d device.Device, got, want uint64, what string) {
	t.Helper()
	diff := got - want
	if got < want {
		diff = want - got
	}
	if slack := memSlack(d); diff > slack {
		t.Errorf("%s: free memory is %d, want %d (within %d bytes on %s)", what, got, want, slack, d.Info().Backend)
	}
}

func roundUp(n, g uint64) uint64 {
	if g == 0 {
		return n
	}
	return (n + g - 1) / g * g
}

// within fails the test if fn does not return within waitLimit.
func within(t *testing.T, what string, fn func()) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		fn()
	}()
	select {
	case <-done:
	case <-time.After(waitLimit):
		t.Fatalf("%s did not return within %v", what, waitLimit)
	}
}

func syncStream(t *testing.T, s device.Stream) {
	t.Helper()
	var err error
	within(t, "Stream.Synchronize", func() { err = s.Synchronize() })
	ok(t, err)
}

// hold blocks stream s until the returned release function is called (at
// the latest when the test ends): with a Go kernel that waits on a channel
// on a device.FuncLauncher, else with a PTX kernel that spins on a flag in
// mapped host memory on a device.ModuleLoader that is also a
// device.HostAllocator. It skips the test when the device can do neither,
// or when the stream is not busy right after the launch (a driver that
// does not really run kernels).
func hold(t *testing.T, d device.Device, s device.Stream) (release func()) {
	t.Helper()
	if !d.Info().Backed {
		t.Skip("device is address-only and runs no kernels: the suite cannot hold a stream busy")
	}
	if fl, isFL := d.(device.FuncLauncher); isFL {
		ch := make(chan struct{})
		ok(t, fl.LaunchFunc(s, 1, func(device.View, int, int) error {
			<-ch
			return nil
		}))
		var once sync.Once
		release = func() { once.Do(func() { close(ch) }) }
		t.Cleanup(release)
		return release
	}
	return holdPTX(t, d, s)
}

// spinPTX waits until the 32-bit word at flag is not zero.
const spinPTX = `.version 7.0
.target sm_52
.address_size 64

.visible .entry vram_devicetest_spin(
	.param .u64 flag
)
{
	.reg .pred %p<2>;
	.reg .b32 %r<2>;
	.reg .b64 %rd<3>;

	ld.param.u64 %rd1, [flag];
	cvta.to.global.u64 %rd2, %rd1;
$L_spin:
	ld.volatile.global.u32 %r1, [%rd2];
	setp.eq.s32 %p1, %r1, 0;
	@%p1 bra $L_spin;
	ret;
}
`

func holdPTX(t *testing.T, d device.Device, s device.Stream) (release func()) {
	t.Helper()
	ml, isML := d.(device.ModuleLoader)
	ha, isHA := d.(device.HostAllocator)
	if !isML || !isHA {
		t.Skip("device is neither a device.FuncLauncher nor a ModuleLoader with HostAllocator: the suite cannot hold a stream busy")
	}
	flag, err := ha.HostAlloc(4, true)
	if err != nil {
		t.Skipf("cannot hold a stream: mapped host memory for the flag: %v", err)
	}
	mod, err := ml.LoadPTX(spinPTX)
	if err != nil {
		ok(t, ha.HostFree(flag))
		t.Skipf("cannot hold a stream: loading the spin kernel: %v", err)
	}
	cleanup := func() {
		if err := mod.Close(); err != nil {
			t.Errorf("closing the spin module: %v", err)
		}
		if err := ha.HostFree(flag); err != nil {
			t.Errorf("freeing the spin flag: %v", err)
		}
	}
	fn, err := mod.Function("vram_devicetest_spin")
	if err == nil {
		err = fn.Launch(s, device.Dim3{X: 1, Y: 1, Z: 1}, device.Dim3{X: 1, Y: 1, Z: 1}, 0, flag.DevicePtr)
	}
	if err != nil {
		cleanup()
		t.Fatalf("launching the spin kernel: %v", err)
	}
	if done, _ := s.Query(); done {
		ok(t, s.Synchronize())
		cleanup()
		t.Skip("the stream was idle right after launching the spin kernel: this driver does not run kernels, so the suite cannot hold a stream busy")
	}
	var once sync.Once
	release = func() {
		once.Do(func() { atomic.StoreUint32((*uint32)(unsafe.Pointer(&flag.Data[0])), 1) })
	}
	t.Cleanup(func() {
		release()
		within(t, "the spin kernel's end", func() { _ = d.Synchronize() })
		cleanup()
	})
	return release
}

func pattern(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = seed + byte(i*7)
	}
	return b
}

func testInfo(t *testing.T, o opener) {
	d := o.fresh(t)
	info := d.Info()
	free, total, err := d.MemInfo()
	ok(t, err)
	if info.Backend == "" || info.Name == "" {
		t.Errorf("Info has an empty backend or name: %+v", info)
	}
	if total == 0 || total != info.TotalBytes {
		t.Errorf("MemInfo total %d, Info.TotalBytes %d: want equal and > 0", total, info.TotalBytes)
	}
	if free == 0 || free > total || free > total-info.ContextBytes {
		t.Errorf("MemInfo free %d of total %d with context %d", free, total, info.ContextBytes)
	}
	if info.Granularity == 0 || info.Granularity&(info.Granularity-1) != 0 {
		t.Errorf("Info.Granularity %d: want a power of two", info.Granularity)
	}
	if s := d.DefaultStream(); s == nil || s.Handle() != 0 {
		t.Errorf("DefaultStream %v: want a stream with handle 0", s)
	}
}

func testAccounting(t *testing.T, o opener) {
	d := o.fresh(t)
	g := d.Info().Granularity
	start := memFree(t, d)
	sizes := map[string]uint64{
		"one granule":      g,
		"granule plus one": g + 1,
		"three granules":   3 * g,
		"many granules":    16*g + 12345,
	}
	var ptrs []device.Ptr
	var spent uint64
	for _, name := range sortedKeys(sizes) {
		n := sizes[name]
		t.Run(name, func(t *testing.T) {
			before := memFree(t, d)
			p := ptr(t)(d.Malloc(n))
			ptrs = append(ptrs, p)
			after := memFree(t, d)
			lo, hi, slack := n, roundUp(n, g)+g, memSlack(d)
			drop := int64(before) - int64(after)
			if drop < int64(lo)-int64(slack) || drop > int64(hi+slack) {
				t.Errorf("Malloc(%d): free went from %d to %d; want a drop between %d and %d (give or take %d on %s)",
					n, before, after, lo, hi, slack, d.Info().Backend)
			}
			spent += before - after
		})
	}
	freeNear(t, d, memFree(t, d), start-spent, "after the allocations, against their drops one by one")
	for _, p := range ptrs {
		ok(t, d.Free(p))
	}
	freeNear(t, d, memFree(t, d), start, "after freeing everything (where it started)")
	if aa, isAA := d.(device.AsyncAllocator); isAA {
		s := d.DefaultStream()
		var ps []device.Ptr
		for _, n := range []uint64{1, 1000, g, 5*g + 3} {
			ps = append(ps, ptr(t)(aa.MallocAsync(n, s)))
		}
		for _, p := range ps {
			ok(t, aa.FreeAsync(p, s))
		}
		ok(t, aa.SetReleaseThreshold(0))
		syncStream(t, s)
		ok(t, aa.TrimPool(0))
		freeNear(t, d, memFree(t, d), start, "after MallocAsync, FreeAsync, a synchronize and a trim")
	}
}

func testMalloc(t *testing.T, o opener) {
	d := o.fresh(t)
	type span struct{ lo, hi uint64 }
	var spans []span
	sizes := []uint64{1, 255, 256, 4097, 1 << 20, 3<<20 + 1}
	for _, n := range sizes {
		p := ptr(t)(d.Malloc(n))
		if p == 0 {
			t.Fatalf("Malloc(%d) returned the null pointer", n)
		}
		if p%256 != 0 {
			t.Errorf("Malloc(%d) = %v: not aligned to 256 bytes", n, p)
		}
		for _, s := range spans {
			if uint64(p) < s.hi && uint64(p)+n > s.lo {
				t.Errorf("Malloc(%d) = %v overlaps a live allocation [0x%x, 0x%x)", n, p, s.lo, s.hi)
			}
		}
		spans = append(spans, span{uint64(p), uint64(p) + n})
	}
	for _, s := range spans {
		ok(t, d.Free(device.Ptr(s.lo)))
	}
	// The largest block that fits must fit; more than the total must not.
	_, total, err := d.MemInfo()
	ok(t, err)
	_, err = d.Malloc(total + 1)
	isErr(t, err, device.ErrOutOfMemory, "Malloc(total+1)")
}

func testCopies(t *testing.T, o opener) {
	d := o.fresh(t)
	backed(t, d)
	s := d.DefaultStream()
	const n = 1 << 16
	a := ptr(t)(d.Malloc(n))
	b := ptr(t)(d.Malloc(n))
	defer func() { ok(t, d.Free(a)); ok(t, d.Free(b)) }()
	src := pattern(n, 3)
	cases := map[string]struct {
		run  func() error
		want func() []byte
	}{
		"HtoD then DtoH": {
			run:  func() error { return d.CopyHtoD(a, src, s) },
			want: func() []byte { return src },
		},
		"interior pointer": {
			run: func() error {
				if err := d.CopyHtoD(a, src, s); err != nil {
					return err
				}
				return d.CopyHtoD(a.Add(100), []byte("interior"), s)
			},
			want: func() []byte {
				w := bytes.Clone(src)
				copy(w[100:], "interior")
				return w
			},
		},
		"DtoD": {
			run: func() error {
				if err := d.CopyHtoD(b, pattern(n, 9), s); err != nil {
					return err
				}
				return d.CopyDtoD(a, b, n, s)
			},
			want: func() []byte { return pattern(n, 9) },
		},
		"Memset range": {
			run: func() error {
				if err := d.CopyHtoD(a, src, s); err != nil {
					return err
				}
				return d.Memset(a.Add(10), 0xab, 20, s)
			},
			want: func() []byte {
				w := bytes.Clone(src)
				for i := 10; i < 30; i++ {
					w[i] = 0xab
				}
				return w
			},
		},
		"Memset zero whole": {
			run: func() error {
				if err := d.CopyHtoD(a, src, s); err != nil {
					return err
				}
				return d.Memset(a, 0, n, s)
			},
			want: func() []byte { return make([]byte, n) },
		},
	}
	for _, name := range sortedKeys(cases) {
		tc := cases[name]
		t.Run(name, func(t *testing.T) {
			ok(t, tc.run())
			got := make([]byte, n)
			ok(t, d.CopyDtoH(got, a, s))
			syncStream(t, s)
			if !bytes.Equal(got, tc.want()) {
				t.Errorf("device bytes differ from what was written")
			}
		})
	}
}

func testStreamOrder(t *testing.T, o opener) {
	d := o.fresh(t)
	backed(t, d)
	s := strm(t)(d.NewStream())
	defer func() { ok(t, s.Close()) }()
	const n = 4096
	p := ptr(t)(d.Malloc(n))
	defer func() { ok(t, d.Free(p)) }()
	// Many writes to one place, then reads after each: every read must see
	// the write just before it and nothing later.
	const rounds = 64
	reads := make([][]byte, rounds)
	for i := range rounds {
		ok(t, d.CopyHtoD(p, pattern(n, byte(i)), s))
		ok(t, d.Memset(p.Add(uint64(i)), 0xff, 1, s))
		reads[i] = make([]byte, n)
		ok(t, d.CopyDtoH(reads[i], p, s))
	}
	syncStream(t, s)
	for i := range rounds {
		want := pattern(n, byte(i))
		want[i] = 0xff
		if !bytes.Equal(reads[i], want) {
			t.Fatalf("read %d saw other writes than the ones enqueued before it", i)
		}
	}
	if done, err := s.Query(); err != nil || !done {
		t.Errorf("Query after Synchronize = %v, %v; want true, nil", done, err)
	}
}

func testAsynchrony(t *testing.T, o opener) {
	d := o.fresh(t)
	backed(t, d)
	s := strm(t)(d.NewStream())
	defer func() { ok(t, s.Close()) }()
	p := ptr(t)(d.Malloc(64))
	defer func() { ok(t, d.Free(p)) }()
	ok(t, d.CopyHtoD(p, []byte("written on the device"), s))
	syncStream(t, s)

	got := hostBytes(t, d, 21)
	release := hold(t, d, s)
	ok(t, d.CopyDtoH(got, p, s))
	if string(got) != string(make([]byte, 21)) {
		t.Fatalf("CopyDtoH wrote %q before its stream reached it", got)
	}
	if done, err := s.Query(); err != nil || done {
		t.Fatalf("Query on a held stream = %v, %v; want false, nil", done, err)
	}
	release()
	syncStream(t, s)
	if string(got) != "written on the device" {
		t.Fatalf("after Synchronize got %q", got)
	}
	if done, err := s.Query(); err != nil || !done {
		t.Fatalf("Query after Synchronize = %v, %v; want true, nil", done, err)
	}
}

func testEvents(t *testing.T, o opener) {
	t.Run("never recorded", func(t *testing.T) {
		d := o.fresh(t)
		e := evt(t)(d.NewEvent())
		defer func() { ok(t, e.Close()) }()
		if done, err := e.Query(); err != nil || !done {
			t.Errorf("Query of a fresh event = %v, %v; want true, nil", done, err)
		}
		within(t, "Event.Synchronize", func() { ok(t, e.Synchronize()) })
		ok(t, e.Wait(d.DefaultStream()))
		syncStream(t, d.DefaultStream())
	})
	t.Run("record and query", func(t *testing.T) {
		d := o.fresh(t)
		s := strm(t)(d.NewStream())
		defer func() { ok(t, s.Close()) }()
		e := evt(t)(d.NewEvent())
		defer func() { ok(t, e.Close()) }()
		release := hold(t, d, s)
		ok(t, e.Record(s))
		if done, err := e.Query(); err != nil || done {
			t.Fatalf("Query of an event behind held work = %v, %v; want false, nil", done, err)
		}
		release()
		within(t, "Event.Synchronize", func() { ok(t, e.Synchronize()) })
		if done, err := e.Query(); err != nil || !done {
			t.Fatalf("Query after Synchronize = %v, %v; want true, nil", done, err)
		}
	})
	t.Run("cross-stream wait", func(t *testing.T) {
		d := o.fresh(t)
		backed(t, d)
		s1 := strm(t)(d.NewStream())
		s2 := strm(t)(d.NewStream())
		defer func() { ok(t, s1.Close()); ok(t, s2.Close()) }()
		e := evt(t)(d.NewEvent())
		defer func() { ok(t, e.Close()) }()
		p := ptr(t)(d.Malloc(256))
		defer func() { ok(t, d.Free(p)) }()
		src := hostText(t, d, "from stream one")
		got := hostBytes(t, d, 15)
		release := hold(t, d, s1)
		ok(t, d.CopyHtoD(p, src, s1))
		ok(t, e.Record(s1))
		within(t, "Event.Wait on a held stream's event (it must not block the host)", func() { ok(t, e.Wait(s2)) })
		ok(t, d.CopyDtoH(got, p, s2))
		if done, err := s2.Query(); err != nil || done {
			t.Fatalf("stream two did not wait for the event: Query = %v, %v", done, err)
		}
		time.Sleep(20 * time.Millisecond) // time for a wrongly ordered copy to run
		if string(got) != string(make([]byte, 15)) {
			t.Fatalf("stream two ran its copy before the event's work (read %q)", got)
		}
		release()
		syncStream(t, s2)
		if string(got) != "from stream one" {
			t.Fatalf("stream two read %q before stream one's write", got)
		}
	})
	t.Run("wait ignores work after the record", func(t *testing.T) {
		d := o.fresh(t)
		backed(t, d)
		s1 := strm(t)(d.NewStream())
		s2 := strm(t)(d.NewStream())
		defer func() { ok(t, s1.Close()); ok(t, s2.Close()) }()
		e := evt(t)(d.NewEvent())
		defer func() { ok(t, e.Close()) }()
		p := ptr(t)(d.Malloc(64))
		defer func() { ok(t, d.Free(p)) }()
		ok(t, d.CopyHtoD(p, []byte("before the record"), s1))
		ok(t, e.Record(s1))
		release := hold(t, d, s1) // after the record: stream two must not wait for it
		ok(t, e.Wait(s2))
		got := make([]byte, 17)
		ok(t, d.CopyDtoH(got, p, s2))
		syncStream(t, s2) // returns while stream one is still held
		if string(got) != "before the record" {
			t.Errorf("stream two read %q after waiting on the event, want the write recorded before it", got)
		}
		if done, err := s1.Query(); err != nil || done {
			t.Errorf("stream one Query = %v, %v while held; want false, nil", done, err)
		}
		release()
		syncStream(t, s1)
	})
	t.Run("re-record moves the mark", func(t *testing.T) {
		d := o.fresh(t)
		s := strm(t)(d.NewStream())
		defer func() { ok(t, s.Close()) }()
		e := evt(t)(d.NewEvent())
		defer func() { ok(t, e.Close()) }()
		release := hold(t, d, s)
		ok(t, e.Record(d.DefaultStream())) // nothing pending there
		if done, err := e.Query(); err != nil || !done {
			t.Fatalf("event recorded on an idle stream: Query = %v, %v; want true, nil", done, err)
		}
		ok(t, e.Record(s)) // now behind the held work
		if done, err := e.Query(); err != nil || done {
			t.Fatalf("event re-recorded behind held work: Query = %v, %v; want false, nil", done, err)
		}
		release()
		within(t, "Event.Synchronize", func() { ok(t, e.Synchronize()) })
	})
	t.Run("record captures only earlier work", func(t *testing.T) {
		d := o.fresh(t)
		s := strm(t)(d.NewStream())
		defer func() { ok(t, s.Close()) }()
		e := evt(t)(d.NewEvent())
		defer func() { ok(t, e.Close()) }()
		ok(t, e.Record(s)) // nothing enqueued yet: complete at once
		within(t, "Event.Synchronize", func() { ok(t, e.Synchronize()) })
		release := hold(t, d, s)
		if done, err := e.Query(); err != nil || !done {
			t.Fatalf("an event recorded before held work reports %v, %v; want done", done, err)
		}
		release()
		syncStream(t, s)
	})
}

func testStickyErrors(t *testing.T, o opener) {
	d := o.fresh(t)
	fl, isFL := d.(device.FuncLauncher)
	if !isFL {
		t.Skip("device is no device.FuncLauncher: no portable way to raise an asynchronous error")
	}
	backed(t, d)
	s := strm(t)(d.NewStream())
	defer func() { ok(t, s.Close()) }()
	boom := errors.New("kernel says no")
	ok(t, fl.LaunchFunc(s, 4, func(device.View, int, int) error { return boom }))
	ok(t, fl.LaunchFunc(s, 1, func(device.View, int, int) error { return nil }))
	var err error
	within(t, "Synchronize", func() { err = s.Synchronize() })
	if !errors.Is(err, boom) {
		t.Fatalf("Synchronize after a failing kernel = %v; want it to wrap the kernel's error", err)
	}
	if err := s.Synchronize(); err != nil {
		t.Fatalf("second Synchronize = %v; want nil (the error was reported)", err)
	}
	ok(t, fl.LaunchFunc(s, 1, func(device.View, int, int) error { return boom }))
	within(t, "Device.Synchronize", func() { err = d.Synchronize() })
	if !errors.Is(err, boom) {
		t.Fatalf("Device.Synchronize after a failing kernel = %v; want the kernel's error", err)
	}
}

func testKernels(t *testing.T, o opener) {
	d := o.fresh(t)
	fl, isFL := d.(device.FuncLauncher)
	if !isFL {
		t.Skip("device is no device.FuncLauncher")
	}
	backed(t, d)
	s := d.DefaultStream()
	sizes := map[string]int{"one": 1, "small": 7, "odd": 1001, "large": 1 << 16}
	for _, name := range sortedKeys(sizes) {
		n := sizes[name]
		t.Run(name, func(t *testing.T) {
			p := ptr(t)(d.Malloc(uint64(n)))
			defer func() { ok(t, d.Free(p)) }()
			var calls atomic.Int64
			ok(t, fl.LaunchFunc(s, n, func(mem device.View, lo, hi int) error {
				calls.Add(1)
				b, err := mem.Bytes(p.Add(uint64(lo)), uint64(hi-lo))
				if err != nil {
					return err
				}
				for i := range b {
					b[i]++ // each index once: 1 everywhere, or a block ran twice
				}
				return nil
			}))
			got := make([]byte, n)
			ok(t, d.CopyDtoH(got, p, s))
			syncStream(t, s)
			for i, v := range got {
				if v != 1 {
					t.Fatalf("index %d was covered %d times, want once", i, v)
				}
			}
			if calls.Load() < 1 || calls.Load() > int64(n) {
				t.Errorf("%d blocks for %d indices", calls.Load(), n)
			}
		})
	}
	t.Run("view bounds", func(t *testing.T) {
		p := ptr(t)(d.Malloc(100))
		defer func() { ok(t, d.Free(p)) }()
		ok(t, fl.LaunchFunc(s, 1, func(mem device.View, lo, hi int) error {
			_, err := mem.Bytes(p.Add(50), 51)
			return err
		}))
		var err error
		within(t, "Synchronize", func() { err = s.Synchronize() })
		isErr(t, err, device.ErrOutOfBounds, "kernel access one byte past the end")
	})
}

func asyncOf(t *testing.T, d device.Device) device.AsyncAllocator {
	t.Helper()
	aa, isAA := d.(device.AsyncAllocator)
	if !isAA {
		t.Skip("device is no device.AsyncAllocator")
	}
	return aa
}

func testAsyncPool(t *testing.T, o opener) {
	t.Run("same stream reuses at once", func(t *testing.T) {
		d := o.fresh(t)
		aa := asyncOf(t, d)
		s := strm(t)(d.NewStream())
		defer func() { ok(t, s.Close()) }()
		ok(t, aa.SetReleaseThreshold(math.MaxUint64))
		release := hold(t, d, s) // the free is not complete: only s may reuse
		p := ptr(t)(aa.MallocAsync(1<<20, s))
		ok(t, aa.FreeAsync(p, s))
		q := ptr(t)(aa.MallocAsync(1<<20, s))
		if q != p {
			t.Errorf("MallocAsync on the freeing stream = %v, want the block just freed %v", q, p)
		}
		ok(t, aa.FreeAsync(q, s))
		release()
		syncStream(t, s)
		ok(t, aa.TrimPool(0))
	})
	t.Run("other stream waits for the free", func(t *testing.T) {
		d := o.fresh(t)
		aa := asyncOf(t, d)
		s1 := strm(t)(d.NewStream())
		s2 := strm(t)(d.NewStream())
		defer func() { ok(t, s1.Close()); ok(t, s2.Close()) }()
		ok(t, aa.SetReleaseThreshold(math.MaxUint64))
		release := hold(t, d, s1)
		p := ptr(t)(aa.MallocAsync(1<<20, s1))
		ok(t, aa.FreeAsync(p, s1))
		q := ptr(t)(aa.MallocAsync(1<<20, s2))
		if q == p {
			// Allowed only if the driver made stream 2 wait for stream 1
			// (CUDA's internal dependencies); the simulator never does.
			if done, err := s2.Query(); err != nil || done {
				t.Fatalf("a block freed on stream 1 was reused on stream 2 before stream 1's work up to the free finished, and stream 2 does not wait for it")
			}
		}
		release()
		syncStream(t, s1)
		ok(t, aa.FreeAsync(q, s2))
		syncStream(t, s2)
		ok(t, aa.TrimPool(0))
	})
	t.Run("usage and release threshold", func(t *testing.T) {
		d := o.fresh(t)
		aa := asyncOf(t, d)
		s := d.DefaultStream()
		start := memFree(t, d)
		ok(t, aa.SetReleaseThreshold(math.MaxUint64))
		p := ptr(t)(aa.MallocAsync(3<<20, s))
		res, used, err := aa.PoolUsage()
		ok(t, err)
		if used < 3<<20 || res < used {
			t.Errorf("PoolUsage with 3 MiB live = reserved %d, used %d", res, used)
		}
		if f := memFree(t, d); start-f+memSlack(d) < res {
			t.Errorf("free memory dropped by %d, less than the pool's reserve %d", start-f, res)
		}
		ok(t, aa.FreeAsync(p, s))
		syncStream(t, s)
		res2, used2, err := aa.PoolUsage()
		ok(t, err)
		if used2 != 0 || res2 == 0 {
			t.Errorf("after free and sync with a high threshold: reserved %d, used %d; want memory kept, none used", res2, used2)
		}
		ok(t, aa.SetReleaseThreshold(0))
		syncStream(t, s)
		res3, _, err := aa.PoolUsage()
		ok(t, err)
		if res3 != 0 {
			t.Errorf("after a sync with threshold 0 the pool still holds %d bytes", res3)
		}
		freeNear(t, d, memFree(t, d), start, "after the pool released everything")
	})
	t.Run("trim", func(t *testing.T) {
		d := o.fresh(t)
		aa := asyncOf(t, d)
		s := d.DefaultStream()
		ok(t, aa.SetReleaseThreshold(math.MaxUint64))
		var ps []device.Ptr
		for range 4 {
			ps = append(ps, ptr(t)(aa.MallocAsync(4<<20, s)))
		}
		for _, p := range ps {
			ok(t, aa.FreeAsync(p, s))
		}
		syncStream(t, s)
		ok(t, aa.TrimPool(0))
		if res, used, err := aa.PoolUsage(); err != nil || res != 0 || used != 0 {
			t.Errorf("PoolUsage after TrimPool(0) = %d, %d, %v; want 0, 0, nil", res, used, err)
		}
	})
	t.Run("copies through pool memory", func(t *testing.T) {
		d := o.fresh(t)
		aa := asyncOf(t, d)
		backed(t, d)
		s := d.DefaultStream()
		p := ptr(t)(aa.MallocAsync(1000, s))
		ok(t, d.CopyHtoD(p, pattern(1000, 1), s))
		got := make([]byte, 1000)
		ok(t, d.CopyDtoH(got, p, s))
		ok(t, aa.FreeAsync(p, s))
		syncStream(t, s)
		if !bytes.Equal(got, pattern(1000, 1)) {
			t.Errorf("bytes through a MallocAsync block differ")
		}
	})
}

func testHostMemory(t *testing.T, o opener) {
	d := o.fresh(t)
	ha, isHA := d.(device.HostAllocator)
	if !isHA {
		t.Skip("device is no device.HostAllocator")
	}
	start := memFree(t, d)
	t.Run("pinned", func(t *testing.T) {
		b := hbuf(t)(ha.HostAlloc(10000, false))
		if len(b.Data) != 10000 || b.DevicePtr != 0 {
			t.Errorf("HostAlloc(10000, false) = %d bytes, device address %v; want 10000 bytes, none", len(b.Data), b.DevicePtr)
		}
		freeNear(t, d, memFree(t, d), start, "with pinned host memory (which takes no device memory)")
		ok(t, ha.HostFree(b))
		err := ha.HostFree(b)
		if !errors.Is(err, device.ErrDoubleFree) && !errors.Is(err, device.ErrInvalidPointer) {
			t.Errorf("second HostFree = %v; want ErrDoubleFree or ErrInvalidPointer", err)
		}
	})
	t.Run("mapped", func(t *testing.T) {
		backed(t, d)
		b := hbuf(t)(ha.HostAlloc(4096, true))
		defer func() { ok(t, ha.HostFree(b)) }()
		if b.DevicePtr == 0 {
			t.Fatal("mapped HostAlloc has no device address")
		}
		copy(b.Data, "host bytes seen by the device")
		p := ptr(t)(d.Malloc(4096))
		defer func() { ok(t, d.Free(p)) }()
		s := d.DefaultStream()
		ok(t, d.CopyDtoD(p, b.DevicePtr, 4096, s))
		got := make([]byte, 29)
		ok(t, d.CopyDtoH(got, p, s))
		syncStream(t, s)
		if string(got) != "host bytes seen by the device" {
			t.Errorf("device read %q through the mapped address", got)
		}
	})
}

func testMemcheck(t *testing.T, o opener) {
	t.Run("out of bounds", func(t *testing.T) {
		d := o.fresh(t)
		backed(t, d)
		s := d.DefaultStream()
		p := ptr(t)(d.Malloc(1000))
		q := ptr(t)(d.Malloc(1000))
		defer func() { ok(t, d.Free(p)); ok(t, d.Free(q)) }()
		ok(t, d.CopyHtoD(p, pattern(1000, 1), s))
		ok(t, d.CopyHtoD(q, pattern(1000, 2), s))
		cases := map[string]func() error{
			"HtoD past end":       func() error { return d.CopyHtoD(p.Add(999), []byte{1, 2}, s) },
			"DtoH past end":       func() error { return d.CopyDtoH(make([]byte, 1001), p, s) },
			"DtoD dst past end":   func() error { return d.CopyDtoD(p.Add(1), q, 1000, s) },
			"DtoD src past end":   func() error { return d.CopyDtoD(p, q.Add(500), 501, s) },
			"Memset past end":     func() error { return d.Memset(p, 0, 1001, s) },
			"Memset from the end": func() error { return d.Memset(p.Add(1000), 0, 1, s) },
		}
		for _, name := range sortedKeys(cases) {
			t.Run(name, func(t *testing.T) {
				isOnly(t, cases[name](), device.ErrOutOfBounds, name)
			})
		}
		// Refused means refused: not a byte written, here or next door.
		gotP, gotQ := make([]byte, 1000), make([]byte, 1000)
		ok(t, d.CopyDtoH(gotP, p, s))
		ok(t, d.CopyDtoH(gotQ, q, s))
		syncStream(t, s)
		if !bytes.Equal(gotP, pattern(1000, 1)) || !bytes.Equal(gotQ, pattern(1000, 2)) {
			t.Errorf("refused out-of-bounds accesses changed device memory")
		}
	})
	t.Run("use after free", func(t *testing.T) {
		d := o.fresh(t)
		backed(t, d)
		s := d.DefaultStream()
		p := ptr(t)(d.Malloc(1000))
		ok(t, d.Free(p))
		cases := map[string]func() error{
			"HtoD":   func() error { return d.CopyHtoD(p, []byte{1}, s) },
			"DtoH":   func() error { return d.CopyDtoH(make([]byte, 1), p.Add(10), s) },
			"Memset": func() error { return d.Memset(p, 0, 8, s) },
			// Moving no bytes does not make a freed pointer valid.
			"HtoD of 0 bytes":   func() error { return d.CopyHtoD(p, nil, s) },
			"Memset of 0 bytes": func() error { return d.Memset(p, 0, 0, s) },
		}
		for _, name := range sortedKeys(cases) {
			t.Run(name, func(t *testing.T) {
				isOnly(t, cases[name](), device.ErrUseAfterFree, name)
			})
		}
		if aa, isAA := d.(device.AsyncAllocator); isAA {
			q := ptr(t)(aa.MallocAsync(1000, s))
			ok(t, aa.FreeAsync(q, s))
			isOnly(t, d.CopyHtoD(q, []byte{1}, s), device.ErrUseAfterFree, "HtoD to a FreeAsync'd block")
		}
		syncStream(t, s)
	})
	t.Run("double free", func(t *testing.T) {
		d := o.fresh(t)
		p := ptr(t)(d.Malloc(1000))
		ok(t, d.Free(p))
		isOnly(t, d.Free(p), device.ErrDoubleFree, "second Free")
		if aa, isAA := d.(device.AsyncAllocator); isAA {
			s := d.DefaultStream()
			q := ptr(t)(aa.MallocAsync(1000, s))
			ok(t, aa.FreeAsync(q, s))
			isOnly(t, aa.FreeAsync(q, s), device.ErrDoubleFree, "second FreeAsync")
			syncStream(t, s)
		}
	})
	t.Run("invalid pointer", func(t *testing.T) {
		d := o.fresh(t)
		p := ptr(t)(d.Malloc(1000))
		defer func() { ok(t, d.Free(p)) }()
		isOnly(t, d.Free(0), device.ErrInvalidPointer, "Free(0)")
		isOnly(t, d.Free(p.Add(256)), device.ErrInvalidPointer, "Free of an interior pointer")
		isOnly(t, d.Free(p.Add(1<<40)), device.ErrInvalidPointer, "Free of an address never allocated")
		if d.Info().Backed {
			isOnly(t, d.CopyHtoD(0, []byte{1}, d.DefaultStream()), device.ErrInvalidPointer, "copy to the null pointer")
		}
	})
	t.Run("zero bytes", func(t *testing.T) {
		// Moving no bytes is allowed at the nil pointer and anywhere from
		// an allocation's start to just past its end; a pointer past that
		// is still checked.
		d := o.fresh(t)
		backed(t, d)
		s := d.DefaultStream()
		p := ptr(t)(d.Malloc(1000))
		defer func() { ok(t, d.Free(p)) }()
		for name, at := range map[string]device.Ptr{"nil": 0, "start": p, "inside": p.Add(500), "end": p.Add(1000)} {
			for op, err := range map[string]error{
				"HtoD":   d.CopyHtoD(at, nil, s),
				"DtoH":   d.CopyDtoH(nil, at, s),
				"Memset": d.Memset(at, 0, 0, s),
				"DtoD":   d.CopyDtoD(at, p, 0, s),
			} {
				if err != nil {
					t.Errorf("0-byte %s at %s (%v): %v", op, name, at, err)
				}
			}
		}
		if err := d.CopyHtoD(p.Add(1<<40), nil, s); err == nil {
			t.Errorf("0-byte HtoD at an address never allocated: nil error")
		}
		syncStream(t, s)
	})
	t.Run("pointer from another device", func(t *testing.T) {
		d1 := o.fresh(t)
		d2 := o.fresh(t)
		p := ptr(t)(d2.Malloc(1000))
		defer func() { ok(t, d2.Free(p)) }()
		err := d1.Free(p)
		isOnly(t, err, device.ErrInvalidPointer, "Free on one device of another's pointer")
		if d1.Info().Backed {
			isOnly(t, d1.CopyHtoD(p, []byte{1}, d1.DefaultStream()), device.ErrInvalidPointer, "copy to another device's pointer")
			q := ptr(t)(d1.Malloc(1000))
			defer func() { ok(t, d1.Free(q)) }()
			isOnly(t, d1.CopyDtoD(q, p, 8, d1.DefaultStream()), device.ErrInvalidPointer, "copy from another device's pointer")
		}
		if aa, isAA := d2.(device.AsyncAllocator); isAA {
			ap := ptr(t)(aa.MallocAsync(1000, d2.DefaultStream()))
			defer func() { ok(t, aa.FreeAsync(ap, d2.DefaultStream())); syncStream(t, d2.DefaultStream()) }()
			isOnly(t, d1.(device.AsyncAllocator).FreeAsync(ap, d1.DefaultStream()), device.ErrInvalidPointer, "FreeAsync on one device of another's MallocAsync pointer")
		}
	})
}

func testReset(t *testing.T, o opener) {
	d := o.fresh(t)
	start := memFree(t, d)
	p := ptr(t)(d.Malloc(1 << 20))
	s := strm(t)(d.NewStream())
	e := evt(t)(d.NewEvent())
	ok(t, e.Record(s))
	oldDefault := d.DefaultStream()
	aa, isAA := d.(device.AsyncAllocator)
	var ap device.Ptr
	if isAA {
		ap = ptr(t)(aa.MallocAsync(4096, s))
	}
	gd, isGen := d.(device.Generational)
	var gen uint64
	if isGen {
		gen = gd.Generation()
		// Work, allocations and frees do not move it; only Reset does.
		q := ptr(t)(d.Malloc(4096))
		ok(t, d.Free(q))
		ok(t, s.Synchronize())
		if g := gd.Generation(); g != gen {
			t.Errorf("Generation moved from %d to %d without a Reset", gen, g)
		}
	}
	ok(t, d.Reset())
	if isGen && gd.Generation() == gen {
		t.Errorf("Generation is still %d after Reset", gen)
	}
	freeNear(t, d, memFree(t, d), start, "after Reset (everything released)")
	if aa, isAA := d.(device.AsyncAllocator); isAA {
		if res, used, err := aa.PoolUsage(); err != nil || res != 0 || used != 0 {
			t.Errorf("PoolUsage after Reset = %d reserved, %d used, %v; want 0, 0, nil", res, used, err)
		}
	}
	// Every use of what came before fails. Nothing is allocated until
	// these are checked: a driver may hand the old addresses out again,
	// and then an old pointer is indistinguishable from a new one.
	ns := d.DefaultStream()
	type use struct {
		call    func() error
		pointer bool // a pointer from before the Reset: ErrInvalidated and no other memcheck error
	}
	uses := map[string]use{
		"Free of a Malloc pointer":       {func() error { return d.Free(p) }, true},
		"Stream.Synchronize":             {func() error { return s.Synchronize() }, false},
		"Stream.Query":                   {func() error { _, err := s.Query(); return err }, false},
		"old default stream Synchronize": {func() error { return oldDefault.Synchronize() }, false},
		"Event.Record on the new stream": {func() error { return e.Record(ns) }, false},
		"Event.Wait by the new stream":   {func() error { return e.Wait(ns) }, false},
		"Event.Query":                    {func() error { _, err := e.Query(); return err }, false},
		"Event.Synchronize":              {func() error { return e.Synchronize() }, false},
		"new event recorded on an old stream": {func() error {
			e2, err := d.NewEvent()
			if err != nil {
				return err
			}
			defer e2.Close()
			return e2.Record(s)
		}, false},
	}
	if d.Info().Backed {
		uses["copy to an old pointer"] = use{func() error { return d.CopyHtoD(p, []byte{1}, ns) }, true}
		uses["copy from an old pointer"] = use{func() error { return d.CopyDtoH(make([]byte, 8), p.Add(8), ns) }, true}
		uses["memset of an old pointer"] = use{func() error { return d.Memset(p, 0, 8, ns) }, true}
		uses["copy on the old default stream"] = use{func() error { return d.CopyHtoD(p, []byte{1}, oldDefault) }, false}
		uses["copy on an old stream"] = use{func() error { return d.CopyDtoH(make([]byte, 1), p, s) }, false}
	}
	if isAA {
		uses["MallocAsync on an old stream"] = use{func() error { _, err := aa.MallocAsync(10, s); return err }, false}
		uses["FreeAsync of an old MallocAsync pointer"] = use{func() error { return aa.FreeAsync(ap, ns) }, true}
	}
	if fl, isFL := d.(device.FuncLauncher); isFL && d.Info().Backed {
		uses["LaunchFunc on an old stream"] = use{func() error {
			return fl.LaunchFunc(s, 1, func(device.View, int, int) error { return nil })
		}, false}
	}
	for _, name := range sortedKeys(uses) {
		u := uses[name]
		t.Run(name, func(t *testing.T) {
			if u.pointer {
				isOnly(t, u.call(), device.ErrInvalidated, name)
			} else {
				isErr(t, u.call(), device.ErrInvalidated, name)
			}
		})
	}
	t.Run("closing old streams and events", func(t *testing.T) {
		isErr(t, s.Close(), device.ErrInvalidated, "Close of a stream from before Reset")
		isErr(t, e.Close(), device.ErrInvalidated, "Close of an event from before Reset")
	})
	// The device works afterwards, with a new default stream.
	q := ptr(t)(d.Malloc(1 << 20))
	defer func() { ok(t, d.Free(q)) }()
	if d.Info().Backed {
		ok(t, d.CopyHtoD(q, []byte("after reset"), ns))
		got := make([]byte, 11)
		ok(t, d.CopyDtoH(got, q, ns))
		syncStream(t, ns)
		if string(got) != "after reset" {
			t.Errorf("a copy round trip after Reset read %q", got)
		}
	}
	s2 := strm(t)(d.NewStream())
	syncStream(t, s2)
	ok(t, s2.Close())
}

func testBadInputs(t *testing.T, o opener) {
	d := o.fresh(t)
	s := d.DefaultStream()
	cases := map[string]struct {
		call func() error
		want error
	}{
		"Malloc zero": {func() error { _, err := d.Malloc(0); return err }, device.ErrInvalidValue},
		"Malloc more than total": {func() error {
			_, err := d.Malloc(d.Info().TotalBytes + 1)
			return err
		}, device.ErrOutOfMemory},
		"Malloc max": {func() error { _, err := d.Malloc(math.MaxUint64); return err }, device.ErrOutOfMemory},
		"copy on nil stream": {func() error {
			return d.CopyHtoD(1, []byte{1}, nil)
		}, device.ErrInvalidValue},
		"event record on nil stream": {func() error {
			e, err := d.NewEvent()
			if err != nil {
				return err
			}
			defer e.Close()
			return e.Record(nil)
		}, device.ErrInvalidValue},
	}
	if aa, isAA := d.(device.AsyncAllocator); isAA {
		cases["MallocAsync zero"] = struct {
			call func() error
			want error
		}{func() error { _, err := aa.MallocAsync(0, s); return err }, device.ErrInvalidValue}
		cases["MallocAsync nil stream"] = struct {
			call func() error
			want error
		}{func() error { _, err := aa.MallocAsync(8, nil); return err }, device.ErrInvalidValue}
	}
	if ha, isHA := d.(device.HostAllocator); isHA {
		cases["HostAlloc zero"] = struct {
			call func() error
			want error
		}{func() error { _, err := ha.HostAlloc(0, false); return err }, device.ErrInvalidValue}
	}
	if fl, isFL := d.(device.FuncLauncher); isFL && d.Info().Backed {
		cases["LaunchFunc zero range"] = struct {
			call func() error
			want error
		}{func() error { return fl.LaunchFunc(s, 0, func(device.View, int, int) error { return nil }) }, device.ErrInvalidValue}
		cases["LaunchFunc nil func"] = struct {
			call func() error
			want error
		}{func() error { return fl.LaunchFunc(s, 1, nil) }, device.ErrInvalidValue}
		cases["LaunchFunc negative range"] = struct {
			call func() error
			want error
		}{func() error { return fl.LaunchFunc(s, -1, func(device.View, int, int) error { return nil }) }, device.ErrInvalidValue}
	}
	if aa, isAA := d.(device.AsyncAllocator); isAA {
		cases["MallocAsync more than total"] = struct {
			call func() error
			want error
		}{func() error { _, err := aa.MallocAsync(d.Info().TotalBytes+1, s); return err }, device.ErrOutOfMemory}
		cases["MallocAsync max"] = struct {
			call func() error
			want error
		}{func() error { _, err := aa.MallocAsync(math.MaxUint64, s); return err }, device.ErrOutOfMemory}
		cases["FreeAsync null"] = struct {
			call func() error
			want error
		}{func() error { return aa.FreeAsync(0, s) }, device.ErrInvalidPointer}
	}
	for _, name := range sortedKeys(cases) {
		tc := cases[name]
		t.Run(name, func(t *testing.T) {
			free := memFree(t, d)
			isErr(t, tc.call(), tc.want, name)
			freeNear(t, d, memFree(t, d), free, "after a failed call")
		})
	}
	t.Run("stream from another device", func(t *testing.T) {
		d2 := o.fresh(t)
		s2 := strm(t)(d2.NewStream())
		defer func() { ok(t, s2.Close()) }()
		e := evt(t)(d.NewEvent())
		defer func() { ok(t, e.Close()) }()
		isErr(t, e.Record(s2), device.ErrInvalidValue, "Record on another device's stream")
		isErr(t, e2Wait(d, s2), device.ErrInvalidValue, "Wait by another device's stream")
		if d.Info().Backed {
			p := ptr(t)(d.Malloc(8))
			defer func() { ok(t, d.Free(p)) }()
			isErr(t, d.CopyHtoD(p, []byte{1}, s2), device.ErrInvalidValue, "copy on another device's stream")
		}
		if aa, isAA := d.(device.AsyncAllocator); isAA {
			free := memFree(t, d)
			_, err := aa.MallocAsync(8, s2)
			isErr(t, err, device.ErrInvalidValue, "MallocAsync on another device's stream")
			freeNear(t, d, memFree(t, d), free, "after a refused MallocAsync, another device's stream open")
		}
	})
}

// e2Wait makes an event on d, records it on d's default stream and waits
// for it from s.
func e2Wait(d device.Device, s device.Stream) error {
	e, err := d.NewEvent()
	if err != nil {
		return err
	}
	defer e.Close()
	if err := e.Record(d.DefaultStream()); err != nil {
		return err
	}
	return e.Wait(s)
}

func testClosed(t *testing.T, o opener) {
	t.Run("device", func(t *testing.T) {
		d := o.fresh(t)
		s := d.DefaultStream()
		ns := strm(t)(d.NewStream())
		e := evt(t)(d.NewEvent())
		ok(t, e.Record(ns))
		ok(t, ns.Close())
		ok(t, e.Close())
		e2 := evt(t)(d.NewEvent()) // left open: Close takes it down
		ok(t, d.Close())
		calls := map[string]func() error{
			"MemInfo":     func() error { _, _, err := d.MemInfo(); return err },
			"Malloc":      func() error { _, err := d.Malloc(8); return err },
			"Free":        func() error { return d.Free(1) },
			"NewStream":   func() error { _, err := d.NewStream(); return err },
			"NewEvent":    func() error { _, err := d.NewEvent(); return err },
			"CopyHtoD":    func() error { return d.CopyHtoD(1, []byte{1}, s) },
			"CopyDtoH":    func() error { return d.CopyDtoH([]byte{1}, 1, s) },
			"CopyDtoD":    func() error { return d.CopyDtoD(1, 2, 1, s) },
			"Memset":      func() error { return d.Memset(1, 0, 1, s) },
			"Synchronize": func() error { return d.Synchronize() },
			"Reset":       func() error { return d.Reset() },
			"Close":       func() error { return d.Close() },
			"Stream.Sync": func() error { return s.Synchronize() },
			"Stream.Query": func() error {
				_, err := s.Query()
				return err
			},
			"Event.Record":      func() error { return e2.Record(s) },
			"Event.Query":       func() error { _, err := e2.Query(); return err },
			"Event.Synchronize": func() error { return e2.Synchronize() },
			"Event.Wait":        func() error { return e2.Wait(s) },
		}
		if aa, isAA := d.(device.AsyncAllocator); isAA {
			calls["MallocAsync"] = func() error { _, err := aa.MallocAsync(8, s); return err }
			calls["FreeAsync"] = func() error { return aa.FreeAsync(1, s) }
			calls["PoolUsage"] = func() error { _, _, err := aa.PoolUsage(); return err }
			calls["SetReleaseThreshold"] = func() error { return aa.SetReleaseThreshold(0) }
			calls["TrimPool"] = func() error { return aa.TrimPool(0) }
		}
		if ha, isHA := d.(device.HostAllocator); isHA {
			calls["HostAlloc"] = func() error { _, err := ha.HostAlloc(8, false); return err }
			calls["HostFree"] = func() error { return ha.HostFree(device.HostBuffer{Data: make([]byte, 8)}) }
		}
		if fl, isFL := d.(device.FuncLauncher); isFL {
			calls["LaunchFunc"] = func() error {
				return fl.LaunchFunc(s, 1, func(device.View, int, int) error { return nil })
			}
		}
		if sc, isSC := d.(device.StridedCopier); isSC {
			calls["CopyHtoD2D"] = func() error { return sc.CopyHtoD2D(1, 8, make([]byte, 16), 8, 8, 2, s) }
			calls["CopyDtoH2D"] = func() error { return sc.CopyDtoH2D(make([]byte, 16), 8, 1, 8, 8, 2, s) }
		}
		for _, name := range sortedKeys(calls) {
			t.Run(name, func(t *testing.T) {
				isErr(t, calls[name](), device.ErrClosed, name+" on a closed device")
			})
		}
	})
	t.Run("stream", func(t *testing.T) {
		d := o.fresh(t)
		s := strm(t)(d.NewStream())
		ok(t, s.Close())
		isErr(t, s.Synchronize(), device.ErrClosed, "Synchronize of a closed stream")
		isErr(t, s.Close(), device.ErrClosed, "second Close of a stream")
		e := evt(t)(d.NewEvent())
		isErr(t, e.Record(s), device.ErrClosed, "Record on a closed stream")
		ok(t, e.Close())
		isErr(t, e.Close(), device.ErrClosed, "second Close of an event")
		isErr(t, e.Record(d.DefaultStream()), device.ErrClosed, "Record of a closed event")
		ok(t, d.DefaultStream().Close()) // a no-op
		syncStream(t, d.DefaultStream())
	})
}

func testConcurrency(t *testing.T, o opener) {
	d := o.fresh(t)
	start := memFree(t, d)
	const workers, rounds = 8, 50
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s, err := d.NewStream()
			if err != nil {
				errs <- err
				return
			}
			defer s.Close()
			aa, isAA := d.(device.AsyncAllocator)
			for i := range rounds {
				n := uint64(1+w) * 4096 * uint64(1+i%3)
				p, err := d.Malloc(n)
				if err != nil {
					errs <- err
					return
				}
				if d.Info().Backed {
					if err := d.Memset(p, byte(w), n, s); err != nil {
						errs <- err
						return
					}
				}
				if isAA {
					q, err := aa.MallocAsync(n, s)
					if err != nil {
						errs <- err
						return
					}
					if err := aa.FreeAsync(q, s); err != nil {
						errs <- err
						return
					}
				}
				if err := s.Synchronize(); err != nil {
					errs <- err
					return
				}
				if err := d.Free(p); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	within(t, "concurrent workers", wg.Wait)
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if aa, isAA := d.(device.AsyncAllocator); isAA {
		ok(t, aa.TrimPool(0))
	}
	freeNear(t, d, memFree(t, d), start, "after concurrent alloc/free")
}

func testDeviceSync(t *testing.T, o opener) {
	d := o.fresh(t)
	backed(t, d)
	var streams []device.Stream
	var ptrs []device.Ptr
	var outs [][]byte
	for i := range 4 {
		s := strm(t)(d.NewStream())
		streams = append(streams, s)
		p := ptr(t)(d.Malloc(512))
		ptrs = append(ptrs, p)
		ok(t, d.CopyHtoD(p, pattern(512, byte(i)), s))
		out := make([]byte, 512)
		ok(t, d.CopyDtoH(out, p, s))
		outs = append(outs, out)
	}
	within(t, "Device.Synchronize", func() { ok(t, d.Synchronize()) })
	for i, out := range outs {
		if !bytes.Equal(out, pattern(512, byte(i))) {
			t.Errorf("stream %d's copies had not finished after Device.Synchronize", i)
		}
		if done, err := streams[i].Query(); !done || err != nil {
			t.Errorf("stream %d Query after Device.Synchronize = %v, %v", i, done, err)
		}
	}
	for i := range streams {
		ok(t, streams[i].Close())
		ok(t, d.Free(ptrs[i]))
	}
}

func testStreamCloseWaits(t *testing.T, o opener) {
	d := o.fresh(t)
	backed(t, d)
	s := strm(t)(d.NewStream())
	p := ptr(t)(d.Malloc(1 << 16))
	defer func() { ok(t, d.Free(p)) }()
	ok(t, d.CopyHtoD(p, pattern(1<<16, 5), s))
	out := make([]byte, 1<<16)
	ok(t, d.CopyDtoH(out, p, s))
	within(t, "Stream.Close", func() { ok(t, s.Close()) })
	if !bytes.Equal(out, pattern(1<<16, 5)) {
		t.Errorf("Stream.Close returned before its work finished")
	}
}

// hostBytes returns n zeroed host bytes for a copy that is enqueued behind
// held work. On a device with pinned host memory they are pinned: a driver
// may complete a copy to or from ordinary (pageable) memory before
// returning (CUDA does), which would block on the held stream forever.
// Elsewhere they are ordinary Go memory.
func hostBytes(t *testing.T, d device.Device, n int) []byte {
	t.Helper()
	ha, isHost := d.(device.HostAllocator)
	if !isHost {
		return make([]byte, n)
	}
	b, err := ha.HostAlloc(uint64(n), false)
	if err != nil {
		t.Fatalf("HostAlloc(%d) for a copy behind held work: %v", n, err)
	}
	t.Cleanup(func() {
		if err := ha.HostFree(b); err != nil {
			t.Errorf("HostFree: %v", err)
		}
	})
	clear(b.Data)
	return b.Data[:n]
}

// hostText is hostBytes holding s.
func hostText(t *testing.T, d device.Device, s string) []byte {
	t.Helper()
	b := hostBytes(t, d, len(s))
	copy(b, s)
	return b
}
