package broker

// Serving connections. Each admitted connection (conns.go) is served by
// one goroutine that reads its requests in order and answers every call
// that does not wait in that goroutine: a call is a read, its operation
// under mu, and a write, with no other goroutine woken between them. A
// call that waits (a claim whose memory is lent out) waits in a
// goroutine of its own, and the watch sends its events from another
// (watch.go). Replies and events share the connection's writer, under its
// write lock, never under mu.
//
// A connection ends when its client closes it, sends what the protocol
// does not allow (brokerpb/broker.proto: a wrong preface, a frame too
// long or that does not decode, call 0), does not send its preface
// within Config.HandshakeTimeout, or has no call waiting and sends none
// for Config.IdleTimeout; or when the server stops. Its session ends with
// it (conns.go), and with it every lease it held.
//
// Locking: served.mu (the server's connections) and serverConn.mu (a
// connection's waiting calls) are never held with Server.mu or with each
// other; serverConn.wmu is held only to write.

import (
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vramkit/vram/broker/brokerpb"
)

// maxWaitingPerConn bounds the calls one connection has waiting: its
// watch and its claims.
const maxWaitingPerConn = 128

// served is what a Server serves: its listeners and connections, which
// Stop closes, and their goroutines, which Stop waits for.
type served struct {
	wg sync.WaitGroup // every goroutine of a connection

	mu      sync.Mutex // protects the fields below
	stopped bool
	lns     map[net.Listener]struct{}
	conns   map[*serverConn]struct{}
}

// serverConn is one connection served.
type serverConn struct {
	s      *Server
	conn   *admittedConn
	sess   *session
	ctx    context.Context // ends with the connection
	cancel context.CancelFunc
	calls  atomic.Uint64 // requests read, for the idle check

	wmu sync.Mutex // protects w and the connection's writes
	w   frameWriter

	mu      sync.Mutex                    // protects waiting
	waiting map[uint64]context.CancelFunc // the calls that wait, by number
}

// Serve serves ln (a Unix socket, from Listen) until Stop. It returns nil
// after Stop.
func (s *Server) Serve(ln net.Listener) error {
	if !s.net.add(ln) {
		_ = ln.Close()
		return nil
	}
	var delay time.Duration
	for {
		c, err := s.admit.accept(ln)
		if err != nil {
			if s.net.isStopped() {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Temporary() { // out of files or buffers: wait, as net/http does
				delay = min(max(2*delay, 5*time.Millisecond), time.Second)
				time.Sleep(delay)
				continue
			}
			return err
		}
		delay = 0
		ctx, cancel := context.WithCancel(context.Background())
		sc := &serverConn{s: s, conn: c, sess: c.cred.sess, ctx: ctx, cancel: cancel, w: frameWriter{w: c},
			waiting: map[uint64]context.CancelFunc{}}
		if !s.net.serve(sc) {
			sc.close()
		}
	}
}

// add takes ln, unless the server has stopped.
func (n *served) add(ln net.Listener) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.stopped {
		return false
	}
	n.lns[ln] = struct{}{}
	return true
}

func (n *served) isStopped() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.stopped
}

// serve serves sc in a goroutine, unless the server has stopped.
func (n *served) serve(sc *serverConn) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.stopped {
		return false
	}
	n.conns[sc] = struct{}{}
	n.wg.Add(1)
	go func() {
		defer n.wg.Done()
		sc.serve()
		n.mu.Lock()
		delete(n.conns, sc)
		n.mu.Unlock()
	}()
	return true
}

// stop closes every listener and connection and waits for their
// goroutines.
func (n *served) stop() {
	n.mu.Lock()
	n.stopped = true
	lns, conns := n.lns, n.conns
	n.lns, n.conns = map[net.Listener]struct{}{}, map[*serverConn]struct{}{}
	n.mu.Unlock()
	for ln := range lns {
		_ = ln.Close()
	}
	for sc := range conns {
		sc.close()
	}
	n.wg.Wait()
}

