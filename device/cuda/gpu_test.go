package cuda

// Tests and benchmarks that need a GPU. Each skips, saying why, where the
// CUDA backend cannot open device 0.

import (
	"bytes"
	_ "embed"
	"errors"
	"fmt"
	"math"
	"os"
	"testing"
	"time"

	"github.com/vramkit/vram/alloc"
	"github.com/vramkit/vram/alloc/alloctest"
	"github.com/vramkit/vram/device"
	"github.com/vramkit/vram/device/devicetest"
)

// TestConformance runs the device conformance suite with one Device held
// open throughout, so that the primary context is not destroyed and made
// again for each of the suite's fifty-odd opens (each a context creation
// on a real GPU).
func TestConformance(t *testing.T) {
	openOrSkip(t) // held until the test ends
	devicetest.Run(t, func(t *testing.T) device.Device {
		d, err := Open(0)
		if err != nil {
			t.Fatalf("cuda.Open(0): %v", err)
		}
		return d
	})
}

// holdEnv names a file for TestHoldDevice to write once it holds device 0.
const holdEnv = "VRAM_GPU_CHECK_HOLD"

// TestHoldDevice is scripts/gpu-check.sh's keeper, skipped otherwise: it
// opens device 0, writes "ready" to the file named by VRAM_GPU_CHECK_HOLD,
// and holds the device until that file is removed (or 20 minutes pass).
// Without persistence mode the driver tears a GPU down when no process
// holds it, so every check would pay a cold cuInit; held, only this one
// does.
func TestHoldDevice(t *testing.T) {
	file := os.Getenv(holdEnv)
	if file == "" {
		t.Skip("run by scripts/gpu-check.sh (set " + holdEnv + ")")
	}
	d := openOrSkip(t)
	if err := os.WriteFile(file, []byte("ready "+d.Info().Name+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(20 * time.Minute); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		if _, err := os.Stat(file); errors.Is(err, os.ErrNotExist) {
			return
		}
	}
}

// TestStickyErrorOnGPU makes a kernel store to address 0x10 and checks
// that the device reports the sticky error (ErrNeedsReset, Device.Err) and
// refuses work until Reset, and then whether Reset recovers the context
// (the driver promises recovery only by restarting the process). It breaks
// the context of its process, so it runs only when asked, alone:
// scripts/gpu-check.sh's last step sets VRAM_GPU_CHECK_STICKY=1.
func TestStickyErrorOnGPU(t *testing.T) {
	if os.Getenv("VRAM_GPU_CHECK_STICKY") == "" {
		t.Skip("breaks the CUDA context: run alone by scripts/gpu-check.sh (set VRAM_GPU_CHECK_STICKY=1)")
	}
	d := openOrSkip(t)
	mod, err := d.LoadPTX(fillPTX)
	if err != nil {
		t.Fatal(err)
	}
	fn, err := mod.Function("fill")
	if err != nil {
		t.Fatal(err)
	}
	s := d.DefaultStream()
	err = fn.Launch(s, device.Dim3{X: 1, Y: 1, Z: 1}, device.Dim3{X: 1, Y: 1, Z: 1}, 0, uint64(0x10), uint32(1), float32(1), 1.0)
	if err == nil {
		err = s.Synchronize() // on a GPU the fault shows here
	}
	if !errors.Is(err, ErrNeedsReset) {
		t.Fatalf("a kernel storing to 0x10: %v; want a sticky error (ErrNeedsReset)", err)
	}
	t.Logf("the fault: %v", err)
	if d.Err() == nil {
		t.Error("Device.Err() is nil after a sticky error")
	}
	if _, err := d.Malloc(4096); !errors.Is(err, ErrNeedsReset) {
		t.Errorf("Malloc after a sticky error = %v; want ErrNeedsReset", err)
	}
	if err := d.Reset(); err != nil {
		t.Fatalf("Reset after a sticky error: %v", err)
	}
	p, err := d.Malloc(4096)
	if err == nil {
		err = d.Memset(p, 1, 4096, d.DefaultStream())
	}
	if err == nil {
		err = d.Synchronize()
	}
	if err != nil {
		t.Errorf("after Reset the context still fails (%v): a sticky error needs a new process here", err)
	} else {
		t.Log("Reset recovered the context after the sticky error")
		d.Free(p)
	}
}

// allocators are the allocator kinds exercised on the GPU: Expandable is
// what the manager and libvram use by default on CUDA (kind pool on a
// device with virtual memory).
var allocators = map[string]func(dev device.Device) (alloc.Allocator, error){
	"Direct":    func(dev device.Device) (alloc.Allocator, error) { return alloc.NewDirect(dev), nil },
	"Pool":      func(dev device.Device) (alloc.Allocator, error) { return alloc.NewPool(dev, alloc.PoolConfig{}) },
	"AsyncPool": func(dev device.Device) (alloc.Allocator, error) { return alloc.NewAsyncPool(dev, alloc.AsyncConfig{}) },
	"Expandable": func(dev device.Device) (alloc.Allocator, error) {
		return alloc.NewExpandable(dev, alloc.ExpandableConfig{})
	},
}

// TestAllocatorConformance holds Direct, Pool, AsyncPool and Expandable
// over the CUDA device to the allocator contract (alloctest.RunOn), each
// subtest on a freshly opened Device. One Device stays open throughout so
// that the primary context is not destroyed and made again between
// subtests.
func TestAllocatorConformance(t *testing.T) {
	openOrSkip(t) // held until the test ends
	open := func(t *testing.T) device.Device {
		d, err := Open(0)
		if err != nil {
			t.Fatalf("cuda.Open(0): %v", err)
		}
		return d
	}
	for name, mk := range allocators {
		t.Run(name, func(t *testing.T) {
			alloctest.RunOn(t, open, func(t *testing.T, dev device.Device) alloc.Allocator {
				a, err := mk(dev)
				if err != nil {
					t.Fatalf("new %s: %v", name, err)
				}
				return a
			})
		})
	}
}

// TestAllocatorsOnCUDA runs each allocator through a round of allocations
// of assorted sizes on two streams, writes and reads every block, checks
// that live blocks do not overlap, frees on the other stream, and checks
// that Trim and Close give the device its memory back: the allocator and
// the driver's pool hold nothing (exact), and the device's free memory is
// back (see memBack).
func TestAllocatorsOnCUDA(t *testing.T) {
	if why := probe(); why != "" {
		t.Skipf("no CUDA device: %s", why)
	}
	for name, mk := range allocators {
		t.Run(name, func(t *testing.T) {
			d := openOrSkip(t)
			s1 := d.DefaultStream()
			s2, err := d.NewStream()
			if err != nil {
				t.Fatal(err)
			}
			defer s2.Close()
			start := warmFree(t, d, s1, s2)
			a, err := mk(d)
			if err != nil {
				t.Fatal(err)
			}
			type blk struct {
				p device.Ptr
				n uint64
			}
			var live []blk
			for i, n := range []uint64{1, 512, 4096, 1 << 20, 3<<20 + 7, 12 << 20, 64 << 20, 100} {
				p, err := a.Alloc(n, s1)
				if err != nil {
					t.Fatalf("Alloc(%d): %v", n, err)
				}
				for _, b := range live {
					if uint64(p) < uint64(b.p)+b.n && uint64(b.p) < uint64(p)+n {
						t.Fatalf("Alloc(%d) = %v overlaps live block %v of %d", n, p, b.p, b.n)
					}
				}
				live = append(live, blk{p, n})
				if err := d.Memset(p, byte(i+1), n, s1); err != nil {
					t.Fatal(err)
				}
			}
			for i, b := range live {
				got := make([]byte, b.n)
				if err := d.CopyDtoH(got, b.p, s1); err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(got, bytes.Repeat([]byte{byte(i + 1)}, int(b.n))) {
					t.Fatalf("block %d (%d bytes) does not hold what was written", i, b.n)
				}
			}
			if err := s1.Synchronize(); err != nil {
				t.Fatal(err)
			}
			for _, b := range live {
				if err := a.Free(b.p, s2); err != nil {
					t.Fatalf("Free(%v) on another stream: %v", b.p, err)
				}
			}
			if st := a.Stats(); st.InUse != 0 || st.Allocs != uint64(len(live)) || st.Frees != uint64(len(live)) {
				t.Errorf("Stats after freeing everything: %+v", st)
			}
			if err := d.Synchronize(); err != nil {
				t.Fatal(err)
			}
			if err := a.Trim(); err != nil {
				t.Fatal(err)
			}
			if st := a.Stats(); st.Reserved != 0 {
				t.Errorf("Stats.Reserved = %d after freeing everything and Trim; want 0", st.Reserved)
			}
			if err := a.Close(); err != nil {
				t.Fatal(err)
			}
			if err := d.Synchronize(); err != nil {
				t.Fatal(err)
			}
			if err := d.TrimPool(0); err != nil {
				t.Fatal(err)
			}
			if res, used, err := d.PoolUsage(); err != nil || res != 0 || used != 0 {
				t.Errorf("the driver's pool after Close and TrimPool(0): %d reserved, %d used, %v; want 0, 0", res, used, err)
			}
			memBack(t, d, start, "after Close")
		})
	}
}

// driverSlack is how far a real driver moves free memory for reasons of
// its own between two readings a test expects to be equal (internal
// modules loaded on first use, resources of streams and of the pool): the
// device conformance suite's tolerance on CUDA (devicetest's cudaMemSlack).
const driverSlack = 16 << 20

// warmFree makes the driver take, before a test measures free memory, the
// memory it takes lazily on first use (a memset and a copy each way on
// every stream given), and returns the free memory then.
func warmFree(t *testing.T, d *Device, streams ...device.Stream) uint64 {
	t.Helper()
	p, err := d.Malloc(4096)
	if err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 64)
	for _, s := range streams {
		for _, err := range []error{d.Memset(p, 1, 64, s), d.CopyHtoD(p, b, s), d.CopyDtoH(b, p, s), s.Synchronize()} {
			if err != nil {
				t.Fatalf("warming up: %v", err)
			}
		}
	}
	if err := d.Free(p); err != nil {
		t.Fatal(err)
	}
	free, _, err := d.MemInfo()
	if err != nil {
		t.Fatal(err)
	}
	return free
}

