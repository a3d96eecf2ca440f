package capi

import (
	"errors"
	"reflect"
	"slices"
	"testing"

	"github.com/vramkit/vram"
	"github.com/vramkit/vram/device"
)

// TestQueueAllocateSameAsSteps: QueueAllocate gives what Queue, Allocate,
// Plan, Arrays and SimHost give one after another, for one client alone
// and for one of a group whose other member hears of it; with TakeEvent
// the caller's own event is taken, and only when it is first in the
// queue; without, every event stays queued.
func TestQueueAllocateSameAsSteps(t *testing.T) {
	reqs := map[string]vram.ArrayRequest{"x": {Shape: []int{4, 1000}, DType: vram.Float32, ChunkAxis: 1},
		"p": {Shape: []int{8}, DType: vram.Float64, Memory: vram.Pinned, Unchunkable: true}}
	cases := map[string]struct {
		take       bool
		peerFirst  bool // a member of the group with a lower id, which hears of the allocation first
		peerAfter  bool // one with a higher id, which hears of it after the caller
		stale      bool // an event of the caller's left unpolled from an allocation before
		wantTaken  bool
		wantEvents int // queued after the call
	}{
		"alone, event taken":            {take: true, wantTaken: true},
		"alone, event left queued":      {take: false, wantEvents: 1},
		"a peer's event first":          {take: true, peerFirst: true, wantEvents: 2},
		"an older event first":          {take: true, stale: true, wantEvents: 2},
		"a peer behind, its event left": {take: true, peerAfter: true, wantTaken: true, wantEvents: 1},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			var r Registry
			var cs Clients
			m := open(t, &r, "sim:vram=16MiB", 0)
			hooks := ClientOptions{Group: "g", Hooks: HookAllocated | HookInvalidate}
			var peer int64
			if tc.peerFirst { // a requester too: requesters hear first, in id order
				peer = register(t, &cs, m, hooks)
				must(t, cs.Queue(peer, map[string]vram.ArrayRequest{"y": {Shape: []int{1000}, DType: vram.Float32}}))
			}
			c := register(t, &cs, m, hooks)
			if tc.peerAfter {
				peer = register(t, &cs, m, hooks)
			}
			if tc.stale {
				must(t, cs.Queue(c, reqs))
				rh, err := cs.Allocate(c, 0)
				must(t, err)
				must(t, cs.ReleaseResponse(rh))
			}
			a, err := cs.QueueAllocate(c, AllocateOptions{Queue: true, Requests: reqs, TakeEvent: tc.take, SimHosts: true})
			must(t, err)
			defer cs.ReleaseResponse(a.Response)
			if a.EventTaken != tc.wantTaken || a.Pending != tc.wantEvents {
				t.Fatalf("event taken %v, %d pending; want %v, %d", a.EventTaken, a.Pending, tc.wantTaken, tc.wantEvents)
			}
			evs := poll(&cs, m)
			for _, ev := range evs {
				defer cs.ReleaseResponse(ev.Response)
			}
			if len(evs) != tc.wantEvents {
				t.Fatalf("events after the call = %+v; want %d", evs, tc.wantEvents)
			}
			if peer != 0 && !slices.ContainsFunc(evs, func(ev Event) bool { return ev.Client == peer }) {
				t.Errorf("events = %+v; want the peer %d's", evs, peer)
			}
			pi, err := cs.Plan(a.Response)
			must(t, err)
			if !reflect.DeepEqual(pi, a.Plan) {
				t.Errorf("plan = %+v; Plan says %+v", a.Plan, pi)
			}
			as, err := cs.Arrays(a.Response, 0, nil)
			must(t, err)
			if !slices.EqualFunc(as, a.Arrays, arrayInfoEqual) || len(as) != 2 {
				t.Errorf("arrays = %+v; Arrays says %+v", a.Arrays, as)
			}
			for i, ai := range a.Arrays {
				want := uintptr(0)
				if ai.Memory == vram.Device {
					want, err = cs.SimHost(a.Response, ai.Label, 0)
					must(t, err)
				}
				if a.SimHosts[i] != want || (ai.Memory == vram.Device && want == 0) {
					t.Errorf("%q's host address = %#x; SimHost says %#x", ai.Label, a.SimHosts[i], want)
				}
			}
		})
	}
}

func arrayInfoEqual(a, b ArrayInfo) bool {
	return a.Label == b.Label && a.LabelC == b.LabelC && a.DType == b.DType && a.Memory == b.Memory &&
		slices.Equal(a.Shape, b.Shape) && slices.Equal(a.Strides, b.Strides) && a.ChunkAxis == b.ChunkAxis &&
		a.DevicePtr == b.DevicePtr && a.Host == b.Host && a.Bytes == b.Bytes && a.Freed == b.Freed
}

