package vram

// Clients and their shares of device memory.
//
// The rules by which clients share the device (manual proportions, the
// auto pool and its MinAutoPool floor, caps of proportion × total) live in
// internal/share, which the node broker (vram/broker) divides each device
// between processes by too. The manager holds one share.Pools under mu:
// the sum of the manual proportions and the number of auto clients; an
// auto client's share, (1 − manual) / auto clients, is computed when asked
// for. So registering, closing or moving a client is O(1) whatever the
// number of clients, and the auto pool is "rebalanced on every change"
// without touching the other clients.

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/vramkit/vram/device"
	"github.com/vramkit/vram/internal/share"
	"github.com/vramkit/vram/streams"
)

// ClientOptions describe a client to Register. The zero value is an
// unnamed client in the auto pool and the "default" group, with no hooks.
// Register copies what it needs; the hooks must be safe to call from
// whichever goroutine runs Allocate, SetAllocator or InvalidateAll.
//
// A client's hooks are called with no lock held, one at a time, in the
// order of the events: the OnAllocated of arrays installed before an
// invalidation comes before that invalidation's OnInvalidate. Each is
// called on the goroutine that caused its event, before that call
// returns, except when another goroutine is calling the same client's
// earlier hook at the time (or is still finishing the allocation it is
// for): that goroutine then calls the later hook, after the earlier one.
// A hook may call the manager, Allocate included.
type ClientOptions struct {
	// Name labels the client in errors, logs and plans ("" is "client").
	Name string
	// Proportion is a manual share of device memory, 0 < p ≤ 1; 0 puts
	// the client in the auto pool.
	Proportion float64
	// Group is the stream group to join ("" is "default").
	Group string
	// OnInvalidate is called when the manager has freed the client's
	// arrays behind its back, with the reason: SetAllocator or
	// InvalidateAll (an error wrapping ErrFreed), an eviction for another
	// group (ErrEvicted, evict.go), or a failed Allocate that had to free
	// the arrays it was replacing first (ErrFreed). Drop the arrays and
	// queue again. A client with no OnInvalidate is never evicted (as if
	// NoEvict): nothing could tell it its arrays were gone.
	OnInvalidate func(reason error)
	// NoEvict opts the client out of eviction: its arrays are never freed
	// to make room for another group. A client with no OnInvalidate is
	// never evicted either.
	NoEvict bool
	// OnAllocated is called after Allocate has allocated its group:
	// with the client's arrays when it had requests queued, and with the
	// chunk parameters and no arrays when another member of its group
	// had.
	OnAllocated func(*ArrayResponse)
}

// Client is a registered component: a handle with a unique id, never
// reused, so nothing can confuse it with another client. Its methods are
// safe for concurrent use.
type Client struct {
	m            *Manager
	id           uint64
	name         string
	onInvalidate func(reason error)
	onAllocated  func(*ArrayResponse)
	work         workState // work marks and eviction (workmarks.go, evict.go)

	hookMu     sync.Mutex  // protects hooks and delivering; taken after m.mu, never held over a call
	hooks      []*hookCall // hook calls to make, in event order (hooks.go)
	delivering bool        // a goroutine is making the calls

	// Protected by m.mu:
	slot         int          // index in the registry's slots
	gprev, gnext *Client      // neighbours in the group's member list (group.head)
	leave        func() error // releases c's hold of its group's stream (package streams); nil once closed
	closed       bool
	prop         uint64                   // manual proportion in share.Unit; 0 in the auto pool
	group        string                   // stream group name
	arrays       map[string][]*allocation // label → one allocation per buffer
	held         uint64                   // device bytes held, as charged
}

// allocation is one array a client holds.
type allocation struct {
	label   string
	dev     *DeviceArray // Device and Mapped memory
	host    *HostArray   // Pinned, Mapped and Pageable memory
	charged uint64       // device bytes counted in held (rounded)
}

// isManual reports whether c has a manual proportion (else it is in the
// auto pool). m.mu must be held.
func (c *Client) isManual() bool { return c.prop > 0 }

// ID is the client's id, unique within the process.
func (c *Client) ID() uint64 { return c.id }

// Name is the name given at registration.
func (c *Client) Name() string { return c.name }

// String is "name#id", the key the client has in plans and errors.
func (c *Client) String() string {
	if c == nil {
		return "<nil client>"
	}
	n := c.name
	if n == "" {
		n = "client"
	}
	return fmt.Sprintf("%s#%d", n, c.id)
}

