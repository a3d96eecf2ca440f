package account

// An account's cap from a lease of the node broker (Config.Broker).
//
// This package does not import package broker (package broker imports
// it, and the arrows point one way): it states here the little it needs of
// a broker (Broker) and of a lease (Lease), and the caller passes the
// broker as a value, LeaseOptions.Broker, which package broker's At makes.
// A socket given by name (Config.Socket: the deprecated vram.WithBroker,
// $VRAM_BROKER for vram.Default) needs the dialer package broker registers
// when it is linked in (RegisterBroker, in its init); a program that links
// no broker client gets ErrNoBroker from New, saying what to pass.
//
// The lease bounds what the allocator holds of the device (its
// Stats().Reserved: live allocations and cache, as the device counts
// them):
//
//  1. The cap follows the lease: at each change of the lease's budget the
//     cap is set to it, a Change that the owner's running batches plan
//     again for at their next chunk, and Room states the lease.
//  2. An owner short of room claims it (Reserve, Alloc): the broker grants
//     what is free at once, and the rest of the lease's guaranteed part
//     once its borrowers have shrunk, waiting under the caller's context.
//  3. Before the owner takes device memory for a planned set of
//     allocations, Reserve reports what the allocator will hold at most:
//     a claim another process makes meanwhile then sees that memory in
//     use and asks this one to shrink, rather than handing it out as
//     free.
//  4. What the allocator holds is reported as it changes (after frees,
//     after each reservation ends), and the lease is lowered to it when
//     the allocator holds less, so that memory it does not use is free
//     for other processes to borrow; a later claim takes it back.
//  5. A request to shrink sets the cap lower; the owner's batches plan
//     again at their next chunk boundary; the owner reclaims what its idle
//     allocations hold (Owner.Reclaim) and the cache is trimmed as needed;
//     and the report of what is then held is the acknowledgement. What no
//     one gives back is kept: the deadline is missed, and the broker names
//     the lease. Nothing is killed.
//  6. A lease that ends while the account lives (the broker did not take
//     it back after a restart) ends the budget: the cap goes to nothing,
//     Change.Ended says why (wrapping ErrLease), and the owner's running
//     batches stop at their next chunk boundary rather than keep memory the
//     broker may grant to others. A broker that is merely away ends
//     nothing: its leases are taken back when it returns.
//
// Which of the broker's devices is the account's: LeaseOptions.Device when
// it names one (an index of the broker's --devices, or its name), else
// the one whose ID is the device's device.Info.ID (GPU-UUID on CUDA,
// sim:shared=NAME for a shared simulator), which every process of the
// node reads alike whatever its CUDA_VISIBLE_DEVICES. A device with no ID
// (a private simulator) must be named.
//
// Locks: the follower's mu is taken after the account's mu and never held
// over a call to the broker; rpc (room for one) serializes the calls that
// set what the broker counts (Claim, Report), so that the latest figure
// sent is the latest known.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/vramkit/vram/device"
	"github.com/vramkit/vram/internal/units"
)

// Lease is what an account needs of a lease from the node broker. Package
// broker implements it and makes one through the dialer it registers
// (RegisterBroker). Its methods are safe for concurrent use.
type Lease interface {
	// Budget is the lease as the broker last stated it.
	Budget() LeaseBudget
	// Changed is closed at the lease's next change (a new budget, a
	// request to shrink, its end); call it again for the one after.
	Changed() <-chan struct{}
	// Claim asks that the allocator may hold bytes. Less than the lease
	// gives lowers it at once; more is granted from what is free and,
	// within the guaranteed part, once borrowers have shrunk, waiting
	// under ctx. It returns the budget then, which beyond the guaranteed
	// part may be less than asked.
	Claim(ctx context.Context, bytes uint64) (LeaseBudget, error)
	// Report tells the broker the allocator holds bytes (after a request
	// to shrink, the acknowledgement) and returns the budget as the
	// broker stated it in reply.
	Report(ctx context.Context, bytes uint64) (LeaseBudget, error)
	// Err is why the lease ended, or nil while it lasts.
	Err() error
	// String names the lease in messages.
	String() string
	// Close releases the lease and the connection it came by.
	Close() error
}