// memBack checks that d's free memory is back at start: exactly on the
// stand-in driver, whose own memory moves only on the first use and with
// streams (warmFree took both), and within driverSlack on a GPU.
func memBack(t *testing.T, d *Device, start uint64, when string) {
	t.Helper()
	end, _, err := d.MemInfo()
	if err != nil {
		t.Fatal(err)
	}
	slack := uint64(driverSlack)
	if os.Getenv(fakeEnv) != "" {
		slack = 0
	}
	if diff := max(end, start) - min(end, start); diff > slack {
		t.Errorf("free memory %d %s, want %d as before (within %d bytes)", end, when, start, slack)
	}
}

// fillPTX is a small kernel: p[i] = a*i + b for i < n, as float32.
//
//go:embed testdata/fill.ptx
var fillPTX string

func TestLaunchPTX(t *testing.T) {
	d := openOrSkip(t)
	mod, err := d.LoadPTX(fillPTX)
	if err != nil {
		t.Fatal(err)
	}
	defer mod.Close()
	fn, err := mod.Function("fill")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := mod.Function("nosuch"); err == nil {
		t.Error(`Function("nosuch") found a kernel`)
	}
	const n = 1000
	p, err := d.Malloc(4 * (n + 24))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Free(p)
	s := d.DefaultStream()
	if err := d.Memset(p, 0, 4*(n+24), s); err != nil {
		t.Fatal(err)
	}
	if err := fn.Launch(s, device.Dim3{X: (n + 127) / 128, Y: 1, Z: 1}, device.Dim3{X: 128, Y: 1, Z: 1}, 0,
		p, uint32(n), float32(0.5), 3.0); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 4*(n+24))
	if err := d.CopyDtoH(got, p, s); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < n+24; i++ {
		v := math.Float32frombits(uint32(got[4*i]) | uint32(got[4*i+1])<<8 | uint32(got[4*i+2])<<16 | uint32(got[4*i+3])<<24)
		want := float32(0)
		if i < n {
			want = 0.5*float32(i) + 3
		}
		if v != want {
			t.Fatalf("p[%d] = %v, want %v", i, v, want)
		}
	}
	bad := map[string][]any{
		"too few":       {p, uint32(n), float32(1)},
		"wrong width":   {p, uint64(n), float32(1), 1.0},
		"freed pointer": {device.Ptr(0), uint32(n), float32(1), 1.0},
	}
	q, _ := d.Malloc(64)
	d.Free(q)
	bad["freed pointer"][0] = q
	for name, args := range bad {
		if err := fn.Launch(s, device.Dim3{X: 1, Y: 1, Z: 1}, device.Dim3{X: 1, Y: 1, Z: 1}, 0, args...); err == nil {
			t.Errorf("Launch with %s arguments succeeded", name)
		}
	}
	if _, err := d.LoadPTX(".version 7.0\n.target sm_52\n.address_size 64\n.visible .entry broken() { bogus.instruction; }"); err == nil {
		t.Error("LoadPTX of broken PTX succeeded")
	} else {
		t.Logf("broken PTX is refused: %v", err)
	}
	if err := s.Synchronize(); err != nil {
		t.Fatal(err)
	}
}

