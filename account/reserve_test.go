package account

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/vramkit/vram/device/sim"
	"github.com/vramkit/vram/internal/simtest"
	"github.com/vramkit/vram/internal/units"
)

const MiB = units.MiB

// TestReserve: what Reserve asks of the broker and what it returns, by
// the lease it finds. The allocator (Direct) holds nothing, so n bytes
// reserved take the allocator to n.
func TestReserve(t *testing.T) {
	tests := map[string]struct {
		lease    LeaseBudget // before Reserve (set as the broker's change)
		grantMax uint64      // the broker grants at most this (0: all)
		refuse   error
		n        uint64
		claim    bool   // a claim of n is made
		report   bool   // n is reported held
		short    bool   // *ShortError
		refused  bool   // ShortError.Refused
		after    uint64 // the lease after
	}{
		"within the lease: reported, no claim": {lease: LeaseBudget{Bytes: 8 * MiB}, n: 4 * MiB, report: true, after: 8 * MiB},
		"past the lease: claimed, reported":    {lease: LeaseBudget{Bytes: 2 * MiB}, n: 4 * MiB, claim: true, report: true, after: 4 * MiB},
		"granted in part: short":               {lease: LeaseBudget{Bytes: 2 * MiB}, grantMax: 3 * MiB, n: 4 * MiB, claim: true, short: true, after: 3 * MiB},
		"refused: short, refused":              {lease: LeaseBudget{Bytes: 2 * MiB}, refuse: errors.New("no"), n: 4 * MiB, claim: true, short: true, refused: true, after: 2 * MiB},
		"asked to shrink: short, no claim":     {lease: LeaseBudget{Bytes: 2 * MiB, Shrink: true}, n: 4 * MiB, short: true, after: 2 * MiB},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			l := newFakeLease(64 * MiB)
			a := newLeased(t, l)
			a.leaveBroker()         // the test plays the follower
			a.lease.apply(tc.lease) // as the follower applies the broker's change
			l.mu.Lock()
			l.b, l.grantMax, l.refuse, l.claims, l.reports = tc.lease, tc.grantMax, tc.refuse, nil, nil
			l.mu.Unlock()
			r, err := a.Reserve(context.Background(), tc.n)
			defer r.Release()
			var short *ShortError
			if got := errors.As(err, &short); got != tc.short || (err != nil && !tc.short) {
				t.Fatalf("Reserve: %v; want a ShortError %v", err, tc.short)
			}
			if tc.short && (short.Refused() != tc.refused || !errors.Is(err, ErrLease) || !errors.Is(err, ErrOutOfMemory)) {
				t.Errorf("%v: refused %v, want %v, wrapping ErrLease and ErrOutOfMemory", err, short.Refused(), tc.refused)
			}
			l.mu.Lock()
			claims, reports := slices.Clone(l.claims), slices.Clone(l.reports)
			l.mu.Unlock()
			if got := slices.Contains(claims, tc.n); got != tc.claim {
				t.Errorf("claims %v; want one of %d: %v", claims, tc.n, tc.claim)
			}
			if got := slices.Contains(reports, tc.n); got != tc.report {
				t.Errorf("reports %v; want one of %d: %v", reports, tc.n, tc.report)
			}
			if b := a.lease.budget(); b.Bytes != tc.after {
				t.Errorf("lease %d MiB after; want %d MiB", b.Bytes/MiB, tc.after/MiB)
			}
		})
	}
}

// TestReserveHoldsTheLease: while a reservation holds, the follower gives
// nothing back, and the cap stays at what was reserved when the lease
// is lowered; Release lets both go.
func TestReserveHoldsTheLease(t *testing.T) {
	a := newLeased(t, newFakeLease(64*MiB))
	a.leaveBroker() // the test plays the follower
	r, err := a.Reserve(context.Background(), 8*MiB)
	if err != nil {
		t.Fatal(err)
	}
	a.lease.apply(LeaseBudget{Bytes: 2 * MiB, Shrink: true})
	if c, _ := a.Cap(); c != 8*MiB {
		t.Errorf("cap %d MiB while reserved; want the 8 MiB reserved", c/MiB)
	}
	r.Release()
	r.Release() // a second release does nothing
	a.lease.apply(LeaseBudget{Bytes: 2 * MiB, Shrink: true})
	if c, _ := a.Cap(); c != 2*MiB {
		t.Errorf("cap %d MiB once released; want the lease's 2 MiB", c/MiB)
	}
}