// LeaseBudget is a lease's budget in the allocator's bytes (the context
// its process pays on the device left out). A plain value.
type LeaseBudget struct {
	Bytes      uint64    // what the allocator may hold now
	Guaranteed uint64    // what it may always claim: its share
	Shrink     bool      // the broker asks it to come down to Bytes
	Deadline   time.Time // by when, with Shrink
	Overdue    bool      // the deadline passed: the broker names the lease
}

// Broker is a node broker as an account asks it for its lease
// (LeaseOptions.Broker). Package broker's At is the broker on a socket.
type Broker interface {
	// Lease connects to the broker and acquires the lease req asks for,
	// waiting no longer than ctx. Its errors name the broker (its socket)
	// and say what to do: the account returns them as they are.
	Lease(ctx context.Context, req LeaseRequest) (Lease, error)
	// String names the broker in messages (its socket).
	String() string
}

// LeaseOptions describe the lease an account asks the broker for.
type LeaseOptions struct {
	// Broker is the broker the lease is asked of (broker.At(socket)).
	// When it is nil, the socket Config.Socket names is (or none).
	Broker Broker
	// Device is the broker's device: an index of its --devices or its
	// name. "" finds the one whose ID is the account's device's
	// (device.Info.ID).
	Device string
	// Name labels the lease in the broker's status and errors (default:
	// the program's name).
	Name string
	// Proportion is a manual share of the device, 0 < p ≤ 1; 0 puts the
	// lease in the broker's auto pool.
	Proportion float64
	// Cap, when not 0, bounds the lease in bytes, the context included.
	Cap uint64
}

// LeaseRequest is what an account asks a Broker (or a BrokerDialer) for.
type LeaseRequest struct {
	Socket  string      // the broker's Unix socket, as Config.Socket names it; "" to a Broker value, which knows its own
	Device  device.Info // the account's device; its ID finds the broker's entry
	Options LeaseOptions
	Logger  *slog.Logger
}

// BrokerDialer connects to the broker on req.Socket and acquires its
// lease, waiting no longer than ctx: how a socket given by name is
// dialed.
type BrokerDialer func(ctx context.Context, req LeaseRequest) (Lease, error)

var (
	dialerMu sync.Mutex // protects dialer
	dialer   BrokerDialer
)

// RegisterBroker makes d the dialer of a socket given by name
// (Config.Socket). Package broker calls it when it is linked in; a second
// call replaces the first, and nil removes it.
func RegisterBroker(d BrokerDialer) {
	dialerMu.Lock()
	defer dialerMu.Unlock()
	dialer = d
}

func brokerDialer() BrokerDialer {
	dialerMu.Lock()
	defer dialerMu.Unlock()
	return dialer
}

// leaseDialTimeout bounds New's wait for the broker and the lease.
const leaseDialTimeout = 10 * time.Second

// LeaseCallTimeout bounds a report or a give-back that no caller's
// context bounds; an owner bounds a Reserve its context no longer may
// cancel with it.
const LeaseCallTimeout = 10 * time.Second

// broker is the broker the lease is asked of: Lease.Broker, else the
// socket given by name, dialed by the registered dialer; nil for none.
func (c Config) broker() (Broker, error) {
	switch {
	case c.Lease.Broker != nil:
		return c.Lease.Broker, nil
	case c.Socket == "":
		return nil, nil
	}
	dial := brokerDialer()
	if dial == nil {
		return nil, fmt.Errorf("broker %s: %w; pass the broker as a value, LeaseOptions{Broker: broker.At(%q)} (package github.com/vramkit/vram/broker)", c.Socket, ErrNoBroker, c.Socket)
	}
	return namedBroker{socket: c.Socket, dial: dial}, nil
}

// namedBroker is a broker's socket given by name, and the registered
// dialer that reaches it.
type namedBroker struct {
	socket string
	dial   BrokerDialer
}

func (b namedBroker) Lease(ctx context.Context, req LeaseRequest) (Lease, error) {
	req.Socket = b.socket
	return b.dial(ctx, req)
}

func (b namedBroker) String() string { return b.socket }