// TestQueueAllocateFailures: a refused queue allocates nothing and keeps
// the queue before; bad buffers change nothing; a batch that does not fit
// fails as Allocate does, the queue queued; the memory read before the
// allocation is MemInfo's.
func TestQueueAllocateFailures(t *testing.T) {
	var r Registry
	var cs Clients
	m := open(t, &r, "sim:vram=16MiB", 0)
	c := register(t, &cs, m, ClientOptions{Name: "c", Group: "g", Hooks: HookAllocated})
	small := map[string]vram.ArrayRequest{"x": {Shape: []int{16}, DType: vram.Float32}}
	must(t, cs.Queue(c, small))
	cases := map[string]struct {
		o    AllocateOptions
		want error
	}{
		"bad request":   {AllocateOptions{Queue: true, Requests: map[string]vram.ArrayRequest{"x": {Shape: []int{-1}, DType: vram.Float32}}}, vram.ErrInvalidRequest},
		"bad buffers":   {AllocateOptions{Queue: true, Requests: map[string]vram.ArrayRequest{}, Buffers: -1}, device.ErrInvalidValue},
		"closed client": {AllocateOptions{}, ErrNoManager},
	}
	for _, name := range []string{"bad request", "bad buffers", "closed client"} {
		tc := cases[name]
		t.Run(name, func(t *testing.T) {
			h := c
			if name == "closed client" {
				h = 1 << 40
			}
			_, err := cs.QueueAllocate(h, tc.o)
			if !errors.Is(err, tc.want) {
				t.Fatalf("err = %v; want %v", err, tc.want)
			}
			if evs := poll(&cs, m); len(evs) != 0 {
				t.Errorf("events after a failed call: %+v", evs)
			}
			info, err := cs.Info(c)
			must(t, err)
			if info.Held != 0 {
				t.Errorf("%d bytes held after a failed call; want 0", info.Held)
			}
		})
	}
	// the refused queue and bad buffers left the first queue
	free, total, err := m.Manager().MemInfo()
	must(t, err)
	a, err := cs.QueueAllocate(c, AllocateOptions{MemInfo: true, TakeEvent: true})
	must(t, err)
	defer cs.ReleaseResponse(a.Response)
	if a.Free != free || a.Total != total || len(a.Arrays) != 1 || a.Arrays[0].Label != "x" || a.SimHosts != nil {
		t.Errorf("memory %d of %d, arrays %+v, host addresses %v; want %d of %d, x alone, no addresses", a.Free, a.Total, a.Arrays, a.SimHosts, free, total)
	}
	big := map[string]vram.ArrayRequest{"u": {Shape: []int{8 << 20}, DType: vram.Float32, Unchunkable: true}}
	if _, err := cs.QueueAllocate(c, AllocateOptions{Queue: true, Requests: big}); !errors.Is(err, vram.ErrUnchunkable) {
		t.Fatalf("32 MiB unchunkable on 16 MiB: %v; want ErrUnchunkable", err)
	}
	if x, err := cs.Array(a.Response, "x", 0); err != nil || x.Freed {
		t.Errorf("x after the failed allocation = %+v, %v; want it as it was", x, err)
	}
	if evs := poll(&cs, m); len(evs) != 0 {
		t.Errorf("events after a failed allocation: %+v", evs)
	}
}

// FuzzQueueAllocate: any sequence of queues and allocations by two clients
// of one group, each allocation through QueueAllocate (taking its own
// event or not) or Allocate, with polls between: every client hears of its
// allocations in the order they were made (the events polled and the ones
// the calls took, by response id), a call's description is Plan's and
// Arrays', and once every handle is released none is left.
func FuzzQueueAllocate(f *testing.F) {
	f.Add([]byte{0x01, 0x13, 0x22, 0x05, 0x37})
	f.Add([]byte{0x11, 0x11, 0x03, 0x00, 0x0f})
	f.Fuzz(func(t *testing.T, ops []byte) {
		var r Registry
		var cs Clients
		m := open(t, &r, "sim:vram=16MiB", 0)
		hooks := ClientOptions{Group: "g", Hooks: HookAllocated | HookInvalidate}
		cl := [2]int64{register(t, &cs, m, hooks), register(t, &cs, m, hooks)}
		last := map[int64]int64{} // client → the id of the last response it heard of
		hear := func(c, id int64) {
			if id <= last[c] {
				t.Fatalf("client %d heard of response %d after %d", c, id, last[c])
			}
			last[c] = id
		}
		var held []int64
		for _, op := range ops[:min(len(ops), 32)] {
			c := cl[op&1]
			reqs := map[string]vram.ArrayRequest{"x": {Shape: []int{16 << (op >> 5 & 3)}, DType: vram.Float32}}
			switch op >> 1 & 3 {
			case 0:
				must(t, cs.Queue(c, reqs))
			case 1, 2:
				a, err := cs.QueueAllocate(c, AllocateOptions{Queue: op&16 != 0, Requests: reqs, TakeEvent: op>>1&3 == 1, SimHosts: true})
				if errors.Is(err, vram.ErrNothingQueued) || errors.Is(err, vram.ErrRunsMismatch) { // refusals that change nothing
					continue
				}
				must(t, err)
				held = append(held, a.Response)
				if a.EventTaken {
					hear(c, a.Plan.ID)
				}
				as, err := cs.Arrays(a.Response, 0, nil)
				must(t, err)
				if pi, err := cs.Plan(a.Response); err != nil || !reflect.DeepEqual(pi, a.Plan) || !slices.EqualFunc(as, a.Arrays, arrayInfoEqual) {
					t.Fatalf("the call's description %+v %+v; Plan and Arrays say %+v %+v (%v)", a.Plan, a.Arrays, pi, as, err)
				}
			case 3:
				for _, ev := range poll(&cs, m) {
					if ev.Kind == EventAllocated {
						hear(ev.Client, ev.ID)
						held = append(held, ev.Response)
					}
				}
			}
		}
		for _, ev := range poll(&cs, m) {
			if ev.Kind == EventAllocated {
				hear(ev.Client, ev.ID)
				held = append(held, ev.Response)
			}
		}
		for _, h := range held {
			must(t, cs.ReleaseResponse(h))
		}
		cs.mu.Lock()
		left := len(cs.resps)
		cs.mu.Unlock()
		if left != 0 {
			t.Errorf("%d responses left after every handle was released", left)
		}
	})
}
