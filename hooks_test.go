package vram

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/vramkit/vram/alloc"
	"github.com/vramkit/vram/device"
)

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
