package account

// Reservations: room made under a broker's lease before the owner
// allocates (lease.go's overview, points 2 and 3). Without a lease there
// is nothing to reserve: the cap alone bounds the allocations, and
// Reserve returns at once.

import (
	"context"
	"fmt"
	"time"

	"github.com/vramkit/vram/internal/units"
)

// Reservation is room Reserve made. Release it once the allocations it
// was for are made (or abandoned); a nil Reservation (no lease) releases
// nothing.
type Reservation struct {
	done func()
}

// Release ends the reservation: the lease may be given back again, and
// the broker is told what the allocator then holds. A second call does
// nothing.
func (r *Reservation) Release() {
	if r != nil && r.done != nil {
		r.done()
		r.done = nil
	}
}

// ShortError is Reserve's error when the lease could not be brought to
// what the allocations need: the broker refused the claim, granted part
// of it, asks the account to shrink, or lowered the lease meanwhile. The
// reservation it came with still holds; Lease is the lease's budget
// after, for the owner to plan again within. It wraps ErrLease,
// ErrOutOfMemory and the broker's error, if any.
type ShortError struct {
	Want  uint64      // what the allocator would hold, bytes
	Lease LeaseBudget // the lease after
	desc  string
	err   error // the broker's error, or nil
}

func (e *ShortError) Error() string { return e.desc }

// Unwrap is ErrLease, ErrOutOfMemory and the broker's error.
func (e *ShortError) Unwrap() []error {
	if e.err == nil {
		return []error{ErrLease, ErrOutOfMemory}
	}
	return []error{ErrLease, ErrOutOfMemory, e.err}
}

// Refused reports whether the broker refused the claim (its error is
// wrapped), rather than granting it in part.
func (e *ShortError) Refused() bool { return e.err != nil }

// Reserve makes room for n more bytes of device memory than the allocator
// holds now, for allocations the caller is about to make, and holds it
// until the Reservation is released. Under a broker's lease:
//
//   - when what the allocator holds and n pass the lease, it trims the
//     allocator's cache and, if that is not enough, claims the difference
//     from the broker, waiting under ctx for borrowers to shrink (not
//     while the broker asks the account to shrink);
//   - it reports that the allocator will hold that much, so that no
//     other process's claim takes the memory as free meanwhile, and keeps
//     the cap there until the release, whatever the lease does meanwhile;
//   - the lease is not given back while the reservation holds.
//
// When the lease cannot be brought to it, the error is a *ShortError and
// the reservation still holds. An ended lease is an error wrapping
// ErrLease and ErrOutOfMemory. Without a lease Reserve does nothing and
// returns a nil Reservation.
func (a *Account) Reserve(ctx context.Context, n uint64) (*Reservation, error) {
	f := a.lease
	if f == nil {
		return nil, nil
	}
	a.mu.RLock()
	defer a.mu.RUnlock()
	if a.closed {
		return nil, closedErr("reserve")
	}
	r := &Reservation{done: f.hold()}
	if err := f.l.Err(); err != nil {
		return r, fmt.Errorf("%s has ended: %w (%w, %w)", f.l, err, ErrLease, ErrOutOfMemory)
	}
	upper := units.SatAdd(a.al.Stats().Reserved, n)
	if upper > f.budget().Bytes && a.al.Stats().Cached() > 0 {
		if err := a.trimLocked(ctx); err != nil {
			return r, fmt.Errorf("make room for %s within %s: %w", units.Format(n), f.l, err)
		}
		upper = units.SatAdd(a.al.Stats().Reserved, n)
	}
	if b := f.budget(); upper > b.Bytes {
		if err := f.claimUpTo(ctx, upper, b); err != nil {
			return r, err
		}
	}
	return r, f.report1(ctx, upper)
}

