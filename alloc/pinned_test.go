package alloc_test

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"unsafe"

	"github.com/vramkit/vram/alloc"
	"github.com/vramkit/vram/alloc/alloctest"
	"github.com/vramkit/vram/device"
	"github.com/vramkit/vram/device/sim"
)

func newPinnedT(t *testing.T, dev device.Device, cfg alloc.PinnedConfig) *alloc.PinnedPool {
	t.Helper()
	p, err := alloc.NewPinnedPoolConfig(dev, cfg)
	if err != nil {
		t.Fatalf("NewPinnedPool: %v", err)
	}
	t.Cleanup(func() {
		if err := p.Close(); err != nil {
			t.Errorf("pinned Close: %v", err)
		}
	})
	return p
}

func pinnedAlloc(t *testing.T, p *alloc.PinnedPool, n uint64, s device.Stream) device.HostBuffer {
	t.Helper()
	b, err := p.Alloc(n, s)
	if err != nil {
		t.Fatalf("pinned Alloc(%d): %v", n, err)
	}
	if uint64(len(b.Data)) != n || uint64(cap(b.Data)) != n {
		t.Fatalf("pinned Alloc(%d): len %d cap %d", n, len(b.Data), cap(b.Data))
	}
	return b
}

func pinnedFree(t *testing.T, p *alloc.PinnedPool, b device.HostBuffer, s device.Stream) {
	t.Helper()
	if err := p.Free(b, s); err != nil {
		t.Fatalf("pinned Free: %v", err)
	}
}

func same(a, b device.HostBuffer) bool {
	return unsafe.SliceData(a.Data) == unsafe.SliceData(b.Data)
}

func TestPinnedPoolReusesBySize(t *testing.T) {
	tests := map[string]struct {
		first, second uint64
		reuse         bool
	}{
		"same size":                 {first: 4096, second: 4096, reuse: true},
		"same after rounding":       {first: 4000, second: 3600, reuse: true},
		"a quarter smaller":         {first: 5 * 1024, second: 4 * 1024, reuse: true},
		"much smaller makes new":    {first: 4096, second: 1024},
		"larger makes new":          {first: 4096, second: 4097},
		"large buffers reuse too":   {first: 64 * mib, second: 60 * mib, reuse: true},
		"rounded to 512 both ways ": {first: 1, second: 512, reuse: true},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			dev := openSimT(t, sim.Config{TotalBytes: 64 * mib})
			p := newPinnedT(t, dev, alloc.PinnedConfig{})
			s := dev.DefaultStream()
			a := pinnedAlloc(t, p, tc.first, s)
			pinnedFree(t, p, a, s)
			b := pinnedAlloc(t, p, tc.second, s)
			if same(a, b) != tc.reuse {
				t.Errorf("reused %v, want %v", same(a, b), tc.reuse)
			}
			st := p.Stats()
			wantAllocs := uint64(2)
			if tc.reuse {
				wantAllocs = 1
			}
			held := (tc.second + 511) &^ 511 // a reused buffer counts whole
			if tc.reuse {
				held = (tc.first + 511) &^ 511
			}
			if st.DeviceAllocs != wantAllocs || st.CacheHits != 2-wantAllocs || st.InUse != held {
				t.Errorf("stats %+v", st)
			}
		})
	}
}

func TestPinnedPoolWaitsForTheStream(t *testing.T) {
	dev := openSimT(t, sim.Config{TotalBytes: 64 * mib})
	p := newPinnedT(t, dev, alloc.PinnedConfig{})
	s1, err := dev.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	defer s1.Close()
	s2, err := dev.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	release := busy(t, dev, s1)

	buf := pinnedAlloc(t, p, 8192, s1)
	pinnedFree(t, p, buf, s1) // s1 may still be copying from it
	for name, s := range map[string]device.Stream{"same stream": s1, "other stream": s2} {
		// The host would write into the buffer at once: not even the
		// freeing stream may have it back before its work is done.
		if b := pinnedAlloc(t, p, 8192, s); same(b, buf) {
			t.Errorf("%s: got the buffer back while stream 1 was busy", name)
		} else {
			defer pinnedFree(t, p, b, s)
		}
	}
	release()
	b := pinnedAlloc(t, p, 8192, s2)
	if !same(b, buf) {
		t.Errorf("after stream 1 finished: got a new buffer, want the cached one")
	}
	pinnedFree(t, p, b, s2)
	if st := p.Stats(); st.DeviceAllocs != 3 || st.CacheHits != 1 {
		t.Errorf("stats %+v: want 3 HostAllocs and one hit", st)
	}
}

