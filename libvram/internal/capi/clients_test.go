package capi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"unsafe"

	"github.com/vramkit/vram"
	"github.com/vramkit/vram/device"
)

// register registers a client or fails the test.
func register(t *testing.T, cs *Clients, m *Manager, o ClientOptions) int64 {
	t.Helper()
	h, err := cs.Register(m, o)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// f32 is a host description of xs with shape.
func f32(xs []float32, shape ...int) HostDesc {
	return HostDesc{Data: unsafe.Pointer(&xs[0]), Shape: shape, DType: vram.Float32}
}

// poll takes every queued event of m.
func poll(cs *Clients, m *Manager) []Event {
	var evs []Event
	for ev := cs.Poll(m); ev.Kind != EventNone; ev = cs.Poll(m) {
		evs = append(evs, ev)
	}
	return evs
}

// TestClientsChunkedBatch: two clients of one group on a 16 MiB simulator,
// 24 MB of runs each way: the allocation chunks them; each member's
// response describes its arrays at the chunk length; a chunk copied in
// through one member's array, doubled on the host through the simulator's
// bytes and copied out, lands at its runs; both members get their events,
// in id order, on the poller's goroutine.
func TestClientsChunkedBatch(t *testing.T) {
	var r Registry
	var cs Clients
	m := open(t, &r, "sim:vram=16MiB", 0)
	const runs = 3 << 20 // 12 MiB of float32 for x, and as much for y
	in := register(t, &cs, m, ClientOptions{Name: "in", Group: "solver", Hooks: HookAllocated | HookInvalidate})
	out := register(t, &cs, m, ClientOptions{Name: "out", Group: "solver", Hooks: HookAllocated})
	must(t, cs.Queue(in, map[string]vram.ArrayRequest{"x": {Shape: []int{runs}, DType: vram.Float32},
		"k": {Shape: []int{4}, DType: vram.Float32, Unchunkable: true}}))
	must(t, cs.Queue(out, map[string]vram.ArrayRequest{"y": {Shape: []int{runs}, DType: vram.Float32}}))
	rh, err := cs.Allocate(out, 0)
	must(t, err)
	defer cs.ReleaseResponse(rh)
	pi, err := cs.Plan(rh)
	must(t, err)
	if pi.Client != out || pi.Plan.Chunks < 2 || pi.Plan.TotalRuns != runs || pi.Arrays != 1 {
		t.Fatalf("plan = client %d, %d chunks of %d, %d runs, %d arrays; want client %d, chunked, %d runs, 1 array",
			pi.Client, pi.Plan.Chunks, pi.Plan.ChunkLength, pi.Plan.TotalRuns, pi.Arrays, out, runs)
	}
	evs := poll(&cs, m)
	if len(evs) != 2 || evs[0].Client != in || evs[1].Client != out || evs[0].Kind != EventAllocated || evs[1].Kind != EventAllocated {
		t.Fatalf("events = %+v; want an allocation for %d, then for %d", evs, in, out)
	}
	for _, ev := range evs {
		defer cs.ReleaseResponse(ev.Response)
	}
	mh, err := cs.Member(rh, in)
	must(t, err)
	defer cs.ReleaseResponse(mh)
	x, err := cs.Array(mh, "x", 0)
	must(t, err)
	k, err := cs.Array(mh, "k", 0)
	must(t, err)
	n := pi.Plan.ChunkLength
	if !slices.Equal(x.Shape, []int{n}) || x.ChunkAxis != 0 || x.DevicePtr == 0 || x.Host != 0 || x.Bytes != uint64(4*n) ||
		k.ChunkAxis != -1 || !slices.Equal(k.Shape, []int{4}) {
		t.Errorf("x = %+v, k = %+v; want x chunked to %d runs on axis 0, k unchunkable", x, k, n)
	}

	// Chunk 1: runs [n, 2n) of xs in, doubled in place, out into ys.
	xs, ys := make([]float32, runs), make([]float32, runs)
	for i := range xs {
		xs[i] = float32(i)
	}
	sp, err := cs.Span(mh, 1, 0)
	must(t, err)
	must(t, cs.Copy(true, in, mh, "x", 0, f32(xs, runs), &sp))
	must(t, cs.Do(in, "sync", syncClient))
	addr, err := cs.SimHost(mh, "x", 0)
	must(t, err)
	_, bs, err := cs.simBytes(mh, "x", 0)
	must(t, err)
	if addr != uintptr(unsafe.Pointer(&bs[0])) || len(bs) != 4*n {
		t.Fatalf("SimHost = %#x; the simulator's bytes are %d at %p", addr, len(bs), &bs[0])
	}
	view := unsafe.Slice((*float32)(unsafe.Pointer(&bs[0])), sp.Len)
	for i := range view {
		view[i] *= 2
	}
	must(t, cs.Copy(false, in, mh, "x", 0, f32(ys, runs), &sp))
	must(t, cs.Do(in, "sync", syncClient))
	for _, i := range []int{0, sp.Start - 1, sp.Start, sp.Start + sp.Len - 1, sp.Start + sp.Len} {
		want := float32(0)
		if i >= sp.Start && i < sp.Start+sp.Len {
			want = 2 * float32(i)
		}
		if i >= 0 && i < runs && ys[i] != want {
			t.Errorf("ys[%d] = %v; want %v (chunk 1 is runs %d..%d)", i, ys[i], want, sp.Start, sp.Start+sp.Len)
		}
	}

	var js responseJSON
	s, err := cs.JSON(mh)
	must(t, err)
	must(t, json.Unmarshal([]byte(s), &js))
	if js.Client != in || len(js.Buffers) != 1 || js.Buffers[0]["x"].DevicePtr != x.DevicePtr || js.Plan.Chunks != pi.Plan.Chunks {
		t.Errorf("JSON = %s; want client %d, x at %#x, %d chunks", s, in, x.DevicePtr, pi.Plan.Chunks)
	}
}

func syncClient(c *vram.Client) error { return c.Sync(context.Background()) }

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// TestClientsInvalidation: InvalidateAll frees every array and queues an
// invalidation with its reason for the clients that asked, none for the
// others; an eviction for another group says so; a closed client's
// queued events are dropped.
func TestClientsInvalidation(t *testing.T) {
	var r Registry
	var cs Clients
	m := open(t, &r, "sim:vram=16MiB", 0)
	a := register(t, &cs, m, ClientOptions{Name: "a", Group: "A", Hooks: HookInvalidate})
	quiet := register(t, &cs, m, ClientOptions{Name: "quiet", Group: "A"})
	b := register(t, &cs, m, ClientOptions{Name: "b", Group: "B", Hooks: HookInvalidate | HookAllocated})
	must(t, cs.Queue(a, map[string]vram.ArrayRequest{"x": {Shape: []int{2 << 20}, DType: vram.Float32}})) // 8 MiB
	ah, err := cs.Allocate(a, 0)
	must(t, err)
	defer cs.ReleaseResponse(ah)
	if evs := poll(&cs, m); len(evs) != 0 {
		t.Fatalf("events after an allocation no one asked to hear of: %+v", evs)
	}

	// b needs 12 MiB of the device: a's arrays, idle, are evicted.
	must(t, cs.Queue(b, map[string]vram.ArrayRequest{"y": {Shape: []int{3 << 20}, DType: vram.Float32, Unchunkable: true}}))
	bh, err := cs.Allocate(b, 0)
	must(t, err)
	defer cs.ReleaseResponse(bh)
	evs := poll(&cs, m)
	if len(evs) != 2 || evs[0].Kind != EventInvalidated || evs[0].Client != a || !evs[0].Evicted || evs[1].Kind != EventAllocated || evs[1].Client != b {
		t.Fatalf("events = %+v; want a's eviction, then b's allocation", evs)
	}
	cs.ReleaseResponse(evs[1].Response)
	if x, err := cs.Array(ah, "x", 0); err != nil || !x.Freed || x.DevicePtr != 0 {
		t.Errorf("a's x after the eviction = %+v, %v; want freed", x, err)
	}
	if err := cs.Do(a, "begin work", func(c *vram.Client) error { _, err := c.BeginWork(); return err }); !errors.Is(err, vram.ErrEvicted) {
		t.Errorf("begin work after the eviction = %v; want ErrEvicted", err)
	}

	must(t, m.InvalidateAll())
	evs = poll(&cs, m)
	if len(evs) != 2 || evs[0].Client != a || evs[1].Client != b || evs[0].Evicted || !strings.Contains(evs[1].Reason, "freed") {
		t.Fatalf("events after InvalidateAll = %+v; want an invalidation of a and of b, saying freed", evs)
	}
	must(t, m.InvalidateAll())
	must(t, cs.Close(b))
	if evs := poll(&cs, m); len(evs) != 1 || evs[0].Client != a {
		t.Errorf("events after b closed = %+v; want a's alone", evs)
	}
	must(t, cs.Close(b)) // a second close is no error
	if _, err := cs.Info(quiet); err != nil {
		t.Errorf("the quiet client: %v", err)
	}
}

// TestClientsErrors: each call refuses what it cannot do, naming it, with
// an error the C status codes tell apart.
func TestClientsErrors(t *testing.T) {
	var r Registry
	var cs Clients
	m := open(t, &r, "sim:vram=16MiB", 0)
	c := register(t, &cs, m, ClientOptions{Name: "c"})
	must(t, cs.Queue(c, map[string]vram.ArrayRequest{"x": {Shape: []int{4, 8}, DType: vram.Float32},
		"p": {Shape: []int{8}, DType: vram.Float32, Memory: vram.Pinned, Unchunkable: true}}))
	rh, err := cs.Allocate(c, 0)
	must(t, err)
	defer cs.ReleaseResponse(rh)
	xs := make([]float32, 32)
	for name, tc := range map[string]struct {
		want error
		call func() error
	}{
		"unknown client":       {ErrNoManager, func() error { _, err := cs.Info(999); return err }},
		"unknown response":     {ErrNoManager, func() error { _, err := cs.Plan(999); return err }},
		"negative buffers":     {device.ErrInvalidValue, func() error { _, err := cs.Allocate(c, -1); return err }},
		"buffer past the end":  {device.ErrInvalidValue, func() error { _, err := cs.Array(rh, "x", 1); return err }},
		"no such label":        {device.ErrInvalidValue, func() error { _, err := cs.Array(rh, "z", 0); return err }},
		"chunk out of range":   {vram.ErrChunkRange, func() error { _, err := cs.Span(rh, 5, 0); return err }},
		"host array as device": {device.ErrInvalidValue, func() error { _, err := cs.SimHost(rh, "p", 0); return err }},
		"shape mismatch":       {vram.ErrMismatch, func() error { return cs.Copy(true, c, rh, "x", 0, f32(xs, 8, 4), nil) }},
		"dtype mismatch": {vram.ErrMismatch, func() error {
			return cs.Copy(true, c, rh, "x", 0, HostDesc{Data: unsafe.Pointer(&xs[0]), Shape: []int{4, 8}, DType: vram.Int32}, nil)
		}},
		"no host data": {device.ErrInvalidValue, func() error {
			return cs.Copy(true, c, rh, "x", 0, HostDesc{Shape: []int{4, 8}, DType: vram.Float32}, nil)
		}},
		"span past the runs": {vram.ErrMismatch, func() error {
			return cs.Copy(true, c, rh, "x", 0, f32(xs, 4, 8), &vram.Span{Axis: 0, Start: 2, Len: 3})
		}},
		"bad request": {vram.ErrInvalidRequest, func() error { return cs.Queue(c, map[string]vram.ArrayRequest{"x": {Shape: []int{0}}}) }},
		"managed memory": {device.ErrNotSupported, func() error {
			return cs.Queue(c, map[string]vram.ArrayRequest{"x": {Shape: []int{1}, DType: vram.Float32, Memory: vram.Managed}})
		}},
		"proportion":        {vram.ErrProportion, func() error { _, err := cs.Register(m, ClientOptions{Proportion: 1.5}); return err }},
		"limit mode":        {device.ErrInvalidValue, func() error { return m.SetLimitMode(7) }},
		"end unknown work":  {device.ErrInvalidValue, func() error { return cs.EndWork(999) }},
		"free unknown host": {device.ErrInvalidValue, func() error { return cs.HostFree(999) }},
		"release twice": {ErrNoManager, func() error {
			mh, err := cs.Member(rh, c)
			must(t, err)
			must(t, cs.ReleaseResponse(mh))
			return cs.ReleaseResponse(mh)
		}},
	} {
		t.Run(name, func(t *testing.T) {
			err := tc.call()
			if !errors.Is(err, tc.want) {
				t.Fatalf("got %v; want %v", err, tc.want)
			}
			if !strings.HasPrefix(err.Error(), "vram: ") {
				t.Errorf("%q does not start with vram:", err)
			}
		})
	}
	// A failed queue left the first one: the arrays are still described.
	if _, err := cs.Array(rh, "x", 0); err != nil {
		t.Error(err)
	}
}

// TestClientsCloseManager: closing a manager frees the host arrays the
// client API made for it and forgets its clients, responses, work marks and
// events; one with a live allocation is refused with all of them kept.
func TestClientsCloseManager(t *testing.T) {
	var r Registry
	var cs Clients
	m, err := r.Open(Options{Spec: "sim:vram=16MiB"})
	must(t, err)
	c := register(t, &cs, m, ClientOptions{Name: "c", Hooks: HookAllocated})
	must(t, cs.Queue(c, map[string]vram.ArrayRequest{"x": {Shape: []int{8}, DType: vram.Float64}}))
	rh, err := cs.Allocate(c, 0)
	must(t, err)
	wh, err := cs.BeginWork(c)
	must(t, err)
	hh, addr, err := cs.HostArray(m, []int{3, 5}, vram.Int64, vram.Pinned)
	must(t, err)
	if data := cs.hosts[hh].h.Data(); len(data) != 120 || addr != uintptr(unsafe.Pointer(&data[0])) {
		t.Fatalf("host array at %#x; its bytes are %d at %p", addr, len(data), &data[0])
	}
	p, err := m.Alloc(SourceC, 100, 0)
	must(t, err)
	if err := cs.CloseManager(&r, m.Handle()); !errors.Is(err, ErrBusy) {
		t.Fatalf("close with a live allocation = %v; want ErrBusy", err)
	}
	if _, err := cs.Info(c); err != nil {
		t.Fatalf("a refused close forgot the client: %v", err)
	}
	must(t, m.Free(p, 100, 0))
	must(t, cs.CloseManager(&r, m.Handle()))
	for name, call := range map[string]func() error{
		"client":   func() error { _, err := cs.Info(c); return err },
		"response": func() error { _, err := cs.Plan(rh); return err },
		"work":     func() error { return cs.EndWork(wh) },
		"host":     func() error { return cs.HostFree(hh) },
	} {
		if err := call(); err == nil {
			t.Errorf("%s after the manager closed: no error; want it forgotten", name)
		}
	}
	if ev := cs.Poll(m); ev.Kind != EventNone {
		t.Errorf("an event after the manager closed: %+v", ev)
	}
}

// TestClientsConcurrent: clients of several groups allocate, copy, mark
// work, poll and close at once (run with -race): every event is for a
// client that asked, and nothing is left once all are closed.
func TestClientsConcurrent(t *testing.T) {
	var r Registry
	var cs Clients
	m := open(t, &r, "sim:vram=64MiB", 0)
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- clientRounds(&cs, m, fmt.Sprintf("g%d", g), 10)
		}()
	}
	var polled sync.WaitGroup
	stop := make(chan struct{})
	polled.Add(1)
	go func() {
		defer polled.Done()
		for {
			for _, ev := range poll(&cs, m) {
				if ev.Response != 0 {
					cs.ReleaseResponse(ev.Response)
				}
			}
			select {
			case <-stop:
				return
			default:
			}
		}
	}()
	wg.Wait()
	close(stop)
	polled.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if len(cs.clients)+len(cs.resps)+len(cs.works) != 0 {
		t.Errorf("left: %d clients, %d responses, %d work marks", len(cs.clients), len(cs.resps), len(cs.works))
	}
}

