package batch

// The package's sentinels, and the error a panic in a batch's own
// functions becomes.

import (
	"errors"
	"fmt"
	"runtime/debug"
	"strings"
)

var (
	// ErrBatch is wrapped by a batch that Run cannot run: an array that
	// is not among the responses, a host side that does not fit its
	// device array, too many buffers.
	ErrBatch = errors.New("bad batch")
	// ErrPanic is wrapped by the error of a batch whose Compute, fill,
	// drain or Progress function panicked (a *PanicError): the batch stops
	// as on any other error, waits for what it enqueued and releases what
	// it took.
	ErrPanic = errors.New("a batch's function panicked")
)

// Bounds of a PanicError: a panic's value is the program's own, but may
// be of any size.
const (
	maxPanicValue = 256      // runes of the formatted value kept
	maxPanicStack = 64 << 10 // bytes of the stack kept
)

// PanicError is a panic in one of a batch's functions, recovered on the
// goroutine that ran it. A plain value.
type PanicError struct {
	Value string // the panic value as %v, clipped to 256 runes
	Type  string // the panic value's type (%T)
	At    string // the function and file:line that panicked
	Stack []byte // the goroutine's stack at the panic, clipped to 64 KiB
}

func (e *PanicError) Error() string {
	return fmt.Sprintf("panic: %s (%s) at %s: %v", e.Value, e.Type, e.At, ErrPanic)
}

func (e *PanicError) Unwrap() error { return ErrPanic }

// newPanicError describes the recovered value p; call it in the deferred
// function that recovered p, so that the stack is the panic's.
func newPanicError(p any) *PanicError {
	stack := debug.Stack()
	e := &PanicError{Value: clip(fmt.Sprint(p), maxPanicValue), Type: fmt.Sprintf("%T", p), At: panicSite(stack)}
	if len(stack) > maxPanicStack {
		stack = stack[:maxPanicStack]
	}
	e.Stack = stack
	return e
}

// panicSite is the first frame of stack below the runtime's panic: the
// function that panicked and its file:line.
func panicSite(stack []byte) string {
	lines := strings.Split(string(stack), "\n")
	for i := 0; i+1 < len(lines); i++ {
		if strings.HasPrefix(lines[i], "panic(") {
			for j := i + 2; j+1 < len(lines); j += 2 {
				fn, loc := lines[j], strings.TrimSpace(lines[j+1])
				if !strings.HasPrefix(fn, "runtime.") {
					if k := strings.LastIndex(fn, "("); k > 0 {
						fn = fn[:k] // its arguments' words say nothing to a reader
					}
					if k := strings.LastIndex(loc, " +0x"); k >= 0 {
						loc = loc[:k]
					}
					return clip(fn, maxPanicValue) + " " + clip(loc, maxPanicValue)
				}
			}
		}
	}
	return "an unknown place"
}

// clip shortens s to at most n runes, saying so.
func clip(s string, n int) string {
	if c := fmt.Sprintf("%.*s", n, s); len(c) < len(s) {
		return fmt.Sprintf("%s… (%d bytes in all)", c, len(s))
	}
	return s
}
