package vram

// The Manager: the registry of clients, the allocator, the stream groups
// and the queues of array requests.
//
// Locking. Four levels, always taken in this order:
//
//  1. a per-group mutex (groupLock), held by Allocate for one group
//     while it plans and allocates, so two calls never allocate the same
//     queue;
//  2. planMu, held by Allocate from reading the device's free memory
//     until its arrays are allocated, so that two groups never plan
//     against the same free memory;
//  3. allocMu, an RWMutex: held for reading by everything that uses the
//     allocator (allocating, freeing), for writing by SetAllocator and
//     Close, which swap or close it;
//  4. mu, which protects the registry (clients, shares, queues, each
//     client's arrays). Nothing holding mu calls the device or the
//     allocator, and no hook is ever called with any of these held.
//
// The stream groups (package streams) have their own lock, taken after mu
// when both are needed. SetCap's capMu comes before all four; the budget
// notices and the free signal (replan.go) have locks of their own, taken
// last.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/vramkit/vram/alloc"
	"github.com/vramkit/vram/device"
	"github.com/vramkit/vram/internal/share"
	"github.com/vramkit/vram/streams"
)

// MinAutoPool is the smallest proportion of device memory the auto pool
// may be left with while it has clients.
const MinAutoPool = share.MinAutoPool

// AllocatorKind names the kind of allocator the manager serves device
// arrays from: alloc.Kind, whose names, aliases and allocators are the
// allocator registry's (package alloc, registry.go). What serves a kind is
// named by the registry's name of the allocator made (ManagerReport,
// AllocatorReport). A plain value, safe to share.
type AllocatorKind = alloc.Kind

// Allocator kinds. Pool, the zero value, is the default.
const (
	// Pool is a caching best-fit allocator (CuPy's MemoryPool, PyTorch's
	// caching allocator): alloc.Expandable (PyTorch's expandable segments)
	// where the device manages virtual memory, as the simulator does, else
	// the segment alloc.Pool; WithExpandable and WithPoolConfig choose.
	Pool = alloc.KindPool
	// Direct is alloc.Direct: every call goes to the device.
	Direct = alloc.KindDirect
	// AsyncPool is alloc.AsyncPool: the device's stream-ordered pool
	// (cuMemAllocAsync; CuPy's MemoryAsyncPool).
	AsyncPool = alloc.KindAsync
)

// ParseAllocatorKind reads a kind's name in the allocator registry
// (alloc.ParseKind: "pool", "direct" or "async", and the aliases of the
// allocators that name them, such as cubie's "cupy", "default" and
// "cupy_async"; case ignored), and "" as Pool. Errors wrap
// device.ErrInvalidValue.
func ParseAllocatorKind(s string) (AllocatorKind, error) {
	if strings.TrimSpace(s) == "" {
		return Pool, nil
	}
	return alloc.ParseKind(s)
}

// LimitMode says how much memory a stream group may plan with. A plain
// value, safe to share.
type LimitMode uint8

const (
	// Passive (the default): caps are computed but not enforced; a group
	// may plan with all of the device's free memory.
	Passive LimitMode = iota
	// Active: a group may plan with the sum of its members' caps less
	// what they hold, and never more than the device's free memory.
	Active
)

// String is "passive" or "active".
func (l LimitMode) String() string {
	switch l {
	case Passive:
		return "passive"
	case Active:
		return "active"
	}
	return fmt.Sprintf("limitmode(%d)", uint8(l))
}

// ParseLimitMode reads "passive" or "active".
func ParseLimitMode(s string) (LimitMode, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "passive", "":
		return Passive, nil
	case "active":
		return Active, nil
	}
	return 0, fmt.Errorf("limit mode %q: want passive or active: %w", s, device.ErrInvalidValue)
}

// Option configures New. Options are applied once, by New, on its
// goroutine.
type Option func(*config)

type config struct {
	kind   AllocatorKind
	mode   LimitMode
	log    *slog.Logger
	wrap   func(alloc.Allocator) alloc.Allocator
	pcfg   alloc.PoolConfig
	acfg   alloc.AsyncConfig
	total  uint64
	cap    uint64      // WithCap; 0: none
	pick   allocChoice // WithAllocatorEntry, WithExpandable (poolkind.go)
	host   HostOptions
	broker brokerConfig // WithBroker, WithLease (lease.go)

	oom func(*alloc.OutOfMemoryError, ManagerReport) // WithOOMObserver (report.go); nil: none
}