func TestPinnedCopiesAreAsync(t *testing.T) {
	d := openOrSkip(t)
	const n = 32 << 20
	h, err := d.HostAlloc(n, false)
	if err != nil {
		t.Fatal(err)
	}
	defer d.HostFree(h)
	for i := range h.Data {
		h.Data[i] = byte(i * 13)
	}
	p, err := d.Malloc(n)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Free(p)
	s, err := d.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := d.CopyHtoD(p, h.Data, s); err != nil {
		t.Fatal(err)
	}
	back, err := d.HostAlloc(n, false)
	if err != nil {
		t.Fatal(err)
	}
	defer d.HostFree(back)
	if err := d.CopyDtoH(back.Data, p, s); err != nil {
		t.Fatal(err)
	}
	done, err := s.Query()
	t.Logf("pinned 32 MiB round trip done at return of CopyDtoH: %v (%v)", done, err)
	if err := s.Synchronize(); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(back.Data, h.Data) {
		t.Fatal("pinned round trip changed the bytes")
	}
	// A slice of a pinned buffer is pinned too; a Go slice is not.
	d.mu.Lock()
	pinnedPart, pinnedGo := d.pinnedLocked(h.Data[100:200]), d.pinnedLocked(make([]byte, 100))
	d.mu.Unlock()
	if !pinnedPart || pinnedGo {
		t.Errorf("pinnedLocked(slice of a pinned buffer) = %v, (Go slice) = %v; want true, false", pinnedPart, pinnedGo)
	}
}