// clientRounds registers a client in group and runs n rounds of queue,
// allocate, copy in and out, and a work mark, then closes it.
func clientRounds(cs *Clients, m *Manager, group string, n int) error {
	c, err := cs.Register(m, ClientOptions{Name: group, Group: group, Hooks: HookAllocated | HookInvalidate})
	if err != nil {
		return err
	}
	xs := make([]float32, 1<<16)
	for i := range n {
		if err := cs.Queue(c, map[string]vram.ArrayRequest{"x": {Shape: []int{len(xs)}, DType: vram.Float32}}); err != nil {
			return err
		}
		rh, err := cs.Allocate(c, 1+i%2)
		if err != nil {
			return err
		}
		wh, err := cs.BeginWork(c)
		if err == nil {
			err = cs.Copy(true, c, rh, "x", 0, f32(xs, len(xs)), nil)
		}
		if err == nil {
			err = cs.Copy(false, c, rh, "x", 0, f32(xs, len(xs)), nil)
		}
		if err == nil {
			err = cs.Do(c, "sync", syncClient)
		}
		if err == nil {
			err = cs.EndWork(wh)
		}
		if err == nil {
			err = cs.ReleaseResponse(rh)
		}
		if err != nil {
			return err
		}
	}
	return cs.Close(c)
}