// claimUpTo claims a lease of upper bytes, b being the lease now: a
// *ShortError unless the broker grants it all.
func (f *follower) claimUpTo(ctx context.Context, upper uint64, b LeaseBudget) error {
	if b.Shrink {
		return &ShortError{Want: upper, Lease: b, desc: fmt.Sprintf("%s asks this process to shrink to %s; the allocator would hold %s",
			f.l, units.Format(b.Bytes), units.Format(upper))}
	}
	start := time.Now()
	got, err := f.claim(ctx, upper)
	f.countClaim(start, upper, got, err)
	if err != nil {
		return &ShortError{Want: upper, Lease: b, err: err, desc: fmt.Sprintf("a claim of %s of %s failed: %v", units.Format(upper), f.l, err)}
	}
	f.applyLocked(got)
	if got.Bytes < upper {
		return &ShortError{Want: upper, Lease: got, desc: fmt.Sprintf("%s granted %s of the %s claimed: beyond its guaranteed %s the broker lends only what no other lease holds or was granted (vram broker status shows who)",
			f.l, units.Format(got.Bytes), units.Format(upper), units.Format(got.Guaranteed))}
	}
	return nil
}

// report1 reports that the allocator will hold upper, which the
// reservations keep under the cap, and applies the broker's reply: a
// *ShortError when it lowered the lease below upper meanwhile.
func (f *follower) report1(ctx context.Context, upper uint64) error {
	f.mu.Lock()
	f.reserving = upper
	f.mu.Unlock()
	b, err := f.tell(ctx, upper)
	if err != nil {
		return fmt.Errorf("report to the broker that the allocator will hold %s: %w", units.Format(upper), err)
	}
	f.applyLocked(b)
	f.acked(upper, b)
	if upper > b.Bytes {
		return &ShortError{Want: upper, Lease: b, desc: fmt.Sprintf("the allocations take the allocator to %s, over the %s %s gives",
			units.Format(upper), units.Format(b.Bytes), f.l)}
	}
	return nil
}

// hold keeps the follower from giving the lease back until the func it
// returns is called, which has it report what the allocator then holds.
func (f *follower) hold() (done func()) {
	f.mu.Lock()
	f.busy++
	f.holds++
	f.mu.Unlock()
	return func() {
		f.mu.Lock()
		if f.busy--; f.busy == 0 {
			f.reserving = 0
		}
		f.mu.Unlock()
		f.wake()
	}
}

// claimFor makes room under the lease for an allocation charged bytes
// under the cap (n asked) that no Reserve made room for: when what the
// allocator holds and charged pass the lease, it claims the difference,
// waiting under ctx. The lease is not given back until done is called,
// after the allocation. A claim the broker refuses, or grants only in
// part, is an error wrapping ErrLease and ErrOutOfMemory, naming the
// figures. The account's mu is held for reading.
func (f *follower) claimFor(ctx context.Context, n, charged uint64) (done func(), err error) {
	a := f.a
	done = f.hold()
	if err := f.l.Err(); err != nil {
		done()
		return nil, fmt.Errorf("%s has ended: %w (%w, %w)", f.l, err, ErrLease, ErrOutOfMemory)
	}
	want := units.SatAdd(a.al.Stats().Reserved, charged)
	f.mu.Lock()
	f.reserving = max(f.reserving, want) // the cap stays there until done, whatever reply comes meanwhile
	f.mu.Unlock()
	if want <= f.budget().Bytes {
		return done, nil
	}
	start := time.Now()
	got, err := f.claim(ctx, want)
	f.countClaim(start, want, got, err)
	if err == nil {
		f.applyLocked(got)
	}
	switch {
	case err != nil:
		err = fmt.Errorf("a claim of %s of %s, for %s more: %w (%w, %w)", units.Format(want), f.l, units.Format(n), err, ErrLease, ErrOutOfMemory)
	case got.Bytes < want:
		err = fmt.Errorf("%s granted %s of the %s claimed, for %s more: beyond its guaranteed %s the broker lends only what no other lease holds or was granted (vram broker status shows who): %w (%w)",
			f.l, units.Format(got.Bytes), units.Format(want), units.Format(n), units.Format(got.Guaranteed), ErrLease, ErrOutOfMemory)
	}
	if err != nil {
		done()
		return nil, err
	}
	return done, nil
}

// countClaim counts a claim of want made at start, granted got or failed
// with err.
func (f *follower) countClaim(start time.Time, want uint64, got LeaseBudget, err error) {
	f.count(func(s *LeaseStats) {
		s.Claims++
		s.ClaimWait += time.Since(start)
		if err != nil || got.Bytes < want {
			s.Refused++
		}
	})
}

var _ error = (*ShortError)(nil)
