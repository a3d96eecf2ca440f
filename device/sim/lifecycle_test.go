package sim_test

import (
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/vramkit/vram/device"
	"github.com/vramkit/vram/device/sim"
	"github.com/vramkit/vram/internal/units"
)

// Close racing NewStream: every stream NewStream returns is stopped by
// Close, and NewStream after Close fails with ErrClosed, so no stream's
// goroutine outlives the device.
func TestCloseRacesNewStream(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	for range 300 {
		d, err := sim.New(sim.Config{TotalBytes: 64 * MiB})
		check(t, err)
		var (
			wg   sync.WaitGroup
			made []device.Stream
			bad  error
		)
		wg.Add(2)
		go func() {
			defer wg.Done()
			for {
				s, err := d.NewStream()
				if err != nil {
					if !errors.Is(err, device.ErrClosed) {
						bad = err
					}
					return
				}
				made = append(made, s)
			}
		}()
		go func() {
			defer wg.Done()
			runtime.Gosched()
			if err := d.Close(); err != nil {
				t.Errorf("Close: %v", err)
			}
		}()
		wg.Wait()
		if bad != nil {
			t.Fatalf("NewStream racing Close: %v, want an error wrapping ErrClosed", bad)
		}
		for _, s := range made {
			wantErr(t, s.Close(), device.ErrClosed)
		}
	}
}

// Device sizes beyond MaxTotalBytes are refused at once, with the figure
// and the cap, rather than hanging or overflowing the address arithmetic.
func TestTotalBytesCap(t *testing.T) {
	tests := map[string]struct {
		spec string
		want []string
	}{
		"600000 TiB":        {"sim:vram=600000TiB,backed=false", []string{"600000 TiB", "256 TiB"}},
		"2^60 bytes":        {"sim:vram=1048576TiB,backed=false", []string{"1048576 TiB", "256 TiB"}},
		"one byte too many": {fmt.Sprintf("sim:vram=%d,backed=false", sim.MaxTotalBytes+1), []string{"256 TiB"}},
		"granularity 2 TiB": {"sim:vram=4TiB,granularity=2TiB,backed=false", []string{"1 TiB"}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			d, err := device.Open(tc.spec)
			if err == nil {
				d.Close()
				t.Fatalf("Open(%q) accepted it", tc.spec)
			}
			wantErr(t, err, device.ErrBadSpec, device.ErrInvalidValue)
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not name %s", err, w)
				}
			}
		})
	}
	// The cap itself works, and so does a Malloc of most of it.
	d := newSim(t, sim.Config{TotalBytes: sim.MaxTotalBytes, AddressOnly: true})
	p := get[device.Ptr](t)(d.Malloc(200 * units.TiB))
	check(t, d.Free(p))
}

// The address range is recycled: devices that hold it all make New fail
// with ErrOutOfMemory; closing one makes room again; and devices never
// share addresses, so each still refuses the others' pointers.
func TestAddressRegionsRecycled(t *testing.T) {
	heldBefore, _ := sim.HeldRegions()
	cfg := sim.Config{TotalBytes: sim.MaxTotalBytes, AddressOnly: true}
	type dev struct {
		d *sim.Device
		p device.Ptr
	}
	var devs []dev
	defer func() {
		for _, x := range devs {
			check(t, x.d.Free(x.p))
			check(t, x.d.Close())
		}
		if held, _ := sim.HeldRegions(); held != heldBefore {
			t.Errorf("after closing every device %d regions are held, want %d as before", held, heldBefore)
		}
	}()
	open := func() (dev, error) {
		d, err := sim.New(cfg)
		if err != nil {
			return dev{}, err
		}
		return dev{d, get[device.Ptr](t)(d.Malloc(units.TiB))}, nil
	}
	var full error
	for range 4096 { // 2^63 of addresses hold about 2048 regions of 4 PiB
		x, err := open()
		if err != nil {
			full = err
			break
		}
		devs = append(devs, x)
	}
	if full == nil {
		t.Fatalf("%d devices of %s opened and New never ran out of addresses", len(devs), units.Format(cfg.TotalBytes))
	}
	wantErr(t, full, device.ErrOutOfMemory)
	if !strings.Contains(full.Error(), "close the devices") {
		t.Errorf("the error does not say what to do: %v", full)
	}
	if len(devs) < 1000 {
		t.Fatalf("only %d devices of %s opened before running out", len(devs), units.Format(cfg.TotalBytes))
	}
	// A Reset needs a new region too: it fails and leaves the device as it was.
	last := &devs[len(devs)-1]
	wantErr(t, last.d.Reset(), device.ErrOutOfMemory)
	check(t, last.d.Free(last.p)) // still a live pointer of the current generation
	last.p = get[device.Ptr](t)(last.d.Malloc(units.TiB))
	check(t, last.d.Synchronize())

	// Closing one device gives its region back.
	check(t, devs[0].d.Free(devs[0].p))
	check(t, devs[0].d.Close())
	devs = devs[1:]
	x, err := open()
	check(t, err)
	devs = append(devs, x)
	for _, other := range []dev{devs[0], devs[len(devs)/2]} {
		err := x.d.Free(other.p)
		wantErr(t, err, device.ErrInvalidPointer)
		if !strings.Contains(err.Error(), "another device") {
			t.Errorf("a pointer of another device is not recognised: %v", err)
		}
		wantErr(t, other.d.Free(x.p), device.ErrInvalidPointer)
	}
}

