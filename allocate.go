package vram

// Client.Allocate and what it returns (ArrayResponse).
//
// Clients queue requests per stream group; Allocate takes the whole
// group's queue, works out the group's budget, plans the requests
// together (Plan), allocates every requester's arrays at the planned
// shapes on the group's stream, installs them, frees the arrays they
// replace, and then, with no lock held, calls the requesters' and the
// other members' OnAllocated hooks. If planning or any allocation fails,
// what was allocated is freed and the queue is put back as it was. The
// arrays being replaced are freed before allocating only when the plan
// needs their memory (or, for host arrays, the pinned-memory limit does);
// a failure after that calls their owners' OnInvalidate hooks. The
// transaction itself, its steps named, is in alloctx.go.

import (
	"context"
	"fmt"
)

// ArrayResponse is what Allocate gives a client: its arrays (none for
// a notary, a group member that queued nothing) and the group's chunk
// parameters. The arrays stay the manager's: it frees them on Free,
// FreeAll, the client's Close, a later allocation under the same label,
// or SetAllocator.
//
// A response is not changed after it is delivered; it is safe to read
// from many goroutines.
type ArrayResponse struct {
	// Client is the client the response is for.
	Client *Client
	// Buffers holds the client's arrays, one set per buffer in flight
	// (Plan.Buffers, at least one; a notary's one set is empty): the
	// device arrays by label (Device and Mapped requests; for Mapped, the
	// device address of the host memory) and the host arrays (Pinned,
	// Mapped and Pageable requests). The unchunkable arrays are the same
	// in every buffer. Arrays and Host read buffer 0.
	Buffers []ArraySet
	// Plan is the group's plan: its chunks (Chunks passes of ChunkLength
	// runs, TotalRuns in all), its buffers and every requester's shapes.
	Plan ChunkPlan
	// FreeErr is what went wrong freeing the arrays this allocation
	// replaced for the client (nil when nothing did; always nil for a
	// notary). It never means the allocation failed: the new arrays are
	// installed and the old ones are no longer the client's. After a
	// device reset it wraps device.ErrInvalidated: the old memory went
	// with the reset and there was nothing left to free.
	FreeErr error

	shapes map[string][]int // the client's shapes in Plan, by label (ChunkedShapes)
	group  []*ArrayResponse // every response of the same Allocate, this one included; set before delivery
}

// Arrays returns the client's device arrays of buffer 0, by label (nil
// in the zero response, which Allocate never returns).
func (r *ArrayResponse) Arrays() map[string]*DeviceArray {
	if len(r.Buffers) == 0 {
		return nil
	}
	return r.Buffers[0].Device
}

// Host returns the client's host arrays of buffer 0, by label (nil in
// the zero response).
func (r *ArrayResponse) Host() map[string]*HostArray {
	if len(r.Buffers) == 0 {
		return nil
	}
	return r.Buffers[0].Host
}

// ChunkedShapes returns the shape each of the client's arrays was
// allocated with, by label (its entry in Plan.ChunkedShapes; empty for a
// notary).
func (r *ArrayResponse) ChunkedShapes() map[string][]int { return r.shapes }

// ArraySet is one buffer's arrays. Like the response it belongs to, it
// is not changed after delivery and is safe to read concurrently.
type ArraySet struct {
	Device map[string]*DeviceArray
	Host   map[string]*HostArray
}

// Chunk returns the runs of chunk i: see ChunkPlan.Chunk.
func (r *ArrayResponse) Chunk(i int) (start, n int, err error) { return r.Plan.Chunk(i) }

// Span returns chunk i along axis: see ChunkPlan.Span.
func (r *ArrayResponse) Span(i, axis int) (Span, error) { return r.Plan.Span(i, axis) }

// Member returns the response the same Allocate delivered to c, a member
// of r's group: a requester's, with its arrays, or a notary's, with the
// chunk parameters alone. It is nil when that Allocate delivered c none
// (c was not in the group, or closed meanwhile). So whoever called
// Allocate reaches every member's arrays without an OnAllocated hook.
func (r *ArrayResponse) Member(c *Client) *ArrayResponse {
	for _, m := range r.group {
		if m.Client == c {
			return m
		}
	}
	if r.Client == c {
		return r // delivered alone (its client had moved to another group)
	}
	return nil
}

// lockCtx takes the lock l (a channel with room for one; receive from it
// to unlock), or returns an error wrapping ctx.Err() if ctx is done
// first.
func lockCtx(ctx context.Context, l chan struct{}, what string) error {
	select {
	case l <- struct{}{}:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("waiting for %s: %w", what, ctx.Err())
	}
}