func TestResetAcrossDevices(t *testing.T) {
	d1 := openOrSkip(t)
	d2 := openOrSkip(t)
	p, err := d2.Malloc(1 << 20)
	if err != nil {
		t.Fatal(err)
	}
	h, err := d2.HostAlloc(4096, true)
	if err != nil {
		t.Fatal(err)
	}
	s, err := d2.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	if err := d1.Reset(); err != nil {
		t.Fatal(err)
	}
	if err := d2.Free(p); !errors.Is(err, device.ErrInvalidated) {
		t.Errorf("Free on device 2 of a pointer from before device 1's Reset = %v; want ErrInvalidated", err)
	}
	if err := s.Synchronize(); !errors.Is(err, device.ErrInvalidated) {
		t.Errorf("stream of device 2 after device 1's Reset: %v; want ErrInvalidated", err)
	}
	copy(h.Data, "still mapped") // the host memory outlives the reset
	if err := d2.HostFree(h); !errors.Is(err, device.ErrInvalidated) {
		t.Errorf("HostFree of a buffer from before the Reset = %v; want ErrInvalidated", err)
	}
	q, err := d2.Malloc(1 << 20)
	if err != nil {
		t.Fatalf("Malloc after Reset: %v", err)
	}
	if err := d2.Free(q); err != nil {
		t.Fatal(err)
	}
}

func benchSizes() map[string]uint64 {
	return map[string]uint64{"2MiB": 2 << 20, "64MiB": 64 << 20}
}

