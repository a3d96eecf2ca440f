package vram

import (
	"errors"
	"github.com/vramkit/vram/account"
	"strings"
	"testing"
)

// TestActiveOwnCaps: in the Active mode each requester's arrays fit its
// own cap (less what it holds besides the arrays being replaced), not
// only the group's sum of caps: the group takes the chunk count the
// most bound member needs, and a member whose arrays cannot fit its cap
// however chunked fails the allocation, named. In the Passive mode caps
// bound nothing (as cubie's).
func TestActiveOwnCaps(t *testing.T) {
	const runs = 1 << 20
	for name, tc := range map[string]struct {
		mode    LimitMode
		buffers int
		a, b    ArrayRequest // a's cap is 32 MiB; b's 32 MiB, or bCap bytes
		aHeld   int          // a holds this much under another label first
		bCap    uint64
		notary  float64 // a third member's proportion (0: none), which queues nothing
		chunked bool
		wantErr error
		names   string // the member the error names
	}{
		"a member over its cap is chunked to it": {mode: Active, a: req(Uint8, 0, runs, 40), b: fixed(Uint8, int(MiB)), chunked: true},
		"what it holds counts":                   {mode: Active, a: req(Uint8, 0, runs, 24), b: fixed(Uint8, int(MiB)), aHeld: 16 * int(MiB), chunked: true},
		"double buffered":                        {mode: Active, buffers: 2, a: req(Uint8, 0, runs, 40), b: req(Uint8, 0, runs, 8), chunked: true},
		"fits its cap: whole":                    {mode: Active, a: req(Uint8, 0, runs, 30), b: fixed(Uint8, int(MiB))},
		"unchunkable over its own cap": {mode: Active, a: fixed(Uint8, 40*int(MiB)), b: fixed(Uint8, int(MiB)),
			wantErr: ErrUnchunkable, names: "a#"},
		// b fits its 600 B whole (one 512 B block) but not in two
		// buffers once a's cap chunks the group (whose sum of caps, with
		// the notary's, would take a's 50 MB whole).
		"a member that fits whole but not in the group's buffers": {mode: Active, buffers: 2,
			a: req(Uint8, 0, 500, 100_000), b: req(Uint8, 0, 500), bCap: 600, notary: 0.4, wantErr: ErrRunTooLarge, names: "b#"},
		"passive: caps bound nothing": {mode: Passive, a: req(Uint8, 0, runs, 40), b: fixed(Uint8, int(MiB))},
	} {
		t.Run(name, func(t *testing.T) {
			m, _, lb := newManager(t, 64*MiB, WithLimitMode(tc.mode), WithAllocatorChoice(account.Choice{Kind: Pool}))
			pb := 0.5
			if tc.bCap > 0 {
				pb = float64(tc.bCap) / float64(64*MiB)
			}
			a := register(t, m, ClientOptions{Name: "a", Group: "g", Proportion: 0.5})
			b := register(t, m, ClientOptions{Name: "b", Group: "g", Proportion: pb})
			if tc.notary > 0 {
				register(t, m, ClientOptions{Name: "n", Group: "g", Proportion: tc.notary})
			}
			if tc.aHeld > 0 {
				holdBytes(t, a, tc.aHeld)
			}
			if err := b.Queue(map[string]ArrayRequest{"y": tc.b}); err != nil {
				t.Fatal(err)
			}
			if err := a.Queue(map[string]ArrayRequest{"z": tc.a}); err != nil {
				t.Fatal(err)
			}
			resp, err := a.Allocate(t.Context(), WithBuffers(max(tc.buffers, 1)))
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) || !strings.Contains(err.Error(), tc.names) || !strings.Contains(err.Error(), "own cap") {
					t.Fatalf("got %v, want %v naming %s and its own cap", err, tc.wantErr, tc.names)
				}
				if a.Held() != uint64(tc.aHeld) || b.Held() != 0 {
					t.Errorf("a refused allocation left a holding %d, b %d", a.Held(), b.Held())
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if chunked := resp.Plan.Chunks > 1; chunked != tc.chunked {
				t.Errorf("%d chunks; want chunked %v", resp.Plan.Chunks, tc.chunked)
			}
			for _, c := range []*Client{a, b} {
				if over := c.Held() > c.Cap(); over != (tc.mode == Passive && c == a) {
					t.Errorf("%v holds %d of its cap %d", c, c.Held(), c.Cap())
				}
			}
			if strings.Contains(lb.String(), "95%") {
				t.Errorf("the manager warned of its own plan: %s", lb)
			}
		})
	}
}

// TestOwnCapsSkipClosedRequesters: a requester closed while its group is
// planned has no room read for it; the plan goes on without bounding it
// (its arrays are freed at install), rather than failing the group.
func TestOwnCapsSkipClosedRequesters(t *testing.T) {
	open, closed := &Client{name: "open", id: 1}, &Client{name: "closed", id: 2}
	reqs := map[*Client]map[string]ArrayRequest{open: {"x": req(Uint8, 0, 1000)}, closed: {"y": req(Uint8, 0, 1000)}}
	b := &groupBudget{mode: Active, budget: 1 << 20, own: map[*Client]ownRoom{open: {cap: 1 << 20, room: 1 << 20}}}
	p, err := planGroupOnce(reqs, b.budget, PlanOptions{})
	if err != nil {
		t.Fatal(err)
	}
	got, err := withinOwnCaps(reqs, b, PlanOptions{}, p)
	if err != nil || got.Chunks != 1 {
		t.Errorf("%+v, %v; want the plan as it was", got, err)
	}
}
