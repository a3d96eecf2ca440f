package sim

// Fault injection: the simulator as the test double of a failing driver.
//
// Each device has one Faults (Device.Faults). Triggers count calls of one
// kind from the moment they are armed; "the nth" means the nth such call
// from then on (1 is the next one). A trigger fires once and disarms,
// except OOMAbove, which stays until changed. Counted calls are those that
// pass argument checks on an open device (a Malloc(0) counts nothing).
// Every injected error wraps ErrInjected as well as the device sentinel.

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/vramkit/vram/device"
	"github.com/vramkit/vram/internal/units"
)

// ErrInjected is wrapped by every error that fault injection caused.
var ErrInjected = errors.New("injected fault")

// Op is a kind of device call that fault triggers count.
type Op int

// Kinds of calls.
const (
	OpAlloc  Op = iota // Malloc, MallocAsync, HostAlloc
	OpFree             // Free, FreeAsync, HostFree
	OpCopy             // CopyHtoD, CopyDtoH, CopyDtoD, CopyHtoD2D, CopyDtoH2D
	OpMemset           // Memset
	OpLaunch           // LaunchFunc
	OpSync             // Device, Stream and Event Synchronize
	OpMap              // Map (virtual memory)
	numOps
)

func (o Op) String() string {
	switch o {
	case OpAlloc:
		return "alloc"
	case OpFree:
		return "free"
	case OpCopy:
		return "copy"
	case OpMemset:
		return "memset"
	case OpLaunch:
		return "launch"
	case OpSync:
		return "sync"
	case OpMap:
		return "map"
	}
	return fmt.Sprintf("Op(%d)", int(o))
}

// Faults injects failures into one device. Safe for concurrent use.
type Faults struct {
	dev   *Device
	armed atomic.Bool // any trigger set: the fast path skips the lock

	mu         sync.Mutex // protects the fields below
	oomAt      int        // countdown of allocations; 0 = off
	oomAbove   uint64     // allocations of more bytes fail; 0 = off
	failCopyAt int        // countdown of copies; 0 = off
	failMapAt  int        // countdown of Maps; 0 = off
	resetAt    [numOps]int
	fired      int
}

func (f *Faults) rearmLocked() {
	on := f.oomAt > 0 || f.oomAbove > 0 || f.failCopyAt > 0 || f.failMapAt > 0
	for _, n := range f.resetAt {
		on = on || n > 0
	}
	f.armed.Store(on)
}

// OOMAtAlloc makes the nth allocation call from now (Malloc, MallocAsync
// or HostAlloc; 1 is the next) fail with ErrOutOfMemory. 0 disarms it.
func (f *Faults) OOMAtAlloc(n int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.oomAt = max(n, 0)
	f.rearmLocked()
}

// OOMAbove makes every allocation of more than bytes fail with
// ErrOutOfMemory until it is changed. 0 disarms it.
func (f *Faults) OOMAbove(bytes uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.oomAbove = bytes
	f.rearmLocked()
}

// FailCopyAt makes the nth copy from now (CopyHtoD, CopyDtoH, CopyDtoD,
// or a whole 2-D copy, CopyHtoD2D or CopyDtoH2D, which counts as one) fail
// when its stream runs it, as a transfer error would: the call
// returns nil, no byte moves, and the stream's next Synchronize returns an
// error wrapping device.ErrCopyFailed. 0 disarms it.
func (f *Faults) FailCopyAt(n int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.failCopyAt = max(n, 0)
	f.rearmLocked()
}

// ResetAt makes the nth call of kind op from now reset the device (as
// Device.Reset) before doing anything; that call then fails with an error
// wrapping device.ErrInvalidated. 0 disarms it.
func (f *Faults) ResetAt(op Op, n int) {
	if op < 0 || op >= numOps {
		panic(fmt.Sprintf("sim: ResetAt: unknown op %d", op))
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.resetAt[op] = max(n, 0)
	f.rearmLocked()
}

// FailMapAt makes the nth Map from now (1 is the next) fail with
// ErrOutOfMemory, as cuMemMap can when the driver cannot make page-table
// entries. 0 disarms it.
func (f *Faults) FailMapAt(n int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.failMapAt = max(n, 0)
	f.rearmLocked()
}

// Clear disarms every trigger.
func (f *Faults) Clear() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.oomAt, f.oomAbove, f.failCopyAt, f.failMapAt = 0, 0, 0, 0
	f.resetAt = [numOps]int{}
	f.rearmLocked()
}

// Fired counts the faults injected so far.
func (f *Faults) Fired() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.fired
}

// check counts a call of kind op (of size bytes for allocations) and
// returns the injected error, if any.
func (f *Faults) check(op Op, name string, size uint64) error {
	if !f.armed.Load() {
		return nil
	}
	f.mu.Lock()
	reset := false
	if f.resetAt[op] > 0 {
		f.resetAt[op]--
		reset = f.resetAt[op] == 0
	}
	oomHere := false
	if op == OpAlloc && f.oomAt > 0 {
		f.oomAt--
		oomHere = f.oomAt == 0
	}
	if op == OpMap && f.failMapAt > 0 {
		f.failMapAt--
		oomHere = f.failMapAt == 0
	}
	var err error
	d := f.dev
	switch {
	case reset:
		f.fired++
	case oomHere:
		f.fired++
		err = fmt.Errorf("%v: %s %s: injected out-of-memory at this allocation: %w (%w)",
			d, name, units.Format(size), device.ErrOutOfMemory, ErrInjected)
	case op == OpAlloc && f.oomAbove > 0 && size > f.oomAbove:
		f.fired++
		err = fmt.Errorf("%v: %s %s: injected out-of-memory above %s: %w (%w)",
			d, name, units.Format(size), units.Format(f.oomAbove), device.ErrOutOfMemory, ErrInjected)
	}
	f.rearmLocked()
	f.mu.Unlock()
	if reset {
		if rerr := d.Reset(); rerr != nil {
			return rerr
		}
		return fmt.Errorf("%v: %s: injected device reset: %w (%w)", d, name, device.ErrInvalidated, ErrInjected)
	}
	return err
}

// copyFault counts a copy and reports whether it must fail.
func (f *Faults) copyFault() bool {
	if !f.armed.Load() {
		return false
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.failCopyAt == 0 {
		return false
	}
	f.failCopyAt--
	fail := f.failCopyAt == 0
	if fail {
		f.fired++
	}
	f.rearmLocked()
	return fail
}
