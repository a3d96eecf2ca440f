package broker

// The client: one connection to the broker (clientconn.go), its watch,
// and the leases held through it.
//
// A Client keeps a connection. When the broker goes away (it stopped, or
// was killed and restarted) the client dials again with backoff
// (dial.go), opens the watch again, and once the broker greets the new
// session every lease is acquired again with rejoin set: its id, its
// token, what it holds, its limit and the broker instance it was held on
// (rejoin.go), so that the new table matches what the process holds and
// no lease is counted twice. A lease the broker does not take back is
// lost: its Err says why and its budget is 0.
//
// Calls made meanwhile wait, under their context, until the leases are
// back, and no longer than the client's call timeout (a Claim: the
// broker's reclaim deadline and the call timeout), so that a broker that
// stops answering fails calls with ErrUnavailable rather than hang them.
// The connection lives as long as the client, whatever the context given
// to Dial.

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/vramkit/vram/broker/brokerpb"
)

// DialOption configures Dial.
type DialOption func(*dialConfig)

type dialConfig struct {
	log         *slog.Logger
	minBackoff  time.Duration
	maxBackoff  time.Duration
	callTimeout time.Duration
}

// DefaultCallTimeout bounds each call of a client (WithCallTimeout).
const DefaultCallTimeout = 30 * time.Second

// WithLogger sets where the client logs lost leases and reconnections
// (default slog.Default()).
func WithLogger(l *slog.Logger) DialOption { return func(c *dialConfig) { c.log = l } }

// WithBackoff sets the delays between attempts to reach a broker that
// went away: from min, growing to max (default 50ms to 2s).
func WithBackoff(min, max time.Duration) DialOption {
	return func(c *dialConfig) { c.minBackoff, c.maxBackoff = min, max }
}

// WithCallTimeout bounds how long a call waits for the broker, when its
// context allows longer (default 30s); a Claim may wait the broker's
// reclaim deadline more.
func WithCallTimeout(d time.Duration) DialOption { return func(c *dialConfig) { c.callTimeout = d } }

// DeviceInfo is one of the broker's devices.
type DeviceInfo struct {
	Index   int
	Name    string
	ID      string // device.Info.ID of the device ("": none)
	Total   uint64 // bytes
	Context uint64 // bytes a process's context takes
}

// Client is a connection to a broker. It is safe for concurrent use.
// Close it to release every lease it holds.
type Client struct {
	log    *slog.Logger
	cfg    dialConfig
	dialer *dialer
	runCtx context.Context // lives until Close: the reconnecting loop's
	cancel context.CancelFunc
	done   chan struct{} // the reconnecting loop returned

	mu       sync.Mutex // protects the fields below
	leases   map[uint64]*Lease
	conn     *clientConn     // the connection greeted last; nil while there is none
	hello    *brokerpb.Hello // the current session's greeting; nil while disconnected
	ready    chan struct{}   // closed while connected with every lease rejoined
	session  uint64          // the last session greeted, and its broker's instance
	instance uint64
	reclaim  time.Duration // the broker's reclaim deadline, from its greeting
	closed   bool
	rejoins  int // sessions rejoined after the first
}

// Dial connects to the broker at socket and waits, under ctx (at most
// 30s when ctx has no deadline), for its greeting, trying again while the
// broker is busy (dial.go). Leases acquired through the client end when
// it is closed, or when the process exits. ctx bounds Dial alone, not
// the client.
func Dial(ctx context.Context, socket string, opts ...DialOption) (*Client, error) {
	cfg := dialConfig{log: slog.Default(), minBackoff: 50 * time.Millisecond, maxBackoff: 2 * time.Second, callTimeout: DefaultCallTimeout}
	for _, o := range opts {
		o(&cfg)
	}
	if err := checkDialPath(socket); err != nil {
		return nil, err
	}
	runCtx, cancel := context.WithCancel(context.Background())
	c := &Client{log: cfg.log, cfg: cfg, dialer: &dialer{path: socket}, runCtx: runCtx, cancel: cancel,
		done: make(chan struct{}), leases: map[uint64]*Lease{}, ready: make(chan struct{})}
	cc, hello, err := c.firstConnect(ctx)
	if err != nil {
		cancel()
		return nil, err
	}
	c.mu.Lock()
	c.conn = cc
	c.greetedLocked(hello)
	close(c.ready)
	c.mu.Unlock()
	go c.run(cc)
	return c, nil
}