// spawn runs f in a goroutine of the connection, which Stop waits for.
// Only a goroutine of the connection calls it (so that the count is not
// 0 while Stop waits).
func (sc *serverConn) spawn(f func()) {
	sc.s.net.wg.Add(1)
	go func() {
		defer sc.s.net.wg.Done()
		f()
	}()
}

// close ends the connection: its waiting calls, its session.
func (sc *serverConn) close() {
	sc.cancel()
	_ = sc.conn.Close()
}

// serve reads and answers the connection's requests until it ends.
func (sc *serverConn) serve() {
	defer sc.close()
	if err := sc.readPreface(); err != nil {
		sc.s.log.Warn("vram broker: connection closed", "pid", sc.sess.pid, "uid", sc.sess.uid, "why", err)
		return
	}
	stopIdle := sc.closeWhenIdle()
	defer stopIdle()
	fr := newFrameReader(sc.conn, maxMessageBytes)
	var req brokerpb.Request
	for {
		if err := fr.read(&req); err != nil {
			if !errors.Is(err, io.EOF) && sc.ctx.Err() == nil {
				sc.s.log.Warn("vram broker: connection closed", "pid", sc.sess.pid, "uid", sc.sess.uid, "why", err)
			}
			return
		}
		sc.calls.Add(1)
		if req.GetCall() == 0 {
			sc.s.log.Warn("vram broker: connection closed", "pid", sc.sess.pid, "uid", sc.sess.uid, "why", "a request of call 0")
			return
		}
		sc.handle(&req)
	}
}

// readPreface reads the client's preface, within the handshake timeout.
func (sc *serverConn) readPreface() error {
	var b [len(preface)]byte
	_ = sc.conn.SetReadDeadline(time.Now().Add(sc.s.cfg.HandshakeTimeout))
	if _, err := io.ReadFull(sc.conn, b[:]); err != nil {
		return errorf(ErrInvalid, "no preface in %v: %v", sc.s.cfg.HandshakeTimeout, unexpectedEOF(err))
	}
	switch got := string(b[:]); {
	case got == preface:
	case got == http2Preface:
		return errorf(ErrInvalid, "the client speaks gRPC: a vram from before the broker's protocol %q; upgrade the client", preface[:len(preface)-1])
	default:
		return errorf(ErrInvalid, "the preface %q is not %q: not a vram broker client", got, preface)
	}
	return sc.conn.SetReadDeadline(time.Time{})
}

// closeWhenIdle closes the connection once it has had no call waiting,
// and sent no request, for the idle timeout (between one and two times
// it, checked each time it passes).
func (sc *serverConn) closeWhenIdle() (stop func()) {
	idle := sc.s.cfg.IdleTimeout
	var mu sync.Mutex // protects the fields below
	seen := ^uint64(0)
	var t *time.Timer
	mu.Lock()
	defer mu.Unlock()
	t = time.AfterFunc(idle, func() {
		mu.Lock()
		defer mu.Unlock()
		n := sc.calls.Load()
		switch {
		case sc.ctx.Err() != nil:
		case n == seen && sc.waitingCalls() == 0:
			sc.s.log.Debug("vram broker: an idle connection closed", "pid", sc.sess.pid, "uid", sc.sess.uid, "idle", idle)
			sc.close()
		default:
			seen = n
			t.Reset(idle)
		}
	})
	return func() { t.Stop() }
}

