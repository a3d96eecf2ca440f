package vram

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/vramkit/vram/account"
	"github.com/vramkit/vram/device"
)

func TestQueueValidation(t *testing.T) {
	m, _, _ := newManager(t, 64*MiB)
	c := register(t, m, ClientOptions{})
	for name, tc := range map[string]struct {
		r  ArrayRequest
		is error
	}{
		"zero dimension":   {ArrayRequest{Shape: []int{4, 0}, DType: Float32}, ErrInvalidRequest},
		"no shape":         {ArrayRequest{DType: Float32}, ErrInvalidRequest},
		"no dtype":         {ArrayRequest{Shape: []int{4}}, ErrInvalidRequest},
		"managed memory":   {ArrayRequest{Shape: []int{4}, DType: Float32, Memory: Managed}, ErrNotSupported},
		"size overflow":    {ArrayRequest{Shape: []int{1 << 40, 1 << 30}, DType: Float64}, ErrInvalidRequest},
		"runs disagree":    {ArrayRequest{Shape: []int{10}, DType: Float32, TotalRuns: 11}, ErrInvalidRequest},
		"negative axis":    {ArrayRequest{Shape: []int{10}, DType: Float32, ChunkAxis: -1}, ErrInvalidRequest},
		"unknown memory":   {ArrayRequest{Shape: []int{10}, DType: Float32, Memory: 9}, ErrInvalidRequest},
		"negative runs":    {ArrayRequest{Shape: []int{10}, DType: Float32, Unchunkable: true, TotalRuns: -2}, ErrInvalidRequest},
		"unknown dtype 99": {ArrayRequest{Shape: []int{10}, DType: 99}, ErrInvalidRequest},
	} {
		t.Run(name, func(t *testing.T) {
			err := c.Queue(map[string]ArrayRequest{"good": req(Float32, 0, 10), "bad": tc.r})
			if !errors.Is(err, tc.is) || !strings.Contains(err.Error(), "bad") {
				t.Errorf("got %v, want %v naming the label", err, tc.is)
			}
			if q := c.Queued(); len(q) != 0 {
				t.Errorf("a refused request set queued %v", q)
			}
		})
	}
	// Queuing again replaces the whole set, as cubie's queue_request:
	// b, not queued again, is gone.
	_ = c.Queue(map[string]ArrayRequest{"a": req(Float32, 0, 10), "b": req(Float32, 0, 10)})
	shape := []int{20}
	_ = c.Queue(map[string]ArrayRequest{"a": {Shape: shape, DType: Float64}})
	shape[0] = 99 // the queue holds its own copy
	q := c.Queued()
	if len(q) != 1 || q["a"].DType != Float64 || q["a"].Shape[0] != 20 {
		t.Errorf("queue after re-queuing a alone: %v; want a alone", q)
	}
	// A refused set leaves what was queued; an empty one drops it.
	if err := c.Queue(map[string]ArrayRequest{"bad": {}}); err == nil || len(c.Queued()) != 1 {
		t.Errorf("a refused set: %v, queue %v", err, c.Queued())
	}
	if err := c.Queue(nil); err != nil || len(c.Queued()) != 0 {
		t.Errorf("Queue(nil): %v, queue %v; want it empty", err, c.Queued())
	}
}

// TestEmptyRequestQueuesNothing: queuing no request is a no-op; it does
// not make the client a requester whose hook Allocate calls. A group that
// was never planned has no plan to send again: ErrNothingQueued, saying
// what cubie would do.
func TestEmptyRequestQueuesNothing(t *testing.T) {
	m, _, _ := newManager(t, 64*MiB)
	h := newHookLog()
	c := register(t, m, h.opts("c", "g"))
	for name, reqs := range map[string]map[string]ArrayRequest{"nil": nil, "empty": {}} {
		if err := c.Queue(reqs); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if resp, err := c.Allocate(context.Background()); resp != nil || !errors.Is(err, ErrNothingQueued) ||
			!strings.Contains(err.Error(), "Client.Queue") || !strings.Contains(err.Error(), "cubie") {
			t.Errorf("%s: Allocate after an empty Queue = %v, %v; want ErrNothingQueued saying to queue and what cubie does", name, resp, err)
		}
	}
	if got := h.got(); len(got) != 0 {
		t.Errorf("hooks called for an empty queue: %v", got)
	}
	_ = c.Close()
	if err := c.Queue(nil); !errors.Is(err, ErrClosed) {
		t.Errorf("Queue(nil) of a closed client = %v; want ErrClosed", err)
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
