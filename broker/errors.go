package broker

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/vramkit/vram/internal/share"
)

// Sentinel errors. The broker's refusals wrap one of these with the
// figures that explain them; over the socket each travels as a gRPC
// status carrying its reason, and the client's errors wrap the same
// sentinel again, so errors.Is works on both sides.
var (
	// ErrProportion: the share rules refuse the proportion (a manual
	// total over 1, an auto pool under 5%). It is vram.ErrProportion.
	ErrProportion = share.ErrProportion
	// ErrInvalid: a request with a bad field (a size past the device, a
	// proportion out of range, a name too long); the message names it.
	ErrInvalid = errors.New("broker: invalid request")
	// ErrNotFound: no lease of that id, or no device of that index.
	ErrNotFound = errors.New("broker: no such lease or device")
	// ErrPermission: a lease changed or released through a connection
	// other than the one that acquired it (root's included), a rejoin
	// without the lease's token, or a socket, directory or key file
	// another user could swap.
	ErrPermission = errors.New("broker: not permitted")
	// ErrLimit: a limit of the broker reached (connections or leases of
	// a uid, leases per connection, leases in all, one watch stream per
	// connection).
	ErrLimit = errors.New("broker: limit reached")
	// ErrReclaimTimeout: a claim whose memory the borrowers did not give
	// back by the deadline; the message names them and what they hold.
	ErrReclaimTimeout = errors.New("broker: borrowers did not give memory back in time")
	// ErrReleased: the lease ended (released, its connection closed, the
	// broker stopped) while a call on it waited.
	ErrReleased = errors.New("broker: lease released")
	// ErrBusy: a claim on a lease that already has one waiting.
	ErrBusy = errors.New("broker: a claim is already waiting on the lease")
	// ErrExists: a lease id already in use by another lease.
	ErrExists = errors.New("broker: lease id in use")
	// ErrClosed: the client (or the server) has been closed.
	ErrClosed = errors.New("broker: closed")
	// ErrUnavailable: the broker cannot be reached (not running, or
	// restarting); the client library keeps retrying in the background.
	ErrUnavailable = errors.New("broker: unavailable")
	// ErrInUse: what a broker would serve is served already: its socket
	// by a live broker, a device by another broker.
	ErrInUse = errors.New("broker: in use by another broker")
	// ErrNotTrusted: the socket is served by a process of a user who is
	// neither root nor the client's own; the client does not talk to it.
	ErrNotTrusted = errors.New("broker: served by an untrusted user")
)

// errorDomain is the ErrorInfo domain of the broker's statuses.
const errorDomain = "vram.broker"

// reasons maps each sentinel that crosses the socket to its reason and
// gRPC code, the one table both directions read.
var reasons = []struct {
	err    error
	reason string
	code   codes.Code
}{
	{ErrProportion, "PROPORTION", codes.FailedPrecondition},
	{ErrInvalid, "INVALID", codes.InvalidArgument},
	{ErrNotFound, "NOT_FOUND", codes.NotFound},
	{ErrPermission, "PERMISSION", codes.PermissionDenied},
	{ErrLimit, "LIMIT", codes.ResourceExhausted},
	{ErrReclaimTimeout, "RECLAIM_TIMEOUT", codes.DeadlineExceeded},
	{ErrReleased, "RELEASED", codes.Aborted},
	{ErrBusy, "BUSY", codes.FailedPrecondition},
	{ErrExists, "EXISTS", codes.AlreadyExists},
}

// toStatus turns a broker error into the status the handler returns.
func toStatus(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	switch {
	case errors.Is(err, context.Canceled):
		return status.Error(codes.Canceled, err.Error())
	case errors.Is(err, context.DeadlineExceeded):
		return status.Error(codes.DeadlineExceeded, err.Error())
	}
	for _, r := range reasons {
		if errors.Is(err, r.err) {
			st, derr := status.New(r.code, err.Error()).WithDetails(&errdetails.ErrorInfo{Reason: r.reason, Domain: errorDomain})
			if derr != nil {
				return status.Error(r.code, err.Error())
			}
			return st.Err()
		}
	}
	return status.Error(codes.Internal, err.Error())
}

// remoteError is an error the broker returned: its message, matching
// the sentinel its reason names.
type remoteError struct {
	msg      string
	sentinel error // nil when the status carries no known reason
	code     codes.Code
}

func (e *remoteError) Error() string { return e.msg }
func (e *remoteError) Unwrap() error { return e.sentinel }

// fromStatus turns a status from the broker back into an error that
// wraps its sentinel. A context error of the caller stays itself; an
// unreachable broker wraps ErrUnavailable.
func fromStatus(ctx context.Context, op string, err error) error {
	if err == nil {
		return nil
	}
	if cerr := ctx.Err(); cerr != nil {
		return fmt.Errorf("broker: %s: %w", op, cerr)
	}
	st, ok := status.FromError(err)
	if !ok {
		return fmt.Errorf("broker: %s: %w", op, err)
	}
	re := &remoteError{msg: st.Message(), code: st.Code()}
	for _, d := range st.Details() {
		info, ok := d.(*errdetails.ErrorInfo)
		if !ok || info.GetDomain() != errorDomain {
			continue
		}
		for _, r := range reasons {
			if r.reason == info.GetReason() {
				re.sentinel = r.err
			}
		}
	}
	if re.sentinel == nil {
		switch st.Code() {
		case codes.Unavailable:
			return fmt.Errorf("broker: %s: %s: %w", op, st.Message(), ErrUnavailable)
		case codes.DeadlineExceeded:
			// The broker saw the caller's deadline (gRPC sends it along)
			// pass a moment before the caller's own clock did.
			re.sentinel = context.DeadlineExceeded
		case codes.Canceled:
			re.sentinel = context.Canceled
		}
	}
	return re
}

// plainError is an error whose message says it all, matching the
// sentinels (and causes) it carries: the errors a user reads first, which
// say "broker:" once (at their start, or in the caller's wrapping), where
// wrapping a sentinel would say it again.
type plainError struct {
	msg  string
	errs []error
}

func (e *plainError) Error() string   { return e.msg }
func (e *plainError) Unwrap() []error { return e.errs }

// errorf is a plainError of the message format makes, matching sentinel.
func errorf(sentinel error, format string, args ...any) error {
	return &plainError{fmt.Sprintf(format, args...), []error{sentinel}}
}
