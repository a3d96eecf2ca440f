package vram

// The Manager: the registry of clients, the stream groups, the queues of
// array requests and the shares, over the device-memory account (package
// account), which owns the allocator, its cap and a broker's lease.
//
// Locking. Four levels, always taken in this order:
//
//  1. a per-group mutex (groupLock), held by Allocate for one group
//     while it plans and allocates, so two calls never allocate the same
//     queue;
//  2. planMu, held by Allocate from reading the account's room until its
//     arrays are allocated, so that two groups never plan against the
//     same free memory (and by the eviction a broker's lease asks for,
//     and by Close);
//  3. useMu, an RWMutex: held for reading by everything that uses the
//     arrays, the streams or the account (allocating, freeing, copying,
//     moving a client between groups), for writing by SetAllocator,
//     ReinitStreams and Close, which replace or close them;
//  4. mu, which protects the registry (clients, shares, queues, each
//     client's arrays). Nothing holding mu calls the device, the account
//     or the allocator, and no hook is ever called with any of these held.
//
// The account's own locks come after useMu and before mu (it calls back
// into the registry only to list the arrays a new cap counts: Owner.Live);
// the stream groups (package streams) have their own lock, taken after mu
// when both are needed.

import (
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"

	"github.com/vramkit/vram/account"
	"github.com/vramkit/vram/device"
	"github.com/vramkit/vram/internal/share"
	"github.com/vramkit/vram/streams"

	// Link the device backends, so that device.Open("auto") — and with it
	// Default — finds CUDA when a driver and GPU are there and the
	// simulator otherwise.
	_ "github.com/vramkit/vram/device/cuda"
	_ "github.com/vramkit/vram/device/sim"
)

// Manager gives registered clients shares of one device's memory, puts
// them in stream groups, and serves their array requests, chunking a
// group's batch when it does not fit.
//
// A Manager is safe for concurrent use by any number of goroutines.
type Manager struct {
	dev     device.Device
	strided device.StridedCopier // dev's 2-D copies, or nil
	total   uint64               // bytes that shares are proportions of
	groups  *streams.Groups
	log     *slog.Logger
	cfg     config
	host    *hostPool
	acct    *account.Account // the allocator, its cap and the broker's lease; set in New
	nextID  atomic.Uint64
	ownsDev bool          // Open's manager: Close closes dev; set before m is shared
	replans atomic.Uint64 // Allocate plans made again after the allocator took more than reserved

	planMu chan struct{} // room for one: serializes Allocate's budget, plan and allocation (lockCtx)
	useMu  sync.RWMutex  // read: arrays, streams and the account are in use; write: replaced or closed

	mu     sync.Mutex  // protects the fields below
	reg    registry    // open clients and their groups, each group's queue, lock and last plan (group.go)
	pools  share.Pools // the clients' shares (internal/share)
	mode   LimitMode   // Passive or Active
	closed bool
}

// New returns a manager of dev. The caller keeps ownership of dev: Close
// the manager before the device.
func New(dev device.Device, opts ...Option) (*Manager, error) {
	if dev == nil {
		return nil, fmt.Errorf("new manager: nil device: %w", device.ErrInvalidValue)
	}
	var cfg config
	for _, o := range opts {
		o(&cfg)
	}
	if cfg.log == nil {
		cfg.log = slog.Default()
	}
	if cfg.mode != Passive && cfg.mode != Active {
		return nil, fmt.Errorf("new manager: limit mode %v: want Passive or Active: %w", cfg.mode, device.ErrInvalidValue)
	}
	total := cfg.total
	if total == 0 {
		_, t, err := dev.MemInfo()
		if err != nil {
			return nil, fmt.Errorf("new manager: read device memory: %w", err)
		}
		total = t
	}
	groups := streams.New(dev)
	m := &Manager{
		dev:    dev,
		total:  total,
		groups: groups,
		log:    cfg.log,
		cfg:    cfg,
		host:   newHostPool(dev, groups.WaitClosed, cfg.host, cfg.log),
		reg:    newRegistry(),
		pools:  share.New("client"),
		mode:   cfg.mode,
		planMu: make(chan struct{}, 1),
	}
	m.strided, _ = dev.(device.StridedCopier)
	m.observePinnedOOM()
	acct, err := account.New(dev, m.accountConfig()) // options.go
	if err != nil {
		// As the account says it: "new account: …", or a broker's lease
		// refused or not reached, in the broker's own line, which names it
		// and the fix (account.Broker.Lease).
		return nil, err
	}
	m.acct = acct
	return m, nil
}