// Manager is the manager the client is registered with.
func (c *Client) Manager() *Manager { return c.m }

// Closed reports whether the client has been closed.
func (c *Client) Closed() bool {
	c.m.mu.Lock()
	defer c.m.mu.Unlock()
	return c.closed
}

// Group is the name of the client's stream group ("" once closed).
func (c *Client) Group() string {
	c.m.mu.Lock()
	defer c.m.mu.Unlock()
	if c.closed {
		return ""
	}
	return c.group
}

// Proportion is the client's share of device memory: its manual
// proportion, or its equal part of the auto pool (0 once closed).
func (c *Client) Proportion() float64 {
	c.m.mu.Lock()
	defer c.m.mu.Unlock()
	if c.m.checkLocked(c) != nil {
		return 0
	}
	return c.m.proportionLocked(c)
}

// Cap is the client's share of device memory in bytes: Proportion × the
// manager's total memory (0 once closed).
func (c *Client) Cap() uint64 {
	c.m.mu.Lock()
	defer c.m.mu.Unlock()
	if c.m.checkLocked(c) != nil {
		return 0
	}
	return c.m.capLocked(c)
}

// Arrays returns the client's device arrays by label (buffer 0).
func (c *Client) Arrays() map[string]*DeviceArray {
	c.m.mu.Lock()
	defer c.m.mu.Unlock()
	out := make(map[string]*DeviceArray, len(c.arrays))
	for l, as := range c.arrays {
		if as[0].dev != nil {
			out[l] = as[0].dev
		}
	}
	return out
}

// Held is the device bytes the client's arrays take, as the allocator
// charges them.
func (c *Client) Held() uint64 {
	c.m.mu.Lock()
	defer c.m.mu.Unlock()
	return c.held
}

// Free frees the client's arrays under label (every buffer). It is not an
// error if there are none: a warning is logged, as cubie warns, since a
// label freed twice or misspelt usually means a bug.
func (c *Client) Free(label string) error {
	m := c.m
	m.useMu.RLock()
	defer m.useMu.RUnlock()
	m.mu.Lock()
	if err := m.checkLocked(c); err != nil {
		m.mu.Unlock()
		return err
	}
	allocs := c.takeLocked(label)
	m.mu.Unlock()
	if len(allocs) == 0 {
		m.log.Warn("vram: Free of a label the client holds no array under", "client", c.String(), "label", label)
		return nil
	}
	return m.freeWork([]freeWork{{c: c, allocs: allocs}})
}

// Close frees the client's arrays, drops its queued requests, and takes
// it out of its group and the pools (rebalancing the auto pool). Its
// hooks are not called. When it is the last member of its stream group,
// the group is removed and its stream closed, after the work queued on
// it, in the background (Close does not wait for that work). A second Close, or a Close after the manager's,
// returns nil.
func (c *Client) Close() error {
	m := c.m
	m.useMu.RLock()
	m.mu.Lock()
	if c.closed || m.closed {
		m.mu.Unlock()
		m.useMu.RUnlock()
		return nil
	}
	c.closed = true
	m.leftLocked(m.reg.remove(c)) // and what c queued
	m.pools.Leave(c.prop)
	allocs := c.takeAllLocked()
	leave := c.leave
	c.leave = nil
	m.mu.Unlock()
	defer m.useMu.RUnlock()
	var err error
	if len(allocs) > 0 {
		err = m.freeWork([]freeWork{{c: c, allocs: allocs}})
	}
	// After the frees, which use its stream. The last member of a group
	// closes the group's stream, which waits for its work: under useMu,
	// so that no SetAllocator or Close overlaps it (an allocator's Close
	// waits for the frees queued on live streams only).
	if gerr := leave(); gerr != nil {
		err = errors.Join(err, wrapIf("leave the stream group", gerr))
	}
	return errors.Join(err, c.work.drop())
}

// takeLocked removes and returns the allocations under label. m.mu must
// be held.
func (c *Client) takeLocked(label string) []*allocation {
	as, ok := c.arrays[label]
	if !ok {
		return nil
	}
	delete(c.arrays, label)
	for _, a := range as {
		c.held -= a.charged
	}
	return as
}

