package account

// Trims: the allocator's cache given back to the device.
//
// A trim waits for work: every stream that owns cached blocks must reach
// the frees that cached them before their pages go back, and a device
// free waits for all the device's work (cuMemFree synchronizes; so does
// the simulator). That work may be anyone's, a long kernel included. So
// a trim waits no longer than its caller's context: when the context ends
// first, the caller gets its error and the trim finishes in the
// background (Swap and Close wait for it before closing the allocator),
// and the next Trim joins it.

import (
	"context"
	"errors"
	"fmt"

	"github.com/vramkit/vram/alloc"
)

// trimRun is a trim of the allocator in flight.
type trimRun struct {
	done chan struct{} // closed when the trim has returned
	err  error         // its error, once done
}

// Trim gives the allocator's cached memory back to the device (PyTorch's
// empty_cache, CuPy's free_all_blocks), or joins the trim in flight,
// waiting no longer than ctx.
func (a *Account) Trim(ctx context.Context) error {
	a.mu.RLock()
	defer a.mu.RUnlock()
	if a.closed {
		return closedErr("trim")
	}
	return a.trimLocked(ctx)
}

// trimLocked is Trim with mu held for reading.
func (a *Account) trimLocked(ctx context.Context) error {
	a.trimMu.Lock()
	run := a.trim
	if run == nil {
		run = &trimRun{done: make(chan struct{})}
		a.trim = run
		al := a.al
		a.trims.Add(1)
		go func() {
			defer a.trims.Done()
			err := al.Trim()
			a.trimMu.Lock()
			run.err, a.trim = err, nil
			a.trimMu.Unlock()
			close(run.done)
		}()
	}
	a.trimMu.Unlock()
	select {
	case <-run.done:
		return trimErr(run.err)
	case <-ctx.Done():
		return fmt.Errorf("trim the allocator's cache (it waits for the work of the streams its cached blocks were last used on, other groups' too): %w", ctx.Err())
	}
}

// trimming reports whether a trim is in flight.
func (a *Account) trimming() bool {
	a.trimMu.Lock()
	defer a.trimMu.Unlock()
	return a.trim != nil
}

func trimErr(err error) error {
	if err != nil && !errors.Is(err, alloc.ErrClosed) {
		return fmt.Errorf("trim the allocator: %w", err)
	}
	return nil
}
