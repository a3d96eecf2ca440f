package account

// The cap: an alloc.Limit, outermost around the allocator, that bounds
// the bytes allocations through the account take, as the allocator
// charges them. It may change while the account serves (SetCap, which a
// broker's lease drives the same way); lowered below what is held, it
// frees nothing: the owner's batches plan again at their next chunk, and
// WaitWithinCap waits for them.

import (
	"context"
	"fmt"

	"github.com/vramkit/vram/alloc"
	"github.com/vramkit/vram/internal/units"
)

// SetCap sets the cap on the device bytes allocations through the account
// may take, as the allocator charges them (0: none): an allocation past
// it is refused. An account made without a cap gets one around its
// allocator, counting what its owner holds (Owner.Live). Lowered below
// what is held, it frees nothing. Each call that changes the cap is a
// Change.
func (a *Account) SetCap(bytes uint64) error {
	a.capMu.Lock()
	defer a.capMu.Unlock()
	to := bytes
	if to == 0 {
		to = alloc.NoCap
	}
	a.mu.RLock()
	if a.closed {
		a.mu.RUnlock()
		return closedErr("set the cap")
	}
	lim := a.lim
	if lim != nil {
		lim.SetCap(to)
	}
	a.mu.RUnlock()
	if lim == nil && bytes != 0 {
		if err := a.installCap(to); err != nil {
			return err
		}
	}
	from := a.capBytes.Swap(bytes)
	if from != bytes {
		a.Note(fmt.Sprintf("cap %s → %s (SetCap)", capWords(from), capWords(bytes)))
	}
	return nil
}

func capWords(n uint64) string {
	if n == 0 {
		return "none"
	}
	return units.Format(n)
}

// installCap wraps the allocator in a Limit of capBytes that counts every
// device allocation the owner holds.
func (a *Account) installCap(capBytes uint64) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return closedErr("set the cap")
	}
	lim := alloc.NewLimit(a.al, capBytes)
	if a.owner != nil {
		a.owner.Live(lim.Adopt)
	}
	a.al, a.lim = lim, lim
	a.observeOOM(lim, a.kind, a.name)
	return nil
}

// Cap returns the cap (0: none) and the bytes charged under it now.
func (a *Account) Cap() (capBytes, used uint64) {
	a.mu.RLock()
	defer a.mu.RUnlock()
	if a.lim == nil {
		return 0, 0
	}
	return a.capBytes.Load(), a.lim.Used()
}

// capNowLocked is the cap's Limit's cap now (alloc.NoCap without one).
// mu must be held.
func (a *Account) capNowLocked() uint64 {
	if a.lim == nil {
		return alloc.NoCap
	}
	return a.lim.Cap()
}

// WaitWithinCap waits until the bytes charged under the cap are within
// it (at once with no cap, or when they are): after SetCap lowered it,
// until the owner's batches have planned again and given memory back.
// When ctx is done first it returns an error wrapping ctx.Err() with both
// figures.
func (a *Account) WaitWithinCap(ctx context.Context) error {
	for {
		freed := a.freed.wait()
		capBytes, used := a.Cap()
		if capBytes == 0 || used <= capBytes {
			return nil
		}
		select {
		case <-freed:
		case <-ctx.Done():
			return fmt.Errorf("wait for the arrays (%s) to come within the cap %s: %w", units.Format(used), units.Format(capBytes), ctx.Err())
		}
	}
}
