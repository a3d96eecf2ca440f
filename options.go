package vram

// Options: how New configures a Manager (Option, with the allocator kinds
// and limit modes they name) and how one Allocate is tuned
// (AllocateOption).
//
// Which of the allocator registry's allocators (package alloc,
// registry.go) serves a kind: the one an option names, else the kind's
// choice for the device (makeAllocator).

import (
	"context"
	"fmt"
	"log/slog"
	"strings"

	"github.com/vramkit/vram/alloc"
	"github.com/vramkit/vram/device"
)

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
	pick   allocChoice // WithAllocatorEntry, WithExpandable (below)
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

// allocChoice is the allocator an option chose: the zero value leaves the
// choice to the registry (alloc.Kind.New).
type allocChoice struct {
	entry alloc.Entry            // the chosen allocator; zero: none chosen
	ecfg  alloc.ExpandableConfig // WithExpandable's configuration
}

// WithAllocatorEntry serves the manager from the allocator registry's
// entry e (alloc.Lookup): the kind is e's (as WithAllocator(e.Kind)), and
// whenever the manager makes an allocator of that kind (New, SetAllocator)
// it is e's. An entry not from the registry makes New fail with an error
// wrapping device.ErrInvalidValue; the zero Entry chooses nothing (the
// Pool kind, served as the registry chooses).
func WithAllocatorEntry(e alloc.Entry) Option {
	return func(c *config) { c.kind, c.pick.entry = e.Kind, e }
}

// WithExpandable chooses the allocator of the Pool kind: on, alloc.Expandable
// with cfg (New fails with an error wrapping device.ErrNotSupported on a
// device without virtual memory); off, the segment alloc.Pool with the
// WithPoolConfig configuration. Without it the Pool kind is Expandable
// where the device manages virtual memory (device.VirtualMemory) and no
// PoolConfig was given, else Pool.
func WithExpandable(on bool, cfg alloc.ExpandableConfig) Option {
	name := alloc.NamePool
	if on {
		name = alloc.NameExpandable
	}
	e := poolEntry(name)
	return func(c *config) { c.pick = allocChoice{entry: e, ecfg: cfg} }
}

// poolEntry is the Pool kind's allocator named name.
func poolEntry(name string) alloc.Entry {
	for _, e := range Pool.Allocators() {
		if e.Name == name {
			return e
		}
	}
	return alloc.Entry{}
}

// makeAllocator makes the allocator that serves kind on dev, and returns
// it with its registry entry: the chosen one when it is of kind; for the
// Pool kind given a PoolConfig, the segment Pool (WithPoolConfig); else
// the kind's choice for dev, Expandable for the Pool kind where the device
// manages virtual memory because it holds fewer bytes beyond the live ones
// on every trace measured (BENCHMARKS.md, "Expandable segments").
func (c *config) makeAllocator(dev device.Device, kind AllocatorKind) (alloc.Allocator, alloc.Entry, error) {
	cfgs := alloc.Configs{Pool: c.pcfg, Expandable: c.pick.ecfg, Async: c.acfg}
	e := c.pick.entry
	if e.Name == "" || e.Kind != kind {
		e = alloc.Entry{}
	}
	if e.Name == "" && kind == Pool && c.pcfg != (alloc.PoolConfig{}) {
		e = poolEntry(alloc.NamePool)
	}
	if e.Name == "" {
		return kind.New(dev, cfgs)
	}
	a, err := e.New(dev, cfgs)
	return a, e, err
}

// kindNames lists the kinds' names, by value: "pool, direct, async".
func kindNames() string {
	var names []string
	for _, k := range alloc.Kinds() {
		names = append(names, k.String())
	}
	return strings.Join(names, ", ")
}

// WithHostOptions sets the host ladder's limits and spill directory.
func WithHostOptions(o HostOptions) Option { return func(c *config) { c.host = o } }

// WithOOMObserver calls f once for each allocation the manager refuses
// for want of memory: its device allocator's (or WithCap's Limit's) and
// its pinned pool's. f gets the error the allocation returns and the
// manager's report, whose Memory (or, for the pinned pool's failure,
// Pinned, with Memory and Allocator left zero) is the error's Report,
// named by the allocator registry's name as AllocatorReport's is. It
// runs on the goroutine whose allocation failed, before the failing call
// (Allocate, NewHostArray…) returns, with no manager lock held but the
// allocator in use: f may read the manager (Clients, Client.Held) but
// must not call SetAllocator, Close or Report, which would wait for the
// failing call. f must be safe for concurrent use.
func WithOOMObserver(f func(err *alloc.OutOfMemoryError, r ManagerReport)) Option {
	return func(c *config) { c.oom = f }
}

// AllocateOption tunes one Allocate; applied on the caller's
// goroutine.
type AllocateOption func(*allocConfig)

type allocConfig struct {
	buffers int
	ctx     context.Context // Allocate's
}

// WithBuffers plans for k chunk buffers in flight (2 for double
// buffering) and, when the batch is chunked, allocates k copies of each
// chunkable array (ArrayResponse.Buffers).
func WithBuffers(k int) AllocateOption { return func(a *allocConfig) { a.buffers = max(k, 1) } }
