package vram

import (
	"strings"
	"testing"
)

// TestWarnings: cubie's two warnings go to the manager's logger when
// their thresholds are passed, and only then.
func TestWarnings(t *testing.T) {
	const capMsg, bigMsg = "more than 95% of its members' caps", "more than 20 times the memory available"
	tests := map[string]struct {
		mode LimitMode
		ask  ArrayRequest
		want string // the message logged ("" none)
	}{
		"active, past 95% of the cap":  {mode: Active, ask: fixed(Uint8, 31*int(MiB)), want: capMsg},
		"active, under 95% of the cap": {mode: Active, ask: fixed(Uint8, 30*int(MiB))},
		"passive: caps bound nothing":  {mode: Passive, ask: fixed(Uint8, 31*int(MiB))},
		"a batch 32 times the device":  {mode: Passive, ask: req(Uint8, 0, 2048*int(MiB)), want: bigMsg},
		"a batch 16 times the device":  {mode: Passive, ask: req(Uint8, 0, 1024*int(MiB))},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			m, _, lb := newManager(t, 64*MiB, WithLimitMode(tc.mode))
			c := register(t, m, ClientOptions{Name: "c", Group: "g", Proportion: 0.5}) // a 32 MiB cap
			if _, err := queueAndAllocate(t, c, map[string]ArrayRequest{"x": tc.ask}); err != nil {
				t.Fatal(err)
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