var (
	defaultOnce sync.Once
	defaultMgr  *Manager
	defaultErr  error
)

// Default returns the process-wide manager, made on the first call as
// Open("") makes one: on device.Open("auto") (or $VRAM_DEVICE), the CUDA
// device 0 when a driver and GPU are present, else the simulator, with
// the allocator that $VRAM_ALLOC_CONF configures (ParseAllocConf) and,
// when $VRAM_BROKER names the node broker's socket, its budget from a
// lease of it (WithBroker; the program must link package broker). Every
// call returns the same manager (or the same error); it is safe to call
// from many goroutines at once. Its device is never closed. Do not Close
// the default manager while anything in the process may still use it:
// it is never remade, so every later call returns the closed manager.
// Close clients instead, or use Open for a manager of your own.
func Default() (*Manager, error) {
	defaultOnce.Do(func() {
		defaultMgr, defaultErr = open("", false, nil)
		if defaultErr != nil {
			defaultErr = fmt.Errorf("default manager: %w", defaultErr)
		}
	})
	return defaultMgr, defaultErr
}

// Open opens the device spec names (device.Open: "" is $VRAM_DEVICE, else
// "auto", the CUDA device 0 when a driver and GPU are present and the
// simulator otherwise) and a manager of it that owns it: Close closes the
// manager, then the device. The manager is made as Default's is, with
// the options $VRAM_ALLOC_CONF and $VRAM_BROKER give first and opts after
// them, so that an option given here wins.
func Open(spec string, opts ...Option) (*Manager, error) { return open(spec, true, opts) }

// open opens spec's device and a manager of it with the environment's
// options and then opts; own makes the device the manager's to close.
func open(spec string, own bool, opts []Option) (*Manager, error) {
	env, err := AllocConfFromEnv() // $VRAM_ALLOC_CONF (allocconf.go)
	if err != nil {
		return nil, err
	}
	env = append(env, brokerFromEnv()...) // $VRAM_BROKER (options.go)
	dev, err := device.Open(spec)
	if err != nil {
		return nil, err
	}
	m, err := New(dev, append(env, opts...)...)
	if err != nil {
		return nil, errors.Join(err, dev.Close())
	}
	m.ownsDev = own
	return m, nil
}

// Device is the managed device.
func (m *Manager) Device() device.Device { return m.dev }

// Account is the manager's device-memory account: its allocator (Stats,
// Report, Trim), the cap (SetCap, Cap, WaitWithinCap), a broker's lease
// (Lease) and the budget changes batches plan again for (LastChange,
// WaitChange). Use it for those; allocate and free through the manager.
func (m *Manager) Account() *account.Account { return m.acct }

// MemInfo reports the device's free and total memory.
func (m *Manager) MemInfo() (free, total uint64, err error) { return m.dev.MemInfo() }

// LimitMode returns the current limit mode.
func (m *Manager) LimitMode() LimitMode {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.mode
}

// SetLimitMode sets the limit mode for later allocations.
func (m *Manager) SetLimitMode(mode LimitMode) error {
	if mode != Passive && mode != Active {
		return fmt.Errorf("set limit mode %v: want Passive or Active: %w", mode, device.ErrInvalidValue)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return closedErr("set limit mode")
	}
	m.mode = mode
	return nil
}

// SetAllocator frees every array the manager has handed out, closes the
// current allocator, makes one of kind, gives every stream group a fresh
// stream and then calls every client's OnInvalidate hook: the manager's
// equivalent of a context reset, with no reset needed. Queued requests
// stay queued. If the new allocator cannot be made (AsyncPool on a device
// without a stream-ordered pool returns an error wrapping
// ErrNotSupported) nothing changes.
func (m *Manager) SetAllocator(kind AllocatorKind) error {
	m.useMu.Lock()
	if m.isClosed() {
		m.useMu.Unlock()
		return closedErr("set allocator")
	}
	next, err := m.acct.Prepare(kind)
	if err != nil {
		m.useMu.Unlock()
		return fmt.Errorf("set allocator %v: %w", kind, err)
	}
	freeErr := m.freeAllLocked(nil)
	swapErr := m.acct.Swap(next)
	streamErr := m.groups.Reinit()
	m.mu.Lock()
	clients, _ := m.postInvalidateLocked(fmt.Errorf("SetAllocator(%v) freed every array: %w", kind, ErrFreed), true)
	m.mu.Unlock()
	m.useMu.Unlock()
	deliver(clients)
	return errors.Join(freeErr, swapErr, wrapIf("new streams", streamErr))
}

func wrapIf(what string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("%s: %w", what, err)
}

