package vram

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/vramkit/vram/account"
	"github.com/vramkit/vram/device"
	"github.com/vramkit/vram/device/sim"
)

// longKernel launches on c's stream a kernel that runs until release is
// closed: another group's long work.
func longKernel(t *testing.T, dev *sim.Device, c *Client) (release func()) {
	t.Helper()
	s, err := c.Stream()
	if err != nil {
		t.Fatal(err)
	}
	ch := make(chan struct{})
	if err := dev.LaunchFunc(s, 1, func(device.View, int, int) error { <-ch; return nil }); err != nil {
		t.Fatal(err)
	}
	var done bool
	release = func() {
		if !done {
			done = true
			close(ch)
		}
	}
	t.Cleanup(release)
	return release
}

// within runs f and fails the test if it has not returned after 30 s (it
// is then waiting for work that only the test can end: release ends it).
func within(t *testing.T, what string, release func(), f func() error) error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- f() }()
	select {
	case err := <-done:
		return err
	case <-time.After(30 * time.Second):
		release()
		<-done
		t.Fatalf("%s waited for a kernel that only the test ends", what)
		return nil
	}
}

// cachedBehindKernel sets up group "a" holding nothing but a cache: its
// client allocated n bytes, started a kernel that runs until released,
// and freed the array, so the allocator caches it with a's stream still
// to reach the free.
func cachedBehindKernel(t *testing.T, n int) (*Manager, *sim.Device, func()) {
	m, dev, _ := newManager(t, 64*MiB, WithAllocatorChoice(account.Choice{Kind: Pool}))
	a := register(t, m, ClientOptions{Name: "a", Group: "a"})
	must(t, a.Queue(map[string]ArrayRequest{"x": {Shape: []int{n}, DType: Uint8, Unchunkable: true}}))
	if _, err := a.Allocate(context.Background()); err != nil {
		t.Fatal(err)
	}
	release := longKernel(t, dev, a)
	must(t, a.Free("x"))
	if cachedOf(m) == 0 {
		t.Fatal("the allocator caches nothing after the free")
	}
	return m, dev, release
}

// TestAllocateDoesNotTrimWhenThePlanFits: while another group's kernel
// runs and the allocator caches memory that kernel's stream has still to
// reach, an Allocate whose plan fits the free memory returns without
// waiting for that kernel (it once trimmed the cache at every budget
// read, and the trim waited).
func TestAllocateDoesNotTrimWhenThePlanFits(t *testing.T) {
	m, _, release := cachedBehindKernel(t, 24<<20)
	b := register(t, m, ClientOptions{Name: "b", Group: "b"})
	must(t, b.Queue(map[string]ArrayRequest{"y": {Shape: []int{1 << 20}, DType: Uint8, Unchunkable: true}}))
	err := within(t, "an Allocate that fits", release, func() error {
		_, err := b.Allocate(context.Background())
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestAllocateTrimWaitsNoLongerThanItsContext: an Allocate that needs the
// cache given back trims it, and the trim waits for the other group's
// kernel; with a deadline it fails at the deadline, wrapping
// context.DeadlineExceeded, with its queue as it was, and once the kernel
// ends the same Allocate succeeds.
func TestAllocateTrimWaitsNoLongerThanItsContext(t *testing.T) {
	m, _, release := cachedBehindKernel(t, 40<<20)
	b := register(t, m, ClientOptions{Name: "b", Group: "b"})
	queued := map[string]ArrayRequest{"y": {Shape: []int{40 << 20}, DType: Uint8, Unchunkable: true}}
	must(t, b.Queue(queued))
	err := within(t, "an Allocate with a 200 ms deadline", release, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		defer cancel()
		_, err := b.Allocate(ctx)
		return err
	})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Allocate: %v; want it to fail at its deadline", err)
	}
	if q := b.Queued(); len(q) != 1 {
		t.Errorf("queue after the failed Allocate: %v; want y still queued", q)
	}
	release()
	if _, err := b.Allocate(context.Background()); err != nil {
		t.Fatalf("Allocate once the kernel ended: %v", err)
	}
}

// TestChangeStreamGroupDoesNotWaitForTheOldStream: the last member of a
// group whose stream runs a long kernel moves to another group; the move
// returns at once (the old stream closes in the background once the
// kernel ends), and another group's Allocate meanwhile is not held up.
func TestChangeStreamGroupDoesNotWaitForTheOldStream(t *testing.T) {
	m, dev, _ := newManager(t, 64*MiB, WithAllocatorChoice(account.Choice{Kind: Pool}))
	c := register(t, m, ClientOptions{Name: "c", Group: "g1"})
	old, err := c.Stream()
	if err != nil {
		t.Fatal(err)
	}
	release := longKernel(t, dev, c)
	if err := within(t, "ChangeStreamGroup", release, func() error { return c.ChangeStreamGroup("g2") }); err != nil {
		t.Fatal(err)
	}
	d := register(t, m, ClientOptions{Name: "d", Group: "g3"})
	must(t, d.Queue(map[string]ArrayRequest{"z": {Shape: []int{1 << 20}, DType: Uint8, Unchunkable: true}}))
	if err := within(t, "another group's Allocate", release, func() error {
		_, err := d.Allocate(context.Background())
		return err
	}); err != nil {
		t.Fatal(err)
	}
	release()
	m.groups.WaitClosing()
	if _, err := old.Query(); !errors.Is(err, device.ErrClosed) {
		t.Errorf("the old group's stream once its kernel ended: Query = %v, want closed", err)
	}
}