// joinBroker acquires the lease Config.Lease (or Config.Socket) asks for
// and starts following it; nothing is done without one. a is not yet
// shared.
func (a *Account) joinBroker() error {
	br, err := a.cfg.broker()
	if br == nil || err != nil {
		return err
	}
	o := a.cfg.Lease
	if o.Name == "" {
		o.Name = filepath.Base(os.Args[0])
	}
	ctx, cancel := context.WithTimeout(context.Background(), leaseDialTimeout)
	defer cancel()
	l, err := br.Lease(ctx, LeaseRequest{Device: a.dev.Info(), Options: o, Logger: a.log})
	if err != nil {
		return err // the broker's, which names it and says what to do (Broker.Lease)
	}
	// The broker grants a new lease what is free of its guaranteed part;
	// the account holds nothing yet, so it gives that back at once, for
	// others to borrow until its owner's first claim takes what it needs.
	b, err := l.Claim(ctx, 0)
	if err != nil {
		return errors.Join(fmt.Errorf("lease from the broker on %s: %w", br, err), l.Close())
	}
	f := &follower{a: a, l: l, rpc: make(chan struct{}, 1), poke: make(chan struct{}, 1), done: make(chan struct{}), applied: b, capSet: capFor(b.Bytes)}
	if err := a.SetCap(capFor(b.Bytes)); err != nil {
		return errors.Join(err, l.Close())
	}
	a.lease = f
	var fctx context.Context
	fctx, f.stop = context.WithCancel(context.Background())
	go f.follow(fctx)
	return nil
}

// capFor is the cap for a lease of bytes: SetCap(0) removes the cap, so a
// lease of nothing caps at one byte, which every allocation is over.
func capFor(bytes uint64) uint64 { return max(bytes, 1) }

// leaveBroker stops following the lease (before Close takes mu).
func (a *Account) leaveBroker() {
	if f := a.lease; f != nil {
		f.stopOnce.Do(func() {
			f.stop()
			<-f.done
		})
	}
}

// releaseLease releases the lease once the allocator has given its memory
// back (Close).
func (a *Account) releaseLease() error {
	f := a.lease
	if f == nil {
		return nil
	}
	var err error
	f.closeOnce.Do(func() { err = f.l.Close() })
	if err != nil {
		return fmt.Errorf("release %s: %w", f.l, err)
	}
	return nil
}

// follower is the account's side of its lease: it applies the lease's
// budget as the cap, reports what the allocator holds, gives back what it
// does not, and answers requests to shrink.
type follower struct {
	a         *Account
	l         Lease
	rpc       chan struct{} // room for one: serializes Claim and Report
	poke      chan struct{} // room for one: what the allocator holds may have changed
	stop      context.CancelFunc
	done      chan struct{} // closed when follow returns
	stopOnce  sync.Once
	closeOnce sync.Once

	mu        sync.Mutex  // protects the fields below
	applied   LeaseBudget // the budget the cap was last set to
	busy      int         // reservations held: no give-back meanwhile
	holds     uint64      // reservations (and allocations' claims) taken so far: one taken since held was read makes it stale
	reserving uint64      // the most the reservations will hold (0: none)
	capSet    uint64      // the cap last set: capFor the lease, or of reserving while more
	reported  uint64      // what was last reported held
	stats     LeaseStats
	shrinkAt  time.Time // when the request to shrink in hand was seen (zero: none)
}

// LeaseStats count what an account's lease did. A plain value.
type LeaseStats struct {
	ID          string        // the lease, as the broker names it
	Bytes       uint64        // what the allocator may hold now
	Guaranteed  uint64        // of Bytes, the lease's share; the rest is borrowed
	Held        uint64        // what was last reported held
	Claims      int           // claims for more made by Reserve and Alloc
	ClaimWait   time.Duration // their time in all, from the claim to the grant or refusal
	Refused     int           // claims the broker refused or granted only in part
	Shrinks     int           // requests to shrink answered
	ShrinkAck   time.Duration // the longest of them, from seeing the request to the report within it
	Evicted     int           // owners of allocations reclaimed to shrink (Owner.Reclaim)
	GaveBack    int           // times the lease was lowered to what the allocator held
	ReportFails int           // reports the broker did not take (it was away); retried
}