// TestReserveWithoutALease: with no lease there is nothing to reserve.
func TestReserveWithoutALease(t *testing.T) {
	a, err := New(simtest.New(t, 64*MiB), Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close(nil)
	r, err := a.Reserve(context.Background(), 1<<40)
	if r != nil || err != nil {
		t.Errorf("Reserve without a lease = %v, %v; want nil, nil", r, err)
	}
	r.Release() // a nil Reservation releases nothing
}

// TestGiveBackSkipsAHeldLease: the follower decides to give the lease
// back from what it read of the reservations before its call to the
// broker; a reservation or allocation that holds the lease by the time
// the call's turn comes keeps it (its claim must not be given back
// behind it, or its allocations fail at a cap of what was held before).
func TestGiveBackSkipsAHeldLease(t *testing.T) {
	l := newFakeLease(64 * MiB)
	a := newLeased(t, l)
	a.leaveBroker() // the test plays the follower
	holds := a.lease.holdsTaken()
	r, err := a.Reserve(context.Background(), 8*MiB)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Release()
	l.mu.Lock()
	l.claims = nil
	l.mu.Unlock()
	a.lease.giveBack(context.Background(), 0, holds) // as settle would, having read busy == 0 before the Reserve
	l.mu.Lock()
	claims := slices.Clone(l.claims)
	l.mu.Unlock()
	if len(claims) != 0 || a.lease.budget().Bytes != 8*MiB {
		t.Errorf("claims %v and a lease of %d MiB while reserved; want none, and the 8 MiB reserved kept", claims, a.lease.budget().Bytes/MiB)
	}
}

// TestGiveBackSkipsAStaleFigure: a reservation that came and went
// between the follower's reading of what the allocator holds and its call
// to the broker (which waited its turn behind the reservation's claim)
// left the allocator holding more than that figure: the follower gives
// nothing back to it, which would lower the lease under what is held and
// have the account shrink for nothing. The next settle reads it again.
func TestGiveBackSkipsAStaleFigure(t *testing.T) {
	l := newFakeLease(64 * MiB)
	a := newLeased(t, l)
	a.leaveBroker() // the test plays the follower
	ctx := context.Background()
	holds := a.lease.holdsTaken()
	held := a.lease.heldNow() // nothing yet
	r, err := a.Reserve(ctx, 8*MiB)
	if err != nil {
		t.Fatal(err)
	}
	p, err := a.AllocExact(8*MiB, a.Device().DefaultStream())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { must(t, a.Free(p, a.Device().DefaultStream())) }()
	r.Release()
	l.mu.Lock()
	l.claims = nil
	l.mu.Unlock()
	a.lease.giveBack(ctx, held, holds)
	l.mu.Lock()
	claims := slices.Clone(l.claims)
	l.mu.Unlock()
	if len(claims) != 0 || a.lease.budget().Bytes < 8*MiB {
		t.Errorf("claims %v and a lease of %d MiB with 8 MiB held; want none, and the lease kept", claims, a.lease.budget().Bytes/MiB)
	}
	a.lease.giveBack(ctx, a.lease.heldNow(), a.lease.holdsTaken()) // read afresh: nothing to give back
	if b := a.lease.budget().Bytes; b != 8*MiB {
		t.Errorf("a lease of %d MiB given back to a fresh figure; want the 8 MiB held", b/MiB)
	}
}

// TestAllocKeepsItsClaimUnderTheCap: an allocation that claimed room
// under the lease keeps the cap at what it claimed until it is made,
// whatever budget is applied meanwhile (a give-back's reply that crossed
// its claim): it is not refused at a cap lowered under it.
func TestAllocKeepsItsClaimUnderTheCap(t *testing.T) {
	a := newLeased(t, newFakeLease(64*MiB))
	a.leaveBroker() // the test plays the follower
	a.mu.RLock()
	done, err := a.lease.claimFor(context.Background(), 4*MiB, 4*MiB) // as Alloc does, before it allocates
	a.mu.RUnlock()
	if err != nil {
		t.Fatal(err)
	}
	a.lease.apply(LeaseBudget{}) // the reply of a give-back to nothing, applied late
	if c, _ := a.Cap(); c < 4*MiB {
		t.Errorf("cap %d B while the allocation is in progress; want the 4 MiB it claimed", c)
	}
	done()
	a.lease.apply(LeaseBudget{})
	if c, _ := a.Cap(); c != 1 {
		t.Errorf("cap %d B once done; want the lease's (nothing: 1 B)", c)
	}
}

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
