package broker

// The client: one connection to the broker, its Watch stream, and the
// leases held through it.
//
// A Client keeps its connection. When the broker goes away (it stopped,
// or was killed and restarted) gRPC redials with backoff (dial.go), the
// Watch stream is opened again, and once the broker greets a new session
// every lease is acquired again with rejoin set: its id, its token, what
// it holds, its limit and the broker instance it was held on
// (rejoin.go), so that the new table matches what the process holds and
// no lease is counted twice. A lease the broker does not take back is
// lost: its Err says why and its budget is 0.
//
// Calls made meanwhile wait, under their context, until the leases are
// back, and no longer than the client's call timeout (a Claim: the
// broker's reclaim deadline and the call timeout), so that a broker that
// stops answering fails calls with ErrUnavailable rather than hang them.
// The Watch stream lives as long as the client, whatever the context
// given to Dial.

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

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
	conn   *grpc.ClientConn
	api    brokerpb.BrokerClient
	log    *slog.Logger
	cfg    dialConfig
	dialer *dialer
	runCtx context.Context // lives until Close: the Watch stream's
	cancel context.CancelFunc
	done   chan struct{} // the watch loop returned

	mu         sync.Mutex // protects the fields below
	leases     map[uint64]*Lease
	hello      *brokerpb.Hello // the current session's greeting; nil while disconnected
	ready      chan struct{}   // closed while connected with every lease rejoined
	down       chan struct{}   // closed when that connection is lost
	session    uint64          // the last session greeted, and its broker's instance
	instance   uint64
	reclaim    time.Duration      // the broker's reclaim deadline, from its greeting
	stopStream context.CancelFunc // ends the current Watch stream
	closed     bool
	rejoins    int // sessions rejoined after the first
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
	d := &dialer{path: socket}
	conn, err := grpc.NewClient("passthrough:///vram-broker",
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(d.dial),
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff: backoff.Config{BaseDelay: cfg.minBackoff, Multiplier: 1.6, Jitter: 0.2, MaxDelay: cfg.maxBackoff},
			// A busy broker answers a new connection late: a handshake
			// cut short would only be tried again.
			MinConnectTimeout: DefaultHandshakeTimeout,
		}),
		// Calls wait for a broker that restarts (under their contexts).
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(4<<20), grpc.WaitForReady(true)),
		// Static windows: no BDP pings (server.go).
		grpc.WithStaticStreamWindowSize(64<<10),
		grpc.WithStaticConnWindowSize(1<<20),
	)
	if err != nil {
		return nil, fmt.Errorf("broker: dial %s: %w", socket, err)
	}
	runCtx, cancel := context.WithCancel(context.Background())
	c := &Client{conn: conn, api: brokerpb.NewBrokerClient(conn), log: cfg.log, cfg: cfg, dialer: d, runCtx: runCtx, cancel: cancel,
		done: make(chan struct{}), leases: map[uint64]*Lease{}, ready: make(chan struct{}), down: make(chan struct{})}
	stream, hello, err := c.firstWatch(ctx, socket)
	if err != nil {
		cancel()
		_ = conn.Close()
		return nil, err
	}
	c.mu.Lock()
	c.greetedLocked(hello)
	close(c.ready)
	c.mu.Unlock()
	go c.watch(stream)
	return c, nil
}

// firstWatch opens the first Watch stream, waiting under ctx for the
// greeting while the broker is busy, and ending the wait at once at a
// dial error no retry mends.
func (c *Client) firstWatch(ctx context.Context, socket string) (brokerpb.Broker_WatchClient, *brokerpb.Hello, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, defaultDialTimeout)
		defer cancel()
	}
	wctx, stop := context.WithCancelCause(ctx)
	defer stop(nil)
	c.dialer.setStop(stop)
	defer c.dialer.setStop(nil)
	stream, hello, err := c.openWatch(wctx)
	switch cause := context.Cause(wctx); {
	case err == nil:
		return stream, hello, nil
	case wctx.Err() != nil && ctx.Err() == nil && cause != nil:
		return nil, nil, cause // a dial error: it says it all
	case ctx.Err() != nil && !errors.Is(err, ErrLimit):
		last := "it accepted connections but sent no greeting: at its limit of connections, or not a vram broker (see its log)"
		if de := c.dialer.lastErr(); de != nil {
			last = de.Error()
		}
		return nil, nil, &plainError{fmt.Sprintf("broker: no greeting from %s: %v (%s)", socket, ctx.Err(), last), []error{ErrUnavailable, ctx.Err()}}
	}
	return nil, nil, fmt.Errorf("broker: dial %s: %w", socket, err)
}