// WithAllocator sets the allocator kind (default Pool).
func WithAllocator(kind AllocatorKind) Option { return func(c *config) { c.kind = kind } }

// WithLimitMode sets the limit mode (default Passive).
func WithLimitMode(mode LimitMode) Option { return func(c *config) { c.mode = mode } }

// WithLogger sets where warnings go (default slog.Default()).
func WithLogger(l *slog.Logger) Option { return func(c *config) { c.log = l } }

// WithPoolConfig configures the segment alloc.Pool, and a configuration
// other than the zero value makes it the Pool kind's allocator even where
// the device manages virtual memory (unless WithExpandable(true, …)).
func WithPoolConfig(cfg alloc.PoolConfig) Option { return func(c *config) { c.pcfg = cfg } }

// WithAsyncConfig configures the AsyncPool allocator kind.
func WithAsyncConfig(cfg alloc.AsyncConfig) Option { return func(c *config) { c.acfg = cfg } }

// WithWrap wraps every allocator the manager makes (now and on each
// SetAllocator) in adaptors, e.g. alloc.NewLimit or alloc.NewTrace. The
// wrapper owns what it wraps: closing it must close the upstream. A
// wrapper should forward alloc.Coster (the package's adaptors do): the
// manager plans with the cost it states, and with the room a Limit in
// the chain leaves. One that does not is taken to give every array a
// segment of whole pages, and is planned around by trying.
func WithWrap(wrap func(alloc.Allocator) alloc.Allocator) Option {
	return func(c *config) { c.wrap = wrap }
}

// WithCap caps the device bytes the manager's arrays may take, as the
// allocator charges them (0: no cap): every group plans within what the
// cap leaves, and an allocation past it is refused (an alloc.Limit
// around the allocator, WithWrap's included). SetCap changes it while
// the manager runs (replan.go).
func WithCap(bytes uint64) Option { return func(c *config) { c.cap = bytes } }

// WithTotalMemory makes shares and caps a proportion of total bytes
// instead of the device's total memory (to manage part of a device).
func WithTotalMemory(total uint64) Option { return func(c *config) { c.total = total } }

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
	nextID  atomic.Uint64
	replans atomic.Uint64 // Allocate plans made again after the allocator took more than reserved

	planMu  chan struct{}   // room for one: serializes Allocate's budget, plan and allocation (lockCtx)
	allocMu sync.RWMutex    // read: the allocator is in use; write: swapped or closed
	al      alloc.Allocator // protected by allocMu
	kind    AllocatorKind   // protected by allocMu
	name    string          // the registry's name of what serves kind (alloc.Entry.Name); protected by allocMu
	capLim  *alloc.Limit    // the cap's Limit, outermost in al; nil with none; protected by allocMu
	trims   sync.WaitGroup  // trims in flight (trim.go), an Allocate's context may abandon; waited for before al closes

	capMu    sync.Mutex     // serializes SetCap (replan.go); taken before allocMu
	capBytes atomic.Uint64  // the cap (WithCap, SetCap); 0: none
	notices  budgetNotices  // budget changes (replan.go)
	freed    signal         // broadcast after each device array is freed
	lease    *leaseFollower // the broker's lease (lease.go); nil without; set in New

	mu         sync.Mutex                                     // protects the fields below
	reg        registry                                       // open clients
	pools      share.Pools                                    // the clients' shares (internal/share)
	mode       LimitMode                                      // Passive or Active
	queues     map[string]map[*Client]map[string]ArrayRequest // group → client → label → request
	groupLocks map[string]chan struct{}                       // group → Allocate's lock (lockCtx)
	claims     map[string]uint64                              // group → device bytes it claims back from busy groups (replan.go)
	plans      map[string]ChunkPlan                           // group → its last plan, sent again when nothing is queued (rebroadcast.go)
	trim       *trimRun                                       // the allocator's trim in flight (trim.go); nil: none
	closed     bool
}

