package vram

// A manager's budget from a lease of the node broker
// (WithLease(LeaseOptions{Broker: broker.At(socket)}), $VRAM_BROKER).
//
// vram does not import package broker (package broker imports vram, and
// the arrows point one way): it states here the little it needs of a
// broker (Broker) and of a lease (Lease), and the caller passes the
// broker as a value, LeaseOptions.Broker, which package broker's At
// makes. A socket given by name (the deprecated WithBroker, $VRAM_BROKER
// for Default) needs the dialer package broker registers when it is
// linked in (RegisterBroker, in its init); a program that links no broker
// client gets ErrNoBroker from New, saying what to pass.
//
// The lease bounds what the manager's allocator holds of the device (its
// Stats().Reserved: live arrays and cache, as the device counts them):
//
//  1. The cap follows the lease: at each change of the lease's budget the
//     manager's cap is set to it, a BudgetChange that running batches
//     re-plan for at their next chunk boundary (package batch), and each
//     Allocate plans with at most the lease less what the allocator holds
//     (groupBudget's lease clause, in device bytes).
//  2. An Allocate whose plan fails, or chunks, for want of the lease
//     claims what its arrays take unchunked (leasetx.go): the broker
//     grants what is free at once, and the rest of the lease's guaranteed
//     part once its borrowers have shrunk, waiting under the Allocate's
//     context; then the group is planned again. A claim that fails is the
//     Allocate's error when its plan failed (the broker's error names who
//     holds what); a chunked plan goes on within the lease.
//  3. Before it takes device memory an Allocate reports what the
//     allocator will hold at most (what it holds and what the plan's
//     arrays take): a claim another process makes meanwhile then sees
//     that memory in use and asks this one to shrink, rather than handing
//     it out as free. When the broker's reply shows the lease lowered
//     meanwhile, the group is planned again within it.
//  4. What the allocator holds is reported as it changes (after each
//     Allocate, after frees), and the lease is lowered to it when the
//     allocator holds less, so that memory it does not use is free for
//     other processes to borrow; a later Allocate claims it back.
//  5. A request to shrink sets the cap lower; running batches re-plan at
//     their next chunk boundary; the allocator's cache is trimmed and idle
//     owners are evicted (oldest first) as needed; and the report of what
//     is then held is the acknowledgement. Live arrays no batch re-plans
//     and no eviction may take are kept: the deadline is missed, and the
//     broker names the lease. Nothing is killed.
//  6. A lease that ends while the manager lives (the broker did not take
//     it back after a restart) ends the budget: the cap goes to nothing,
//     BudgetChange.Ended says why (wrapping ErrLease), and running batches
//     stop at their next chunk boundary rather than keep memory the
//     broker may grant to others. A broker that is merely away ends
//     nothing: its leases are taken back when it returns.
//
// Which of the broker's devices is the manager's: LeaseOptions.Device when
// it names one (an index of the broker's --devices, or its name), else
// the one whose ID is the manager's device.Info.ID (GPU-UUID on CUDA,
// sim:shared=NAME for a shared simulator), which every process of the
// node reads alike whatever its CUDA_VISIBLE_DEVICES. A device with no ID
// (a private simulator) must be named.
//
// Locks: the follower's mu is taken after allocMu and never held over a
// call to the broker; rpc (room for one) serializes the calls that set
// what the broker counts (Claim, Report), so that the latest figure sent
// is the latest known.

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

// BrokerEnv names the environment variable from which Default reads the
// node broker's socket (the same variable package broker's daemon and
// clients read). Unset or empty: no broker.
const BrokerEnv = "VRAM_BROKER"

var (
	// ErrNoBroker: a broker's socket given by name (WithBroker,
	// $VRAM_BROKER) in a program that links no broker client.
	ErrNoBroker = errors.New("no broker client is linked into this program")
	// ErrLease: the broker's lease cannot cover what the manager needs, or
	// has ended.
	ErrLease = errors.New("the broker's lease cannot cover it")
)

// Lease is what a manager needs of a lease from the node broker. Package
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

