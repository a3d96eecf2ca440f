package vram

import (
	"errors"
	"strings"
	"testing"

	"github.com/vramkit/vram/account"
)

// TestWarnings: cubie's two warnings go to the manager's logger when
// their thresholds are passed, as cubie checks them (before planning:
// what the group holds already; the group's whole request against the
// device's free memory, on a refused plan too), and only then: never
// about the plan the manager made.
func TestWarnings(t *testing.T) {
	const capMsg, bigMsg = "more than 95% of its members' caps", "more than 20 times the device's free memory"
	tests := map[string]struct {
		mode    LimitMode
		held    int            // bytes c holds under another label first
		ask     []ArrayRequest // c's requests, then a second member's
		wantErr error
		want    string // the message logged ("" none)
	}{
		// c's cap is 32 MiB of the 64 MiB device.
		"active, holding past 95% of the cap":  {mode: Active, held: 31 * int(MiB), ask: []ArrayRequest{fixed(Uint8, 1<<10)}, want: capMsg},
		"active, holding under 95% of the cap": {mode: Active, held: 30 * int(MiB), ask: []ArrayRequest{fixed(Uint8, 1<<10)}},
		"active, its own plan fills the cap":   {mode: Active, ask: []ArrayRequest{req(Uint8, 0, 62*int(MiB))}}, // 2 chunks of 31 MiB
		"passive: caps bound nothing":          {mode: Passive, held: 31 * int(MiB), ask: []ArrayRequest{fixed(Uint8, 1<<10)}},
		"a batch 32 times the device":          {mode: Passive, ask: []ArrayRequest{req(Uint8, 0, 2048*int(MiB))}, want: bigMsg},
		"a batch 16 times the device":          {mode: Passive, ask: []ArrayRequest{req(Uint8, 0, 1024*int(MiB))}},
		"two members, 12 times each":           {mode: Passive, ask: []ArrayRequest{req(Uint8, 0, 768*int(MiB)), req(Uint8, 0, 768*int(MiB))}, want: bigMsg},
		"refused, 32 times the device":         {mode: Passive, ask: []ArrayRequest{fixed(Uint8, 2048*int(MiB))}, wantErr: ErrUnchunkable, want: bigMsg},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			m, _, lb := newManager(t, 64*MiB, WithLimitMode(tc.mode), WithAllocatorChoice(account.Choice{Kind: Pool})) // 512 B granularity: 31 MiB held is 31 MiB
			c := register(t, m, ClientOptions{Name: "c", Group: "g", Proportion: 0.5})
			if tc.held > 0 {
				holdBytes(t, c, tc.held)
				if strings.Contains(lb.String(), capMsg) {
					t.Fatalf("warned while allocating what c holds: %s", lb)
				}
			}
			for i, r := range tc.ask[1:] {
				d := register(t, m, ClientOptions{Name: "d", Group: "g", Proportion: 0.25})
				if err := d.Queue(map[string]ArrayRequest{"y": r}); err != nil {
					t.Fatal(i, err)
				}
			}
			_, err := queueAndAllocate(t, c, map[string]ArrayRequest{"z": tc.ask[0]}) // holdBytes holds "x"
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("allocate: %v, want %v", err, tc.wantErr)
			}
			log := lb.String()
			for _, msg := range []string{capMsg, bigMsg} {
				if got := strings.Contains(log, msg); got != (msg == tc.want) {
					t.Errorf("logged %q: %v, want %v; log:\n%s", msg, got, msg == tc.want, log)
				}
			}
		})
	}
}
