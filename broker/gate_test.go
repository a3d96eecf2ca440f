package broker

// Gate figures of package broker (package internal/gate): the client's
// heap allocations per lease acquired and released.

import (
	"context"
	"testing"

	"github.com/vramkit/vram/internal/gate"
)

// TestGateAcquireRelease: heap allocations in the client's process per
// Acquire and Release over the socket, the broker serving from a child
// process (the test binary) so that its own allocations do not count.
func TestGateAcquireRelease(t *testing.T) {
	path := socketPath(t)
	if _, line := child(t, "broker", []string{"VRAM_BROKER_TEST_SOCKET=" + path}, nil); line != "serving" {
		t.Fatalf("the broker said %q", line)
	}
	c := dial(t, path)
	ctx := context.Background()
	pair := func() {
		l, err := c.Acquire(ctx, LeaseOptions{Name: "gate", Proportion: 0.5})
		if err == nil {
			err = l.Release(ctx)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	pair()
	allocs := testing.AllocsPerRun(200, pair)
	if allocs == 0 {
		t.Fatal("no heap allocation per acquire and release: the measure is broken")
	}
	gate.Record(t, gate.Figure{Name: "heap/broker/Client.Acquire+Lease.Release", Value: allocs, Unit: "allocs/op", Better: gate.Lower, Slack: brokerSlack})
}

// brokerSlack is the noise of the figure: a run may count an allocation
// more or less (the client's map of waiting calls grows now and then, a
// frame buffer past its kept size is let go).
const brokerSlack = 0.03