// Free frees, for every client, the arrays held under label (in every
// buffer). It frees nothing and returns nil when no client holds label.
func (m *Manager) Free(label string) error {
	m.useMu.RLock()
	defer m.useMu.RUnlock()
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return closedErr("free")
	}
	var work []freeWork
	for _, c := range m.reg.slots {
		if c == nil {
			continue
		}
		if allocs := c.takeLocked(label); len(allocs) > 0 {
			work = append(work, freeWork{c: c, allocs: allocs})
		}
	}
	m.mu.Unlock()
	return m.freeWork(work)
}

// FreeAll frees every array of every client. Hooks are not called.
// After Close it returns an error wrapping ErrClosed.
func (m *Manager) FreeAll() error {
	m.useMu.RLock()
	defer m.useMu.RUnlock()
	if m.isClosed() {
		return closedErr("free all")
	}
	return m.freeAllLocked(nil)
}

// InvalidateAll frees every array of every client and then calls every
// client's OnInvalidate hook, so that they drop what they held and ask
// again. After Close it returns an error wrapping ErrClosed and calls no
// hook.
func (m *Manager) InvalidateAll() error {
	m.useMu.RLock()
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		m.useMu.RUnlock()
		return closedErr("invalidate all")
	}
	// Take the arrays and queue the hooks at once, so that an allocation
	// installed before is delivered before, and one installed after is
	// not taken; the hooks wait for the frees.
	work := m.takeAllLocked(nil)
	clients, calls := m.postInvalidateLocked(fmt.Errorf("InvalidateAll freed every array: %w", ErrFreed), false)
	m.mu.Unlock()
	err := m.freeWork(work)
	m.useMu.RUnlock()
	for i, c := range clients {
		c.markReady(calls[i])
	}
	deliver(clients)
	return err
}

// ReinitStreams gives every stream group a fresh stream, as needed after
// the device has been reset, and closes the old ones (waiting for their
// work). Arrays are not freed (after a reset they are already invalid:
// call InvalidateAll too). A stream obtained from Client.Stream before is closed.
func (m *Manager) ReinitStreams() error {
	m.useMu.Lock()
	defer m.useMu.Unlock()
	if m.isClosed() {
		return closedErr("reinit streams")
	}
	return wrapIf("reinit streams", m.groups.Reinit())
}

// freeAllLocked frees every array of every client (or, with only
// non-nil, of that client). useMu must be held (either way).
func (m *Manager) freeAllLocked(only *Client) error {
	m.mu.Lock()
	work := m.takeAllLocked(only)
	m.mu.Unlock()
	return m.freeWork(work)
}

// takeAllLocked takes every array of every client (or, with only
// non-nil, of that client) for freeWork. m.mu must be held.
func (m *Manager) takeAllLocked(only *Client) []freeWork {
	var work []freeWork
	for _, c := range m.reg.slots {
		if c == nil || (only != nil && c != only) {
			continue
		}
		if allocs := c.takeAllLocked(); len(allocs) > 0 {
			work = append(work, freeWork{c: c, allocs: allocs})
		}
	}
	return work
}

// freeWork is arrays taken from a client, to be freed on its stream.
type freeWork struct {
	c      *Client
	allocs []*allocation
	s      device.Stream // nil: the client's current stream
}

// freeWork frees the arrays in work. useMu must be held.
func (m *Manager) freeWork(work []freeWork) error {
	var errs []error
	for _, w := range work {
		s, release := w.s, func() error { return nil }
		if s == nil {
			s, release = m.clientStream(w.c)
		}
		for _, a := range w.allocs {
			if err := m.release(a, s); err != nil {
				errs = append(errs, fmt.Errorf("free %s of %v: %w", a.label, w.c, err))
			}
		}
		if err := release(); err != nil {
			errs = append(errs, fmt.Errorf("free the arrays of %v: %w", w.c, err))
		}
	}
	return errors.Join(errs...)
}

// clientStream is c's group stream, held (so that it stays open even if
// the group's last member leaves meanwhile) until release is called; or
// the device's default stream when the group is gone (c left it, and so
// did everyone else).
func (m *Manager) clientStream(c *Client) (s device.Stream, release func() error) {
	m.mu.Lock()
	group := c.group
	m.mu.Unlock()
	if s, release, err := m.groups.HoldExisting(group); err == nil {
		return s, release
	}
	return m.dev.DefaultStream(), func() error { return nil }
}

