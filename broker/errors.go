package broker

import (
	"context"
	"errors"
	"fmt"

	"github.com/vramkit/vram/broker/brokerpb"
	"github.com/vramkit/vram/internal/share"
)

// Sentinel errors. The broker's refusals wrap one of these with the
// figures that explain them; over the socket each travels as an Error
// reply carrying its reason, and the client's errors wrap the same
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

// reasons maps each sentinel that crosses the socket to its reason, the
// one table both directions read; the broker's errors first, then the
// ends of a caller's context (a claim waits under it).
var reasons = []struct {
	err    error
	reason string
}{
	{ErrProportion, "PROPORTION"},
	{ErrInvalid, "INVALID"},
	{ErrNotFound, "NOT_FOUND"},
	{ErrPermission, "PERMISSION"},
	{ErrLimit, "LIMIT"},
	{ErrReclaimTimeout, "RECLAIM_TIMEOUT"},
	{ErrReleased, "RELEASED"},
	{ErrBusy, "BUSY"},
	{ErrExists, "EXISTS"},
	{context.Canceled, "CANCELED"},
	{context.DeadlineExceeded, "DEADLINE_EXCEEDED"},
}

// toWire is the Error reply of a broker error.
func toWire(err error) *brokerpb.Error {
	for _, r := range reasons {
		if errors.Is(err, r.err) {
			return &brokerpb.Error{Reason: r.reason, Message: err.Error()}
		}
	}
	return &brokerpb.Error{Reason: "INTERNAL", Message: err.Error()}
}

// remoteError is an error the broker returned: its message, matching
// the sentinel its reason names.
type remoteError struct {
	msg      string
	sentinel error // nil when the reason is none the client knows
}

func (e *remoteError) Error() string { return e.msg }
func (e *remoteError) Unwrap() error { return e.sentinel }

// fromWire is the error of an Error reply, which wraps the sentinel of
// its reason.
func fromWire(e *brokerpb.Error) error {
	re := &remoteError{msg: e.GetMessage()}
	for _, r := range reasons {
		if r.reason == e.GetReason() {
			re.sentinel = r.err
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
