package broker

// The client: one connection to the broker, its Watch stream, and the
// leases held through it.
//
// A Client keeps its connection. When the broker goes away (it stopped,
// or was killed and restarted) gRPC redials with backoff, the Watch
// stream is opened again, and once the broker greets a new session every
// lease is acquired again with rejoin set, its id, what it holds and its
// limit, so that the new table matches what the process holds and no
// lease is counted twice. A lease the broker refuses to take back (the
// shares no longer fit) is lost: its Err says why and its budget is 0.
// Calls made meanwhile wait, under their context, until the leases are
// back.

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
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
	log        *slog.Logger
	minBackoff time.Duration
	maxBackoff time.Duration
}

// WithLogger sets where the client logs lost leases and reconnections
// (default slog.Default()).
func WithLogger(l *slog.Logger) DialOption { return func(c *dialConfig) { c.log = l } }

// WithBackoff sets the delays between attempts to reach a broker that
// went away: from min, growing to max (default 50ms to 2s).
func WithBackoff(min, max time.Duration) DialOption {
	return func(c *dialConfig) { c.minBackoff, c.maxBackoff = min, max }
}

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
	cancel context.CancelFunc
	done   chan struct{} // the watch loop returned

	mu       sync.Mutex // protects the fields below
	leases   map[uint64]*Lease
	hello    *brokerpb.Hello // the current session's greeting; nil while disconnected
	ready    chan struct{}   // closed while connected with every lease rejoined
	down     chan struct{}   // closed when that connection is lost
	session  uint64          // the last session greeted, and its broker's instance
	instance uint64
	closed   bool
	rejoins  int // sessions rejoined after the first
}

// Dial connects to the broker at socket and waits, under ctx, for its
// greeting. Leases acquired through the client end when it is closed, or
// when the process exits.
func Dial(ctx context.Context, socket string, opts ...DialOption) (*Client, error) {
	cfg := dialConfig{log: slog.Default(), minBackoff: 50 * time.Millisecond, maxBackoff: 2 * time.Second}
	for _, o := range opts {
		o(&cfg)
	}
	dialer := func(ctx context.Context, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", socket)
	}
	conn, err := grpc.NewClient("passthrough:///vram-broker",
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(dialer),
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: cfg.minBackoff, Multiplier: 1.6, Jitter: 0.2, MaxDelay: cfg.maxBackoff},
			MinConnectTimeout: time.Second,
		}),
		// Calls wait for a broker that restarts (under their contexts);
		// Dial's first Watch does not.
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(4<<20), grpc.WaitForReady(true)),
	)
	if err != nil {
		return nil, fmt.Errorf("broker: dial %s: %w", socket, err)
	}
	runCtx, cancel := context.WithCancel(context.Background())
	c := &Client{conn: conn, api: brokerpb.NewBrokerClient(conn), log: cfg.log, cfg: cfg, cancel: cancel,
		done: make(chan struct{}), leases: map[uint64]*Lease{}, ready: make(chan struct{}), down: make(chan struct{})}
	stream, hello, err := c.openWatch(ctx, false)
	if err != nil {
		cancel()
		_ = conn.Close()
		return nil, fmt.Errorf("broker: dial %s: %w", socket, err)
	}
	c.mu.Lock()
	c.hello = hello
	c.session, c.instance = hello.GetSession(), hello.GetBroker()
	close(c.ready)
	c.mu.Unlock()
	go c.watch(runCtx, stream)
	return c, nil
}

// openWatch opens the Watch stream and reads its Hello. wait makes it
// wait for the connection to come back (after the first dial).
func (c *Client) openWatch(ctx context.Context, wait bool) (brokerpb.Broker_WatchClient, *brokerpb.Hello, error) {
	sctx, cancel := context.WithCancel(ctx)
	stream, err := c.api.Watch(sctx, &brokerpb.WatchRequest{}, grpc.WaitForReady(wait))
	if err != nil {
		cancel()
		return nil, nil, fromStatus(ctx, "watch", err)
	}
	ev, err := stream.Recv()
	if err != nil {
		cancel()
		return nil, nil, fromStatus(ctx, "watch", err)
	}
	h := ev.GetHello()
	if h == nil {
		cancel()
		return nil, nil, fmt.Errorf("broker: watch: the first event is not a hello: %w", ErrInvalid)
	}
	context.AfterFunc(ctx, cancel)
	return stream, h, nil
}

// watch reads events until the client is closed, reconnecting and
// rejoining when the stream breaks.
func (c *Client) watch(ctx context.Context, stream brokerpb.Broker_WatchClient) {
	defer close(c.done)
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
			s, hello, err := c.openWatch(ctx, true)
			if err == nil {
				stream = s
				c.reconnected(ctx, hello)
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
// (the old one's leases ended with it), then lets calls through.
func (c *Client) reconnected(ctx context.Context, hello *brokerpb.Hello) {
	c.mu.Lock()
	if hello.GetSession() == c.session && hello.GetBroker() == c.instance {
		// Only the stream broke: the session, and its leases, live on.
		c.hello = hello
		c.down = make(chan struct{})
		close(c.ready)
		c.mu.Unlock()
		return
	}
	leases := make([]*Lease, 0, len(c.leases))
	for _, l := range c.leases {
		leases = append(leases, l)
	}
	c.mu.Unlock()
	slices.SortFunc(leases, func(a, b *Lease) int { return cmp.Compare(a.id, b.id) })
	for _, l := range leases {
		req := l.rejoinRequest()
		st, err := c.api.Acquire(ctx, req)
		if err != nil {
			err = fromStatus(ctx, "rejoin", err)
			c.log.Warn("vram broker: a lease was not taken back after reconnecting", "lease", leaseID(l.id), "name", l.opts.Name, "err", err)
			l.lose(err)
			c.forget(l)
			continue
		}
		l.apply(st)
	}
	c.mu.Lock()
	c.hello = hello
	c.session, c.instance = hello.GetSession(), hello.GetBroker()
	c.rejoins++
	c.down = make(chan struct{})
	close(c.ready)
	c.mu.Unlock()
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
// and returns the channel closed when that connection is lost.
func (c *Client) waitReady(ctx context.Context) (<-chan struct{}, error) {
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
		case <-ctx.Done():
			return nil, fmt.Errorf("broker: waiting for the broker to come back: %w", ctx.Err())
		}
	}
}

// call runs op once the client is ready, and again if the connection
// broke under it (its leases are rejoined meanwhile), a few times at
// most.
func (c *Client) call(ctx context.Context, name string, op func() error) error {
	var err error
	for range 4 {
		down, werr := c.waitReady(ctx)
		if werr != nil {
			if err != nil {
				break
			}
			return werr
		}
		if err = op(); err == nil {
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
	err := c.call(ctx, "status", func() (err error) {
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
