package vram

// Options: how New configures a Manager (Option, with the allocator kinds
// and limit modes they name) and how one Allocate is tuned
// (AllocateOption).
//
// Which of the allocator registry's allocators (package alloc,
// registry.go) serves a kind: the one an option names, else the kind's
// choice for the device (makeAllocator).

import (
	"fmt"
	"log/slog"
	"os"
	"strings"

	"github.com/vramkit/vram/account"
	"github.com/vramkit/vram/alloc"
	"github.com/vramkit/vram/device"
)

// AllocatorKind names the kind of allocator the manager serves device
// arrays from: alloc.Kind, whose names, aliases and allocators are the
// allocator registry's (package alloc, registry.go). What serves a kind is
// named by the registry's name of the allocator made (ManagerReport,
// account.Account.Report). A plain value, safe to share.
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
	mode  LimitMode
	log   *slog.Logger
	total uint64
	host  HostOptions

	// The account's (package account), the options below:
	choice account.Choice // WithAllocatorChoice, or the deprecated options (legacyChoice)
	legacy *legacyChoice  // the deprecated options' choice; nil: none given
	wrap   func(alloc.Allocator) alloc.Allocator
	cap    uint64 // WithCap; 0: none
	broker string // WithBroker's, $VRAM_BROKER's socket; "": none
	lease  account.LeaseOptions

	oom func(*alloc.OutOfMemoryError, ManagerReport) // WithOOMObserver (report.go); nil: none
}

// WithAllocatorChoice chooses the allocator the manager serves device
// arrays from: a kind, the allocator registry's entry that serves it, and
// their configuration (account.Choice; account.ChoiceOf(e) serves from
// the registry's entry e). New fails with an error wrapping
// device.ErrInvalidValue for an entry not from the registry, and with one
// wrapping device.ErrNotSupported for one the device cannot serve
// (alloc.Expandable on a device without virtual memory). Default: the
// Pool kind, served by alloc.Expandable where the device manages virtual
// memory (it holds fewer bytes beyond the live ones on every trace
// measured: BENCHMARKS.md, "Expandable segments"), else alloc.Pool.
func WithAllocatorChoice(c account.Choice) Option {
	return func(cfg *config) { cfg.choice, cfg.legacy = c, nil }
}

// WithLimitMode sets the limit mode (default Passive).
func WithLimitMode(mode LimitMode) Option { return func(c *config) { c.mode = mode } }

// WithLogger sets where warnings go (default slog.Default()).
func WithLogger(l *slog.Logger) Option { return func(c *config) { c.log = l } }

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
// around the allocator, WithWrap's included). The account's SetCap
// changes it while the manager runs (Manager.Account).
func WithCap(bytes uint64) Option { return func(c *config) { c.cap = bytes } }

// WithTotalMemory makes shares and caps a proportion of total bytes
// instead of the device's total memory (to manage part of a device).
func WithTotalMemory(total uint64) Option { return func(c *config) { c.total = total } }

// BrokerEnv names the environment variable from which Default reads the
// node broker's socket (the same variable package broker's daemon and
// clients read). Unset or empty: no broker.
const BrokerEnv = "VRAM_BROKER"

// WithBroker makes the manager take its budget from a lease of the node
// broker on socket, through the dialer package broker registers when it
// is linked in (ErrNoBroker where none is). "" means none.
//
// Deprecated: pass the broker as a value,
// WithLease(LeaseOptions{Broker: broker.At(socket)}), which needs no
// registered dialer. WithBroker stays for the programs that call it;
// LeaseOptions.Broker, when set, is used instead.
func WithBroker(socket string) Option { return func(c *config) { c.broker = socket } }

// WithLease makes the manager take its budget from a lease of o.Broker
// (package account, lease.go): its cap follows the lease, an Allocate
// that needs more claims it, and a request to shrink is answered at the
// running batches' next chunk boundary. New fails when the broker cannot
// be reached or refuses the lease. Without a Name, the lease is named
// after the program; without a Device, it is the broker's device whose ID
// is the manager's device's. With no Broker, o describes the lease the
// socket $VRAM_BROKER (for Default) or WithBroker names asks for.
func WithLease(o LeaseOptions) Option { return func(c *config) { c.lease = o } }

// LeaseOptions describe the lease a manager asks the broker for
// (WithLease): account.LeaseOptions.
type LeaseOptions = account.LeaseOptions

// Broker is a node broker as a manager asks it for its lease
// (LeaseOptions.Broker): account.Broker. Package broker's At is the
// broker on a socket.
type Broker = account.Broker

// LeaseStats count what a manager's lease did.
//
// Deprecated: it is account.LeaseStats, which m.Account().Lease() returns.
type LeaseStats = account.LeaseStats