// New returns a manager of dev. The caller keeps ownership of dev: Close
// the manager before the device.
func New(dev device.Device, opts ...Option) (*Manager, error) {
	if dev == nil {
		return nil, fmt.Errorf("vram: new manager: nil device: %w", device.ErrInvalidValue)
	}
	var cfg config
	for _, o := range opts {
		o(&cfg)
	}
	if cfg.log == nil {
		cfg.log = slog.Default()
	}
	if cfg.mode != Passive && cfg.mode != Active {
		return nil, fmt.Errorf("vram: new manager: limit mode %v: want Passive or Active: %w", cfg.mode, device.ErrInvalidValue)
	}
	total := cfg.total
	if total == 0 {
		_, t, err := dev.MemInfo()
		if err != nil {
			return nil, fmt.Errorf("vram: new manager: read device memory: %w", err)
		}
		total = t
	}
	groups := streams.New(dev)
	m := &Manager{
		dev:        dev,
		total:      total,
		groups:     groups,
		log:        cfg.log,
		cfg:        cfg,
		host:       newHostPool(dev, groups.WaitClosed, cfg.host, cfg.log),
		reg:        newRegistry(),
		pools:      share.New("client"),
		mode:       cfg.mode,
		queues:     map[string]map[*Client]map[string]ArrayRequest{},
		groupLocks: map[string]chan struct{}{},
		claims:     map[string]uint64{},
		plans:      map[string]ChunkPlan{},
		planMu:     make(chan struct{}, 1),
	}
	m.capBytes.Store(cfg.cap)
	m.strided, _ = dev.(device.StridedCopier)
	m.observeOOM(nil, 0, "", m.host.pinned)
	a, name, err := m.newAllocator(cfg.kind)
	if err != nil {
		return nil, fmt.Errorf("vram: new manager: %w", err)
	}
	m.setAllocator(a, cfg.kind, name)
	if err := m.joinBroker(); err != nil { // lease.go
		return nil, errors.Join(err, m.Close())
	}
	return m, nil
}

var (
	defaultOnce sync.Once
	defaultMgr  *Manager
	defaultErr  error
)

// Default returns the process-wide manager, made on the first call on
// device.Open("auto") (or $VRAM_DEVICE): the CUDA device 0 when a driver
// and GPU are present, else the simulator, with the allocator that
// $VRAM_ALLOC_CONF configures (ParseAllocConf) and, when $VRAM_BROKER
// names the node broker's socket, its budget from a lease of it
// (WithBroker; the program must link package broker). Every call returns the same
// manager (or the same error); it is safe to call from many goroutines
// at once. Its device is never closed. Do not Close the default manager
// while anything in the process may still use it: it is never remade,
// so every later call returns the closed manager. Close clients instead,
// or use New for a manager of your own.
func Default() (*Manager, error) {
	defaultOnce.Do(func() {
		opts, err := AllocConfFromEnv() // $VRAM_ALLOC_CONF (allocconf.go)
		if err != nil {
			defaultErr = fmt.Errorf("vram: default manager: %w", err)
			return
		}
		opts = append(opts, brokerFromEnv()...) // $VRAM_BROKER (lease.go)
		dev, err := device.Open("")
		if err != nil {
			defaultErr = fmt.Errorf("vram: default manager: %w", err)
			return
		}
		defaultMgr, defaultErr = New(dev, opts...)
		if defaultErr != nil {
			_ = dev.Close()
		}
	})
	return defaultMgr, defaultErr
}

// newAllocator makes an allocator of kind, wrapped as configured, and
// returns it with the registry's name of the allocator it wraps.
func (m *Manager) newAllocator(kind AllocatorKind) (alloc.Allocator, string, error) {
	a, e, err := m.cfg.makeAllocator(m.dev, kind) // poolkind.go
	if err != nil {
		return nil, "", err
	}
	if m.cfg.wrap != nil {
		a = m.cfg.wrap(a)
	}
	if c := m.capBytes.Load(); c > 0 {
		a = alloc.NewLimit(a, c)
	}
	m.observeOOM(a, kind, e.Name, nil)
	return a, e.Name, nil
}

// setAllocator makes a, of kind, the allocator (with its cap's Limit
// outermost, when capped), served by the registry's entry name.
// allocMu must be held for writing, or m not yet shared.
func (m *Manager) setAllocator(a alloc.Allocator, kind AllocatorKind, name string) {
	m.al, m.kind, m.name, m.capLim = a, kind, name, nil
	if m.capBytes.Load() > 0 {
		m.capLim, _ = a.(*alloc.Limit)
	}
}

// Device is the managed device.
func (m *Manager) Device() device.Device { return m.dev }

// MemInfo reports the device's free and total memory.
func (m *Manager) MemInfo() (free, total uint64, err error) { return m.dev.MemInfo() }