// firstConnect connects and waits, under ctx, for the broker's greeting,
// trying again with backoff while the broker is busy (its backlog full,
// the connection closed at its limit), and ending the wait at once at an
// error no retry mends: a dial error that says what to do, or the
// broker's refusal.
func (c *Client) firstConnect(ctx context.Context) (*clientConn, *brokerpb.Hello, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, defaultDialTimeout)
		defer cancel()
	}
	socket := c.dialer.path
	for delay := c.cfg.minBackoff; ; delay = min(2*delay, c.cfg.maxBackoff) {
		cc, hello, err := c.connect(ctx)
		var pe *plainError
		var re *remoteError
		switch {
		case err == nil:
			return cc, hello, nil
		case errors.As(err, &re):
			return nil, nil, fmt.Errorf("broker: dial %s: %w", socket, err)
		case errors.As(err, &pe) && !errors.Is(err, errConnEnded):
			return nil, nil, err // a dial error: it says it all
		}
		select {
		case <-time.After(delay):
			continue
		case <-ctx.Done():
		}
		last := "it accepted connections but sent no greeting: at its limit of connections, or not a vram broker (see its log)"
		if de := c.dialer.lastErr(); de != nil {
			last = de.Error()
		}
		return nil, nil, &plainError{fmt.Sprintf("broker: no greeting from %s: %v (%s)", socket, ctx.Err(), last), []error{ErrUnavailable, ctx.Err()}}
	}
}

// connect makes a connection and opens its watch, waiting under ctx for
// the broker's greeting.
func (c *Client) connect(ctx context.Context) (*clientConn, *brokerpb.Hello, error) {
	nc, err := c.dialer.dial(ctx)
	if err != nil {
		return nil, nil, err
	}
	cc := newClientConn(nc, c.dialer.path, c.apply)
	hello, err := cc.openWatch(ctx)
	if err != nil {
		cc.close()
		return nil, nil, err
	}
	return cc, hello, nil
}

// greetedLocked takes hello as the session's. c.mu must be held.
func (c *Client) greetedLocked(hello *brokerpb.Hello) {
	c.hello = hello
	c.session, c.instance = hello.GetSession(), hello.GetBroker()
	c.reclaim = time.Duration(hello.GetReclaimTimeoutNanos())
}

// run keeps the client connected until it is closed: when the
// connection ends, it dials again, with backoff, and rejoins the leases.
func (c *Client) run(cc *clientConn) {
	defer close(c.done)
	for {
		select {
		case <-cc.done:
		case <-c.runCtx.Done():
		}
		if c.runCtx.Err() != nil {
			cc.close()
			return
		}
		cc.close()
		c.disconnected(cc)
		if cc = c.reconnect(); cc == nil {
			return
		}
	}
}

// reconnect dials until a broker greets the client, each try bounded by
// the handshake's timeout, then rejoins the leases; nil once the client
// is closed.
func (c *Client) reconnect() *clientConn {
	for delay := c.cfg.minBackoff; ; delay = min(2*delay, c.cfg.maxBackoff) {
		ctx, cancel := context.WithTimeout(c.runCtx, DefaultHandshakeTimeout)
		cc, hello, err := c.connect(ctx)
		cancel()
		if err == nil {
			c.reconnected(cc, hello)
			return cc
		}
		if c.runCtx.Err() != nil {
			return nil
		}
		c.log.Debug("vram broker: reconnect", "err", err, "retry in", delay)
		select {
		case <-time.After(delay):
		case <-c.runCtx.Done():
			return nil
		}
	}
}