// holdsHostLocked reports whether c holds label and every array under it
// is host memory (Pinned, Mapped or Pageable). m.mu must be held.
func (c *Client) holdsHostLocked(label string) bool {
	as := c.arrays[label]
	for _, a := range as {
		if a.host == nil {
			return false
		}
	}
	return len(as) > 0
}

// takeAllLocked removes and returns every allocation. m.mu must be held.
func (c *Client) takeAllLocked() []*allocation {
	if len(c.arrays) == 0 {
		return nil
	}
	var all []*allocation
	for _, as := range c.arrays {
		all = append(all, as...)
	}
	c.arrays = nil
	c.held = 0
	return all
}

// Register adds a client. A manual Proportion (0 < p ≤ 1) is refused with
// ErrProportion if it would take the manual total over 1, or leave the
// auto pool under MinAutoPool while auto clients exist (with no auto
// clients it is allowed, and a warning is logged). An auto client (p = 0)
// is refused when the manual clients leave less than MinAutoPool. The
// client joins the stream group o.Group, made (with its stream) if new;
// a refused Register makes no group.
func (m *Manager) Register(o ClientOptions) (*Client, error) {
	prop, err := share.ToUnits(o.Proportion, true)
	if err != nil {
		return nil, fmt.Errorf("register %q: %w", o.Name, err)
	}
	group := o.Group
	if group == "" {
		group = streams.Default
	}
	c := &Client{
		m:            m,
		id:           m.nextID.Add(1),
		name:         o.Name,
		onInvalidate: o.OnInvalidate,
		onAllocated:  o.OnAllocated,
		prop:         prop,
		group:        group,
	}
	// cubie refuses queue_request from an instance with no live
	// invalidate hook; here such a client is kept out of eviction instead
	// (doc.go, "From cubie").
	c.work.noEvict = o.NoEvict || o.OnInvalidate == nil
	c.work.touch()
	// Take the share first, so that a refused one makes no group; then
	// hold the group's stream (which may make it: a device call, not under
	// mu), giving the share back if that fails.
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return nil, closedErr("register")
	}
	warn, err := m.pools.Join(prop)
	m.mu.Unlock()
	if err != nil {
		return nil, fmt.Errorf("register %v: %w", c, err)
	}
	_, leave, err := m.groups.Hold(group) // c's, while it is a member
	if err != nil {
		m.mu.Lock()
		if !m.closed { // Close zeroes the pools itself
			m.pools.Leave(c.prop)
		}
		m.mu.Unlock()
		if errors.Is(err, streams.ErrClosed) {
			return nil, closedErr("register") // closed meanwhile
		}
		return nil, fmt.Errorf("register %v: %w", c, err)
	}
	c.leave = leave
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		_ = leave()
		return nil, closedErr("register")
	}
	m.reg.add(c)
	m.mu.Unlock()
	if warn != "" {
		m.log.Warn(warn, "client", c.String())
	}
	return c, nil
}

// setShare puts c in the manual pool with proportion p (toManual) or in
// the auto pool; need "auto" requires c to be in the auto pool first. It
// is the body of the three setters. A refusal leaves every share as it
// was.
func (m *Manager) setShare(c *Client, p float64, toManual bool, need string) error {
	if c == nil || c.m != m {
		return foreign(c)
	}
	prop, err := share.ToUnits(p, !toManual)
	if err != nil {
		return fmt.Errorf("%v: %w", c, err)
	}
	m.mu.Lock()
	if err := m.checkLocked(c); err != nil {
		m.mu.Unlock()
		return err
	}
	if (need == "auto" && c.isManual()) || (!toManual && !c.isManual()) {
		m.mu.Unlock()
		return nil // the mode it has: nothing to do (as cubie)
	}
	// Move c as asked; a refusal leaves the pools as they were.
	warn, err := m.pools.Move(c.prop, prop)
	if err != nil {
		m.mu.Unlock()
		return fmt.Errorf("%v: %w", c, err)
	}
	c.prop = prop
	m.mu.Unlock()
	if warn != "" {
		m.log.Warn(warn, "client", c.String())
	}
	return nil
}

// SetManualProportion gives c the manual proportion p (0 < p ≤ 1),
// moving it out of the auto pool if it is there, under Register's rules:
// ErrProportion when the pools cannot give p. A refusal changes nothing.
func (c *Client) SetManualProportion(p float64) error {
	return c.m.setShare(c, p, true, "")
}

