package account

// Change notices: each change to what the account's owner may plan with
// (a new cap, the lease moved, memory the owner's groups claim of each
// other) is one Change, counted and explained, and a wait for the next
// one. A running batch compares the count between chunks and plans again
// when it moved (package batch).

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// Change is the latest change to what the account's owner may plan with.
// A plain value.
type Change struct {
	Seq uint64    // changes so far (0: none yet)
	Why string    // the latest change, in words
	At  time.Time // when it was made
	// Ended, once set, says why the budget ended for good (the broker's
	// lease ended, wrapping ErrLease): the owner may hold nothing, and a
	// batch stops at its next chunk boundary rather than keep memory the
	// broker may grant to others.
	Ended error
}

// notices is the count of changes and the wait for the next one.
type notices struct {
	mu   sync.Mutex // protects the fields below
	last Change
	next chan struct{} // closed and replaced at each change
}

// Note records a change, why in words, and wakes its waiters. The
// account notes its own (SetCap, the lease); an owner notes those it
// makes (a claim of memory between its groups).
func (a *Account) Note(why string) { a.noteEnd(why, nil) }

// noteEnd records a change, one that ends the budget for good when ended
// is not nil (later changes keep it ended).
func (a *Account) noteEnd(why string, ended error) {
	n := &a.notices
	n.mu.Lock()
	if ended == nil {
		ended = n.last.Ended
	}
	n.last = Change{Seq: n.last.Seq + 1, Why: why, At: time.Now(), Ended: ended}
	if n.next != nil {
		close(n.next)
		n.next = nil
	}
	n.mu.Unlock()
	a.log.Debug("vram: budget change", "why", why)
}

// LastChange is the latest change (Seq 0 before the first). A batch reads
// it between chunks.
func (a *Account) LastChange() Change {
	a.notices.mu.Lock()
	defer a.notices.mu.Unlock()
	return a.notices.last
}

// WaitChange waits for a change after the one numbered seq and returns
// the latest; it returns at once when there is one already. When ctx is
// done first it returns an error wrapping ctx.Err().
func (a *Account) WaitChange(ctx context.Context, seq uint64) (Change, error) {
	for {
		n := &a.notices
		n.mu.Lock()
		last := n.last
		if n.next == nil {
			n.next = make(chan struct{})
		}
		next := n.next
		n.mu.Unlock()
		if last.Seq > seq {
			return last, nil
		}
		select {
		case <-next:
		case <-ctx.Done():
			return last, fmt.Errorf("wait for a budget change after %d: %w", seq, ctx.Err())
		}
	}
}

// signal is a broadcast: every channel taken before a signal is closed
// by it.
type signal struct {
	mu sync.Mutex // protects ch
	ch chan struct{}
}

func (s *signal) wait() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ch == nil {
		s.ch = make(chan struct{})
	}
	return s.ch
}

func (s *signal) broadcast() {
	s.mu.Lock()
	if s.ch != nil {
		close(s.ch)
		s.ch = nil
	}
	s.mu.Unlock()
}
