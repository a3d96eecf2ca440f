package alloctest

// StreamRules lets a sequence of calls check the stream half of the
// Allocator contract deterministically, without timing: streams are held
// busy by kernels that wait on a gate the test opens, the last use of
// every block freed while some stream is held is a kernel that marks
// itself done when it runs, and every new allocation is checked against
// the last uses still pending.

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/vramkit/vram/device"
	"github.com/vramkit/vram/device/sim"
)

// StreamRules is a backed simulated device whose streams a test can hold
// busy, and the record it keeps to check that an allocator never hands a
// range freed on stream S to another stream before S's work up to the
// free has run (Allocator's contract). Give the allocator Device(); call
// BeforeFree before every Free and Allocated after every successful
// Alloc, with the block's size as the allocator spends it (n rounded up
// to its granularity: a block split from a freed one on the freeing
// stream takes its rounded size from it, and the rest stays that
// stream's).
//
// A held stream runs nothing until released. So that no call can wait
// forever on a hold the test would open only afterwards, every call of
// Device() that waits for streams — Free, HostFree and Synchronize of the
// device, Synchronize of its events — first releases every hold (the
// test's own waits go through Device() or ReleaseAll too). The kernels
// touch no memory, so the backed device spends no host memory on them.
//
// Not safe for concurrent use, except that Device() may be used from the
// allocator's goroutines.
type StreamRules struct {
	sim *sim.Device
	dev *heldDevice
	ev  device.Event // orders a block's alloc stream into its free stream

	mu      sync.Mutex // protects the fields below (Device() releases holds)
	gates   map[uintptr]chan struct{}
	pending []lastUse // last uses not yet known done, by start address
}

// lastUse is the pending last use of [lo, hi): work ordered on stream h.
type lastUse struct {
	lo, hi uint64
	h      uintptr
	done   *atomic.Bool
}

// NewStreamRules makes a backed simulated device to cfg (AddressOnly is
// ignored) with its rules. The caller closes Device(), which releases
// every hold first. Holds are also released when the test ends, but
// cleanups run last-registered first: a test that makes streams and may
// stop while one is held registers t.Cleanup(r.ReleaseAll) after making
// them, so that closing a stream does not wait on a hold.
func NewStreamRules(t testing.TB, cfg sim.Config) *StreamRules {
	t.Helper()
	cfg.AddressOnly = false
	d, err := sim.New(cfg)
	if err != nil {
		t.Fatalf("sim.New: %v", err)
	}
	r := &StreamRules{sim: d, gates: map[uintptr]chan struct{}{}}
	r.dev = &heldDevice{Device: d, r: r}
	if r.ev, err = d.NewEvent(); err != nil {
		_ = d.Close()
		t.Fatalf("NewEvent: %v", err)
	}
	t.Cleanup(r.ReleaseAll)
	return r
}

// Device is the device to give the allocator (it releases every hold
// before waiting for streams).
func (r *StreamRules) Device() device.Device { return r.dev }

// Toggle holds s if it is not held, else releases it.
func (r *StreamRules) Toggle(t testing.TB, s device.Stream) {
	t.Helper()
	r.mu.Lock()
	gate := r.gates[s.Handle()]
	if gate != nil {
		close(gate)
		delete(r.gates, s.Handle())
		r.mu.Unlock()
		return
	}
	gate = make(chan struct{})
	r.gates[s.Handle()] = gate
	r.mu.Unlock()
	if err := r.sim.LaunchFunc(s, 1, func(device.View, int, int) error { <-gate; return nil }); err != nil {
		t.Fatalf("holding stream %d: %v", s.Handle(), err)
	}
}

// ReleaseAll releases every held stream. Work queued behind the holds
// runs; it does not wait for it.
func (r *StreamRules) ReleaseAll() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for h, gate := range r.gates {
		close(gate)
		delete(r.gates, h)
	}
}