// Allocator returns the current allocator (for its Stats). It stays valid
// until the next SetAllocator or Close.
func (m *Manager) Allocator() alloc.Allocator {
	m.allocMu.RLock()
	defer m.allocMu.RUnlock()
	return m.al
}

// AllocatorStats returns the current allocator's kind and its Stats, read
// together, so that a SetAllocator in between cannot pair one allocator's
// kind with another's counters.
func (m *Manager) AllocatorStats() (AllocatorKind, alloc.Stats) {
	m.allocMu.RLock()
	defer m.allocMu.RUnlock()
	return m.kind, m.al.Stats()
}

// granularityOf is the rounding unit the planner counts bytes in for a:
// its granularity, or DefaultGranularity.
func granularityOf(a alloc.Allocator) uint64 {
	if g, ok := a.(alloc.Granular); ok && g.Granularity() > 0 {
		return g.Granularity()
	}
	return DefaultGranularity
}

// LimitMode returns the current limit mode.
func (m *Manager) LimitMode() LimitMode {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.mode
}

// SetLimitMode sets the limit mode for later allocations.
func (m *Manager) SetLimitMode(mode LimitMode) error {
	if mode != Passive && mode != Active {
		return fmt.Errorf("vram: set limit mode %v: want Passive or Active: %w", mode, device.ErrInvalidValue)
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
	m.allocMu.Lock()
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		m.allocMu.Unlock()
		return closedErr("set allocator")
	}
	m.mu.Unlock()
	next, name, err := m.newAllocator(kind)
	if err != nil {
		m.allocMu.Unlock()
		return fmt.Errorf("vram: set allocator %v: %w", kind, err)
	}
	freeErr := m.freeAllLocked(nil)
	old := m.al
	m.setAllocator(next, kind, name)
	m.trims.Wait()
	closeErr := old.Close()
	streamErr := m.groups.Reinit()
	m.mu.Lock()
	clients, _ := m.postInvalidateLocked(fmt.Errorf("vram: SetAllocator(%v) freed every array: %w", kind, ErrFreed), true)
	m.mu.Unlock()
	m.allocMu.Unlock()
	deliver(clients)
	return errors.Join(freeErr, wrapIf("close the old allocator", closeErr), wrapIf("new streams", streamErr))
}

func wrapIf(what string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("vram: %s: %w", what, err)
}

// Free frees, for every client, the arrays held under label (in every
// buffer). It frees nothing and returns nil when no client holds label.
func (m *Manager) Free(label string) error {
	m.allocMu.RLock()
	defer m.allocMu.RUnlock()
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
	m.allocMu.RLock()
	defer m.allocMu.RUnlock()
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
	m.allocMu.RLock()
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		m.allocMu.RUnlock()
		return closedErr("invalidate all")
	}
	// Take the arrays and queue the hooks at once, so that an allocation
	// installed before is delivered before, and one installed after is
	// not taken; the hooks wait for the frees.
	work := m.takeAllLocked(nil)
	clients, calls := m.postInvalidateLocked(fmt.Errorf("vram: InvalidateAll freed every array: %w", ErrFreed), false)
	m.mu.Unlock()
	err := m.freeWork(work)
	m.allocMu.RUnlock()
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
	m.allocMu.Lock()
	defer m.allocMu.Unlock()
	if m.isClosed() {
		return closedErr("reinit streams")
	}
	return wrapIf("reinit streams", m.groups.Reinit())
}

// freeAllLocked frees every array of every client (or, with only
// non-nil, of that client). allocMu must be held (either way).
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

// freeWork frees the arrays in work. allocMu must be held.
func (m *Manager) freeWork(work []freeWork) error {
	var errs []error
	for _, w := range work {
		s, release := w.s, func() error { return nil }
		if s == nil {
			s, release = m.clientStream(w.c)
		}
		for _, a := range w.allocs {
			if err := m.release(a, s); err != nil {
				errs = append(errs, fmt.Errorf("vram: free %s of %v: %w", a.label, w.c, err))
			}
		}
		if err := release(); err != nil {
			errs = append(errs, fmt.Errorf("vram: free the arrays of %v: %w", w.c, err))
		}
	}
	return errors.Join(errs...)
}

// clientStream is c's group stream, held (so that it stays open even if
// the group's last member leaves meanwhile) until release is called; or
// the device's default stream when c is in no group any more.
func (m *Manager) clientStream(c *Client) (s device.Stream, release func() error) {
	if g, err := m.groups.Group(c.id); err == nil {
		if s, release, err := m.groups.Hold(g); err == nil {
			return s, release
		}
	}
	return m.dev.DefaultStream(), func() error { return nil }
}

