package alloc_test

// No caching allocator (Pool, PinnedPool, Expandable) may call the device
// while it holds its lock: a
// device call can be slow or block (a Free that waits for a stream, an
// event query on a busy driver), and every other goroutine using the pool
// would wait behind it.

import (
	"errors"
	"sort"
	"sync"
	"testing"

	"github.com/vramkit/vram/alloc"
	"github.com/vramkit/vram/device"
	"github.com/vramkit/vram/device/sim"
	"github.com/vramkit/vram/internal/units"
)

// probeDevice is a simulated device that, at every call a pool makes
// into it, checks that the pool's lock is free. The test drives the pool
// from one goroutine, so a held lock is the caller's.
type probeDevice struct {
	*sim.Device
	t      *testing.T
	locked func() bool // the pool's lock is held
	onWait func()      // called at each Event.Synchronize, after the probe, if set

	mu   sync.Mutex
	seen map[string]int // calls probed, by name
}

func (d *probeDevice) probe(op string) {
	if d.locked != nil && d.locked() {
		d.t.Errorf("%s called with the pool's lock held", op)
	}
	d.mu.Lock()
	d.seen[op]++
	d.mu.Unlock()
}

func (d *probeDevice) Malloc(n uint64) (device.Ptr, error) {
	d.probe("Malloc")
	return d.Device.Malloc(n)
}

func (d *probeDevice) Free(p device.Ptr) error {
	d.probe("Free")
	return d.Device.Free(p)
}

func (d *probeDevice) MemInfo() (free, total uint64, err error) {
	d.probe("MemInfo")
	return d.Device.MemInfo()
}

func (d *probeDevice) HostAlloc(n uint64, mapped bool) (device.HostBuffer, error) {
	d.probe("HostAlloc")
	return d.Device.HostAlloc(n, mapped)
}

func (d *probeDevice) HostFree(b device.HostBuffer) error {
	d.probe("HostFree")
	return d.Device.HostFree(b)
}

func (d *probeDevice) NewEvent() (device.Event, error) {
	d.probe("NewEvent")
	ev, err := d.Device.NewEvent()
	if err != nil {
		return nil, err
	}
	return &probeEvent{Event: ev, d: d}, nil
}

type probeEvent struct {
	device.Event
	d *probeDevice
}

func (e *probeEvent) Record(s device.Stream) error {
	e.d.probe("Event.Record")
	return e.Event.Record(s)
}

func (e *probeEvent) Query() (bool, error) {
	e.d.probe("Event.Query")
	return e.Event.Query()
}

func (e *probeEvent) Synchronize() error {
	e.d.probe("Event.Synchronize")
	if e.d.onWait != nil {
		e.d.onWait()
	}
	return e.Event.Synchronize()
}

func (e *probeEvent) Close() error {
	e.d.probe("Event.Close")
	return e.Event.Close()
}

// The virtual-memory calls, probed as the others (Expandable's).
func (d *probeDevice) ReserveAddress(n uint64) (device.Ptr, error) {
	d.probe("ReserveAddress")
	return d.Device.ReserveAddress(n)
}

func (d *probeDevice) FreeAddress(p device.Ptr, n uint64) error {
	d.probe("FreeAddress")
	return d.Device.FreeAddress(p, n)
}

func (d *probeDevice) CreatePhysical(n uint64) (device.PhysMem, error) {
	d.probe("CreatePhysical")
	return d.Device.CreatePhysical(n)
}

func (d *probeDevice) ReleasePhysical(h device.PhysMem) error {
	d.probe("ReleasePhysical")
	return d.Device.ReleasePhysical(h)
}

func (d *probeDevice) Map(p device.Ptr, n uint64, h device.PhysMem) error {
	d.probe("Map")
	return d.Device.Map(p, n, h)
}

func (d *probeDevice) Unmap(p device.Ptr, n uint64) error {
	d.probe("Unmap")
	return d.Device.Unmap(p, n)
}

func (d *probeDevice) SetAccess(p device.Ptr, n uint64) error {
	d.probe("SetAccess")
	return d.Device.SetAccess(p, n)
}

func newProbeDevice(t *testing.T, total uint64) *probeDevice {
	sd := openSimT(t, sim.Config{TotalBytes: total, NoContext: true})
	return &probeDevice{Device: sd, t: t, seen: map[string]int{}}
}

// checkSeen fails the test unless every call in want was probed.
func (d *probeDevice) checkSeen(t *testing.T, want ...string) {
	t.Helper()
	d.mu.Lock()
	defer d.mu.Unlock()
	var missing []string
	for _, op := range want {
		if d.seen[op] == 0 {
			missing = append(missing, op)
		}
	}
	sort.Strings(missing)
	if len(missing) > 0 {
		t.Errorf("the workload never made %v (saw %v): the probe proves nothing for them", missing, d.seen)
	}
}