// BudgetChange is the latest change to what the manager's groups may plan
// with.
//
// Deprecated: it is account.Change, which m.Account().LastChange() returns.
type BudgetChange = account.Change

// brokerFromEnv is WithBroker($VRAM_BROKER), when it is set.
func brokerFromEnv() []Option {
	if s := os.Getenv(BrokerEnv); s != "" {
		return []Option{WithBroker(s)}
	}
	return nil
}

// accountConfig is the configuration of m's account, m its owner.
func (m *Manager) accountConfig() account.Config {
	c := m.cfg
	ac := account.Config{Allocator: c.choice, Wrap: c.wrap, Cap: c.cap, Socket: c.broker, Lease: c.lease, Logger: c.log, Owner: (*owner)(m)}
	if c.legacy != nil {
		ac.Allocator = c.legacy.resolve()
	}
	if f := c.oom; f != nil {
		ac.OnOOM = func(e *alloc.OutOfMemoryError, kind alloc.Kind, r alloc.MemoryReport) {
			mr := ManagerReport{Allocator: kind, Memory: r}
			m.fillReport(&mr)
			f(e, mr)
		}
	}
	return ac
}

// legacyChoice is what the deprecated options below chose, resolved into
// an account.Choice at New as they always read.
type legacyChoice struct {
	kind  AllocatorKind
	entry alloc.Entry // WithAllocatorEntry, WithExpandable; zero: none
	cfgs  alloc.Configs
}

// legacyOption applies f to the deprecated options' choice.
func legacyOption(f func(*legacyChoice)) Option {
	return func(c *config) {
		if c.legacy == nil {
			c.legacy = &legacyChoice{kind: c.choice.Kind, entry: c.choice.Entry, cfgs: c.choice.Configs}
		}
		f(c.legacy)
	}
}

// resolve is the choice the deprecated options made: the entry chosen
// when it is of the kind; for the Pool kind given a PoolConfig, the
// segment Pool; else the kind's choice for the device.
func (l *legacyChoice) resolve() account.Choice {
	c := account.Choice{Kind: l.kind, Entry: l.entry, Configs: l.cfgs}
	if (l.entry.Name == "" || l.entry.Kind != l.kind) && l.kind == Pool && l.cfgs.Pool != (alloc.PoolConfig{}) {
		c.Entry = poolEntry(alloc.NamePool)
	}
	return c
}

// WithAllocator sets the allocator kind (default Pool).
//
// Deprecated: use WithAllocatorChoice(account.Choice{Kind: kind}).
func WithAllocator(kind AllocatorKind) Option {
	return legacyOption(func(l *legacyChoice) { l.kind = kind })
}

// WithAllocatorEntry serves the manager from the allocator registry's
// entry e (alloc.Lookup): the kind is e's, and whenever the manager makes
// an allocator of that kind it is e's.
//
// Deprecated: use WithAllocatorChoice(account.ChoiceOf(e)).
func WithAllocatorEntry(e alloc.Entry) Option {
	return legacyOption(func(l *legacyChoice) { l.kind, l.entry = e.Kind, e })
}

// WithExpandable chooses the allocator of the Pool kind: on,
// alloc.Expandable with cfg; off, the segment alloc.Pool.
//
// Deprecated: use WithAllocatorChoice with the registry's entry
// (alloc.Lookup("expandable") or "pool") and cfg in its Configs.
func WithExpandable(on bool, cfg alloc.ExpandableConfig) Option {
	name := alloc.NamePool
	if on {
		name = alloc.NameExpandable
	}
	e := poolEntry(name)
	return legacyOption(func(l *legacyChoice) { l.entry, l.cfgs.Expandable = e, cfg })
}

// WithPoolConfig configures the segment alloc.Pool, and a configuration
// other than the zero value makes it the Pool kind's allocator even where
// the device manages virtual memory (unless WithExpandable(true, …)).
//
// Deprecated: use WithAllocatorChoice with the registry's "pool" entry
// and cfg in its Configs.
func WithPoolConfig(cfg alloc.PoolConfig) Option {
	return legacyOption(func(l *legacyChoice) { l.cfgs.Pool = cfg })
}

// WithAsyncConfig configures the AsyncPool allocator kind.
//
// Deprecated: use WithAllocatorChoice with cfg in its Configs.
func WithAsyncConfig(cfg alloc.AsyncConfig) Option {
	return legacyOption(func(l *legacyChoice) { l.cfgs.Async = cfg })
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
// named by the allocator registry's name as the account's Report is. It
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
}

// WithBuffers plans for k chunk buffers in flight (2 for double
// buffering) and, when the batch is chunked, allocates k copies of each
// chunkable array (ArrayResponse.Buffers).
func WithBuffers(k int) AllocateOption { return func(a *allocConfig) { a.buffers = max(k, 1) } }
