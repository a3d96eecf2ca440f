package vram

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/vramkit/vram/account"
	"github.com/vramkit/vram/alloc"
	"github.com/vramkit/vram/device/sim"
)

// A pinned host array that the pinned-memory limit refuses is an
// ErrOutOfMemory that says nothing about device memory: Allocate
// must not plan again for the device, nor free the device arrays being
// replaced (nor call OnInvalidate).
func TestHostOutOfMemoryIsNotDeviceOutOfMemory(t *testing.T) {
	dev, err := sim.New(sim.Config{TotalBytes: 64 * MiB, PinnedLimit: MiB})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = dev.Close() })
	var armed atomic.Bool
	var other uint64
	m, err := New(dev, WithAllocatorChoice(account.Choice{Kind: Pool}), WithWrap(func(a alloc.Allocator) alloc.Allocator {
		return allocHook{a, func() {
			if armed.CompareAndSwap(true, false) {
				p, err := dev.Malloc(16 * MiB) // another user of the GPU
				if err != nil {
					panic(err)
				}
				other = uint64(p)
			}
		}}
	}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close() })
	var inval atomic.Int32
	c, err := m.Register(ClientOptions{Name: "c", Group: "g", OnInvalidate: func(error) { inval.Add(1) }})
	if err != nil {
		t.Fatal(err)
	}
	x := req(Float32, 0, 1000, 5000) // ~19 MiB, chunkable
	if err := c.Queue(map[string]ArrayRequest{"x": x}); err != nil {
		t.Fatal(err)
	}
	r1, err := c.Allocate(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	old := r1.Arrays()["x"]
	armed.Store(true)
	err = c.Queue(map[string]ArrayRequest{
		"x": x,
		"s": fixed(Uint8, 4096),
		"p": {Shape: []int{2 * int(MiB)}, DType: Uint8, Memory: Pinned, Unchunkable: true},
	})
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.Allocate(context.Background())
	t.Logf("err: %v", err)
	if !errors.Is(err, ErrOutOfMemory) {
		t.Fatalf("want ErrOutOfMemory, got %v", err)
	}
	if old.Freed() || c.Arrays()["x"] != old {
		t.Errorf("the pinned-memory failure freed the device array being replaced (freed %v)", old.Freed())
	}
	if n := inval.Load(); n != 0 {
		t.Errorf("OnInvalidate called %d times for a pinned-memory failure", n)
	}
	if strings.Contains(err.Error(), "plan again") {
		t.Errorf("replanned device memory for a host-memory failure")
	}
	_ = other
}

// Replacing a pinned or mapped array with one of the same size, when it
// takes more than half of the pinned-memory limit: the new one does not
// fit beside the old one, so the old host array is freed and the
// allocation tried once more.
func TestReplacingAHostArrayAtItsLimit(t *testing.T) {
	for _, mem := range []MemoryType{Pinned, Mapped} {
		t.Run(mem.String(), func(t *testing.T) {
			dev, err := sim.New(sim.Config{TotalBytes: 64 * MiB, PinnedLimit: 4 * MiB})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = dev.Close() })
			m, err := New(dev, WithAllocatorChoice(account.Choice{Kind: Direct}))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = m.Close() })
			c, _ := m.Register(ClientOptions{Name: "c", Group: "g"})
			h := map[string]ArrayRequest{"h": {Shape: []int{3 * int(MiB)}, DType: Uint8, Memory: mem, Unchunkable: true}}
			_ = c.Queue(h)
			if _, err := c.Allocate(context.Background()); err != nil {
				t.Fatal(err)
			}
			_ = c.Queue(h)
			if _, err := c.Allocate(context.Background()); err != nil {
				t.Errorf("replacing a 3 MiB %v array under a 4 MiB pinned limit: %v", mem, err)
			}
		})
	}
}
