package capi

import (
	"slices"
	"testing"
	"unsafe"

	"github.com/vramkit/vram"
)

// cLabel is the C string response rh keeps for label, and its address.
func cLabel(cs *Clients, rh int64, label string) (string, uintptr) {
	cs.mu.Lock()
	re := cs.resps[rh]
	cs.mu.Unlock()
	re.pinMu.Lock()
	defer re.pinMu.Unlock()
	b := re.cLabels[label]
	if len(b) == 0 {
		return "", 0
	}
	return string(b), uintptr(unsafe.Pointer(&b[0]))
}

// TestResponseIDs: one response given under several handles (Allocate's,
// its event's, Member's) says one id under each, the first handle; the
// next allocation's response has another; an id outlives the release of
// some of its handles and is forgotten with the last.
func TestResponseIDs(t *testing.T) {
	var r Registry
	var cs Clients
	m := open(t, &r, "sim:vram=16MiB", 0)
	a := register(t, &cs, m, ClientOptions{Name: "a", Group: "g", Hooks: HookAllocated})
	b := register(t, &cs, m, ClientOptions{Name: "b", Group: "g", Hooks: HookAllocated})
	must(t, cs.Queue(a, map[string]vram.ArrayRequest{"x": {Shape: []int{64}, DType: vram.Float32}}))
	rh, err := cs.Allocate(a, 0)
	must(t, err)
	evs := poll(&cs, m)
	if len(evs) != 2 || evs[0].Client != a || evs[1].Client != b {
		t.Fatalf("events = %+v; want a's, then b's", evs)
	}
	mh, err := cs.Member(rh, b)
	must(t, err)
	id := func(h int64) int64 {
		t.Helper()
		pi, err := cs.Plan(h)
		must(t, err)
		return pi.ID
	}
	tests := map[string]struct {
		h, want int64
	}{
		"allocate's":    {rh, evs[0].ID}, // a's response: the event came first, so its handle is the id
		"a's event's":   {evs[0].Response, evs[0].Response},
		"b's event's":   {evs[1].Response, evs[1].Response}, // another client's response: another id
		"b's member's":  {mh, evs[1].ID},
		"event's field": {evs[1].Response, evs[1].ID},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if got := id(tc.h); got != tc.want {
				t.Errorf("id of handle %d = %d; want %d", tc.h, got, tc.want)
			}
		})
	}
	if evs[0].ID == evs[1].ID {
		t.Errorf("a's and b's responses share id %d", evs[0].ID)
	}

	// Released handle by handle: the id stays while one is held.
	must(t, cs.ReleaseResponse(evs[0].Response))
	if got := id(rh); got != evs[0].ID {
		t.Errorf("after the event's release, allocate's handle says id %d; want %d", got, evs[0].ID)
	}
	must(t, cs.ReleaseResponse(rh))
	must(t, cs.ReleaseResponse(evs[1].Response))
	must(t, cs.ReleaseResponse(mh))
	cs.mu.Lock()
	left := len(cs.ids)
	cs.mu.Unlock()
	if left != 0 {
		t.Errorf("%d ids kept after every handle was released; want 0", left)
	}

	// The next allocation: new ids.
	rh2, err := cs.Allocate(a, 0)
	must(t, err)
	defer cs.ReleaseResponse(rh2)
	for _, ev := range poll(&cs, m) {
		defer cs.ReleaseResponse(ev.Response)
	}
	if got := id(rh2); got <= evs[1].Response {
		t.Errorf("the next allocation's id is %d; want a new one, above %d", got, evs[1].Response)
	}
}

// TestResponseArrays: Arrays describes a buffer's arrays sorted by label,
// as Array describes each, with the label as a C string that stays; a
// buffer past the response's is refused.
func TestResponseArrays(t *testing.T) {
	var r Registry
	var cs Clients
	m := open(t, &r, "sim:vram=4MiB", 0)
	c := register(t, &cs, m, ClientOptions{Name: "c", Group: "g"})
	must(t, cs.Queue(c, map[string]vram.ArrayRequest{
		"zeta":  {Shape: []int{1 << 18}, DType: vram.Float32}, // 1 MiB: chunked with alpha on 4 MiB
		"alpha": {Shape: []int{1 << 18}, DType: vram.Float64}, // 2 MiB
		"k":     {Shape: []int{3}, DType: vram.Int32, Unchunkable: true},
		"p":     {Shape: []int{16}, DType: vram.Float32, Memory: vram.Pinned, Unchunkable: true},
	}))
	rh, err := cs.Allocate(c, 2)
	must(t, err)
	defer cs.ReleaseResponse(rh)
	pi, err := cs.Plan(rh)
	must(t, err)
	if pi.Sets != 2 || pi.Arrays != 4 {
		t.Fatalf("plan: %d sets, %d arrays; want 2 buffers of 4 arrays", pi.Sets, pi.Arrays)
	}
	for b := range pi.Sets {
		as, err := cs.Arrays(rh, b, nil)
		must(t, err)
		labels := make([]string, len(as))
		for i, a := range as {
			labels[i] = a.Label
			one, err := cs.Array(rh, a.Label, b)
			must(t, err)
			if !slices.Equal(one.Shape, a.Shape) || one.DevicePtr != a.DevicePtr || one.Host != a.Host || one.ChunkAxis != a.ChunkAxis {
				t.Errorf("buffer %d %q: Arrays says %+v, Array %+v", b, a.Label, a, one)
			}
			if got, at := cLabel(&cs, rh, a.Label); got != a.Label+"\x00" || at != a.LabelC || one.LabelC != a.LabelC {
				t.Errorf("buffer %d %q: its C label is %q at %#x; Arrays says %#x, Array %#x", b, a.Label, got, at, a.LabelC, one.LabelC)
			}
		}
		if want := []string{"alpha", "k", "p", "zeta"}; !slices.Equal(labels, want) {
			t.Errorf("buffer %d: labels %q; want %q, sorted", b, labels, want)
		}
	}
	if _, err := cs.Arrays(rh, 2, nil); err == nil {
		t.Error("Arrays of buffer 2 of a response of 2: no error")
	}
}

// TestPollPending: each event says how many were queued behind it.
func TestPollPending(t *testing.T) {
	var r Registry
	var cs Clients
	m := open(t, &r, "sim:vram=16MiB", 0)
	var hs []int64
	for _, name := range []string{"a", "b", "c"} {
		hs = append(hs, register(t, &cs, m, ClientOptions{Name: name, Group: "g", Hooks: HookAllocated | HookInvalidate}))
	}
	must(t, cs.Queue(hs[0], map[string]vram.ArrayRequest{"x": {Shape: []int{64}, DType: vram.Float32}}))
	rh, err := cs.Allocate(hs[0], 0)
	must(t, err)
	must(t, cs.ReleaseResponse(rh))
	must(t, m.InvalidateAll()) // three more: every client's invalidation
	var pending []int
	for _, ev := range poll(&cs, m) {
		pending = append(pending, ev.Pending)
		if ev.Response != 0 {
			must(t, cs.ReleaseResponse(ev.Response))
		}
	}
	if want := []int{5, 4, 3, 2, 1, 0}; !slices.Equal(pending, want) {
		t.Errorf("pending = %v; want %v (three allocations, three invalidations)", pending, want)
	}
	if ev := cs.Poll(m); ev.Kind != EventNone || ev.Pending != 0 {
		t.Errorf("an empty queue polls %+v", ev)
	}
}