// handle answers req: at once, or from a goroutine for a call that waits.
func (sc *serverConn) handle(req *brokerpb.Request) {
	call, s, sess := req.GetCall(), sc.s, sc.sess
	if _, ok := req.GetBody().(*brokerpb.Request_Cancel); ok {
		sc.cancelCall(call)
		return
	}
	if err := sess.refused; err != nil {
		sc.replyError(call, err)
		return
	}
	switch b := req.GetBody().(type) {
	case *brokerpb.Request_Acquire:
		st, err := s.acquire(sess, b.Acquire)
		sc.replyLease(call, st, err)
	case *brokerpb.Request_Release:
		if err := s.release(sess, b.Release); err != nil {
			sc.replyError(call, err)
			return
		}
		sc.send(&brokerpb.Reply{Call: call, Body: &brokerpb.Reply_Released{Released: &brokerpb.ReleaseReply{}}})
	case *brokerpb.Request_Report:
		st, err := s.report(sess, b.Report)
		sc.replyLease(call, st, err)
	case *brokerpb.Request_Change:
		st, err := s.change(sess, b.Change)
		sc.replyLease(call, st, err)
	case *brokerpb.Request_Claim:
		sc.claim(call, time.Duration(req.GetTimeoutNanos()), b.Claim)
	case *brokerpb.Request_Status:
		sc.send(&brokerpb.Reply{Call: call, Body: &brokerpb.Reply_Status{Status: s.statusReply()}})
	case *brokerpb.Request_Watch:
		sc.watch(call)
	default:
		sc.replyError(call, errorf(ErrInvalid, "call %d: a request the broker does not know (from a client newer than the broker?)", call))
	}
}

// claim answers a claim at once when it can, else from a goroutine once
// its memory is there, under the call's timeout.
func (sc *serverConn) claim(call uint64, timeout time.Duration, req *brokerpb.ClaimRequest) {
	if err := sc.canWait(call); err != nil {
		sc.replyError(call, err)
		return
	}
	st, c, err := sc.s.startClaim(sc.sess, req)
	if c == nil {
		sc.replyLease(call, st, err)
		return
	}
	ctx, end := sc.startWait(call, timeout)
	sc.spawn(func() {
		defer end()
		st, err := sc.s.awaitClaim(ctx, c)
		sc.replyLease(call, st, err)
	})
}

// canWait refuses a call that would wait past the connection's bound, or
// under the number of one that waits. Only the reading goroutine adds
// waiting calls, so what it finds holds until it adds one.
func (sc *serverConn) canWait(call uint64) error {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	if _, ok := sc.waiting[call]; ok {
		return errorf(ErrInvalid, "call %d: the number of a call that waits; number each call anew", call)
	}
	if len(sc.waiting) >= maxWaitingPerConn {
		return errorf(ErrLimit, "call %d: the connection has %d calls waiting, its limit", call, len(sc.waiting))
	}
	return nil
}

// startWait registers call as waiting, under the connection's context
// and timeout (0: none), until end.
func (sc *serverConn) startWait(call uint64, timeout time.Duration) (ctx context.Context, end func()) {
	ctx, cancel := context.WithCancel(sc.ctx)
	if timeout > 0 {
		ctx, cancel = context.WithTimeout(sc.ctx, timeout)
	}
	sc.mu.Lock()
	sc.waiting[call] = cancel
	sc.mu.Unlock()
	return ctx, func() {
		sc.mu.Lock()
		delete(sc.waiting, call)
		sc.mu.Unlock()
		cancel()
	}
}

// cancelCall ends the wait of call, if it waits.
func (sc *serverConn) cancelCall(call uint64) {
	sc.mu.Lock()
	cancel := sc.waiting[call]
	sc.mu.Unlock()
	if cancel != nil {
		cancel()
	}
}

func (sc *serverConn) waitingCalls() int {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	return len(sc.waiting)
}

// send writes r; a write that fails ends the connection. It reports
// whether r was written.
func (sc *serverConn) send(r *brokerpb.Reply) bool {
	sc.wmu.Lock()
	err := sc.w.write(r)
	sc.wmu.Unlock()
	if err != nil {
		sc.close()
	}
	return err == nil
}

func (sc *serverConn) replyLease(call uint64, st *brokerpb.LeaseState, err error) {
	if err != nil {
		sc.replyError(call, err)
		return
	}
	sc.send(&brokerpb.Reply{Call: call, Body: &brokerpb.Reply_Lease{Lease: st}})
}

func (sc *serverConn) replyError(call uint64, err error) {
	sc.send(&brokerpb.Reply{Call: call, Body: &brokerpb.Reply_Error{Error: toWire(err)}})
}