// BeforeFree is called before Free(p, on) of the n-byte block p allocated
// on from. While any stream is held it orders from's work so far into on
// (an event, as the contract asks of a caller that frees on another
// stream), and enqueues on on the block's last use: a kernel that marks
// the range's use done when it runs. With no stream held it does nothing:
// every last use is then done at once (once those queued behind earlier
// holds have run).
func (r *StreamRules) BeforeFree(t testing.TB, p device.Ptr, n uint64, from, on device.Stream) {
	t.Helper()
	if !r.active() {
		return
	}
	if from.Handle() != on.Handle() {
		if err := r.ev.Record(from); err != nil {
			t.Fatalf("recording an event on stream %d: %v", from.Handle(), err)
		}
		if err := r.ev.Wait(on); err != nil {
			t.Fatalf("ordering stream %d after stream %d: %v", on.Handle(), from.Handle(), err)
		}
	}
	done := new(atomic.Bool)
	if err := r.sim.LaunchFunc(on, 1, func(device.View, int, int) error { done.Store(true); return nil }); err != nil {
		t.Fatalf("enqueuing the last use of %v on stream %d: %v", p, on.Handle(), err)
	}
	lo, hi := uint64(p), uint64(p)+n
	r.mu.Lock()
	defer r.mu.Unlock()
	// Earlier last uses inside the block are now ordered before on's work
	// too (the block was allocated on a stream they were ordered on, and
	// from is ordered into on): they become on's.
	var out []lastUse
	for _, u := range r.pending {
		if u.done.Load() {
			continue
		}
		if u.hi <= lo || hi <= u.lo {
			out = append(out, u)
			continue
		}
		if u.lo < lo {
			out = append(out, lastUse{lo: u.lo, hi: lo, h: u.h, done: u.done})
		}
		if hi < u.hi {
			out = append(out, lastUse{lo: hi, hi: u.hi, h: u.h, done: u.done})
		}
		out = append(out, lastUse{lo: max(lo, u.lo), hi: min(hi, u.hi), h: on.Handle(), done: u.done})
	}
	r.pending = append(out, lastUse{lo: lo, hi: hi, h: on.Handle(), done: done})
}

// active reports whether a stream is held or a last use is pending, and
// forgets the last uses that have run.
func (r *StreamRules) active() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.pending = slices.DeleteFunc(r.pending, func(u lastUse) bool { return u.done.Load() })
	return len(r.gates) > 0 || len(r.pending) > 0
}

// Allocated checks a new allocation [p, p+n) on s: no last use of any of
// its bytes may still be pending on another stream. Reuse on the stream
// of the last use is allowed at once (stream order runs it first).
func (r *StreamRules) Allocated(t testing.TB, p device.Ptr, n uint64, s device.Stream) {
	t.Helper()
	if err := r.check(p, n, s); err != nil {
		t.Fatal(err)
	}
}

func (r *StreamRules) check(p device.Ptr, n uint64, s device.Stream) error {
	lo, hi := uint64(p), uint64(p)+n
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, u := range r.pending {
		if u.hi <= lo || hi <= u.lo || u.h == s.Handle() || u.done.Load() {
			continue
		}
		return fmt.Errorf("Alloc(%d) on stream %d returned [%v, +%d), whose bytes [%v, %v) were freed on stream %d "+
			"and whose last use there has not run yet: memory handed to another stream before the freeing stream's work was done",
			n, s.Handle(), p, n, device.Ptr(u.lo), device.Ptr(u.hi), u.h)
	}
	return nil
}

// heldDevice is the simulator with every wait for streams preceded by
// releasing the holds, so that no call blocks on a gate.
type heldDevice struct {
	*sim.Device
	r *StreamRules
}

func (d *heldDevice) Free(p device.Ptr) error {
	d.r.ReleaseAll()
	return d.Device.Free(p)
}

func (d *heldDevice) HostFree(b device.HostBuffer) error {
	d.r.ReleaseAll()
	return d.Device.HostFree(b)
}

func (d *heldDevice) Synchronize() error {
	d.r.ReleaseAll()
	return d.Device.Synchronize()
}

// Reset releases every hold and resets the device. The work queued on
// the streams from before the reset went with it, and the memory its last
// uses touched too: those are forgotten. The rules' event, from before the
// reset, is replaced.
func (d *heldDevice) Reset() error {
	d.r.ReleaseAll()
	if err := d.Device.Reset(); err != nil {
		return err
	}
	ev, err := d.Device.NewEvent()
	if err != nil {
		return fmt.Errorf("alloctest: stream rules: an event after the reset: %w", err)
	}
	d.r.mu.Lock()
	d.r.pending = nil
	d.r.mu.Unlock()
	old := d.r.ev
	d.r.ev = ev
	if err := old.Close(); err != nil && !errors.Is(err, device.ErrInvalidated) {
		return fmt.Errorf("alloctest: stream rules: closing the event from before the reset: %w", err)
	}
	return nil
}

// Close releases every hold, closes the rules' event and the device.
func (d *heldDevice) Close() error {
	d.r.ReleaseAll()
	return errors.Join(d.r.ev.Close(), d.Device.Close())
}

func (d *heldDevice) NewEvent() (device.Event, error) {
	ev, err := d.Device.NewEvent()
	if err != nil {
		return nil, err
	}
	return &heldEvent{Event: ev, r: d.r}, nil
}

type heldEvent struct {
	device.Event
	r *StreamRules
}

func (e *heldEvent) Synchronize() error {
	e.r.ReleaseAll()
	return e.Event.Synchronize()
}