// openWatch opens a Watch stream, which lives until the client closes,
// and reads its Hello, waiting no longer than wait allows.
func (c *Client) openWatch(wait context.Context) (brokerpb.Broker_WatchClient, *brokerpb.Hello, error) {
	sctx, cancel := context.WithCancel(c.runCtx)
	unbind := context.AfterFunc(wait, cancel)
	fail := func(err error) (brokerpb.Broker_WatchClient, *brokerpb.Hello, error) {
		unbind()
		cancel()
		return nil, nil, fromStatus(wait, "watch", err)
	}
	stream, err := c.api.Watch(sctx, &brokerpb.WatchRequest{})
	if err != nil {
		return fail(err)
	}
	ev, err := stream.Recv()
	if err != nil {
		return fail(err)
	}
	h := ev.GetHello()
	if h == nil {
		return fail(fmt.Errorf("broker: watch: the first event is not a hello: %w", ErrInvalid))
	}
	if !unbind() {
		return fail(wait.Err()) // the wait ended as the hello came
	}
	c.streamCancel(cancel)
	return stream, h, nil
}

// streamCancel keeps the cancel of the current Watch stream, calling the
// one before.
func (c *Client) streamCancel(cancel context.CancelFunc) {
	c.mu.Lock()
	prev := c.stopStream
	c.stopStream = cancel
	c.mu.Unlock()
	if prev != nil {
		prev()
	}
}

// greetedLocked takes hello as the session's. c.mu must be held.
func (c *Client) greetedLocked(hello *brokerpb.Hello) {
	c.hello = hello
	c.session, c.instance = hello.GetSession(), hello.GetBroker()
	c.reclaim = time.Duration(hello.GetReclaimTimeoutNanos())
}

// watch reads events until the client is closed, reconnecting and
// rejoining when the stream breaks.
func (c *Client) watch(stream brokerpb.Broker_WatchClient) {
	defer close(c.done)
	ctx := c.runCtx
	delay := c.cfg.minBackoff
	for {
		for {
			ev, err := stream.Recv()
			if err != nil {
				break
			}
			if st := ev.GetLease(); st != nil {
				c.apply(st)
			}
		}
		if ctx.Err() != nil {
			return
		}
		c.disconnected()
		for {
			s, hello, err := c.openWatch(ctx)
			if err == nil {
				stream = s
				c.reconnected(hello)
				delay = c.cfg.minBackoff
				break
			}
			if ctx.Err() != nil {
				return
			}
			c.log.Debug("vram broker: watch", "err", err, "retry in", delay)
			select {
			case <-time.After(delay):
			case <-ctx.Done():
				return
			}
			delay = min(2*delay, c.cfg.maxBackoff)
		}
	}
}

// disconnected marks the client as waiting for the broker.
func (c *Client) disconnected() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.hello != nil {
		c.hello = nil
		c.ready = make(chan struct{})
		close(c.down)
	}
}

// reconnected rejoins every lease when the broker greets a new session
// (the old one's leases ended with it), then lets calls through. A lease
// released while it was rejoined is released again on the new session.
func (c *Client) reconnected(hello *brokerpb.Hello) {
	c.mu.Lock()
	if hello.GetSession() == c.session && hello.GetBroker() == c.instance {
		// Only the stream broke: the session, and its leases, live on.
		c.hello = hello
		c.down = make(chan struct{})
		close(c.ready)
		c.mu.Unlock()
		return
	}
	prev := c.instance
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
		held, err := c.rejoin(l, prev)
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
	c.down = make(chan struct{})
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
		_ = c.releaseOnce(l)
	}
	c.retell(told)
}