// release frees one allocation. allocMu must be held. It waits for
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
			if err := m.al.Free(d.ptr, s); err != nil {
				errs = append(errs, err)
			}
			m.freed.broadcast()
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
// the allocator and the streams. The device stays open. Pinned, mapped
// and file-backed host arrays still live (NewHostArray, Host().Alloc,
// Host().Open) are freed too, and the error, wrapping
// ErrLiveHostArrays, names them: their views must not be used after
// Close. Later calls on
// the manager or its clients return ErrClosed; a second Close returns
// nil.
func (m *Manager) Close() error {
	m.leaveBroker() // lease.go
	m.allocMu.Lock()
	defer m.allocMu.Unlock()
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return nil
	}
	m.mu.Unlock()
	freeErr := m.freeAllLocked(nil)
	m.mu.Lock()
	m.closed = true
	clients := m.reg.all()
	for _, c := range clients {
		c.closed = true
		m.reg.remove(c)
	}
	m.queues = map[string]map[*Client]map[string]ArrayRequest{}
	m.pools.Reset()
	m.mu.Unlock()
	for _, c := range clients {
		freeErr = errors.Join(freeErr, c.work.drop())
	}
	liveErr := m.host.freeLive() // before the pinned pool goes (hostlive.go)
	m.trims.Wait()
	closeErr := m.al.Close()
	hostErr := m.host.close()
	groupErr := m.groups.Close()
	leaseErr := m.releaseLease() // once the allocator gave its memory back
	return errors.Join(freeErr, liveErr, wrapIf("close allocator", closeErr), wrapIf("close pinned pool", hostErr), wrapIf("close streams", groupErr), leaseErr)
}

func (m *Manager) isClosed() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.closed
}

// Sync waits for the work enqueued on c's stream and returns its first
// error. When ctx is done first it returns at once an error wrapping
// ctx.Err(); the work goes on, and the wait is abandoned, not undone:
// until the stream reaches the end of that work, SetAllocator,
// ReinitStreams and the manager's Close wait for it as they wait for a
// Sync in progress.
func (c *Client) Sync(ctx context.Context) error {
	m := c.m
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("vram: sync %v: %w", c, err)
	}
	m.allocMu.RLock()
	s, err := m.stream(c)
	if err != nil {
		m.allocMu.RUnlock()
		return err
	}
	if ctx.Done() == nil { // never cancelled: wait here
		defer m.allocMu.RUnlock()
		return s.Synchronize()
	}
	done := make(chan error, 1)
	go func() {
		defer m.allocMu.RUnlock()
		done <- s.Synchronize()
	}()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return fmt.Errorf("vram: sync %v: %w", c, ctx.Err())
	}
}

// Stream returns the stream of c's group, on which its arrays are
// allocated and copied: launch its kernels there. SetAllocator and
// ReinitStreams replace (and close) every group's stream, so ask again
// after an OnInvalidate.
func (c *Client) Stream() (device.Stream, error) { return c.m.stream(c) }

// stream is Client.Stream.
func (m *Manager) stream(c *Client) (device.Stream, error) {
	if err := m.check(c); err != nil {
		return nil, err
	}
	s, err := m.groups.Stream(c.id)
	if err != nil {
		return nil, fmt.Errorf("vram: stream of %v: %w", c, err)
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
		return fmt.Errorf("vram: client %v is closed; register a new client: %w", c, ErrClosed)
	}
	return nil
}

// closedErr is the error of op on a closed manager.
func closedErr(op string) error {
	return fmt.Errorf("vram: %s: the manager is closed; make a new one with New: %w", op, ErrClosed)
}

// foreign is the error for a client handle this manager did not make.
func foreign(c *Client) error {
	if c == nil {
		return fmt.Errorf("vram: nil client; pass the *Client that Register returned: %w", ErrUnknownClient)
	}
	return fmt.Errorf("vram: client %v was registered with another manager; call that manager: %w", c, ErrUnknownClient)
}