// release frees one allocation. useMu must be held. It waits for
// copies being enqueued on the array; the free is ordered on s after them
// and after the work on the stream the array was last used on (its
// client's stream before a group move), so that the allocator cannot
// hand the memory to work on s while an older copy may still write it.
func (m *Manager) release(a *allocation, s device.Stream) error {
	var errs []error
	if d := a.dev; d != nil {
		d.use.Lock()
		if d.freed.CompareAndSwap(false, true) && d.memory == Device {
			if err := m.orderAfter(d.lastStream(), s); err != nil {
				errs = append(errs, err)
			}
			if err := m.acct.Free(d.ptr, s); err != nil {
				errs = append(errs, err)
			}
		}
		d.use.Unlock()
	}
	if a.host != nil {
		if err := a.host.Free(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// orderAfter makes work enqueued on s from now on wait for the work
// enqueued on last so far. Nothing is needed when last is s or nil, or
// has been closed (Close waited for its work). When no event can be made
// it waits for last on the host instead, so the order holds either way.
func (m *Manager) orderAfter(last, s device.Stream) error {
	if last == nil || last == s {
		return nil
	}
	done, err := last.Query()
	if errors.Is(err, device.ErrClosed) {
		// The stream of a group its last member left: its Close waits
		// for its work (any other stream is closed only with the
		// allocator's lock held for writing, which the caller's excludes).
		m.groups.WaitClosed(last)
		return nil
	}
	if (err == nil && done) || errors.Is(err, device.ErrInvalidated) {
		return nil // idle, or gone with a reset
	}
	ev, err := m.dev.NewEvent()
	if err == nil {
		// An event has no owner to leak to: it is closed at once; the
		// wait it enqueued on s stays.
		if err = ev.Record(last); err == nil {
			err = ev.Wait(s)
		}
		err = errors.Join(err, ev.Close())
	}
	if err != nil {
		if serr := last.Synchronize(); serr != nil && !errors.Is(serr, device.ErrClosed) && !errors.Is(serr, device.ErrInvalidated) {
			return fmt.Errorf("order the free after stream %d: %w", last.Handle(), errors.Join(err, serr))
		}
	}
	return nil
}

// Close frees every array, closes every client (no hooks are called),
// the allocator and the streams; the device stays open, unless Open
// opened it, and then Close closes it last. Pinned, mapped
// and file-backed host arrays still live (NewHostArray, Host().Alloc,
// Host().Open) are freed too, and the error, wrapping
// ErrLiveHostArrays, names them: their views must not be used after
// Close. Later calls on
// the manager or its clients return ErrClosed; a second Close returns
// nil.
func (m *Manager) Close() error {
	m.planMu <- struct{}{} // no eviction for the broker's lease meanwhile (Reclaim)
	defer func() { <-m.planMu }()
	m.useMu.Lock()
	defer m.useMu.Unlock()
	if m.isClosed() {
		return nil
	}
	freeErr := m.freeAllLocked(nil)
	m.mu.Lock()
	m.closed = true
	clients := m.reg.all()
	for _, c := range clients {
		c.closed = true
		m.reg.remove(c)
	}
	m.pools.Reset()
	m.mu.Unlock()
	for _, c := range clients {
		freeErr = errors.Join(freeErr, c.work.drop())
	}
	liveErr := m.host.freeLive() // before the pinned pool goes (host.go)
	acctErr := m.acct.Close(func() error {
		return errors.Join(wrapIf("close pinned pool", m.host.close()), wrapIf("close streams", m.groups.Close()))
	})
	var devErr error
	if m.ownsDev {
		devErr = m.dev.Close() // Open's device, closed last
	}
	return errors.Join(freeErr, liveErr, acctErr, wrapIf("close device", devErr))
}

// owner is the Manager as its account's owner (account.Owner): it
// evicts idle clients when the broker's lease asks the account to shrink
// (Reclaim, evict.go) and lists the arrays a new cap counts (Live).
type owner Manager

// Live lists every device array the clients hold. The account calls it
// with its lock held: it takes mu and calls nothing of the account's.
func (o *owner) Live(yield func(p device.Ptr, bytes uint64)) {
	m := (*Manager)(o)
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, c := range m.reg.all() {
		for _, as := range c.arrays {
			for _, a := range as {
				if d := a.dev; d != nil && d.memory == Device && !d.freed.Load() {
					yield(d.ptr, d.Bytes())
				}
			}
		}
	}
}

func (m *Manager) isClosed() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.closed
}

// freeEach frees work as freeWork does, adding the errors to errs by
// owner. useMu must be held.
func (m *Manager) freeEach(work []freeWork, errs map[*Client]error) {
	for _, w := range work {
		if err := m.freeWork([]freeWork{w}); err != nil {
			errs[w.c] = errors.Join(errs[w.c], err)
		}
	}
}