// rejoin takes l back on the new session: it was held on broker instance
// prev. It returns what it said l holds.
func (c *Client) rejoin(l *Lease, prev uint64) (uint64, error) {
	ctx, cancel := context.WithTimeout(c.runCtx, c.cfg.callTimeout)
	defer cancel()
	req := l.rejoinRequest(prev)
	st, err := c.api.Acquire(ctx, req)
	if err != nil {
		return 0, fromStatus(ctx, "rejoin", err)
	}
	l.takeToken(st)
	l.apply(st)
	return req.GetHeldBytes(), nil
}

// retell reports what a lease holds again where a Report made while the
// broker was away changed it after its rejoin said otherwise.
func (c *Client) retell(told map[*Lease]uint64) {
	for l, held := range told {
		l.mu.Lock()
		now := l.held
		l.mu.Unlock()
		if now != held {
			ctx, cancel := context.WithTimeout(c.runCtx, c.cfg.callTimeout)
			if st, err := c.api.Report(ctx, &brokerpb.ReportRequest{LeaseId: l.id, HeldBytes: now}); err == nil {
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
// for no longer than away, and returns the channel closed when that
// connection is lost.
func (c *Client) waitReady(ctx context.Context, away time.Duration) (<-chan struct{}, error) {
	var timeout <-chan time.Time
	for {
		c.mu.Lock()
		ready, down, closed := c.ready, c.down, c.closed
		c.mu.Unlock()
		if closed {
			return nil, ErrClosed
		}
		select {
		case <-ready:
			select {
			case <-down: // lost again meanwhile
				continue
			default:
				return down, nil
			}
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

// call runs op once the client is ready, and again if the connection
// broke under it (its leases are rejoined meanwhile), a few times at
// most, within b: past it, the broker is not answering (ErrUnavailable).
func (c *Client) call(ctx context.Context, name string, b bounds, op func(context.Context) error) error {
	bctx, cancel := context.WithTimeout(ctx, b.wait)
	defer cancel()
	err := c.retry(bctx, name, b.away, op)
	if err != nil && ctx.Err() == nil && bctx.Err() != nil {
		why := ""
		if last := c.dialer.lastErr(); last != nil {
			why = " (" + last.Error() + ")"
		}
		return &plainError{fmt.Sprintf("broker: %s: no answer from the broker on %s in %v%s", name, c.dialer.path, b.wait, why), []error{ErrUnavailable}}
	}
	return err
}

func (c *Client) retry(ctx context.Context, name string, away time.Duration, op func(context.Context) error) error {
	var err error
	for range 4 {
		down, werr := c.waitReady(ctx, away)
		if werr != nil {
			if err != nil && !errors.Is(werr, ErrUnavailable) {
				break
			}
			return werr
		}
		if err = op(ctx); err == nil {
			return nil
		}
		lost := false
		select {
		case <-down:
			lost = true
		default:
		}
		switch code := status.Code(err); {
		case ctx.Err() != nil:
			return fromStatus(ctx, name, err)
		case code == codes.Unavailable && !lost:
			// The watch loop has yet to see the connection go.
			select {
			case <-down:
			case <-time.After(time.Second):
			case <-ctx.Done():
			}
		case code == codes.NotFound && lost: // the lease is rejoined on the new session
		case code != codes.Unavailable:
			return fromStatus(ctx, name, err)
		}
	}
	return fromStatus(ctx, name, err)
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
	var r *brokerpb.StatusReply
	err := c.call(ctx, "status", c.callBounds(), func(ctx context.Context) (err error) {
		r, err = c.api.Status(ctx, &brokerpb.StatusRequest{})
		return err
	})
	if err != nil {
		return Status{}, err
	}
	return statusFromPB(r), nil
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
	leases := c.leases
	c.leases = map[uint64]*Lease{}
	c.mu.Unlock()
	c.cancel()
	err := c.conn.Close()
	<-c.done
	for _, l := range leases {
		l.lose(fmt.Errorf("%s: the client was closed: %w", l.String(), ErrReleased))
	}
	if err != nil && !errors.Is(err, context.Canceled) {
		return fmt.Errorf("broker: close: %w", err)
	}
	return nil
}