// streamGroup returns the name of c's stream group, or why c cannot be
// used.
func (m *Manager) streamGroup(c *Client) (string, error) {
	if c == nil || c.m != m {
		return "", foreign(c)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.checkLocked(c); err != nil {
		return "", err
	}
	return c.group, nil
}

// GroupMembers returns the open clients in the named group ("" is
// "default"), by id.
func (m *Manager) GroupMembers(group string) []*Client {
	if group == "" {
		group = streams.Default
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.reg.members(group)
}

// IsGrouped reports whether c shares a named stream group with another
// client (false once closed). Clients in the "default" group are never
// grouped (as in the reference: the default group is where ungrouped
// clients live).
func (c *Client) IsGrouped() bool {
	m := c.m
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.checkLocked(c) != nil {
		return false
	}
	return c.group != streams.Default && m.reg.groups[c.group].n > 1
}

// ChangeStreamGroup moves c to the named group ("" is "default"), making
// it if needed. Requests c has queued move with it; arrays it holds stay
// valid (they were made on the old group's stream: synchronize it before
// using them on the new one; the manager frees each array ordered after
// the stream it was last copied on). A group c leaves with no member is
// removed and its stream closed once its work is done, so a stream
// obtained from Stream before the move may be closed. The move never
// waits for that work (a long kernel of the old group's): the stream
// closes in the background. A refused move (a closed client or manager)
// makes no group.
func (c *Client) ChangeStreamGroup(group string) error {
	m := c.m
	if group == "" {
		group = streams.Default
	}
	for {
		m.mu.Lock()
		err := m.checkLocked(c)
		from := c.group
		m.mu.Unlock()
		if err != nil || from == group {
			return err
		}
		moved, err := m.moveHeld(c, from, group)
		if moved || err != nil {
			return err
		}
		// c moved meanwhile: try again from where it is now.
	}
}

// moveHeld moves c from group from to group to, holding both groups
// (making to and its stream outside mu, so that a refused move makes
// none) so that the move under mu makes no stream and empties no group.
// Once released, the group c left is removed if it has no member, and
// its stream closed after its work. moved is false, with no error, if c
// was no longer in from.
func (m *Manager) moveHeld(c *Client, from, to string) (moved bool, err error) {
	// Streams of groups left empty are closed under allocMu, so that no
	// SetAllocator or Close overlaps it (see Client.Close).
	m.allocMu.RLock()
	defer m.allocMu.RUnlock()
	_, releaseTo, err := m.groups.Hold(to)
	if err != nil {
		if errors.Is(err, streams.ErrClosed) {
			return false, closedErr("change stream group") // closed meanwhile
		}
		return false, fmt.Errorf("vram: make group %q: %w", to, err)
	}
	_, releaseFrom, err := m.groups.Hold(from)
	if err != nil {
		if errors.Is(err, streams.ErrClosed) {
			err = closedErr("change stream group")
		}
		return false, errors.Join(err, releaseTo())
	}
	defer func() {
		// After mu is released: closing a stream waits for its work.
		err = errors.Join(err, wrapIf("close the stream of the group left", releaseFrom()), releaseTo())
	}()
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.checkLocked(c); err != nil {
		return false, err
	}
	if c.group != from {
		return false, nil
	}
	if err := m.groups.Move(c.id, to); err != nil {
		return false, fmt.Errorf("vram: change group of %v: %w", c, err)
	}
	if q := m.queues[c.group]; q != nil {
		if reqs, ok := q[c]; ok {
			delete(q, c)
			if len(q) == 0 {
				delete(m.queues, c.group)
			}
			m.queueLocked(c, to, reqs)
		}
	}
	m.moveLocked(c, to)
	return true, nil
}

// moveLocked puts c in group in the registry. m.mu must be held.
func (m *Manager) moveLocked(c *Client, group string) {
	from := c.group
	m.reg.move(c, group)
	m.forgetIfEmptyLocked(from)
}

// removeLocked takes c out of the registry. m.mu must be held.
func (m *Manager) removeLocked(c *Client) {
	m.reg.remove(c)
	m.forgetIfEmptyLocked(c.group)
}

// forgetIfEmptyLocked drops the allocation lock of group once it has no
// member, so that group names do not pile up. (Allocate re-checks
// its trigger's group after locking, and planMu serializes allocations,
// so a lock made again later for the name is as good.) m.mu must be held.
func (m *Manager) forgetIfEmptyLocked(group string) {
	if _, ok := m.reg.groups[group]; !ok {
		delete(m.groupLocks, group)
		m.dropClaimLocked(group, "withdrawn: the group has no member left")
		delete(m.plans, group)
	}
}