// disconnected marks the client as waiting for the broker, once cc, its
// connection, has ended.
func (c *Client) disconnected(cc *clientConn) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.conn == cc && c.hello != nil {
		c.hello, c.conn = nil, nil
		c.ready = make(chan struct{})
	}
}

// reconnected rejoins every lease on cc, whose broker greeted a new
// session (the old one's leases ended with it), then lets calls through.
// A lease released while it was rejoined is released again on the new
// session.
func (c *Client) reconnected(cc *clientConn, hello *brokerpb.Hello) {
	c.mu.Lock()
	prev := c.instance
	c.conn = cc
	leases := make([]*Lease, 0, len(c.leases))
	for _, l := range c.leases {
		if !l.releasing {
			leases = append(leases, l)
		}
	}
	c.mu.Unlock()
	slices.SortFunc(leases, func(a, b *Lease) int { return cmp.Compare(a.id, b.id) })
	told := map[*Lease]uint64{} // what each rejoin said it holds
	for _, l := range leases {
		held, err := c.rejoin(cc, l, prev)
		if err != nil {
			c.log.Warn("vram broker: a lease was not taken back after reconnecting", "lease", leaseID(l.id), "name", l.opts.Name, "err", err)
			l.lose(err)
			c.forget(l)
			continue
		}
		told[l] = held
	}
	c.mu.Lock()
	c.greetedLocked(hello)
	c.rejoins++
	close(c.ready)
	var drop []*Lease
	for l := range told {
		if l.releasing {
			drop = append(drop, l)
			delete(told, l)
		}
	}
	c.mu.Unlock()
	for _, l := range drop {
		_ = c.releaseCall(c.runCtx, cc, l)
	}
	c.retell(cc, told)
}

// rejoin takes l back on the new session of cc: it was held on broker
// instance prev. It returns what it said l holds.
func (c *Client) rejoin(cc *clientConn, l *Lease, prev uint64) (uint64, error) {
	ctx, cancel := context.WithTimeout(c.runCtx, c.cfg.callTimeout)
	defer cancel()
	req := l.rejoinRequest(prev)
	st, err := cc.lease(ctx, "rejoin", acquireRequest(req))
	if err != nil {
		return 0, err
	}
	l.takeToken(st)
	l.apply(st)
	return req.GetHeldBytes(), nil
}

// retell reports what a lease holds again where a Report made while the
// broker was away changed it after its rejoin said otherwise.
func (c *Client) retell(cc *clientConn, told map[*Lease]uint64) {
	for l, held := range told {
		l.mu.Lock()
		now := l.held
		l.mu.Unlock()
		if now != held {
			ctx, cancel := context.WithTimeout(c.runCtx, c.cfg.callTimeout)
			if st, err := cc.lease(ctx, "report", reportRequest(&brokerpb.ReportRequest{LeaseId: l.id, HeldBytes: now})); err == nil {
				l.apply(st)
			}
			cancel()
		}
	}
}

// apply gives a lease state from an event to its lease.
func (c *Client) apply(st *brokerpb.LeaseState) {
	c.mu.Lock()
	l := c.leases[st.GetLeaseId()]
	c.mu.Unlock()
	if l != nil {
		l.apply(st)
	}
}

func (c *Client) forget(l *Lease) {
	c.mu.Lock()
	delete(c.leases, l.id)
	c.mu.Unlock()
}

// waitReady waits until the client is connected with its leases back,
// for no longer than away, and returns the connection.
func (c *Client) waitReady(ctx context.Context, away time.Duration) (*clientConn, error) {
	var timeout <-chan time.Time
	for {
		c.mu.Lock()
		ready, cc, closed := c.ready, c.conn, c.closed
		c.mu.Unlock()
		if closed {
			return nil, ErrClosed
		}
		select {
		case <-ready:
			if !cc.lost() {
				return cc, nil
			}
			c.disconnected(cc) // lost meanwhile: wait for the next
			continue
		default:
		}
		if timeout == nil {
			t := time.NewTimer(away)
			defer t.Stop()
			timeout = t.C
		}
		select {
		case <-ready:
		case <-timeout:
			return nil, c.awayError(away)
		case <-ctx.Done():
			return nil, fmt.Errorf("broker: waiting for the broker to come back: %w", ctx.Err())
		}
	}
}

