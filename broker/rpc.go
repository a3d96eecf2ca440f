package broker

// The gRPC service: each handler finds its connection's session, runs the
// operation and turns its error into a status (errors.go). The Watch
// stream sends what afterChangeLocked marked dirty, outside the lock.

import (
	"context"

	"github.com/vramkit/vram/broker/brokerpb"
)

type rpcServer struct {
	brokerpb.UnimplementedBrokerServer
	s *Server
}

// session is the caller's session (every connection has one: conns.go),
// or the status that refuses its connection.
func (r *rpcServer) session(ctx context.Context) (*session, error) {
	sess := sessionOf(ctx)
	switch {
	case sess == nil:
		return nil, toStatus(errNoSession)
	case sess.refused != nil:
		return nil, toStatus(sess.refused)
	}
	return sess, nil
}

func (r *rpcServer) Acquire(ctx context.Context, req *brokerpb.AcquireRequest) (*brokerpb.LeaseState, error) {
	sess, err := r.session(ctx)
	if err != nil {
		return nil, err
	}
	st, err := r.s.acquire(sess, req)
	return st, toStatus(err)
}

func (r *rpcServer) Change(ctx context.Context, req *brokerpb.ChangeRequest) (*brokerpb.LeaseState, error) {
	sess, err := r.session(ctx)
	if err != nil {
		return nil, err
	}
	st, err := r.s.change(sess, req)
	return st, toStatus(err)
}

func (r *rpcServer) Claim(ctx context.Context, req *brokerpb.ClaimRequest) (*brokerpb.LeaseState, error) {
	sess, err := r.session(ctx)
	if err != nil {
		return nil, err
	}
	st, err := r.s.claim(ctx, sess, req)
	return st, toStatus(err)
}

func (r *rpcServer) Report(ctx context.Context, req *brokerpb.ReportRequest) (*brokerpb.LeaseState, error) {
	sess, err := r.session(ctx)
	if err != nil {
		return nil, err
	}
	st, err := r.s.report(sess, req)
	return st, toStatus(err)
}

func (r *rpcServer) Release(ctx context.Context, req *brokerpb.ReleaseRequest) (*brokerpb.ReleaseReply, error) {
	sess, err := r.session(ctx)
	if err != nil {
		return nil, err
	}
	if err := r.s.release(sess, req); err != nil {
		return nil, toStatus(err)
	}
	return &brokerpb.ReleaseReply{}, nil
}

func (r *rpcServer) Status(ctx context.Context, _ *brokerpb.StatusRequest) (*brokerpb.StatusReply, error) {
	if _, err := r.session(ctx); err != nil {
		return nil, err
	}
	return r.s.statusReply(), nil
}

// Watch sends a Hello, then each of the connection's leases whose state
// changed, until the client goes.
func (r *rpcServer) Watch(_ *brokerpb.WatchRequest, stream brokerpb.Broker_WatchServer) error {
	ctx := stream.Context()
	sess, err := r.session(ctx)
	if err != nil {
		return err
	}
	hello, err := r.s.startWatch(sess)
	if err != nil {
		return toStatus(err)
	}
	defer r.s.stopWatch(sess)
	if err := stream.Send(&brokerpb.Event{Kind: &brokerpb.Event_Hello{Hello: hello}}); err != nil {
		return err
	}
	for {
		select {
		case <-sess.wake:
		case <-ctx.Done():
			return nil
		}
		for _, st := range r.s.drain(sess) {
			if err := stream.Send(&brokerpb.Event{Kind: &brokerpb.Event_Lease{Lease: st}}); err != nil {
				return err
			}
		}
	}
}
