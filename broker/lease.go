package broker

// The Lease handle: a process's share of one device, its budget as the
// broker last stated it, and the calls that change it.
//
// Budgets are in the holder's terms: Bytes is what its allocator may
// hold (the limit less the context its process pays on the device), and
// Claim and Report take allocator bytes too; the broker's own figures,
// the context included, are in the Budget's other fields.

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/vramkit/vram/broker/brokerpb"
)

// LeaseOptions describe a lease, as vram.ClientOptions describe a client.
type LeaseOptions struct {
	// Device is the broker's device index (the order of its --devices).
	Device int
	// Name labels the lease in the broker's status and errors.
	Name string
	// Proportion is a manual share of the device, 0 < p ≤ 1; 0 puts the
	// lease in the auto pool.
	Proportion float64
	// Cap, when not 0, bounds the lease's guaranteed part and its limit,
	// in bytes (the context included).
	Cap uint64
}

// Budget is a lease's state as the broker last stated it.
type Budget struct {
	Share      float64 // its proportion of the device now
	Guaranteed uint64  // its share in bytes (context included): it can always claim this
	Limit      uint64  // the bytes it may occupy now, context included
	Context    uint64  // its process's context, when charged to this lease
	Held       uint64  // what it last reported holding
	// Shrink is set while the broker asks the lease to shrink.
	Shrink *Shrink
}

// Bytes is what the holder's allocator may hold now: Limit less Context.
func (b Budget) Bytes() uint64 { return b.Limit - min(b.Limit, b.Context) }

// Shrink is a request to give memory back: hold at most Bytes by Deadline,
// then Report.
type Shrink struct {
	Bytes    uint64 // what the allocator may hold, context excluded
	Deadline time.Time
	Overdue  bool // the deadline passed: the broker names this lease in errors and status
}

// Lease is one lease. Its methods are safe for concurrent use.
type Lease struct {
	c  *Client
	id uint64

	releasing bool // Release was called: not rejoined. Protected by c.mu.

	mu      sync.Mutex // protects the fields below
	token   []byte     // the broker's proof that the lease is ours, for a rejoin (never shown)
	opts    LeaseOptions
	st      *brokerpb.LeaseState
	held    uint64        // last reported, for a rejoin
	changed chan struct{} // closed at the next change
	err     error         // why the lease ended, or nil
}

// Acquire opens a lease on o.Device. It is granted at once what is free
// of its guaranteed part; Claim asks for more.
func (c *Client) Acquire(ctx context.Context, o LeaseOptions) (*Lease, error) {
	l := &Lease{c: c, id: randomID(), opts: o, changed: make(chan struct{})}
	if o.Device < 0 || o.Device > 1<<31 {
		return nil, fmt.Errorf("broker: acquire: device %d: want an index of the broker's devices: %w", o.Device, ErrInvalid)
	}
	// Known before the call, so that an event about it is not missed.
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil, ErrClosed
	}
	c.leases[l.id] = l
	c.mu.Unlock()
	var st *brokerpb.LeaseState
	err := c.call(ctx, "acquire", c.callBounds(), func(ctx context.Context, cc *clientConn) (err error) {
		st, err = cc.lease(ctx, "acquire", acquireRequest(&brokerpb.AcquireRequest{LeaseId: l.id, Spec: l.spec()}))
		return err
	})
	if err != nil {
		c.forget(l)
		return nil, err
	}
	l.takeToken(st)
	l.apply(st)
	return l, nil
}

// takeToken keeps the token of the broker's reply st, for the next rejoin,
// and takes it out of st.
func (l *Lease) takeToken(st *brokerpb.LeaseState) {
	l.mu.Lock()
	l.token = st.GetToken()
	l.mu.Unlock()
	st.Token = nil
}

// spec is the lease's spec. l.mu must be held, or l not yet shared.
func (l *Lease) spec() *brokerpb.LeaseSpec {
	return &brokerpb.LeaseSpec{Device: uint32(l.opts.Device), Name: l.opts.Name, Proportion: l.opts.Proportion, CapBytes: l.opts.Cap}
}

// rejoinRequest takes the lease back to a new session as it is: it was
// held on broker instance prev.
func (l *Lease) rejoinRequest(prev uint64) *brokerpb.AcquireRequest {
	l.mu.Lock()
	defer l.mu.Unlock()
	return &brokerpb.AcquireRequest{LeaseId: l.id, Spec: l.spec(), Rejoin: true, HeldBytes: l.held, LimitBytes: l.st.GetLimitBytes(),
		Token: l.token, RejoinBroker: prev}
}

// ID is the lease's id, as the broker's status shows it.
func (l *Lease) ID() string { return leaseID(l.id) }

// String is "name (lease ID)".
func (l *Lease) String() string { return fmt.Sprintf("%q (lease %s)", l.opts.Name, l.ID()) }

// Options are the options the lease has now.
func (l *Lease) Options() LeaseOptions {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.opts
}

// apply takes a state the broker sent, unless a newer one was seen.
func (l *Lease) apply(st *brokerpb.LeaseState) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.err != nil || (l.st != nil && st.GetSeq() <= l.st.GetSeq()) {
		return
	}
	l.st = st
	close(l.changed)
	l.changed = make(chan struct{})
}

// lose ends the lease on the client's side with err.
func (l *Lease) lose(err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.err != nil {
		return
	}
	l.err = err
	l.st = &brokerpb.LeaseState{LeaseId: l.id, Device: uint32(l.opts.Device), Seq: ^uint64(0)}
	close(l.changed)
	l.changed = make(chan struct{})
}

