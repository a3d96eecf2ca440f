package account

// The account: one device allocator, the cap around it, the lease the cap
// may follow, and what they say.
//
// Locking, in this order:
//
//  1. capMu serializes SetCap;
//  2. mu, an RWMutex: held for reading by every call that uses the
//     allocator (Alloc, Free, Room, Reserve, Stats…), for writing by the
//     calls that replace it (Swap, the first SetCap of an account made
//     without a cap) or close it;
//  3. the lease follower's mu (lease.go), trimMu (trim.go);
//  4. the notices' and the free signal's own locks (changes.go), taken
//     last and never held over anything else.
//
// Nothing holding mu calls the owner (Owner) but Owner.Live, under the
// write lock, whose owner must not call the account back; Reclaim is
// called with no lock of the account's held. A broker is never called
// holding a lock but mu for reading.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"

	"github.com/vramkit/vram/alloc"
	"github.com/vramkit/vram/device"
	"github.com/vramkit/vram/internal/units"
)

// Owner is whoever allocates through the account: the account's one way
// back to it. Its methods are called on the account's goroutines.
type Owner interface {
	// Reclaim frees what the owner's idle allocations hold (the vram
	// Manager evicts idle clients, least recently used first) until the
	// allocator's live bytes are at most target, or nothing idle is
	// left, waiting no longer than ctx, and returns how many owners of
	// allocations it freed. The account calls it, holding none of its
	// locks, when a broker asks it to shrink.
	Reclaim(ctx context.Context, target uint64) int
	// Live calls yield with each device allocation the owner holds
	// through the account (its pointer and the bytes asked), for a cap
	// put on an account made without one (SetCap), which counts them. It
	// is called with the account locked: it must not call the account.
	Live(yield func(p device.Ptr, bytes uint64))
}

// Config is what an account is made with. The zero value serves the Pool
// kind as the allocator registry chooses for the device, with no cap, no
// broker and slog.Default's logger.
type Config struct {
	// Allocator chooses the allocator (Choice).
	Allocator Choice
	// Wrap, when not nil, wraps every allocator the account makes (at
	// New and at each Swap) in adaptors, e.g. alloc.NewTrace. The wrapper
	// owns what it wraps. One that does not forward alloc.Coster leaves
	// the account's owner to plan around its costs by trying.
	Wrap func(alloc.Allocator) alloc.Allocator
	// Cap bounds the device bytes allocations through the account may
	// take, as the allocator charges them (0: none): an alloc.Limit,
	// outermost, around what Wrap returns. SetCap changes it.
	Cap uint64
	// Lease, with a Broker, makes the cap follow a lease of that node
	// broker (lease.go), asked for as the rest of Lease says.
	Lease LeaseOptions
	// Socket, when not "" and Lease has no Broker, is the node broker's
	// socket given by name, dialed by the dialer package broker registers
	// (RegisterBroker); ErrNoBroker where none is.
	Socket string
	// Logger takes the account's warnings (default slog.Default()).
	Logger *slog.Logger
	// OnOOM, when not nil, is called once for each allocation the
	// allocator (or the cap) refuses for want of memory, with the error
	// and the allocator's kind and report (its Allocator the registry's
	// name of what serves), on the goroutine whose allocation failed,
	// before that call returns, with the allocator in use: it must not
	// call Swap or Close.
	OnOOM func(err *alloc.OutOfMemoryError, kind alloc.Kind, r alloc.MemoryReport)
	// Owner is the account's owner (nil: none; nothing is reclaimed, and
	// SetCap on an account made without a cap counts no allocation made
	// before).
	Owner Owner
}

// Account is a process's account of one device's memory: an allocator
// under a cap, which a broker's lease may drive. It is safe for
// concurrent use by any number of goroutines.
type Account struct {
	dev   device.Device
	log   *slog.Logger
	cfg   Config
	owner Owner

	capMu    sync.Mutex    // serializes SetCap (cap.go); taken before mu
	capBytes atomic.Uint64 // the cap (Config.Cap, SetCap); 0: none

	mu          sync.RWMutex    // read: the allocator is in use; write: replaced or closed
	al          alloc.Allocator // protected by mu
	kind        alloc.Kind      // the kind al serves; protected by mu
	name        string          // the registry's name of what serves kind (alloc.Entry.Name); protected by mu
	lim         *alloc.Limit    // the cap's Limit, outermost in al; nil with none; protected by mu
	servedAsync bool            // an AsyncPool served at some point (Close trims the device's pool); protected by mu
	closed      bool            // protected by mu

	trims  sync.WaitGroup // trims in flight (trim.go), which a caller's context may abandon; waited for before al closes
	trimMu sync.Mutex     // protects trim
	trim   *trimRun       // the trim in flight; nil: none

	notices notices   // budget changes (changes.go)
	freed   signal    // broadcast after each Free
	lease   *follower // the broker's lease (lease.go); nil without; set in New
}

