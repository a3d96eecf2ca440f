package cuda_test

// The memory manager's copies (package vram: ToDevice and FromDevice on
// pinned host arrays) on the CUDA backend, against a raw loop of driver
// calls on the same GPU in the same benchmark. Issue 6 asks for the
// manager's pinned copies at 90% or more of the raw bandwidth;
// scripts/gpu-check.sh reads the pct-of-raw figure from here.

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/vramkit/vram"
	"github.com/vramkit/vram/device"
	"github.com/vramkit/vram/device/cuda"
)

// openCUDA opens device 0 for one test or benchmark, or skips it with the
// backend's reason.
func openCUDA(tb testing.TB) *cuda.Device {
	tb.Helper()
	d, err := cuda.Open(0)
	if errors.Is(err, device.ErrNoDevice) {
		tb.Skipf("no CUDA device: %v", err)
	}
	if err != nil {
		tb.Fatalf("cuda.Open(0): %v", err)
	}
	tb.Cleanup(func() {
		if err := d.Close(); err != nil {
			tb.Errorf("Close: %v", err)
		}
	})
	return d
}

// managed is a manager on d with one client, one device array of n bytes
// (float32) and pinned host arrays of the same shape.
type managed struct {
	m    *vram.Manager
	c    *vram.Client
	arr  *vram.DeviceArray
	host []*vram.HostArray
}

func newManaged(tb testing.TB, d device.Device, n uint64, hosts int) *managed {
	tb.Helper()
	m, err := vram.New(d)
	if err != nil {
		tb.Fatalf("vram.New: %v", err)
	}
	tb.Cleanup(func() {
		if err := m.Close(); err != nil {
			tb.Errorf("manager Close: %v", err)
		}
	})
	c, err := m.Register(vram.ClientOptions{Name: "copies"})
	if err != nil {
		tb.Fatalf("Register: %v", err)
	}
	shape := []int{int(n / 4)}
	if err := c.Queue(map[string]vram.ArrayRequest{"a": {Shape: shape, DType: vram.Float32}}); err != nil {
		tb.Fatalf("Queue: %v", err)
	}
	resp, err := c.Allocate(context.Background())
	if err != nil {
		tb.Fatalf("Allocate: %v", err)
	}
	if resp.Plan.Chunks != 1 {
		tb.Fatalf("a %d-byte array was cut into %d chunks; want it whole", n, resp.Plan.Chunks)
	}
	mg := &managed{m: m, c: c, arr: resp.Arrays()["a"]}
	for range hosts {
		h, err := m.NewHostArray(shape, vram.Float32, vram.Pinned, nil)
		if err != nil {
			tb.Fatalf("NewHostArray(pinned): %v", err)
		}
		tb.Cleanup(func() {
			if err := h.Free(); err != nil {
				tb.Errorf("host array Free: %v", err)
			}
		})
		mg.host = append(mg.host, h)
	}
	return mg
}

// TestManagerCopies sends bytes to the device and back through the
// manager on the CUDA backend and checks them.
func TestManagerCopies(t *testing.T) {
	d := openCUDA(t)
	const n = 4 << 20
	mg := newManaged(t, d, n, 2)
	src, dst := mg.host[0].Data(), mg.host[1].Data()
	for i := range src {
		src[i] = byte(i*7 + i>>9)
	}
	if err := mg.c.ToDevice(context.Background(), mg.arr, mg.host[0]); err != nil {
		t.Fatalf("ToDevice: %v", err)
	}
	if err := mg.c.FromDevice(context.Background(), mg.host[1], mg.arr); err != nil {
		t.Fatalf("FromDevice: %v", err)
	}
	if err := mg.c.Sync(context.Background()); err != nil {
		t.Fatalf("Sync: %v", err)
	}
	for i := range src {
		if dst[i] != src[i] {
			t.Fatalf("byte %d came back %#x, sent %#x", i, dst[i], src[i])
		}
	}
}

// copyBytes is the size of each benchmark copy: large enough that the
// bandwidth is the bus's, not a call's overhead.
const copyBytes = 64 << 20

// BenchmarkManagerCopy times, in each iteration, one pinned 64 MiB copy
// through the manager (ToDevice or FromDevice, then Sync) and one raw
// driver copy of the same size (cuMemcpy*Async + cuStreamSynchronize on a
// thread with the context current), alternating which goes first. It
// reports both bandwidths (mgr-MB/s, raw-MB/s, MB = 10^6 bytes) and the
// manager's as a percentage of the raw one (pct-of-raw): measured in the
// same loop, the two share whatever the bus and the GPU are doing.
func BenchmarkManagerCopy(b *testing.B) {
	for _, dir := range []string{"HtoD", "DtoH"} {
		b.Run(dir, func(b *testing.B) {
			d := openCUDA(b)
			mg := newManaged(b, d, copyBytes, 1)
			raw, err := cuda.NewRawCopier(d, copyBytes)
			if err != nil {
				b.Fatalf("raw copier: %v", err)
			}
			b.Cleanup(func() {
				if err := raw.Close(); err != nil {
					b.Errorf("raw copier Close: %v", err)
				}
			})
			mgr, rawStep := func() error {
				if err := mg.c.ToDevice(context.Background(), mg.arr, mg.host[0]); err != nil {
					return err
				}
				return mg.c.Sync(context.Background())
			}, raw.HtoD
			if dir == "DtoH" {
				mgr, rawStep = func() error {
					if err := mg.c.FromDevice(context.Background(), mg.host[0], mg.arr); err != nil {
						return err
					}
					return mg.c.Sync(context.Background())
				}, raw.DtoH
			}
			if err := raw.Pin(); err != nil {
				b.Fatal(err)
			}
			defer raw.Unpin()
			for _, step := range []func() error{mgr, rawStep} { // warm up
				if err := step(); err != nil {
					b.Fatal(err)
				}
			}
			var tMgr, tRaw time.Duration
			timed := func(step func() error, into *time.Duration) {
				t0 := time.Now()
				if err := step(); err != nil {
					b.Fatal(err)
				}
				*into += time.Since(t0)
			}
			iters := 0
			for b.Loop() {
				if iters%2 == 0 {
					timed(mgr, &tMgr)
					timed(rawStep, &tRaw)
				} else {
					timed(rawStep, &tRaw)
					timed(mgr, &tMgr)
				}
				iters++
			}
			moved := float64(iters) * copyBytes
			mgrRate, rawRate := moved/tMgr.Seconds()/1e6, moved/tRaw.Seconds()/1e6
			b.ReportMetric(mgrRate, "mgr-MB/s")
			b.ReportMetric(rawRate, "raw-MB/s")
			b.ReportMetric(100*mgrRate/rawRate, "pct-of-raw")
		})
	}
}