// BenchmarkClients: one allocation of a client's group (the same request
// again, so each replaces the arrays before it) and one copy of 4 KiB in
// and out with a sync, through the client API ("capi": handles, the
// response's description, its release; "capi-one-call": QueueAllocate,
// which describes the response and takes the event in the same call) and through the vram client
// directly ("vram", and "vram-locked" from a goroutine locked to its
// thread, as a call from C runs), side by side on one simulator.
func BenchmarkClients(b *testing.B) {
	var r Registry
	var cs Clients
	m, err := r.Open(Options{Spec: "sim:vram=1GiB"})
	if err != nil {
		b.Fatal(err)
	}
	defer cs.CloseManager(&r, m.Handle())
	reqs := map[string]vram.ArrayRequest{"x": {Shape: []int{1024}, DType: vram.Float32}}
	c, err := cs.Register(m, ClientOptions{Name: "bench", Group: "capi", Hooks: HookAllocated})
	if err != nil {
		b.Fatal(err)
	}
	vc, err := m.Manager().Register(vram.ClientOptions{Name: "bench", Group: "vram"})
	if err != nil {
		b.Fatal(err)
	}
	defer vc.Close()
	ctx := context.Background()
	xs := make([]float32, 1024)
	check := func(err error) { // no b.Helper: its stack walk would be most of a copy's cost
		if err != nil {
			b.Fatal(err)
		}
	}
	b.Run("allocate/capi", func(b *testing.B) {
		for b.Loop() {
			check(cs.Queue(c, reqs))
			rh, err := cs.Allocate(c, 0)
			check(err)
			check(cs.ReleaseResponse(rh))
			ev := cs.Poll(m)
			check(cs.ReleaseResponse(ev.Response))
		}
	})
	b.Run("allocate/capi-one-call", func(b *testing.B) { // QueueAllocate: described, the own event taken
		for b.Loop() {
			a, err := cs.QueueAllocate(c, AllocateOptions{Queue: true, Requests: reqs, TakeEvent: true, SimHosts: true})
			check(err)
			check(cs.ReleaseResponse(a.Response))
		}
	})
	b.Run("allocate/vram", func(b *testing.B) {
		for b.Loop() {
			check(vc.Queue(reqs))
			_, err := vc.Allocate(ctx)
			check(err)
		}
	})
	check(cs.Queue(c, reqs))
	rh, err := cs.Allocate(c, 0)
	check(err)
	b.Run("copy/capi", func(b *testing.B) {
		for b.Loop() {
			check(cs.Copy(true, c, rh, "x", 0, f32(xs, 1024), nil))
			check(cs.Copy(false, c, rh, "x", 0, f32(xs, 1024), nil))
			check(cs.Do(c, "sync", syncClient))
		}
	})
	check(vc.Queue(reqs))
	vr, err := vc.Allocate(ctx)
	check(err)
	h, err := vram.WrapHost(unsafe.Slice((*byte)(unsafe.Pointer(&xs[0])), 4096), []int{1024}, vram.Float32)
	check(err)
	copyVram := func(b *testing.B) {
		for b.Loop() {
			check(vc.ToDevice(ctx, vr.Arrays()["x"], h))
			check(vc.FromDevice(ctx, h, vr.Arrays()["x"]))
			check(vc.Sync(ctx))
		}
	}
	b.Run("copy/vram", copyVram)
	// The same from a goroutine locked to its thread, as every call from C
	// is (a cgo callback): its Sync waits for the simulator's stream
	// goroutine on another thread, not on its own.
	b.Run("copy/vram-locked", func(b *testing.B) {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		copyVram(b)
	})
}