// New makes the account of dev: the allocator cfg chooses, capped, and,
// with a broker, the lease it follows. The caller keeps ownership of dev:
// Close the account before the device.
func New(dev device.Device, cfg Config) (*Account, error) {
	if dev == nil {
		return nil, fmt.Errorf("new account: nil device: %w", device.ErrInvalidValue)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	a := &Account{dev: dev, log: cfg.Logger, cfg: cfg, owner: cfg.Owner}
	a.capBytes.Store(cfg.Cap)
	p, err := a.Prepare(cfg.Allocator.Kind)
	if err != nil {
		return nil, fmt.Errorf("new account: %w", err)
	}
	a.install(p)
	if err := a.joinBroker(); err != nil { // lease.go
		return nil, errors.Join(err, a.Close(nil))
	}
	return a, nil
}

// Prepared is an allocator Prepare made, not yet serving: Swap installs
// it.
type Prepared struct {
	al   alloc.Allocator
	kind alloc.Kind
	name string
}

// Prepare makes an allocator of kind as the account serves it (Choice,
// Wrap, the cap outermost) for Swap. An error changes nothing.
func (a *Account) Prepare(kind alloc.Kind) (*Prepared, error) {
	al, e, err := a.cfg.Allocator.make(a.dev, kind)
	if err != nil {
		return nil, err
	}
	if a.cfg.Wrap != nil {
		al = a.cfg.Wrap(al)
	}
	if c := a.capBytes.Load(); c > 0 {
		al = alloc.NewLimit(al, c)
	}
	a.observeOOM(al, kind, e.Name)
	return &Prepared{al: al, kind: kind, name: e.Name}, nil
}

// install makes p the allocator (its cap's Limit outermost, when
// capped). mu must be held for writing, or a not yet shared.
func (a *Account) install(p *Prepared) {
	a.al, a.kind, a.name, a.lim = p.al, p.kind, p.name, nil
	a.servedAsync = a.servedAsync || p.kind == alloc.KindAsync
	if a.capBytes.Load() > 0 {
		a.lim, _ = p.al.(*alloc.Limit)
	}
}

// Swap makes p the allocator and closes the one it replaces, once the
// trims in flight are done. The caller frees what it allocated from the
// old one first. A cap set since Prepare made p is p's.
func (a *Account) Swap(p *Prepared) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return errors.Join(closedErr("swap the allocator"), p.al.Close())
	}
	old := a.al
	a.install(p)
	if c := a.capBytes.Load(); a.lim != nil && c > 0 {
		a.lim.SetCap(c)
	}
	a.trims.Wait()
	return wrapIf("close the old allocator", old.Close())
}

// observeOOM sets the OnOOM observer, if any, on al, of kind, served by
// the registry's entry name.
func (a *Account) observeOOM(al alloc.Allocator, kind alloc.Kind, name string) {
	f := a.cfg.OnOOM
	if f == nil {
		return
	}
	alloc.ObserveOOM(al, func(e *alloc.OutOfMemoryError) {
		r := e.Report()
		r.Allocator = name
		f(e, kind, r)
	})
}

// Device is the account's device.
func (a *Account) Device() device.Device { return a.dev }

// Alloc allocates n bytes ordered on s, for a caller that reserved
// nothing: under a broker's lease it first claims what the lease lacks
// for them (Reserve's claim, with no report), waiting under ctx. The
// allocation is refused past the cap before the device is asked.
func (a *Account) Alloc(ctx context.Context, n uint64, s device.Stream) (device.Ptr, error) {
	a.mu.RLock()
	defer a.mu.RUnlock()
	if a.closed {
		return 0, closedErr("alloc")
	}
	if f := a.lease; f != nil {
		done, err := f.claimFor(ctx, n, a.chargedLocked(n)) // reserve.go
		if err != nil {
			return 0, err
		}
		defer done()
	}
	return a.al.Alloc(n, s)
}