func TestPinnedPoolMapped(t *testing.T) {
	dev := openSimT(t, sim.Config{TotalBytes: 64 * mib})
	p := newPinnedT(t, dev, alloc.PinnedConfig{Mapped: true})
	s := dev.DefaultStream()
	b := pinnedAlloc(t, p, 4096, s)
	if b.DevicePtr == 0 {
		t.Fatal("mapped buffer has no device address")
	}
	copy(b.Data, "pinned")
	out := make([]byte, 6)
	if err := dev.CopyDtoH(out, b.DevicePtr, s); err != nil {
		t.Fatal(err)
	}
	if err := s.Synchronize(); err != nil {
		t.Fatal(err)
	}
	if string(out) != "pinned" {
		t.Errorf("read %q through the device address", out)
	}
	// Freeing with the wrong device address is refused.
	if err := p.Free(device.HostBuffer{Data: b.Data}, s); !errors.Is(err, alloc.ErrUnknownPointer) {
		t.Errorf("Free without its device address: err = %v", err)
	}
	pinnedFree(t, p, b, s)
}

func TestPinnedPoolOutOfMemory(t *testing.T) {
	t.Run("gives back its cache and retries", func(t *testing.T) {
		dev := openSimT(t, sim.Config{TotalBytes: 64 * mib})
		p := newPinnedT(t, dev, alloc.PinnedConfig{})
		s := dev.DefaultStream()
		pinnedFree(t, p, pinnedAlloc(t, p, 4096, s), s)
		dev.Faults().OOMAtAlloc(1)
		pinnedAlloc(t, p, 64*kib, s)
		if st := p.Stats(); st.Retries != 1 || st.DeviceFrees != 1 || st.Reserved != 64*kib || st.OOMs != 0 {
			t.Errorf("stats %+v: want one retry after freeing the cached buffer", st)
		}
	})
	t.Run("waits for the stream that freed a buffer", func(t *testing.T) {
		// Room for one 512 KiB buffer. It is freed on a busy stream, so
		// the next request must wait for that stream, then reuse it.
		dev := newWaitProbe(t, sim.Config{TotalBytes: 64 * mib, PinnedLimit: 768 * kib})
		p := newPinnedT(t, dev, alloc.PinnedConfig{})
		s1, s2 := newStreamT(t, dev.Device), newStreamT(t, dev.Device)
		release := busy(t, dev.Device, s1)
		b := pinnedAlloc(t, p, 512*kib, s1)
		pinnedFree(t, p, b, s1)
		got := make(chan device.HostBuffer, 1)
		go func() {
			c, err := p.Alloc(512*kib, s2)
			if err != nil {
				t.Errorf("Alloc after waiting for the busy stream: %v", err)
			}
			got <- c
		}()
		select {
		case c := <-got:
			t.Fatalf("Alloc returned (same buffer %v) while the stream that freed the only buffer was busy; want it to wait", len(c.Data) > 0 && same(b, c))
		case <-dev.waits:
		}
		release()
		c := <-got
		if len(c.Data) == 0 || !same(b, c) {
			t.Fatalf("after waiting: got a new buffer (or none), want the one freed on the busy stream")
		}
		if st := p.Stats(); st.Retries != 1 || st.OOMs != 0 || st.DeviceAllocs != 1 || st.CacheHits != 1 {
			t.Errorf("stats %+v: want one retry served from the cache", st)
		}
		pinnedFree(t, p, c, s2)
	})
	t.Run("says so when it cannot", func(t *testing.T) {
		dev := openSimT(t, sim.Config{TotalBytes: 64 * mib})
		p := newPinnedT(t, dev, alloc.PinnedConfig{})
		s := dev.DefaultStream()
		keep := pinnedAlloc(t, p, 4096, s)
		dev.Faults().OOMAbove(8192)
		defer dev.Faults().Clear()
		_, err := p.Alloc(mib, s)
		if !errors.Is(err, device.ErrOutOfMemory) {
			t.Fatalf("err = %v, want ErrOutOfMemory", err)
		}
		if st := p.Stats(); st.OOMs != 1 || st.InUse != 4096 {
			t.Errorf("stats %+v", st)
		}
		pinnedFree(t, p, keep, s)
	})
}