// Broker is a node broker as a manager asks it for its lease
// (LeaseOptions.Broker). Package broker's At is the broker on a socket.
type Broker interface {
	// Lease connects to the broker and acquires the lease req asks for,
	// waiting no longer than ctx. Its errors name the broker (its socket)
	// and say what to do: New returns them as they are.
	Lease(ctx context.Context, req LeaseRequest) (Lease, error)
	// String names the broker in messages (its socket).
	String() string
}

// LeaseOptions describe the lease a manager asks the broker for, as
// ClientOptions describe a client.
type LeaseOptions struct {
	// Broker is the broker the lease is asked of (broker.At(socket)).
	// When it is nil, the socket WithBroker names is (or none).
	Broker Broker
	// Device is the broker's device: an index of its --devices or its
	// name. "" finds the one whose ID is the manager's device's
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

// LeaseRequest is what a manager asks a Broker (or a BrokerDialer) for.
type LeaseRequest struct {
	Socket  string      // the broker's Unix socket, as WithBroker names it; "" to a Broker value, which knows its own
	Device  device.Info // the manager's device; its ID finds the broker's entry
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

// RegisterBroker makes d the dialer of a socket given by name (WithBroker,
// $VRAM_BROKER for Default). Package broker calls it when it is linked
// in; a second call replaces the first, and nil removes it.
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

// brokerConfig is WithLease's (and WithBroker's) part of config.
type brokerConfig struct {
	socket string // WithBroker's, $VRAM_BROKER's; "": none
	lease  LeaseOptions
}

// broker is the broker the lease is asked of: LeaseOptions.Broker, else
// the socket given by name, dialed by the registered dialer; nil for
// none.
func (c brokerConfig) broker() (Broker, error) {
	switch {
	case c.lease.Broker != nil:
		return c.lease.Broker, nil
	case c.socket == "":
		return nil, nil
	}
	dial := brokerDialer()
	if dial == nil {
		return nil, fmt.Errorf("broker %s: %w; pass WithLease(vram.LeaseOptions{Broker: broker.At(%q)}) (package github.com/vramkit/vram/broker)", c.socket, ErrNoBroker, c.socket)
	}
	return namedBroker{socket: c.socket, dial: dial}, nil
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

// WithBroker makes the manager take its budget from a lease of the node
// broker on socket, through the dialer package broker registers when it
// is linked in (ErrNoBroker where none is). "" means none.
//
// Deprecated: pass the broker as a value,
// WithLease(LeaseOptions{Broker: broker.At(socket)}), which needs no
// registered dialer. WithBroker stays for the programs that call it;
// LeaseOptions.Broker, when set, is used instead.
func WithBroker(socket string) Option { return func(c *config) { c.broker.socket = socket } }

// WithLease makes the manager take its budget from a lease of o.Broker
// (see lease.go's overview): its cap follows the lease, an Allocate that
// needs more claims it, and a request to shrink is answered at the
// running batches' next chunk boundary. New fails when the broker cannot
// be reached or refuses the lease. Without a Name, the lease is named
// after the program; without a Device, it is the broker's device whose ID
// is the manager's device's. With no Broker, o describes the lease the
// socket $VRAM_BROKER (for Default) or WithBroker names asks for.
func WithLease(o LeaseOptions) Option { return func(c *config) { c.broker.lease = o } }

// brokerFromEnv is WithBroker($VRAM_BROKER), when it is set.
func brokerFromEnv() []Option {
	if s := os.Getenv(BrokerEnv); s != "" {
		return []Option{WithBroker(s)}
	}
	return nil
}

// leaseDialTimeout bounds New's wait for the broker and the lease.
const leaseDialTimeout = 10 * time.Second

// leaseCallTimeout bounds a report or a give-back that no caller's
// context bounds.
const leaseCallTimeout = 10 * time.Second

// joinBroker acquires the lease WithLease (or WithBroker) asks for and
// starts following it; nothing is done without one. m is not yet shared.
func (m *Manager) joinBroker() error {
	br, err := m.cfg.broker.broker()
	if br == nil || err != nil {
		return err
	}
	o := m.cfg.broker.lease
	if o.Name == "" {
		o.Name = filepath.Base(os.Args[0])
	}
	ctx, cancel := context.WithTimeout(context.Background(), leaseDialTimeout)
	defer cancel()
	l, err := br.Lease(ctx, LeaseRequest{Device: m.dev.Info(), Options: o, Logger: m.log})
	if err != nil {
		return err // the broker's, which names it and says what to do (Broker.Lease)
	}
	// The broker grants a new lease what is free of its guaranteed part;
	// the manager holds nothing yet, so it gives that back at once, for
	// others to borrow until its first Allocate claims what it needs.
	b, err := l.Claim(ctx, 0)
	if err != nil {
		return errors.Join(fmt.Errorf("lease from the broker on %s: %w", br, err), l.Close())
	}
	f := &leaseFollower{m: m, l: l, rpc: make(chan struct{}, 1), poke: make(chan struct{}, 1), done: make(chan struct{}), applied: b, capSet: capFor(b.Bytes)}
	if err := m.SetCap(capFor(b.Bytes)); err != nil {
		return errors.Join(err, l.Close())
	}
	m.lease = f
	var fctx context.Context
	fctx, f.stop = context.WithCancel(context.Background())
	go f.follow(fctx)
	return nil
}

// capFor is the manager's cap for a lease of bytes: SetCap(0) removes
// the cap, so a lease of nothing caps at one byte, which every array is
// over.
func capFor(bytes uint64) uint64 { return max(bytes, 1) }

// leaveBroker stops following the lease (before Close takes allocMu).
func (m *Manager) leaveBroker() {
	if f := m.lease; f != nil {
		f.stopOnce.Do(func() {
			f.stop()
			<-f.done
		})
	}
}

// releaseLease releases the lease once the allocator has given its memory
// back (Close).
func (m *Manager) releaseLease() error {
	f := m.lease
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

// leaseFollower is the manager's side of its lease: it applies the
// lease's budget as the cap, reports what the allocator holds, gives back
// what it does not, and answers requests to shrink.
type leaseFollower struct {
	m         *Manager
	l         Lease
	rpc       chan struct{} // room for one: serializes Claim and Report
	poke      chan struct{} // room for one: what the allocator holds may have changed
	stop      context.CancelFunc
	done      chan struct{} // closed when follow returns
	stopOnce  sync.Once
	closeOnce sync.Once

	mu        sync.Mutex  // protects the fields below
	applied   LeaseBudget // the budget the cap was last set to
	busy      int         // Allocates in progress: no give-back meanwhile
	reserving uint64      // the most the Allocate in progress will hold (0: none)
	capSet    uint64      // the cap last set: capFor the lease, or of reserving while more
	reported  uint64      // what was last reported held
	stats     LeaseStats
	shrinkAt  time.Time // when the request to shrink in hand was seen (zero: none)
}

// LeaseStats count what a manager's lease did. A plain value.
type LeaseStats struct {
	ID          string        // the lease, as the broker names it
	Bytes       uint64        // what the allocator may hold now
	Guaranteed  uint64        // of Bytes, the lease's share; the rest is borrowed
	Held        uint64        // what was last reported held
	Claims      int           // claims for more made by Allocate
	ClaimWait   time.Duration // their time in all, from the claim to the grant or refusal
	Refused     int           // claims the broker refused or granted only in part
	Shrinks     int           // requests to shrink answered
	ShrinkAck   time.Duration // the longest of them, from seeing the request to the report within it
	Evicted     int           // clients evicted to shrink
	GaveBack    int           // times the lease was lowered to what the allocator held
	ReportFails int           // reports the broker did not take (it was away); retried
}

// Lease reports the manager's lease, and false without one.
func (m *Manager) Lease() (LeaseStats, bool) {
	f := m.lease
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
func (f *leaseFollower) follow(ctx context.Context) {
	defer close(f.done)
	m := f.m
	tick := time.NewTicker(time.Second) // a report the broker missed is sent again
	defer tick.Stop()
	for {
		changed := f.l.Changed()
		freed := m.freed.wait()
		if err := f.l.Err(); err != nil {
			m.log.Warn("vram: the broker's lease ended; the manager can allocate nothing more", "lease", f.l.String(), "err", err)
			f.apply(LeaseBudget{})
			m.noteEnd("the broker's lease ended", fmt.Errorf("%s ended: %w (%w)", f.l, err, ErrLease))
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
func (f *leaseFollower) apply(b LeaseBudget) {
	m := f.m
	m.allocMu.RLock()
	defer m.allocMu.RUnlock()
	f.applyLocked(b)
}

// applyLocked is apply with allocMu held for reading (Allocate holds it:
// SetCap, which takes allocMu itself, cannot be called there).
func (f *leaseFollower) applyLocked(b LeaseBudget) {
	m := f.m
	f.mu.Lock()
	from := f.applied
	f.applied = b
	if b.Shrink && f.shrinkAt.IsZero() {
		f.shrinkAt = time.Now()
	}
	// The Allocate in progress takes what the broker took its report of
	// (reserveLease): a lease lowered meanwhile lowers the cap once it is
	// done (holdLease), and is answered then, not by failing it.
	capTo := capFor(max(b.Bytes, f.reserving))
	setCap := capTo != f.capSet
	f.capSet = capTo
	f.mu.Unlock()
	if m.capLim == nil || m.isClosed() {
		return
	}
	if setCap {
		m.capLim.SetCap(capTo)
		m.capBytes.Store(capTo)
	}
	if from.Bytes == b.Bytes {
		return
	}
	// A lease lowered to no less than the allocator holds (given back)
	// asks nothing of the batches; more room, or less than is held, does.
	if b.Bytes < from.Bytes && b.Bytes >= m.al.Stats().Reserved {
		return
	}
	why := "the broker's lease"
	if b.Shrink {
		why = "the broker asks to shrink"
	}
	m.note(fmt.Sprintf("lease %s → %s (%s)", units.Format(from.Bytes), units.Format(b.Bytes), why))
}

// budget is the budget last applied.
func (f *leaseFollower) budget() LeaseBudget {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.applied
}

// settle brings what the allocator holds within the lease when asked to
// shrink (trimming, then evicting idle owners), reports what it holds
// when that changed, and gives back what it does not use.
func (f *leaseFollower) settle(ctx context.Context) {
	b := f.budget()
	if b.Shrink || f.heldNow() > b.Bytes {
		f.shrink(ctx, b.Bytes)
	}
	f.mu.Lock()
	busy, reserving, reported := f.busy, f.reserving, f.reported
	f.mu.Unlock()
	held := max(f.heldNow(), reserving)
	switch {
	case busy == 0 && !b.Shrink && held < b.Bytes:
		if held != reported { // a claim lowers the limit, not what the broker counts held
			f.report(ctx, held)
		}
		f.giveBack(ctx, held)
	case held != reported || b.Shrink:
		f.report(ctx, held)
	}
}

// heldNow is what the allocator holds of the device.
func (f *leaseFollower) heldNow() uint64 {
	m := f.m
	m.allocMu.RLock()
	defer m.allocMu.RUnlock()
	if m.isClosed() {
		return 0
	}
	return m.al.Stats().Reserved
}

// report tells the broker the allocator holds held; within a request to
// shrink, that is its acknowledgement.
func (f *leaseFollower) report(ctx context.Context, held uint64) {
	ctx, cancel := context.WithTimeout(ctx, leaseCallTimeout)
	defer cancel()
	b, err := f.tell(ctx, held)
	if err != nil {
		f.m.log.Debug("vram: report to the broker", "lease", f.l.String(), "held", held, "err", err)
		f.count(func(s *LeaseStats) { s.ReportFails++ })
		return
	}
	f.apply(b)
	f.acked(held, b)
}

// giveBack lowers the lease to held, what the allocator holds.
func (f *leaseFollower) giveBack(ctx context.Context, held uint64) {
	ctx, cancel := context.WithTimeout(ctx, leaseCallTimeout)
	defer cancel()
	b, err := f.claim(ctx, held)
	if err != nil {
		f.m.log.Debug("vram: give back to the broker", "lease", f.l.String(), "held", held, "err", err)
		return
	}
	f.count(func(s *LeaseStats) { s.GaveBack++ })
	f.apply(b)
	f.acked(held, b)
}

// claim asks the broker for a limit of bytes (Lease.Claim). It changes
// the limit only: what the broker counts held stays what was last told.
func (f *leaseFollower) claim(ctx context.Context, bytes uint64) (LeaseBudget, error) {
	return f.oneCall(ctx, func() (LeaseBudget, error) { return f.l.Claim(ctx, bytes) })
}

// tell reports to the broker that the allocator holds bytes
// (Lease.Report), and records the figure.
func (f *leaseFollower) tell(ctx context.Context, bytes uint64) (LeaseBudget, error) {
	b, err := f.oneCall(ctx, func() (LeaseBudget, error) { return f.l.Report(ctx, bytes) })
	if err == nil {
		f.mu.Lock()
		f.reported = bytes
		f.mu.Unlock()
	}
	return b, err
}

// oneCall makes call, one call to the broker at a time.
func (f *leaseFollower) oneCall(ctx context.Context, call func() (LeaseBudget, error)) (LeaseBudget, error) {
	if err := lockCtx(ctx, f.rpc, "the lease's other call to the broker"); err != nil {
		return LeaseBudget{}, err
	}
	defer func() { <-f.rpc }()
	return call()
}

// acked ends the request to shrink in hand once a report of held, which
// the broker answered with b, is within it.
func (f *leaseFollower) acked(held uint64, b LeaseBudget) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if at := f.shrinkAt; !at.IsZero() && held <= b.Bytes {
		f.stats.Shrinks++
		f.stats.ShrinkAck = max(f.stats.ShrinkAck, time.Since(at))
		f.shrinkAt = time.Time{}
	}
}

// wake has follow look again at what the allocator holds.
func (f *leaseFollower) wake() {
	select {
	case f.poke <- struct{}{}:
	default:
	}
}

func (f *leaseFollower) count(add func(*LeaseStats)) {
	f.mu.Lock()
	add(&f.stats)
	f.mu.Unlock()
}

// shrink brings the allocator within bytes as far as it can now: its
// cache trimmed, then idle owners evicted, oldest first, while the live
// arrays take more. Running batches give their part back at their next
// chunk boundary, on their own (the cap is lower).
func (f *leaseFollower) shrink(ctx context.Context, bytes uint64) {
	m := f.m
	if err := lockCtx(ctx, m.planMu, "the allocation of a group"); err != nil {
		return
	}
	defer func() { <-m.planMu }()
	m.allocMu.RLock()
	if m.isClosed() {
		m.allocMu.RUnlock()
		return
	}
	var victims []*Client
	before := m.al.Stats().Reserved
	if st := m.al.Stats(); st.InUse > bytes {
		victims = f.evictLocked(bytes)
	}
	if st := m.al.Stats(); st.Reserved > bytes && st.Cached() > 0 {
		if err := m.trimCtx(ctx); err != nil {
			m.log.Debug("vram: trim to shrink for the broker", "err", err)
		}
	}
	// What the lease leaves the groups grew: a batch that planned while
	// the allocator still held this memory plans again.
	if after := m.al.Stats().Reserved; after < before {
		m.note(fmt.Sprintf("the allocator holds %s, was %s (shrunk for the broker's lease)", units.Format(after), units.Format(before)))
	}
	m.allocMu.RUnlock()
	deliver(victims)
}

// evictLocked evicts idle owners, oldest first, until the live arrays
// take no more than bytes, and returns them (their OnInvalidate queued).
// planMu and allocMu must be held.
func (f *leaseFollower) evictLocked(bytes uint64) []*Client {
	m := f.m
	tx := &allocTx{m: f.m, roomFor: "the broker's lease, which asks this process to shrink"}
	if err := m.readBudget(&tx.gb); err != nil {
		return nil
	}
	for _, v := range tx.idleCandidates() {
		if m.al.Stats().InUse <= bytes {
			break
		}
		tx.evictClients([]victim{v})
	}
	f.count(func(s *LeaseStats) { s.Evicted += len(tx.victims) })
	return tx.victims
}