// Lease reports the account's lease, and false without one.
func (a *Account) Lease() (LeaseStats, bool) {
	f := a.lease
	if f == nil {
		return LeaseStats{}, false
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	s := f.stats
	s.ID, s.Bytes, s.Guaranteed, s.Held = f.l.String(), f.applied.Bytes, f.applied.Guaranteed, f.reported
	return s, true
}

// follow applies each change of the lease and keeps the broker told of
// what the allocator holds, until ctx ends.
func (f *follower) follow(ctx context.Context) {
	defer close(f.done)
	a := f.a
	tick := time.NewTicker(time.Second) // a report the broker missed is sent again
	defer tick.Stop()
	for {
		changed := f.l.Changed()
		freed := a.freed.wait()
		if err := f.l.Err(); err != nil {
			a.log.Warn("vram: the broker's lease ended; the manager can allocate nothing more", "lease", f.l.String(), "err", err)
			f.apply(LeaseBudget{})
			a.noteEnd("the broker's lease ended", fmt.Errorf("%s ended: %w (%w)", f.l, err, ErrLease))
			return
		}
		f.apply(f.l.Budget())
		f.settle(ctx)
		select {
		case <-changed:
		case <-freed:
		case <-f.poke:
		case <-tick.C:
		case <-ctx.Done():
			return
		}
	}
}

// apply sets the cap to b's bytes when they changed, and notes a request
// to shrink as it arrives.
func (f *follower) apply(b LeaseBudget) {
	f.a.mu.RLock()
	defer f.a.mu.RUnlock()
	f.applyLocked(b)
}

// applyLocked is apply with the account's mu held for reading (Reserve
// holds it: SetCap, which takes it itself, cannot be called there).
func (f *follower) applyLocked(b LeaseBudget) {
	a := f.a
	f.mu.Lock()
	from := f.applied
	f.applied = b
	if b.Shrink && f.shrinkAt.IsZero() {
		f.shrinkAt = time.Now()
	}
	// The reservations in progress take what the broker took their report
	// of: a lease lowered meanwhile lowers the cap once they are released,
	// and is answered then, not by failing their allocations.
	capTo := capFor(max(b.Bytes, f.reserving))
	setCap := capTo != f.capSet
	f.capSet = capTo
	f.mu.Unlock()
	if a.lim == nil || a.closed {
		return
	}
	if setCap {
		a.lim.SetCap(capTo)
		a.capBytes.Store(capTo)
	}
	if from.Bytes == b.Bytes {
		return
	}
	// A lease lowered to no less than the allocator holds (given back)
	// asks nothing of the batches; more room, or less than is held, does.
	if b.Bytes < from.Bytes && b.Bytes >= a.al.Stats().Reserved {
		return
	}
	why := "the broker's lease"
	if b.Shrink {
		why = "the broker asks to shrink"
	}
	a.Note(fmt.Sprintf("lease %s → %s (%s)", units.Format(from.Bytes), units.Format(b.Bytes), why))
}

// budget is the budget last applied.
func (f *follower) budget() LeaseBudget {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.applied
}

// settle brings what the allocator holds within the lease when asked to
// shrink (reclaiming, then trimming), reports what it holds when that
// changed, and gives back what it does not use.
func (f *follower) settle(ctx context.Context) {
	b := f.budget()
	if b.Shrink || f.heldNow() > b.Bytes {
		f.shrink(ctx, b.Bytes)
	}
	f.mu.Lock()
	busy, reserving, reported, holds := f.busy, f.reserving, f.reported, f.holds
	f.mu.Unlock()
	held := max(f.heldNow(), reserving) // read after holds: what a hold taken before added is in it
	switch {
	case busy == 0 && !b.Shrink && held < b.Bytes:
		if held != reported { // a claim lowers the limit, not what the broker counts held
			f.report(ctx, held)
		}
		f.giveBack(ctx, held, holds)
	case held != reported || b.Shrink:
		f.report(ctx, held)
	}
}

// heldNow is what the allocator holds of the device.
func (f *follower) heldNow() uint64 {
	a := f.a
	a.mu.RLock()
	defer a.mu.RUnlock()
	if a.closed {
		return 0
	}
	return a.al.Stats().Reserved
}

// report tells the broker the allocator holds held; within a request to
// shrink, that is its acknowledgement.
func (f *follower) report(ctx context.Context, held uint64) {
	ctx, cancel := context.WithTimeout(ctx, LeaseCallTimeout)
	defer cancel()
	b, err := f.tell(ctx, held)
	if err != nil {
		f.a.log.Debug("vram: report to the broker", "lease", f.l.String(), "held", held, "err", err)
		f.count(func(s *LeaseStats) { s.ReportFails++ })
		return
	}
	f.apply(b)
	f.acked(held, b)
}

// giveBack lowers the lease to held, what the allocator held when holds
// reservations had been taken, unless one was taken since by the time
// the call is made: one that holds the lease then must not have its claim
// given back behind it, and one that came and went may have left the
// allocator holding more than held (a give-back to the stale figure
// would ask the account to shrink for nothing). The next settle, which
// the release wakes, reads it again.
func (f *follower) giveBack(ctx context.Context, held, holds uint64) {
	ctx, cancel := context.WithTimeout(ctx, LeaseCallTimeout)
	defer cancel()
	gave := false
	b, err := f.oneCall(ctx, func() (LeaseBudget, error) {
		f.mu.Lock()
		idle := f.busy == 0 && f.holds == holds
		f.mu.Unlock()
		if !idle {
			return LeaseBudget{}, nil
		}
		gave = true
		return f.l.Claim(ctx, held)
	})
	switch {
	case err != nil:
		f.a.log.Debug("vram: give back to the broker", "lease", f.l.String(), "held", held, "err", err)
		return
	case !gave:
		return
	}
	f.count(func(s *LeaseStats) { s.GaveBack++ })
	f.apply(b)
	f.acked(held, b)
}

// claim asks the broker for a limit of bytes (Lease.Claim). It changes
// the limit only: what the broker counts held stays what was last told.
func (f *follower) claim(ctx context.Context, bytes uint64) (LeaseBudget, error) {
	return f.oneCall(ctx, func() (LeaseBudget, error) { return f.l.Claim(ctx, bytes) })
}

// tell reports to the broker that the allocator holds bytes
// (Lease.Report), and records the figure.
func (f *follower) tell(ctx context.Context, bytes uint64) (LeaseBudget, error) {
	b, err := f.oneCall(ctx, func() (LeaseBudget, error) { return f.l.Report(ctx, bytes) })
	if err == nil {
		f.mu.Lock()
		f.reported = bytes
		f.mu.Unlock()
	}
	return b, err
}

// oneCall makes call, one call to the broker at a time.
func (f *follower) oneCall(ctx context.Context, call func() (LeaseBudget, error)) (LeaseBudget, error) {
	select {
	case f.rpc <- struct{}{}:
	case <-ctx.Done():
		return LeaseBudget{}, fmt.Errorf("waiting for the lease's other call to the broker: %w", ctx.Err())
	}
	defer func() { <-f.rpc }()
	return call()
}

// acked ends the request to shrink in hand once a report of held, which
// the broker answered with b, is within it.
func (f *follower) acked(held uint64, b LeaseBudget) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if at := f.shrinkAt; !at.IsZero() && held <= b.Bytes {
		f.stats.Shrinks++
		f.stats.ShrinkAck = max(f.stats.ShrinkAck, time.Since(at))
		f.shrinkAt = time.Time{}
	}
}

