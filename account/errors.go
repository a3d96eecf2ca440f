package account

import (
	"errors"
	"fmt"

	"github.com/vramkit/vram/device"
)

// Sentinel errors; test with errors.Is. Package vram's of the same names
// are these.
var (
	// ErrClosed: the account has been closed.
	ErrClosed = errors.New("closed")
	// ErrLease: the broker's lease cannot cover what is asked, or has
	// ended.
	ErrLease = errors.New("the broker's lease cannot cover it")
	// ErrNoBroker: a broker asked for in a program that links no broker
	// client.
	ErrNoBroker = errors.New("no broker client is linked into this program")
	// ErrOutOfMemory is device.ErrOutOfMemory, which every refusal for
	// want of memory wraps.
	ErrOutOfMemory = device.ErrOutOfMemory
)

// closedErr is the error of op on a closed account.
func closedErr(op string) error {
	return fmt.Errorf("%s: the device-memory account is closed (its manager closed); make a new one: %w", op, ErrClosed)
}