// SetManualLimitMode moves an auto client to the manual pool with
// proportion p, under Register's rules. For a client that is manual
// already it does nothing and returns nil (its proportion stays: change
// it with SetManualProportion).
func (c *Client) SetManualLimitMode(p float64) error {
	return c.m.setShare(c, p, true, "auto")
}

// SetAutoLimitMode moves a manual client to the auto pool; for an auto
// client it does nothing and returns nil. It fails with ErrProportion
// when the other manual clients leave the auto pool less than
// MinAutoPool.
func (c *Client) SetAutoLimitMode() error {
	return c.m.setShare(c, 0, false, "")
}

func (m *Manager) proportionLocked(c *Client) float64 { return m.pools.Proportion(c.prop) }

func (m *Manager) capLocked(c *Client) uint64 { return m.pools.Bytes(c.prop, m.total) }

// Shares are how the manager divides memory between its clients.
type Shares struct {
	// Total is the bytes proportions are of: the device's total memory
	// unless WithTotalMemory said otherwise.
	Total uint64
	// Manual is the sum of the manual clients' proportions.
	Manual float64
	// Auto is the share the auto clients split: 1 minus Manual while
	// there are auto clients, else 0.
	Auto float64
}

// Shares returns how memory is divided now (cubie's
// manual_pool_proportion and auto_pool_proportion).
func (m *Manager) Shares() Shares {
	m.mu.Lock()
	defer m.mu.Unlock()
	return Shares{Total: m.total, Manual: float64(m.pools.Manual()) / float64(share.Unit), Auto: m.pools.AutoShare()}
}

// Clients returns the open clients, by id.
func (m *Manager) Clients() []*Client {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.reg.all()
}

// MinAutoPool is the smallest proportion of device memory the auto pool
// may be left with while it has clients.
const MinAutoPool = share.MinAutoPool

// Sync waits for the work enqueued on c's stream and returns its first
// error. When ctx is done first it returns at once an error wrapping
// ctx.Err(); the work goes on, and the wait is abandoned, not undone:
// until the stream reaches the end of that work, SetAllocator,
// ReinitStreams and the manager's Close wait for it as they wait for a
// Sync in progress.
func (c *Client) Sync(ctx context.Context) error {
	m := c.m
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("sync %v: %w", c, err)
	}
	m.useMu.RLock()
	s, err := m.stream(c)
	if err != nil {
		m.useMu.RUnlock()
		return err
	}
	if ctx.Done() == nil { // never cancelled: wait here
		defer m.useMu.RUnlock()
		return s.Synchronize()
	}
	done := make(chan error, 1)
	go func() {
		defer m.useMu.RUnlock()
		done <- s.Synchronize()
	}()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return fmt.Errorf("sync %v: %w", c, ctx.Err())
	}
}

// Stream returns the stream of c's group, on which its arrays are
// allocated and copied: launch its kernels there. SetAllocator and
// ReinitStreams replace (and close) every group's stream, so ask again
// after an OnInvalidate.
func (c *Client) Stream() (device.Stream, error) { return c.m.stream(c) }

// stream is Client.Stream: the stream of the group c is in, which c
// holds.
func (m *Manager) stream(c *Client) (device.Stream, error) {
	if c == nil || c.m != m {
		return nil, foreign(c)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.checkLocked(c); err != nil {
		return nil, err
	}
	s, err := m.groups.GroupStream(c.group)
	if err != nil {
		return nil, fmt.Errorf("stream of %v: %w", c, err)
	}
	return s, nil
}

// check returns ErrClosed/ErrUnknownClient for a client that cannot be
// used.
func (m *Manager) check(c *Client) error {
	if c == nil || c.m != m {
		return foreign(c)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.checkLocked(c)
}

func (m *Manager) checkLocked(c *Client) error {
	if m.closed {
		return closedErr("use a client")
	}
	if c.closed {
		return fmt.Errorf("client %v is closed; register a new client: %w", c, ErrClosed)
	}
	return nil
}

// closedErr is the error of op on a closed manager.
func closedErr(op string) error {
	return fmt.Errorf("%s: the manager is closed; make a new one with New: %w", op, ErrClosed)
}

// foreign is the error for a client handle this manager did not make.
func foreign(c *Client) error {
	if c == nil {
		return fmt.Errorf("nil client; pass the *Client that Register returned: %w", ErrUnknownClient)
	}
	return fmt.Errorf("client %v was registered with another manager; call that manager: %w", c, ErrUnknownClient)
}