// BenchmarkMallocFree is one cuMemAlloc + cuMemFree pair through the
// Device.
func BenchmarkMallocFree(b *testing.B) {
	d := openOrSkip(b)
	for name, n := range benchSizes() {
		b.Run(name, func(b *testing.B) {
			for b.Loop() {
				p, err := d.Malloc(n)
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

// BenchmarkMallocAsyncFreeAsync is one cuMemAllocAsync + cuMemFreeAsync
// pair on one stream, the pool keeping its memory (threshold at maximum):
// the driver pool's steady state.
func BenchmarkMallocAsyncFreeAsync(b *testing.B) {
	d := openOrSkip(b)
	if err := d.SetReleaseThreshold(math.MaxUint64); err != nil {
		b.Skip(err)
	}
	s, err := d.NewStream()
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	for name, n := range benchSizes() {
		b.Run(name, func(b *testing.B) {
			for b.Loop() {
				p, err := d.MallocAsync(n, s)
				if err != nil {
					b.Fatal(err)
				}
				if err := d.FreeAsync(p, s); err != nil {
					b.Fatal(err)
				}
			}
			if err := s.Synchronize(); err != nil {
				b.Fatal(err)
			}
		})
	}
}

// BenchmarkPoolHit is one Alloc + Free pair on alloc.Pool over the CUDA
// device once the block is cached: no driver call at all.
func BenchmarkPoolHit(b *testing.B) {
	d := openOrSkip(b)
	pool, err := alloc.NewPool(d, alloc.PoolConfig{})
	if err != nil {
		b.Fatal(err)
	}
	defer pool.Close()
	s := d.DefaultStream()
	for name, n := range benchSizes() {
		b.Run(name, func(b *testing.B) {
			p, err := pool.Alloc(n, s)
			if err != nil {
				b.Fatal(err)
			}
			pool.Free(p, s)
			for b.Loop() {
				p, err := pool.Alloc(n, s)
				if err != nil {
					b.Fatal(err)
				}
				if err := pool.Free(p, s); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

const copyBytes = 64 << 20

// copySetup makes a pinned buffer, a device buffer and a stream.
func copySetup(b *testing.B) (*Device, device.HostBuffer, device.Ptr, *stream) {
	d := openOrSkip(b)
	h, err := d.HostAlloc(copyBytes, false)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { d.HostFree(h) })
	p, err := d.Malloc(copyBytes)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { d.Free(p) })
	s, err := d.NewStream()
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { s.Close() })
	b.SetBytes(copyBytes)
	return d, h, p, s.(*stream)
}

// BenchmarkCopy measures pinned 64 MiB copies, each followed by a stream
// synchronize, through the Device API ("api") and as a raw loop of driver
// calls on the same buffers without the Device layer ("raw"). The
// difference is the layer's cost.
func BenchmarkCopy(b *testing.B) {
	for _, dir := range []string{"HtoD", "DtoH"} {
		for _, how := range []string{"api", "raw"} {
			b.Run(fmt.Sprintf("%s/%s", dir, how), func(b *testing.B) {
				d, h, p, s := copySetup(b)
				var step func() error
				switch dir + "/" + how {
				case "HtoD/api":
					step = func() error { return firstErr(d.CopyHtoD(p, h.Data, s), s.Synchronize()) }
				case "DtoH/api":
					step = func() error { return firstErr(d.CopyDtoH(h.Data, p, s), s.Synchronize()) }
				case "HtoD/raw":
					step = rawLoop(b, d, func() Result { return d.lib.memcpyHtoDAsync(uint64(p), h.Data, s.h) }, s.h)
				case "DtoH/raw":
					step = rawLoop(b, d, func() Result { return d.lib.memcpyDtoHAsync(h.Data, uint64(p), s.h) }, s.h)
				}
				if err := step(); err != nil { // warm up
					b.Fatal(err)
				}
				b.ResetTimer()
				for b.Loop() {
					if err := step(); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

// rawLoop makes the context current on this goroutine's locked thread for
// the rest of the benchmark and returns one copy and synchronize as bare
// driver calls: what a program calling the driver directly would do.
func rawLoop(b *testing.B, d *Device, cp func() Result, s uintptr) func() error {
	if err := d.enter(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(d.exit)
	return func() error {
		if r := cp(); r != Success {
			return r
		}
		if r := d.lib.streamSynchronize(s); r != Success {
			return r
		}
		return nil
	}
}

func firstErr(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}