// Allocate allocates every request queued in c's stream group, planned
// together within the group's budget, and delivers them. The budget
// (the device's free memory with the arrays being replaced counted free,
// the Active caps, the allocation cap) and how a plan is fitted to it
// are stated once, in budget.go; a refusal names each figure and what
// would raise the one that binds.
//
// Each requester's arrays are allocated on the group's stream at the
// planned shapes, replacing what it holds under the same labels: the old
// arrays are freed once the new ones are in, or first when the plan needs
// their memory. Then, with no lock held and in client id order, every
// requester's OnAllocated is called with its arrays and every other
// member's (a notary's) with the plan alone, on this goroutine unless
// another is delivering that client's earlier hook (ClientOptions).
// Allocate returns c's own response; ArrayResponse.Member reaches the
// others'.
//
// With nothing queued it allocates nothing and sends every member the
// group's last plan again (as cubie's allocate_queue), or fails with
// ErrNothingQueued when the group has none. If c is closed meanwhile,
// the other members get their arrays and Allocate returns an error
// wrapping ErrClosed.
//
// On failure (ErrUnchunkable, ErrRunTooLarge, ErrRunsMismatch,
// ErrOutOfMemory) no OnAllocated is called, the queue is as it was and
// so are the arrays being replaced, unless they had to be freed first:
// then the error names their owners and labels, and each owner's
// OnInvalidate is called. Freeing the replaced arrays after the install
// never fails the call (ArrayResponse.FreeErr says what went wrong).
//
// ctx bounds the waits: for another allocation of the group, for any
// group's allocation while it plans and allocates, and for the trim of
// the allocator's cache. It is checked before, during those waits and
// once after the plan; a cancelled Allocate returns an error wrapping
// ctx.Err() with the queue and the arrays as they were (its trim may
// have given cached memory back). Past that point it completes. A
// SetAllocator or Close in progress is waited for.
func (c *Client) Allocate(ctx context.Context, opts ...AllocateOption) (*ArrayResponse, error) {
	m := c.m
	ac := allocConfig{buffers: 1}
	for _, o := range opts {
		o(&ac)
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("allocate for %v: %w", c, err)
	}
	res, err := m.allocateLocking(ctx, c, ac)
	// Hooks run with no lock held, in event order (hooks.go): a failure
	// that dropped arrays tells their owners, a success delivers every
	// response, now complete.
	deliver(res.invalidated)
	if err != nil {
		return nil, err
	}
	for i, d := range res.out {
		if h := res.calls[i]; h != nil {
			d.c.markReady(h)
		}
		d.c.deliverHooks()
	}
	if res.mine == nil {
		return nil, fmt.Errorf("allocate for %v: the client was closed while its group was allocated; the other members got their arrays: %w", c, ErrClosed)
	}
	return res.mine, nil
}

// allocateLocking takes c's group lock, planMu and useMu, runs
// allocateGroup and releases them, even if it panics.
func (m *Manager) allocateLocking(ctx context.Context, c *Client, ac allocConfig) (groupOutcome, error) {
	// Lock c's group, making sure c is still in it once locked.
	var gl chan struct{}
	var group string
	for {
		g, l, err := m.groupLock(c)
		if err != nil {
			return groupOutcome{}, err
		}
		gl = l
		if err := lockCtx(ctx, gl, "another allocation of group "+g); err != nil {
			return groupOutcome{}, fmt.Errorf("allocate for %v: %w", c, err)
		}
		if now, nl, err := m.groupLock(c); err != nil || now != g || nl != gl {
			<-gl
			if err != nil {
				return groupOutcome{}, err
			}
			continue
		}
		group = g
		break
	}
	defer func() { <-gl }()
	// One group plans and allocates at a time, so that each plans against
	// free memory no other allocation is taking meanwhile.
	if err := lockCtx(ctx, m.planMu, "the allocation of another group"); err != nil {
		return groupOutcome{}, fmt.Errorf("allocate for %v: %w", c, err)
	}
	defer func() { <-m.planMu }()
	m.useMu.RLock()
	defer m.useMu.RUnlock()
	// Hold the group so that it stays while it is allocated, even if its
	// last member leaves meanwhile; the release (which then closes its
	// stream, waiting for its work) comes before useMu is released.
	if _, release, err := m.groups.Hold(group); err == nil {
		defer func() {
			if err := release(); err != nil {
				m.log.Warn("vram: Allocate could not close the stream of a group left with no member", "group", group, "err", err)
			}
		}()
	}
	return m.allocateGroup(ctx, c, group, ac)
}

// delivery is one hook call.
type delivery struct {
	c    *Client
	resp *ArrayResponse
}

// groupOutcome is what allocateGroup leaves Allocate to do once
// every lock is released.
type groupOutcome struct {
	out         []delivery     // responses, requesters first
	calls       []*hookCall    // out[i]'s OnAllocated call, queued not ready; nil with no hook
	mine        *ArrayResponse // the trigger's response; nil if it was closed meanwhile
	invalidated []*Client      // owners of arrays a failed call freed, their OnInvalidate queued
}

// An Allocate with nothing queued (cubie's allocate_queue with an empty
// queue): every member of the group is sent the group's last plan again,
// with no arrays, which is how members that keep their arrays across
// runs learn the chunking again. A group that has never been planned
// (or was emptied of members since) has no plan to send: that is
// ErrNothingQueued.
