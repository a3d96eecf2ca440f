package broker

// A client's connection to the broker. Each call is written by its
// caller, one frame under the write lock, and waits for its reply, which
// one goroutine reads and hands over by the call's number; the watch's
// events (after its Hello, which its opener waits for as a reply) are
// given to the client by that goroutine as they come. A caller whose
// context ends stops waiting and has the broker cancel the call (a claim
// that waits); a connection that breaks fails every call waiting on it
// with ErrUnavailable.

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/vramkit/vram/broker/brokerpb"
)

// clientConn is one connection of a Client to the broker.
type clientConn struct {
	nc     net.Conn
	path   string                     // the socket, for errors
	events func(*brokerpb.LeaseState) // the watch's lease states
	exited chan struct{}              // the reading goroutine returned

	wmu sync.Mutex // protects w and the connection's writes
	w   frameWriter

	mu    sync.Mutex // protects the fields below
	calls map[uint64]chan *brokerpb.Reply
	next  uint64        // the last call's number
	watch uint64        // the watch's call, once opened
	err   error         // why the connection ended
	done  chan struct{} // closed when it ends
}

// newClientConn starts serving nc, a connection to the broker on path:
// it writes the preface and reads replies until the connection ends.
func newClientConn(nc net.Conn, path string, events func(*brokerpb.LeaseState)) *clientConn {
	cc := &clientConn{nc: nc, path: path, events: events, exited: make(chan struct{}), w: frameWriter{w: nc},
		calls: map[uint64]chan *brokerpb.Reply{}, done: make(chan struct{})}
	go cc.read()
	if _, err := nc.Write([]byte(preface)); err != nil {
		cc.fail(err)
	}
	return cc
}

// read hands each reply to its call, and the watch's events to the
// client, until the connection ends.
func (cc *clientConn) read() {
	defer close(cc.exited)
	fr := newFrameReader(cc.nc, maxReplyBytes)
	for {
		r := new(brokerpb.Reply)
		if err := fr.read(r); err != nil {
			cc.fail(err)
			return
		}
		cc.mu.Lock()
		ch := cc.calls[r.GetCall()]
		delete(cc.calls, r.GetCall())
		watch := r.GetCall() == cc.watch
		cc.mu.Unlock()
		switch st := r.GetEvent().GetLease(); {
		case ch != nil:
			ch <- r // room for one
		case watch && st != nil:
			cc.events(st)
		}
	}
}

// fail ends the connection with err, once.
func (cc *clientConn) fail(err error) {
	cc.mu.Lock()
	if cc.err == nil {
		cc.err = err
		close(cc.done)
	}
	cc.mu.Unlock()
	_ = cc.nc.Close()
}

// close ends the connection and waits for its reading goroutine.
func (cc *clientConn) close() {
	cc.fail(ErrClosed)
	<-cc.exited
}

// lost reports whether the connection has ended.
func (cc *clientConn) lost() bool {
	select {
	case <-cc.done:
		return true
	default:
		return false
	}
}

// call makes the call req under ctx, whose deadline the broker learns,
// and returns its reply: an Error reply is the error it carries.
func (cc *clientConn) call(ctx context.Context, op string, req *brokerpb.Request) (*brokerpb.Reply, error) {
	return cc.callAs(ctx, op, req, false)
}

// callAs is call; with watch, req opens the watch, and the replies after
// its first are events.
func (cc *clientConn) callAs(ctx context.Context, op string, req *brokerpb.Request, watch bool) (*brokerpb.Reply, error) {
	ch := make(chan *brokerpb.Reply, 1)
	cc.mu.Lock()
	if cc.err != nil {
		cc.mu.Unlock()
		return nil, cc.lostError(op)
	}
	cc.next++
	req.Call = cc.next
	cc.calls[req.Call] = ch
	if watch {
		cc.watch = req.Call
	}
	cc.mu.Unlock()
	if d, ok := ctx.Deadline(); ok {
		req.TimeoutNanos = max(1, int64(time.Until(d)))
	}
	if err := cc.send(req); err != nil {
		// The broker is gone (a write to a closed socket, before the
		// reader saw the end): the connection ended, as a read would say.
		cc.mu.Lock()
		delete(cc.calls, req.Call)
		cc.mu.Unlock()
		return nil, cc.lostError(op)
	}
	select {
	case r := <-ch:
		return replyOf(r)
	case <-ctx.Done():
		cc.mu.Lock()
		delete(cc.calls, req.Call)
		cc.mu.Unlock()
		_ = cc.send(&brokerpb.Request{Call: req.Call, Body: &brokerpb.Request_Cancel{Cancel: &brokerpb.CancelRequest{}}})
		return nil, fmt.Errorf("broker: %s: %w", op, ctx.Err())
	case <-cc.done:
		select {
		case r := <-ch: // answered as the connection ended
			return replyOf(r)
		default:
			return nil, cc.lostError(op)
		}
	}
}