func TestPoolNeverCallsTheDeviceUnderItsLock(t *testing.T) {
	d := newProbeDevice(t, 64*mib)
	p, err := alloc.NewPool(d, alloc.PoolConfig{})
	if err != nil {
		t.Fatal(err)
	}
	d.locked = p.Locked
	s1, err := d.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	defer s1.Close()
	s2, err := d.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	must := func(ptr device.Ptr, err error) device.Ptr {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return ptr
	}
	free := func(ptr device.Ptr, s device.Stream) {
		t.Helper()
		if err := p.Free(ptr, s); err != nil {
			t.Fatal(err)
		}
	}

	// A block freed on a busy stream: another stream's miss records and
	// queries an event, finds it pending, and grows.
	release := busy(t, d.Device, s1)
	free(must(p.Alloc(4*kib, s1)), s1)
	small := must(p.Alloc(4*kib, s2))
	release()
	// Now the event completes and the block moves over.
	free(small, s2)
	free(must(p.Alloc(12*mib, s1)), s1)
	must(p.Alloc(4*kib, s2))
	// A growth past the high-water mark gives back the cached 12 MiB.
	big := must(p.Alloc(20*mib, s2))
	free(big, s2)
	// Out of memory: trim, retry, then the error reads MemInfo.
	if _, err := p.Alloc(100*mib, s2); !errors.Is(err, device.ErrOutOfMemory) {
		t.Fatalf("Alloc(100 MiB) on 64 MiB: %v", err)
	}
	if err := p.Trim(); err != nil {
		t.Fatal(err)
	}
	// Out of memory with 40 MiB freed on a busy stream: the pool waits
	// for that stream's event (which releases it) and reuses the block.
	x := must(p.Alloc(40*mib, s1))
	release = busy(t, d.Device, s1)
	free(x, s1)
	d.onWait = release
	if y := must(p.Alloc(40*mib, s2)); y != x {
		t.Errorf("Alloc(40 MiB) on stream 2 got %v, want the block freed on stream 1 (%v)", y, x)
	}
	d.onWait = nil
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	d.checkSeen(t, "Malloc", "Free", "MemInfo", "NewEvent", "Event.Record", "Event.Query", "Event.Synchronize")
}

func TestPinnedPoolNeverCallsTheDeviceUnderItsLock(t *testing.T) {
	d := newProbeDevice(t, 64*mib)
	p, err := alloc.NewPinnedPool(d)
	if err != nil {
		t.Fatal(err)
	}
	d.locked = p.Locked
	s1 := d.DefaultStream()
	b, err := p.Alloc(64*kib, s1)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Free(b, s1); err != nil {
		t.Fatal(err)
	}
	// The buffer waits for an event on s1; the next request fences it and
	// reuses it.
	if b, err = p.Alloc(64*kib, s1); err != nil {
		t.Fatal(err)
	}
	if err := p.Free(b, s1); err != nil {
		t.Fatal(err)
	}
	if err := p.Trim(); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Alloc(units.MiB, s1); err != nil {
		t.Fatal(err)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	d.checkSeen(t, "HostAlloc", "HostFree", "NewEvent", "Event.Record", "Event.Query")
}

func TestExpandableNeverCallsTheDeviceUnderItsLock(t *testing.T) {
	d := newProbeDevice(t, 64*mib)
	e := newExpandableT(t, d, alloc.ExpandableConfig{})
	d.locked = e.Locked
	s1, err := d.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	defer s1.Close()
	s2, err := d.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	must := func(ptr device.Ptr, err error) device.Ptr {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return ptr
	}
	free := func(ptr device.Ptr, s device.Stream) {
		t.Helper()
		if err := e.Free(ptr, s); err != nil {
			t.Fatal(err)
		}
	}

	// Growths reserve a range and map pages; a block freed on a busy
	// stream makes another stream's growth record and query an event.
	release := busy(t, d.Device, s1)
	free(must(e.Alloc(5*mib, s1)), s1)
	a := must(e.Alloc(5*mib, s2))
	release()
	free(a, s2)
	// A growth past the high-water mark unmaps cached pages first.
	b := must(e.Alloc(24*mib, s1))
	free(b, s1)
	c := must(e.Alloc(30*mib, s2))
	// Out of memory: unmap every free page, retry, then fail.
	if _, err := e.Alloc(100*mib, s2); !errors.Is(err, device.ErrOutOfMemory) {
		t.Fatalf("Alloc(100 MiB) on 64 MiB: %v", err)
	}
	free(c, s2)
	if err := e.Trim(); err != nil {
		t.Fatal(err)
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	d.checkSeen(t, "ReserveAddress", "CreatePhysical", "Map", "SetAccess", "ReleasePhysical", "Unmap", "FreeAddress",
		"NewEvent", "Event.Record", "Event.Query")
}