// awayError says the broker has been away for d.
func (c *Client) awayError(d time.Duration) error {
	why := ""
	if last := c.dialer.lastErr(); last != nil {
		why = " (" + last.Error() + ")"
	}
	return &plainError{fmt.Sprintf("broker: the broker on %s is away, and was not back in %v%s", c.dialer.path, d, why), []error{ErrUnavailable}}
}

// bounds are how long a call waits: for the broker's answer in all
// (wait), and for a broker that is away to come back (away).
type bounds struct{ wait, away time.Duration }

// callBounds are a call's bounds, but a Claim's.
func (c *Client) callBounds() bounds { return bounds{c.cfg.callTimeout, c.cfg.callTimeout} }

// call runs op on the connection once the client is ready, and again if
// the connection ended under it (its leases are rejoined on the next), a
// few times at most, within b: past it, the broker is not answering
// (ErrUnavailable).
func (c *Client) call(ctx context.Context, name string, b bounds, op func(context.Context, *clientConn) error) error {
	bctx, cancel := context.WithTimeout(ctx, b.wait)
	defer cancel()
	err := c.retry(bctx, b.away, op)
	if err != nil && ctx.Err() == nil && bctx.Err() != nil {
		why := ""
		if last := c.dialer.lastErr(); last != nil {
			why = " (" + last.Error() + ")"
		}
		return &plainError{fmt.Sprintf("broker: %s: no answer from the broker on %s in %v%s", name, c.dialer.path, b.wait, why), []error{ErrUnavailable}}
	}
	return err
}

func (c *Client) retry(ctx context.Context, away time.Duration, op func(context.Context, *clientConn) error) error {
	var err error
	for range 4 {
		cc, werr := c.waitReady(ctx, away)
		if werr != nil {
			if err != nil && !errors.Is(werr, ErrUnavailable) {
				break
			}
			return werr
		}
		if err = op(ctx, cc); err == nil {
			return nil
		}
		// A call the ended connection took with it, or that did not find
		// its lease there (rejoined on the next), is made again.
		if ctx.Err() != nil || !cc.lost() || !(errors.Is(err, ErrUnavailable) || errors.Is(err, ErrNotFound)) {
			return err
		}
	}
	return err
}

// connected reports whether the client has a session now.
func (c *Client) connected() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.hello != nil
}

// Devices are the broker's devices, as its greeting listed them.
func (c *Client) Devices() []DeviceInfo {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.hello == nil {
		return nil
	}
	var out []DeviceInfo
	for _, d := range c.hello.GetDevices() {
		out = append(out, DeviceInfo{Index: int(d.GetIndex()), Name: d.GetName(), ID: d.GetId(), Total: d.GetTotalBytes(), Context: d.GetContextBytes()})
	}
	return out
}

// Rejoins counts the times the client took its leases back to a new
// broker session (after a restart of the broker, or a broken connection).
func (c *Client) Rejoins() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.rejoins
}

// Status asks the broker for its status.
func (c *Client) Status(ctx context.Context) (Status, error) {
	var r *brokerpb.Reply
	err := c.call(ctx, "status", c.callBounds(), func(ctx context.Context, cc *clientConn) (err error) {
		r, err = cc.call(ctx, "status", statusRequest())
		if err == nil && r.GetStatus() == nil {
			err = unexpected("status", r)
		}
		return err
	})
	if err != nil {
		return Status{}, err
	}
	return statusFromPB(r.GetStatus()), nil
}

// Close releases every lease (the connection closes) and stops the
// client. A second Close returns nil.
func (c *Client) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	leases, cc := c.leases, c.conn
	c.leases = map[uint64]*Lease{}
	c.mu.Unlock()
	c.cancel()
	if cc != nil {
		cc.close()
	}
	<-c.done
	for _, l := range leases {
		l.lose(fmt.Errorf("%s: the client was closed: %w", l.String(), ErrReleased))
	}
	return nil
}