// replyOf is r, or the error it carries.
func replyOf(r *brokerpb.Reply) (*brokerpb.Reply, error) {
	if e := r.GetError(); e != nil {
		return nil, fromWire(e)
	}
	return r, nil
}

// send writes req; a write that fails ends the connection.
func (cc *clientConn) send(req *brokerpb.Request) error {
	cc.wmu.Lock()
	err := cc.w.write(req)
	cc.wmu.Unlock()
	if err != nil {
		cc.fail(err)
	}
	return err
}

// lostError is the error of a call op on the connection that ended.
func (cc *clientConn) lostError(op string) error {
	cc.mu.Lock()
	why := cc.err
	cc.mu.Unlock()
	return &plainError{fmt.Sprintf("broker: %s: the connection to the broker on %s ended: %v", op, cc.path, why), []error{ErrUnavailable, errConnEnded}}
}

// errConnEnded marks the error of a call whose connection ended.
var errConnEnded = errors.New("broker: the connection ended")

// lease makes a call answered with a lease's state.
func (cc *clientConn) lease(ctx context.Context, op string, req *brokerpb.Request) (*brokerpb.LeaseState, error) {
	r, err := cc.call(ctx, op, req)
	if err != nil {
		return nil, err
	}
	if st := r.GetLease(); st != nil {
		return st, nil
	}
	return nil, unexpected(op, r)
}

// unexpected is the error of a reply to op of the wrong kind.
func unexpected(op string, r *brokerpb.Reply) error {
	return errorf(ErrInvalid, "broker: %s: the broker answered with a %T: not a vram broker of this version", op, r.GetBody())
}

// openWatch opens the connection's watch and returns the broker's Hello.
func (cc *clientConn) openWatch(ctx context.Context) (*brokerpb.Hello, error) {
	r, err := cc.callAs(ctx, "watch", &brokerpb.Request{Body: &brokerpb.Request_Watch{Watch: &brokerpb.WatchRequest{}}}, true)
	if err != nil {
		return nil, err
	}
	h := r.GetEvent().GetHello()
	if h == nil {
		return nil, unexpected("watch", r)
	}
	return h, nil
}

// acquireRequest and the others wrap a call's message in a Request.
func acquireRequest(r *brokerpb.AcquireRequest) *brokerpb.Request {
	return &brokerpb.Request{Body: &brokerpb.Request_Acquire{Acquire: r}}
}

func claimRequest(r *brokerpb.ClaimRequest) *brokerpb.Request {
	return &brokerpb.Request{Body: &brokerpb.Request_Claim{Claim: r}}
}

func reportRequest(r *brokerpb.ReportRequest) *brokerpb.Request {
	return &brokerpb.Request{Body: &brokerpb.Request_Report{Report: r}}
}

func changeRequest(r *brokerpb.ChangeRequest) *brokerpb.Request {
	return &brokerpb.Request{Body: &brokerpb.Request_Change{Change: r}}
}

func releaseRequest(r *brokerpb.ReleaseRequest) *brokerpb.Request {
	return &brokerpb.Request{Body: &brokerpb.Request_Release{Release: r}}
}

func statusRequest() *brokerpb.Request {
	return &brokerpb.Request{Body: &brokerpb.Request_Status{Status: &brokerpb.StatusRequest{}}}
}