// Budget is the lease's state as the broker last stated it; after the
// lease ended, the zero Budget.
func (l *Lease) Budget() Budget {
	l.mu.Lock()
	defer l.mu.Unlock()
	st := l.st
	b := Budget{Share: st.GetShare(), Guaranteed: st.GetGuaranteedBytes(), Limit: st.GetLimitBytes(),
		Context: st.GetContextBytes(), Held: st.GetHeldBytes()}
	if r := st.GetReclaim(); r != nil {
		b.Shrink = &Shrink{Bytes: r.GetTargetBytes() - min(r.GetTargetBytes(), b.Context),
			Deadline: time.Unix(0, r.GetDeadlineUnixNano()), Overdue: r.GetOverdue()}
	}
	return b
}

// Changed is closed at the lease's next change (a new budget, a request
// to shrink, the lease's end); call it again for the one after.
func (l *Lease) Changed() <-chan struct{} {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.changed
}

// Err is why the lease ended (released, its client closed, not taken
// back after a broker restart), or nil while it lasts.
func (l *Lease) Err() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.err
}

// live returns the lease's error if it has ended.
func (l *Lease) live() error {
	if err := l.Err(); err != nil {
		return err
	}
	return nil
}

// Claim asks that the lease's allocator may hold bytes. Less than now is
// granted at once. More is granted at once from what is free; the part
// within the guaranteed share that others borrow waits, under ctx, for
// them to shrink, and fails with ErrReclaimTimeout at the broker's
// deadline, naming who holds what. Beyond the guaranteed share only what
// is free is granted, so the Budget returned may be less than asked. A
// broker that does not answer by its deadline and the call timeout fails
// the claim with ErrUnavailable.
func (l *Lease) Claim(ctx context.Context, bytes uint64) (Budget, error) {
	if err := l.live(); err != nil {
		return Budget{}, err
	}
	c := l.c
	c.mu.Lock()
	// The broker's deadline and the call's; a broker away longer than a
	// restart takes (twice the longest backoff, and a second) grants
	// nothing: fail, and let the holder go on within what it has.
	b := bounds{wait: c.reclaim + c.cfg.callTimeout, away: 2*c.cfg.maxBackoff + time.Second}
	c.mu.Unlock()
	err := c.call(ctx, "claim", b, func(ctx context.Context, cc *clientConn) error {
		st, err := cc.lease(ctx, "claim", claimRequest(&brokerpb.ClaimRequest{LeaseId: l.id, LimitBytes: l.limitFor(bytes)}))
		if err == nil {
			l.apply(st)
		}
		return err
	})
	return l.Budget(), err
}

// limitFor is the broker's limit for an allocator of bytes.
func (l *Lease) limitFor(bytes uint64) uint64 {
	ctx := l.Budget().Context
	if s := bytes + ctx; s >= bytes {
		return s
	}
	return ^uint64(0)
}

// Report tells the broker the lease's allocator holds bytes; after a
// Shrink it is the acknowledgement. While the broker is away the figure
// is kept for the rejoin, which tells it, and Report returns nil.
func (l *Lease) Report(ctx context.Context, bytes uint64) error {
	if err := l.live(); err != nil {
		return err
	}
	l.mu.Lock()
	l.held = bytes
	l.mu.Unlock()
	if !l.c.connected() {
		return nil // the rejoin tells it (reconnected)
	}
	return l.c.call(ctx, "report", l.c.callBounds(), func(ctx context.Context, cc *clientConn) error {
		st, err := cc.lease(ctx, "report", reportRequest(&brokerpb.ReportRequest{LeaseId: l.id, HeldBytes: bytes}))
		if err == nil {
			l.apply(st)
		}
		return err
	})
}

// Change gives the lease another proportion (0: the auto pool) and cap,
// under the share rules; a refusal changes nothing.
func (l *Lease) Change(ctx context.Context, proportion float64, capBytes uint64) error {
	if err := l.live(); err != nil {
		return err
	}
	return l.c.call(ctx, "change", l.c.callBounds(), func(ctx context.Context, cc *clientConn) error {
		st, err := cc.lease(ctx, "change", changeRequest(&brokerpb.ChangeRequest{LeaseId: l.id, Proportion: proportion, CapBytes: capBytes}))
		if err == nil {
			l.mu.Lock()
			l.opts.Proportion, l.opts.Cap = proportion, capBytes
			l.mu.Unlock()
			l.apply(st)
		}
		return err
	})
}

// Release ends the lease. Releasing a lease that has ended already (its
// client closed, or not taken back after a broker restart) returns nil,
// and so does releasing one while the broker is away: a broker ends a
// lease with its connection, and a released lease is not rejoined.
func (l *Lease) Release(ctx context.Context) error {
	if err := l.live(); err != nil {
		return nil
	}
	c := l.c
	c.mu.Lock()
	l.releasing = true
	cc := c.conn
	if c.hello == nil {
		cc = nil // rejoining: reconnected releases it
	}
	c.mu.Unlock()
	if cc != nil {
		if err := c.releaseCall(ctx, cc, l); err != nil {
			c.mu.Lock()
			l.releasing = false
			c.mu.Unlock()
			return err // still held
		}
	}
	c.forget(l)
	l.lose(fmt.Errorf("%s: released: %w", l.String(), ErrReleased))
	return nil
}

// releaseCall asks the broker to release l on cc, once: a connection that
// ended meanwhile ended the lease all the same.
func (c *Client) releaseCall(ctx context.Context, cc *clientConn, l *Lease) error {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.callTimeout)
	defer cancel()
	r, err := cc.call(ctx, "release", releaseRequest(&brokerpb.ReleaseRequest{LeaseId: l.id}))
	switch {
	case err == nil && r.GetReleased() == nil:
		return unexpected("release", r)
	case err == nil, ctx.Err() == nil && (errors.Is(err, errConnEnded) || errors.Is(err, ErrNotFound)):
		return nil
	}
	return err
}
