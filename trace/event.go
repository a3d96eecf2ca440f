package trace

import (
	"fmt"
	"math"
	"math/bits"
	"strconv"

	"github.com/vramkit/vram/alloc"
)

// Action is what an event did.
type Action uint8

// Actions, as RMM's logging resource adaptor names them.
const (
	// Allocate: an allocation of Size bytes returned Pointer.
	Allocate Action = iota + 1
	// Free: Pointer, of Size bytes, was freed.
	Free
	// AllocateFailure: an allocation of Size bytes failed. Replay counts
	// these and does not replay them.
	AllocateFailure
)

// String is the action as written in the CSV ("allocate", "free",
// "allocate failure").
func (a Action) String() string {
	switch a {
	case Allocate:
		return alloc.ActionAllocate
	case Free:
		return alloc.ActionFree
	case AllocateFailure:
		return alloc.ActionAllocateFailure
	default:
		return "Action(" + strconv.Itoa(int(a)) + ")"
	}
}

// Event is one line of an allocation log.
type Event struct {
	Thread  uint64  // id of the thread (or goroutine) that made the call; 0 if unknown
	Time    float64 // seconds from the start of the log
	Action  Action  // what happened
	Pointer uint64  // address returned (Allocate) or given back (Free); only a key
	Size    uint64  // bytes
	Stream  uint64  // stream handle; 0 is the default stream
}

// String writes the event as its CSV line would read.
func (e Event) String() string {
	return fmt.Sprintf("%d,%s,%s,0x%x,%d,%d", e.Thread,
		strconv.FormatFloat(e.Time, 'f', -1, 64), e.Action, e.Pointer, e.Size, e.Stream)
}

// Summary describes a trace without replaying it.
type Summary struct {
	Events         int    // lines read
	Allocs         int    // Allocate events
	Frees          int    // Free events that freed a live pointer
	Failures       int    // AllocateFailure events
	UnmatchedFrees int    // Free events of a pointer not live in the trace
	Reallocs       int    // Allocate events of a pointer already live (the earlier block is taken as freed)
	Streams        int    // distinct streams
	PeakLive       uint64 // most bytes live at once (trace sizes); math.MaxUint64 if more

	PeakBlocks  int    // most blocks live at once
	LiveAtEnd   uint64 // bytes still live after the last event; math.MaxUint64 if more
	BlocksAtEnd int    // blocks still live after the last event
	// Duration is the latest event's Time, in seconds.
	Duration float64
}

// Summarize reads the figures of a trace: how many events of each kind,
// and the most bytes and blocks live at once, pairing each Free with the
// live Allocate of the same pointer. Byte counts are summed without
// wrapping: one that passes 2^64 − 1 reads as math.MaxUint64.
func Summarize(events []Event) Summary {
	s := Summary{Events: len(events)}
	live := make(map[uint64]uint64, len(events)/2)
	streams := make(map[uint64]struct{}, 4)
	var bytes u128
	for _, e := range events {
		streams[e.Stream] = struct{}{}
		s.Duration = max(s.Duration, e.Time)
		switch e.Action {
		case Allocate:
			s.Allocs++
			if old, ok := live[e.Pointer]; ok {
				s.Reallocs++
				bytes = bytes.sub(old)
			}
			live[e.Pointer] = e.Size
			bytes = bytes.add(e.Size)
			s.PeakLive = max(s.PeakLive, bytes.sat())
			s.PeakBlocks = max(s.PeakBlocks, len(live))
		case Free:
			n, ok := live[e.Pointer]
			if !ok {
				s.UnmatchedFrees++
				continue
			}
			s.Frees++
			delete(live, e.Pointer)
			bytes = bytes.sub(n)
		case AllocateFailure:
			s.Failures++
		}
	}
	s.Streams = len(streams)
	s.LiveAtEnd = bytes.sat()
	s.BlocksAtEnd = len(live)
	return s
}

// PeakLive is the most bytes live at once in the trace (Summarize's
// PeakLive).
func PeakLive(events []Event) uint64 { return Summarize(events).PeakLive }

// u128 is a byte count that cannot wrap: a sum of up to 2^64 sizes.
type u128 struct{ hi, lo uint64 }

func (x u128) add(n uint64) u128 {
	lo, c := bits.Add64(x.lo, n, 0)
	return u128{x.hi + c, lo}
}

func (x u128) sub(n uint64) u128 {
	lo, b := bits.Sub64(x.lo, n, 0)
	return u128{x.hi - b, lo}
}

// sat is x, or math.MaxUint64 if x is more.
func (x u128) sat() uint64 {
	if x.hi != 0 {
		return math.MaxUint64
	}
	return x.lo
}
