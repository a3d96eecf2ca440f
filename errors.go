package vram

import (
	"errors"

	"github.com/vramkit/vram/account"
	"github.com/vramkit/vram/device"
	"github.com/vramkit/vram/internal/safecopy"
	"github.com/vramkit/vram/internal/share"
)

// Errors. Every error this package returns wraps a sentinel below (or one
// of package device's or alloc's) with the operation and the figures that
// explain it; test with errors.Is. As device's and alloc's, the messages
// carry no package prefix: a sentinel says what went wrong, each wrapper
// what was being done, and whoever prints the error names the program
// once (the vram command writes "vram: " before it, in one place:
// cmd/vram/app.go). So a message read through several layers ("batch:
// chunk 2 of 4: copy …: array has been freed") says no name twice. No
// error is changed after it is returned. (Log messages, which no caller
// wraps, keep their "vram: ".)

// Sentinel errors.
var (
	// ErrOutOfMemory: memory ran out. It is device.ErrOutOfMemory, so
	// errors from the device, the allocators and this package match it
	// alike.
	ErrOutOfMemory = device.ErrOutOfMemory
	// ErrNotSupported: the device lacks an ability asked for (managed
	// memory, pinned host memory, a stream-ordered pool). It is
	// device.ErrNotSupported.
	ErrNotSupported = device.ErrNotSupported

	// ErrClosed: the manager or the client has been closed. It is
	// account.ErrClosed.
	ErrClosed = account.ErrClosed
	// ErrLease: the broker's lease cannot cover what the manager needs, or
	// has ended. It is account.ErrLease.
	ErrLease = account.ErrLease
	// ErrNoBroker: WithBroker in a program that links no broker client.
	// It is account.ErrNoBroker.
	ErrNoBroker = account.ErrNoBroker
	// ErrUnknownClient: a client handle that belongs to another manager.
	ErrUnknownClient = errors.New("client of another manager")
	// ErrProportion: a proportion out of range, or one the pools cannot
	// give (a manual total over 1, an auto pool under MinAutoPool).
	// It is the share rules' own sentinel (internal/share), which the
	// node broker's refusals wrap too.
	ErrProportion = share.ErrProportion
	// ErrLimitMode: a client moved to the limit mode it already has.
	//
	// Deprecated: no call returns it any more: setting a client's limit
	// mode to the one it has does nothing, as in cubie.
	ErrLimitMode = errors.New("client already in that limit mode")
	// ErrInvalidRequest: an ArrayRequest with a bad shape, dtype, memory
	// type or chunk axis, or whose size overflows 64 bits.
	ErrInvalidRequest = errors.New("invalid array request")
	// ErrRunsMismatch: chunkable requests planned together disagree on
	// their number of runs.
	ErrRunsMismatch = errors.New("requests disagree on the number of runs")
	// ErrUnchunkable: a request set does not fit its budget and chunking
	// cannot help (nothing is chunkable, or the unchunkable arrays alone
	// fill the budget).
	ErrUnchunkable = errors.New("does not fit and cannot be chunked")
	// ErrRunTooLarge: even one run at a time does not fit the budget.
	ErrRunTooLarge = errors.New("one run does not fit")
	// ErrFreed: an array used after the manager freed it (by Free,
	// FreeAll, a client's Close, a re-allocation or SetAllocator).
	ErrFreed = errors.New("array has been freed")
	// ErrChunkRange: a chunk index outside the plan's chunks, or a chunk
	// of a plan with no runs, whose arrays are whole (Chunk, Span).
	ErrChunkRange = errors.New("chunk index out of range")
	// ErrEvicted: an array (or a client's work) whose memory the manager
	// gave to another group while its client was idle (evict.go). Errors
	// of copies through an evicted array wrap ErrFreed too. Queue the
	// requests and allocate again.
	ErrEvicted = errors.New("arrays evicted for another group")
	// ErrNothingQueued: Allocate found no request queued in the
	// client's group and no plan of the group's to send again (it was
	// never allocated, or has had no member since).
	ErrNothingQueued = errors.New("nothing queued")
	// ErrMismatch: a copy between arrays whose sizes or shapes differ.
	ErrMismatch = errors.New("arrays do not match")
	// ErrLiveHostArrays: Manager.Close found pinned, mapped or
	// file-backed host arrays not freed; it freed them.
	ErrLiveHostArrays = errors.New("host arrays still live at Close")
	// ErrOtherGroup: a copy by a client into or out of a device array of
	// a client of another stream group, whose work is ordered on another
	// stream.
	ErrOtherGroup = errors.New("array of another stream group")
	// ErrHostFault: host memory a copy read or wrote faulted — a
	// file-backed host array whose file shrank under its mapping, or
	// whose disk filled. The copy fails instead of the process; the
	// array's memory stays unusable.
	ErrHostFault = safecopy.ErrFault
)

// errHostOutOfMemory is ErrOutOfMemory for host memory (the staging pool,
// pageable arrays): errors.Is matches ErrOutOfMemory, and its text does
// not send the reader to the device.
var errHostOutOfMemory error = hostOutOfMemory{}

type hostOutOfMemory struct{}

func (hostOutOfMemory) Error() string        { return "out of host memory" }
func (hostOutOfMemory) Is(target error) bool { return target == ErrOutOfMemory }