func TestPinnedPoolRejectsBadCalls(t *testing.T) {
	dev := openSimT(t, sim.Config{TotalBytes: 64 * mib})
	p := newPinnedT(t, dev, alloc.PinnedConfig{})
	s := dev.DefaultStream()
	live := pinnedAlloc(t, p, 4096, s)
	freed := pinnedAlloc(t, p, 4096, s)
	pinnedFree(t, p, freed, s)
	foreign, err := dev.HostAlloc(4096, false)
	if err != nil {
		t.Fatal(err)
	}
	defer dev.HostFree(foreign)
	before := p.Stats()
	tests := map[string]struct {
		call func() error
		want error
	}{
		"alloc of zero":         {func() error { _, err := p.Alloc(0, s); return err }, device.ErrInvalidValue},
		"alloc on nil stream":   {func() error { _, err := p.Alloc(1, nil); return err }, device.ErrInvalidValue},
		"free on nil stream":    {func() error { return p.Free(live, nil) }, device.ErrInvalidValue},
		"double free":           {func() error { return p.Free(freed, s) }, alloc.ErrUnknownPointer},
		"empty buffer":          {func() error { return p.Free(device.HostBuffer{}, s) }, alloc.ErrUnknownPointer},
		"a slice of a buffer":   {func() error { return p.Free(device.HostBuffer{Data: live.Data[512:]}, s) }, alloc.ErrUnknownPointer},
		"ordinary Go memory":    {func() error { return p.Free(device.HostBuffer{Data: make([]byte, 4096)}, s) }, alloc.ErrUnknownPointer},
		"another pool's buffer": {func() error { return p.Free(foreign, s) }, alloc.ErrUnknownPointer},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if err := tc.call(); !errors.Is(err, tc.want) {
				t.Errorf("err = %v, want %v", err, tc.want)
			}
			if after := p.Stats(); after != before {
				t.Errorf("stats changed: %+v → %+v", before, after)
			}
		})
	}
	pinnedFree(t, p, live, s)
}

// hostOnlyDevice is a device without pinned host memory: the simulator's
// Device interface alone.
type hostOnlyDevice struct{ device.Device }

func TestPinnedPoolNeedsHostAllocator(t *testing.T) {
	dev := openSimT(t, sim.Config{TotalBytes: 64 * mib})
	if _, err := alloc.NewPinnedPool(hostOnlyDevice{dev}); !errors.Is(err, device.ErrNotSupported) {
		t.Errorf("err = %v, want ErrNotSupported", err)
	}
	if _, err := alloc.NewPinnedPool(nil); !errors.Is(err, device.ErrInvalidValue) {
		t.Errorf("nil device: err = %v", err)
	}
}

func TestPinnedPoolTrimAndClose(t *testing.T) {
	dev := openSimT(t, sim.Config{TotalBytes: 64 * mib})
	p, err := alloc.NewPinnedPool(dev)
	if err != nil {
		t.Fatal(err)
	}
	s := dev.DefaultStream()
	var bufs []device.HostBuffer
	for i := range 10 {
		bufs = append(bufs, pinnedAlloc(t, p, uint64(1+i)*4096, s))
	}
	for _, b := range bufs[:6] {
		pinnedFree(t, p, b, s)
	}
	if err := p.Trim(); err != nil {
		t.Fatal(err)
	}
	st := p.Stats()
	if st.DeviceFrees != 6 || st.Reserved != st.InUse || dev.Leaks().HostBuffers != 4 {
		t.Errorf("after Trim: %+v, device holds %d buffers", st, dev.Leaks().HostBuffers)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if l := dev.Leaks(); l.HostBuffers != 0 || l.Events != 0 {
		t.Errorf("after Close the device still holds %v", l)
	}
	if _, err := p.Alloc(1, s); !errors.Is(err, alloc.ErrClosed) {
		t.Errorf("Alloc after Close: %v", err)
	}
	if err := p.Free(bufs[7], s); !errors.Is(err, alloc.ErrClosed) {
		t.Errorf("Free after Close: %v", err)
	}
	if err := p.Trim(); !errors.Is(err, alloc.ErrClosed) {
		t.Errorf("Trim after Close: %v", err)
	}
	if err := p.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

// TestPinnedPoolConcurrent has goroutines on their own streams fill
// buffers from the host, copy them to the device, free them on the stream
// and check that no buffer was handed to two holders at once.
func TestPinnedPoolConcurrent(t *testing.T) {
	dev := openSimT(t, sim.Config{TotalBytes: 64 * mib})
	p := newPinnedT(t, dev, alloc.PinnedConfig{})
	const workers = 4
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		s, err := dev.NewStream()
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		dst, err := dev.Malloc(64 * kib)
		if err != nil {
			t.Fatal(err)
		}
		defer dev.Free(dst)
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(w), 9))
			for i := range 300 {
				n := uint64(512 * (1 + r.IntN(128)))
				b, err := p.Alloc(n, s)
				if err != nil {
					errs <- err
					return
				}
				tag := byte(w*50 + i%50)
				for j := range b.Data {
					b.Data[j] = tag
				}
				if err := dev.CopyHtoD(dst, b.Data, s); err != nil {
					errs <- err
					return
				}
				for j := range b.Data {
					if b.Data[j] != tag {
						errs <- fmt.Errorf("worker %d: buffer overwritten while held", w)
						return
					}
				}
				if err := p.Free(b, s); err != nil {
					errs <- err
					return
				}
			}
			errs <- s.Synchronize()
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if st := p.Stats(); st.InUse != 0 || st.Allocs != workers*300 || st.Frees != workers*300 || st.CacheHits == 0 {
		t.Errorf("stats %+v", st)
	}
}