// Resetting a device without end holds a bounded number of regions, and
// pointers of many generations ago are still known to be from before a
// reset.
func TestManyResets(t *testing.T) {
	heldBefore, _ := sim.HeldRegions()
	d := newSim(t, sim.Config{TotalBytes: 64 * MiB, AddressOnly: true})
	first := get[device.Ptr](t)(d.Malloc(1))
	for range 1100 {
		check(t, d.Reset())
	}
	prev := get[device.Ptr](t)(d.Malloc(1))
	check(t, d.Reset())
	if held, _ := sim.HeldRegions(); held-heldBefore > 1025 {
		t.Errorf("a device reset 1101 times holds %d address regions", held-heldBefore)
	}
	wantOnly(t, d.Free(first), device.ErrInvalidated)
	wantOnly(t, d.Free(prev), device.ErrInvalidated)
	check(t, d.Close())
	if held, _ := sim.HeldRegions(); held != heldBefore {
		t.Errorf("after Close %d regions are held, want %d as before", held, heldBefore)
	}
}

// Once the memory checker's record of freed allocations is full (65,536
// frees), a Malloc/Free or MallocAsync/FreeAsync pair allocates nothing
// on the Go heap, backed or not (a backed Malloc's bytes are made only on
// first access), as doc.go says.
func TestSteadyStateAllocatesNothing(t *testing.T) {
	if testing.Short() {
		t.Skip("70,000 warm-up pairs")
	}
	for _, addressOnly := range []bool{false, true} {
		t.Run(fmt.Sprintf("address-only=%v", addressOnly), func(t *testing.T) {
			d := newSim(t, sim.Config{TotalBytes: GiB, AddressOnly: addressOnly, ReleaseThreshold: GiB})
			s := d.DefaultStream()
			pairs := map[string]func(){
				"Malloc+Free": func() {
					p := get[device.Ptr](t)(d.Malloc(MiB))
					check(t, d.Free(p))
				},
				"MallocAsync+FreeAsync": func() {
					p := get[device.Ptr](t)(d.MallocAsync(64<<10, s))
					check(t, d.FreeAsync(p, s))
				},
			}
			for name, pair := range pairs {
				for range 70_000 {
					pair()
				}
				if n := testing.AllocsPerRun(1000, pair); n != 0 {
					t.Errorf("%s: %v allocations per pair in steady state, want 0", name, n)
				}
			}
		})
	}
}

// A pointer of a device closed since is still told apart from this
// device's own addresses while its region is remembered.
func TestPointerOfClosedDevice(t *testing.T) {
	d := newSim(t, sim.Config{TotalBytes: 64 * MiB})
	gone, err := sim.New(sim.Config{TotalBytes: 64 * MiB})
	check(t, err)
	p := get[device.Ptr](t)(gone.Malloc(100))
	check(t, gone.Free(p))
	check(t, gone.Close())
	for name, err := range map[string]error{
		"free": d.Free(p),
		"copy": d.CopyHtoD(p, []byte{1}, d.DefaultStream()),
	} {
		wantOnly(t, err, device.ErrInvalidPointer)
		if !strings.Contains(err.Error(), "closed since") {
			t.Errorf("%s: the error does not say the pointer is a closed device's: %v", name, err)
		}
	}
}

// Device.Close waits for the queued work of a stream whose own Close is
// still waiting for it: the kernel has finished when Device.Close returns.
func TestCloseWaitsForAStreamBeingClosed(t *testing.T) {
	d, err := sim.New(sim.Config{TotalBytes: 64 * MiB})
	check(t, err)
	s, err := d.NewStream()
	check(t, err)
	open := d.OpenStreams()
	gate := make(chan struct{})
	var finished atomic.Bool
	check(t, d.LaunchFunc(s, 1, func(device.View, int, int) error {
		<-gate
		finished.Store(true)
		return nil
	}))
	streamClosed := make(chan error, 1)
	go func() { streamClosed <- s.Close() }()
	for d.OpenStreams() == open { // until the stream's Close has delisted it
		runtime.Gosched()
	}
	// Open the gate a little later: a Device.Close that did not wait
	// would return before it. With the wait, it returns after, whenever
	// the gate opens.
	time.AfterFunc(20*time.Millisecond, func() { close(gate) })
	if err := d.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if !finished.Load() {
		t.Fatal("Device.Close returned while a closing stream's kernel had not finished")
	}
	check(t, <-streamClosed)
}
