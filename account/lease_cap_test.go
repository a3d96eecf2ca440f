package account

import (
	"testing"

	"github.com/vramkit/vram/device/sim"
)

// TestLeaseCapKeepsTheReservation: a lease lowered while a reservation
// holds, after the broker took its report of what the allocator will
// hold (reserving), leaves the cap at that reservation, so that the
// allocations it was made for do not fail at the cap; once it is
// released the cap follows the lease down.
func TestLeaseCapKeepsTheReservation(t *testing.T) {
	dev, err := sim.New(sim.Config{TotalBytes: 1 << 30, NoContext: true, AddressOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Close()
	a, err := New(dev, Config{Cap: 600 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close(nil)
	f := &follower{a: a, applied: LeaseBudget{Bytes: 600 << 20}, capSet: 600 << 20}
	done := f.hold()
	f.mu.Lock()
	f.reserving = 600 << 20 // the report Reserve made
	f.mu.Unlock()
	for _, tc := range []struct { // in order: each step follows the one before
		name string
		step func()
		want uint64
	}{
		{"lowered during the reservation", func() { f.apply(LeaseBudget{Bytes: 480 << 20, Shrink: true}) }, 600 << 20},
		{"the reservation released", func() { done(); f.apply(LeaseBudget{Bytes: 480 << 20, Shrink: true}) }, 480 << 20},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.step()
			if got := a.lim.Cap(); got != tc.want {
				t.Errorf("cap %d MiB, want %d MiB", got>>20, tc.want>>20)
			}
		})
	}
}