// AllocExact allocates n bytes ordered on s, taking from the device no
// more than the allocator states for them (alloc.AllocExact), within what
// the caller reserved (Reserve).
func (a *Account) AllocExact(n uint64, s device.Stream) (device.Ptr, error) {
	a.mu.RLock()
	defer a.mu.RUnlock()
	if a.closed {
		return 0, closedErr("alloc")
	}
	return alloc.AllocExact(a.al, n, s)
}

// Free gives p, last used on s, back to the allocator, and wakes the
// waits for memory given back (WaitWithinCap, the lease follower).
func (a *Account) Free(p device.Ptr, s device.Stream) error {
	a.mu.RLock()
	defer a.mu.RUnlock()
	if a.closed {
		return closedErr("free")
	}
	err := a.al.Free(p, s)
	a.freed.broadcast()
	return err
}

// Freed returns a channel closed at the next Free.
func (a *Account) Freed() <-chan struct{} { return a.freed.wait() }

// Allocator returns the allocator the account serves from, its cap's
// Limit outermost when capped, for what only it can tell (its type, its
// configuration). It stays valid until the next Swap or Close. Allocate
// and free through the account, not through it: its cap and lease would
// not see the bytes.
func (a *Account) Allocator() alloc.Allocator {
	a.mu.RLock()
	defer a.mu.RUnlock()
	return a.al
}

// Stats returns the allocator's kind and its Stats, read together.
func (a *Account) Stats() (alloc.Kind, alloc.Stats) {
	a.mu.RLock()
	defer a.mu.RUnlock()
	return a.kind, a.al.Stats()
}

// Report returns the allocator's kind and its memory report, read
// together. The report's Allocator is the registry's name of the
// allocator that serves the kind (alloc.Entry.Name: "expandable" for the
// Pool kind served by alloc.Expandable), whatever Wrap wraps it in; its
// Cap is the account's.
func (a *Account) Report() (alloc.Kind, alloc.MemoryReport) {
	a.mu.RLock()
	defer a.mu.RUnlock()
	r := alloc.ReportOf(a.al)
	r.Allocator = a.name
	return a.kind, r
}

// ResetPeaks sets the allocator's peaks to its current figures, where it
// keeps peaks (alloc.PeakResetter).
func (a *Account) ResetPeaks() {
	a.mu.RLock()
	defer a.mu.RUnlock()
	if r, ok := a.al.(alloc.PeakResetter); ok {
		r.ResetPeaks()
	}
}

// chargedLocked is n as the cap charges it: rounded up to the
// allocator's granularity. mu must be held.
func (a *Account) chargedLocked(n uint64) uint64 {
	g := uint64(1)
	if gr, ok := a.al.(alloc.Granular); ok {
		g = max(gr.Granularity(), 1)
	}
	if r, ok := units.RoundUp(n, g); ok {
		return r
	}
	return n
}

// Close closes the allocator, once the trims in flight are done; then
// calls then (nil: nothing), where the owner ends its work on the
// device's streams (a free still queued on a closing stream returns its
// block to the device's stream-ordered pool); then gives that pool its
// unused memory back, when an AsyncPool served, and releases the lease.
// The caller frees what it allocated first. Later calls return errors
// wrapping ErrClosed; a second Close returns nil.
func (a *Account) Close(then func() error) error {
	a.leaveBroker() // lease.go: before mu, which the follower takes
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return nil
	}
	a.closed = true
	a.trims.Wait()
	closeErr := wrapIf("close allocator", a.al.Close())
	var thenErr error
	if then != nil {
		thenErr = then()
	}
	poolErr := wrapIf("trim the device's pool", a.trimDevicePool())
	leaseErr := a.releaseLease() // once the allocator gave its memory back
	return errors.Join(closeErr, thenErr, poolErr, leaseErr)
}

// trimDevicePool gives the device's stream-ordered pool its unused memory
// back, when an AsyncPool served. mu must be held for writing.
func (a *Account) trimDevicePool() error {
	aa, ok := a.dev.(device.AsyncAllocator)
	if !a.servedAsync || !ok {
		return nil
	}
	return aa.TrimPool(0)
}

func wrapIf(what string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("%s: %w", what, err)
}