// wake has follow look again at what the allocator holds.
func (f *follower) wake() {
	select {
	case f.poke <- struct{}{}:
	default:
	}
}

func (f *follower) count(add func(*LeaseStats)) {
	f.mu.Lock()
	add(&f.stats)
	f.mu.Unlock()
}

// shrink brings the allocator within bytes as far as it can now: the
// owner reclaims its idle allocations while the live ones take more, then
// the cache is trimmed. The owner's running batches give their part back
// at their next chunk boundary, on their own (the cap is lower).
func (f *follower) shrink(ctx context.Context, bytes uint64) {
	a := f.a
	before, inUse := f.usage()
	if inUse > bytes && a.owner != nil {
		n := a.owner.Reclaim(ctx, bytes) // no lock of a's held: the owner takes its own first
		f.count(func(s *LeaseStats) { s.Evicted += n })
	}
	a.mu.RLock()
	defer a.mu.RUnlock()
	if a.closed {
		return
	}
	if st := a.al.Stats(); st.Reserved > bytes && st.Cached() > 0 {
		if err := a.trimLocked(ctx); err != nil {
			a.log.Debug("vram: trim to shrink for the broker", "err", err)
		}
	}
	// What the lease leaves the owner grew: a batch that planned while the
	// allocator still held this memory plans again.
	if after := a.al.Stats().Reserved; after < before {
		a.Note(fmt.Sprintf("the allocator holds %s, was %s (shrunk for the broker's lease)", units.Format(after), units.Format(before)))
	}
}

// usage is what the allocator holds and has in use.
func (f *follower) usage() (reserved, inUse uint64) {
	a := f.a
	a.mu.RLock()
	defer a.mu.RUnlock()
	if a.closed {
		return 0, 0
	}
	st := a.al.Stats()
	return st.Reserved, st.InUse
}
