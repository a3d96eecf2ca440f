package vram

// Regression tests for defects found by trying to break the manager:
// misuse, races and faults. Each failed before its fix.

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vramkit/vram/account"
	"github.com/vramkit/vram/alloc"
	"github.com/vramkit/vram/device"
	"github.com/vramkit/vram/device/sim"
)

// holdStream runs a kernel on s that waits until the returned release is
// called (or 10 s pass, so that a failing test cannot hang), holding back
// everything enqueued on s after it.
func holdStream(t *testing.T, dev *sim.Device, s device.Stream) (release func()) {
	t.Helper()
	ch := make(chan struct{})
	err := dev.LaunchFunc(s, 1, func(device.View, int, int) error {
		select {
		case <-ch:
		case <-time.After(10 * time.Second):
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	var once bool
	return func() {
		if !once {
			once = true
			close(ch)
		}
	}
}

// A device array is freed ordered after the stream it was last used on,
// not only its client's current one: a copy queued on the old group's
// stream before a group move once wrote into the block the pool had
// handed, at once, to another client on the new stream.
func TestFreeAfterGroupMoveWaitsForTheOldStream(t *testing.T) {
	const n = 64 << 10 // small: x shares its segment with z, so a trim cannot free it
	m, dev, _ := newManager(t, 64*MiB, WithAllocatorChoice(account.Choice{Kind: Pool}))
	a := register(t, m, ClientOptions{Name: "a", Group: "A"})
	register(t, m, ClientOptions{Name: "keeper", Group: "A"}) // A stays when a leaves
	b := register(t, m, ClientOptions{Name: "b", Group: "B"})
	if err := a.Queue(map[string]ArrayRequest{"x": req(Uint8, 0, n), "z": req(Uint8, 0, n)}); err != nil {
		t.Fatal(err)
	}
	ra, err := a.Allocate(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	x := ra.Arrays()["x"]
	xPtr := x.Ptr()
	sA, _ := a.Stream()
	release := holdStream(t, dev, sA)
	defer release()
	old, _ := m.NewHostArray([]int{n}, Uint8, Pinned, bytes.Repeat([]byte{0xaa}, n))
	defer old.Free()
	if err := a.ToDevice(context.Background(), x, old); err != nil { // queued on A behind the kernel
		t.Fatal(err)
	}
	if err := a.ChangeStreamGroup("B"); err != nil {
		t.Fatal(err)
	}
	if err := a.Free("x"); err != nil {
		t.Fatal(err)
	}
	if err := b.Queue(map[string]ArrayRequest{"y": req(Uint8, 0, n)}); err != nil {
		t.Fatal(err)
	}
	// Ordered after A, Allocate may wait for A's work (its trim waits for
	// the free of x): the kernel on A is let go after a second.
	release = sync.OnceFunc(release)
	timer := time.AfterFunc(time.Second, release)
	defer timer.Stop()
	rb, err := b.Allocate(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	y := rb.Arrays()["y"]
	t.Logf("x at %v, y at %v", xPtr, y.Ptr())
	mine, _ := m.NewHostArray([]int{n}, Uint8, Pinned, bytes.Repeat([]byte{0x55}, n))
	defer mine.Free()
	if err := b.ToDevice(context.Background(), y, mine); err != nil {
		t.Fatal(err)
	}
	// Unordered, B's copy runs at once: let it finish before A's old copy
	// can run, else that copy may come first and the defect not show (B's
	// stream starts its goroutine only with its first work).
	sB, _ := b.Stream()
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		if done, err := sB.Query(); err != nil || done {
			break
		}
	}
	release()
	if err := b.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := sA.Synchronize(); err != nil {
		t.Fatal(err)
	}
	back, _ := m.NewHostArray([]int{n}, Uint8, Pageable, nil)
	if err := b.FromDevice(context.Background(), back, y); err != nil {
		t.Fatal(err)
	}
	if err := b.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	if i := bytes.IndexFunc(back.Data(), func(r rune) bool { return r != 0x55 }); i >= 0 {
		t.Fatalf("y holds %#x at %d, want 0x55 everywhere: the old copy to x on the first stream overwrote it", back.Data()[i], i)
	}
}

// A stream group lives while it has members: the last client to leave
// (Close or ChangeStreamGroup) removes it and closes its stream. Every
// group name once kept a stream and its goroutine for the manager's
// life.
func TestGroupsGoWithTheirLastClient(t *testing.T) {
	m, dev, _ := newManager(t, 128*MiB)
	var cs []*Client
	for i := range 40 {
		c := register(t, m, ClientOptions{Group: fmt.Sprint("g", i)})
		if err := c.Queue(map[string]ArrayRequest{"x": req(Float32, 0, 100)}); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Allocate(context.Background()); err != nil {
			t.Fatal(err)
		}
		cs = append(cs, c)
	}
	for i, c := range cs[:20] {
		if err := c.ChangeStreamGroup(fmt.Sprint("moved", i%5)); err != nil {
			t.Fatal(err)
		}
	}
	if got, want := len(m.groups.Names()), 25; got != want {
		t.Errorf("%d groups after the moves, want %d (20 left, 5 joined)", got, want)
	}
	for _, c := range cs {
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if names := m.groups.Names(); len(names) != 0 {
		t.Errorf("groups %v remain with no client", names)
	}
	m.groups.WaitClosing() // the streams close in the background
	if n := dev.Leaks().Streams; n != 0 {
		t.Errorf("%d streams remain on the device with no client", n)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.reg.groups) != 0 {
		t.Errorf("the manager still keeps %d group records (members, queue, lock, plan)", len(m.reg.groups))
	}
}

// ChangeStreamGroup racing the client's Close leaves no empty group (the
// new group was once made before the move was refused, and stayed).
func TestChangeStreamGroupRacingCloseLeavesNoGroup(t *testing.T) {
	m, _, _ := newManager(t, 64*MiB)
	register(t, m, ClientOptions{Group: "home"})
	for i := range 200 {
		c := register(t, m, ClientOptions{Group: "home"})
		var wg sync.WaitGroup
		wg.Add(2)
		go func() { defer wg.Done(); _ = c.ChangeStreamGroup(fmt.Sprint("new", i)) }()
		go func() { defer wg.Done(); _ = c.Close() }()
		wg.Wait()
	}
	if names := m.groups.Names(); !slices.Equal(names, []string{"home"}) {
		t.Errorf("groups %v, want only home", names)
	}
}

// blockOnFree is an adaptor whose Free, once armed, blocks the first call
// until released, telling entered.
type blockOnFree struct {
	alloc.Allocator
	armed   atomic.Bool
	entered chan struct{}
	release chan struct{}
}

func (b *blockOnFree) Free(p device.Ptr, s device.Stream) error {
	if b.armed.CompareAndSwap(true, false) {
		close(b.entered)
		<-b.release
	}
	return b.Allocator.Free(p, s)
}

// Hooks are delivered in the order of their events: an InvalidateAll
// between Allocate's install and its hook calls once delivered
// OnInvalidate first, so the client went on holding arrays it believed
// live that were already freed.
func TestInvalidationAfterInstallComesAfterOnAllocated(t *testing.T) {
	bf := &blockOnFree{entered: make(chan struct{}), release: make(chan struct{})}
	m, _, _ := newManager(t, 64*MiB, WithWrap(func(a alloc.Allocator) alloc.Allocator { bf.Allocator = a; return bf }))
	var mu sync.Mutex
	var events []string
	record := func(e string) { mu.Lock(); events = append(events, e); mu.Unlock() }
	c := register(t, m, ClientOptions{
		OnInvalidate: func(error) { record("invalidated") },
		OnAllocated:  func(*ArrayResponse) { record("allocated") },
	})
	queue := func() {
		t.Helper()
		if err := c.Queue(map[string]ArrayRequest{"x": req(Float32, 0, 1000)}); err != nil {
			t.Fatal(err)
		}
	}
	queue()
	if _, err := c.Allocate(context.Background()); err != nil {
		t.Fatal(err)
	}
	events = nil
	// Allocate x again: the old x is freed after the new one is
	// installed, before the hooks; hold that free.
	queue()
	bf.armed.Store(true)
	done := make(chan error, 1)
	var resp *ArrayResponse
	go func() {
		var err error
		resp, err = c.Allocate(context.Background())
		done <- err
	}()
	<-bf.entered
	if err := m.InvalidateAll(); err != nil {
		t.Fatal(err)
	}
	close(bf.release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if !resp.Arrays()["x"].Freed() {
		t.Error("InvalidateAll did not free the array installed before it")
	}
	mu.Lock()
	defer mu.Unlock()
	if want := []string{"allocated", "invalidated"}; !slices.Equal(events, want) {
		t.Errorf("hooks in the order %v, want %v", events, want)
	}
}

// blockOnMemInfo is a simulator whose MemInfo, once armed, blocks the
// first call until released, telling entered.
type blockOnMemInfo struct {
	*sim.Device
	armed   atomic.Bool
	entered chan struct{}
	release chan struct{}
}

func (b *blockOnMemInfo) MemInfo() (free, total uint64, err error) {
	if b.armed.CompareAndSwap(true, false) {
		close(b.entered)
		<-b.release
	}
	return b.Device.MemInfo()
}

// An array freed (Client.Free) while Allocate reads its budget is
// counted once: it was once counted both as an array being replaced and
// in the device's free memory, so the plan took one chunk that did not
// fit.
func TestFreeDuringBudgetIsCountedOnce(t *testing.T) {
	bt := &blockOnMemInfo{Device: newSim(t, 64*MiB), entered: make(chan struct{}), release: make(chan struct{})}
	m, err := New(bt, WithAllocatorChoice(account.Choice{Kind: Direct}))
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	c := register(t, m, ClientOptions{})
	if err := c.Queue(map[string]ArrayRequest{"x": req(Float32, 0, 8<<20)}); err != nil { // 32 MiB
		t.Fatal(err)
	}
	if _, err := c.Allocate(context.Background()); err != nil {
		t.Fatal(err)
	}
	// x again, 80 MiB: 64 MiB are free once the old x goes, so two chunks.
	if err := c.Queue(map[string]ArrayRequest{"x": req(Float32, 0, 20<<20)}); err != nil {
		t.Fatal(err)
	}
	bt.armed.Store(true)
	done := make(chan struct{})
	var resp *ArrayResponse
	go func() {
		defer close(done)
		resp, err = c.Allocate(context.Background())
	}()
	<-bt.entered
	if err := c.Free("x"); err != nil {
		t.Fatal(err)
	}
	close(bt.release)
	<-done
	if err != nil {
		t.Fatalf("Allocate: %v", err)
	}
	if resp.Plan.Chunks != 2 {
		t.Errorf("%d chunks of %d, want 2 of %d", resp.Plan.Chunks, resp.Plan.ChunkLength, 10<<20)
	}
}