// FuzzPinnedPool runs byte strings as PinnedPool calls (and device
// resets) and checks that no buffer is handed out twice, that the
// counters add up, and that Trim with nothing live gives every buffer
// back.
func FuzzPinnedPool(f *testing.F) {
	for _, s := range poolSeeds {
		f.Add(s)
	}
	f.Add([]byte{0, 4, 0x80, 2, 0x7f, 0, 0x81, 6, 0xff, 1, 3})
	f.Fuzz(func(t *testing.T, ops []byte) {
		if len(ops) > 1024 {
			ops = ops[:1024]
		}
		dev, err := sim.New(sim.Config{TotalBytes: 64 * mib})
		if err != nil {
			t.Fatal(err)
		}
		defer dev.Close()
		p, err := alloc.NewPinnedPool(dev)
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close()
		s2, err := dev.NewStream()
		if err != nil {
			t.Fatal(err)
		}
		defer s2.Close()
		streams := []device.Stream{dev.DefaultStream(), s2}
		var live []device.HostBuffer
		held := map[*byte]bool{}
		for i := 0; i < len(ops); i++ {
			op := ops[i]
			s := streams[int(op>>7)]
			switch op % 4 {
			case 0, 1:
				n := 1 + uint64(op)*97
				b, err := p.Alloc(n, s)
				if err != nil {
					t.Fatal(err)
				}
				if held[unsafe.SliceData(b.Data)] {
					t.Fatalf("buffer handed out twice")
				}
				held[unsafe.SliceData(b.Data)] = true
				live = append(live, b)
			case 2:
				if len(live) == 0 {
					continue
				}
				j := int(op>>2) % len(live)
				if err := p.Free(live[j], s); err != nil {
					t.Fatal(err)
				}
				delete(held, unsafe.SliceData(live[j].Data))
				live[j] = live[len(live)-1]
				live = live[:len(live)-1]
			case 3:
				if op&0x7c == 0x7c { // 0x7f, 0xff: reset the device with buffers live and cached
					streams = resetPinnedFuzz(t, dev, p, live)
					live, held = nil, map[*byte]bool{}
					continue
				}
				if err := p.Trim(); err != nil {
					t.Fatal(err)
				}
			}
			// A reused buffer counts whole: up to a quarter more than asked.
			var want, most uint64
			for _, b := range live {
				r := (uint64(len(b.Data)) + 511) &^ 511
				want += r
				most += r + r/4
			}
			if st := p.Stats(); st.InUse < want || st.InUse > most || st.Reserved < st.InUse || st.Allocs-st.Frees != uint64(len(live)) {
				t.Fatalf("stats %+v with %d live buffers of %d bytes asked", st, len(live), want)
			}
		}
		for _, b := range live {
			if err := p.Free(b, streams[0]); err != nil {
				t.Fatal(err)
			}
		}
		if err := p.Trim(); err != nil {
			t.Fatal(err)
		}
		if st := p.Stats(); st.Reserved != 0 || dev.Leaks().HostBuffers != 0 {
			t.Fatalf("after freeing everything and Trim: %+v, device holds %d buffers", st, dev.Leaks().HostBuffers)
		}
	})
}

// TestPinnedConformance runs the pinned pool conformance suite on
// PinnedPool, plain and mapped.
func TestPinnedConformance(t *testing.T) {
	for name, cfg := range map[string]alloc.PinnedConfig{"plain": {}, "mapped": {Mapped: true}} {
		t.Run(name, func(t *testing.T) {
			alloctest.RunPinned(t, func(t *testing.T, dev device.Device) alloctest.PinnedAllocator {
				return newPinnedT(t, dev, cfg)
			})
		})
	}
}

// resetPinnedFuzz resets dev under pinned pool p, frees every buffer of
// live, from before the reset (each Free must fail with
// device.ErrInvalidated and take its buffer back, leaving nothing in
// InUse or Reserved), and returns two streams made since.
func resetPinnedFuzz(t *testing.T, dev *sim.Device, p *alloc.PinnedPool, live []device.HostBuffer) []device.Stream {
	t.Helper()
	if err := dev.Reset(); err != nil {
		t.Fatalf("Reset: %v", err)
	}
	s2, err := dev.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s2.Close() })
	streams := []device.Stream{dev.DefaultStream(), s2}
	for i, b := range live {
		if err := p.Free(b, streams[i%2]); !errors.Is(err, device.ErrInvalidated) {
			t.Fatalf("Free of a buffer from before the reset: err = %v, want one wrapping device.ErrInvalidated", err)
		}
	}
	if st := p.Stats(); st.InUse != 0 || st.Reserved != 0 || st.Frees != st.Allocs {
		t.Fatalf("with every buffer from before the reset freed: %+v", st)
	}
	return streams
}
