package trace

// Replay runs a log's allocations and frees against an allocator.
//
// The log is first compiled into steps: each Allocate gets a slot, and
// each Free the slot of the live Allocate of the same pointer (found with
// a map keyed by the log's pointer, once, before the loop). The loop then
// touches only preallocated slices: a step's slot holds the pointer the
// allocator returned, so the replay itself allocates nothing per event and
// its cost is the allocator's.
//
// What a log may cost is bounded, since logs come from anywhere: each
// event costs a fixed number of bytes (its Event, one step, and an entry
// of the pointer map while its block is live), a log may use at most
// MaxStreams distinct streams (each is a simulator stream), and the
// context is checked every cancelCheck steps, so a cancelled replay stops
// within a few thousand allocator calls. Figures in BENCHMARKS.md.

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/vramkit/vram/alloc"
	"github.com/vramkit/vram/device"
	"github.com/vramkit/vram/internal/units"
)

// MaxSamples is the most points Replay records in a time series.
const MaxSamples = 2000

// ErrOptions is wrapped by Replay's errors for options it cannot use.
var ErrOptions = errors.New("bad replay options")

// ErrTooLarge is wrapped by Replay's errors for a log past what a replay
// takes on (MaxStreams).
var ErrTooLarge = errors.New("log too large to replay")

// MaxStreams is the most distinct streams a replayed log may use: each
// becomes a stream of the replay device, and real programs use tens.
const MaxStreams = 1 << 16

// cancelCheck is how many steps run between two looks at the context.
const cancelCheck = 256

// Options configure Replay.
type Options struct {
	// Device is the device the allocator was made on (required). Trace
	// stream 0 replays on its default stream; every other trace stream
	// on a stream made for the replay and closed after it.
	Device device.Device
	// Samples is how many points of (event, live, in use, reserved) to
	// record for a plot, spread evenly over the log; 0 records none, and
	// more than MaxSamples records MaxSamples.
	Samples int
}

// Sample is one point of a replay's time series.
type Sample struct {
	Event    int    // index of the event just replayed
	Live     uint64 // bytes live by the log's sizes
	InUse    uint64 // the allocator's Stats.InUse (after its rounding)
	Reserved uint64 // the allocator's Stats.Reserved
}

// Result is what a replay measured. Counts of device calls and cache hits
// are those made during the replay (differences of the allocator's
// Stats); peaks are from the allocator's Stats after ResetPeaks at the
// start, when it can reset them.
type Result struct {
	Events         int    // events in the log
	Allocs         int    // allocations replayed
	Frees          int    // frees replayed
	FailedAllocs   int    // allocations the allocator refused for want of memory (their frees are skipped)
	TraceFailures  int    // "allocate failure" events of the log, not replayed
	UnmatchedFrees int    // frees of pointers not live in the log, skipped
	Reallocs       int    // allocations of a pointer already live in the log; the earlier block is freed first
	ZeroSize       int    // zero-byte allocations, skipped with their frees
	PeakLive       uint64 // most bytes live at once by the log's sizes, over what was replayed
	PeakInUse      uint64 // the allocator's peak bytes in use (after its rounding)
	PeakReserved   uint64 // the allocator's peak bytes held from the device
	DeviceAllocs   uint64 // device allocations made
	DeviceFrees    uint64 // device frees made
	CacheHits      uint64 // allocations served without a device allocation
	Retries        uint64 // allocations retried after trimming
	// Final is the allocator's Stats after the replay.
	Final        alloc.Stats
	Wall         time.Duration // time to compile and replay the log
	EventsPerSec float64       // Events / Wall
	Samples      []Sample      // the time series, when asked for
}

// Fragmentation is PeakReserved / PeakLive: 1.0 for an allocator that
// wastes nothing at its peak.
func (r Result) Fragmentation() float64 {
	if r.PeakLive == 0 {
		return 0
	}
	return float64(r.PeakReserved) / float64(r.PeakLive)
}

// step operations.
const (
	opAlloc uint8 = iota
	opFree
	opSkip // an event that is not replayed
)

// step is one compiled event.
type step struct {
	size   uint64 // bytes (opAlloc)
	slot   int32  // the allocation's slot
	stream int32  // index into the replay's streams
	event  int32  // index of the event in the log (a realloc's implied free shares its Allocate's)
	op     uint8
}

// program is a compiled log.
type program struct {
	steps    []step
	slots    int      // allocation slots
	streams  []uint64 // trace stream ids, in order of first use
	failures int      // AllocateFailure events
	unmatch  int      // unmatched frees
	reallocs int      // allocations of a live pointer
	zero     int      // zero-byte allocations
}

// compile pairs frees with allocations. An Allocate of a pointer that is
// still live frees the earlier block first (the log missed a free), and
// that free is a step of its own, so steps may outnumber events.
func compile(events []Event) *program {
	pr := &program{steps: make([]step, 0, len(events)+8)}
	// Sized for the blocks live at once, not the events: it grows if need be.
	live := make(map[uint64]int32, min(len(events)/2, 4096)+1) // trace pointer → slot
	streamIdx := make(map[uint64]int32, 4)
	stream := func(id uint64) int32 {
		i, ok := streamIdx[id]
		if !ok {
			i = int32(len(pr.streams))
			streamIdx[id] = i
			pr.streams = append(pr.streams, id)
		}
		return i
	}
	zeroSlot := int32(-1)
	for i, e := range events {
		ev := int32(i)
		switch e.Action {
		case Allocate:
			si := stream(e.Stream)
			if old, ok := live[e.Pointer]; ok {
				pr.reallocs++
				if old != zeroSlot {
					pr.steps = append(pr.steps, step{slot: old, stream: si, event: ev, op: opFree})
				}
				delete(live, e.Pointer)
			}
			if e.Size == 0 {
				pr.zero++
				live[e.Pointer] = zeroSlot
				pr.steps = append(pr.steps, step{event: ev, op: opSkip})
				continue
			}
			slot := int32(pr.slots)
			pr.slots++
			live[e.Pointer] = slot
			pr.steps = append(pr.steps, step{size: e.Size, slot: slot, stream: si, event: ev, op: opAlloc})
		case Free:
			slot, ok := live[e.Pointer]
			if !ok {
				pr.unmatch++
				pr.steps = append(pr.steps, step{event: ev, op: opSkip})
				continue
			}
			delete(live, e.Pointer)
			if slot == zeroSlot {
				pr.steps = append(pr.steps, step{event: ev, op: opSkip})
				continue
			}
			pr.steps = append(pr.steps, step{slot: slot, stream: stream(e.Stream), event: ev, op: opFree})
		default:
			pr.failures++
			pr.steps = append(pr.steps, step{event: ev, op: opSkip})
		}
	}
	return pr
}

// Replay replays events against a, which must have been made on
// opts.Device. Allocations the allocator refuses for want of memory are
// counted (FailedAllocs) and their frees skipped; any other allocator
// error stops the replay and is returned. Blocks the log leaves live stay
// allocated: close a to give them back. A log of more than MaxStreams
// streams is refused with an error wrapping ErrTooLarge.
//
// The allocator should be fresh, or its peaks resettable
// (alloc.PeakResetter), for the peaks to be the replay's own.
func Replay(events []Event, a alloc.Allocator, opts Options) (Result, error) {
	return ReplayContext(context.Background(), events, a, opts)
}

// ReplayContext is Replay that stops, returning ctx's error, soon after
// ctx is done (within cancelCheck allocator calls).
func ReplayContext(ctx context.Context, events []Event, a alloc.Allocator, opts Options) (Result, error) {
	if err := opts.check(); err != nil {
		return Result{}, err
	}
	start := time.Now()
	pr := compile(events)
	if len(pr.streams) > MaxStreams {
		return Result{}, fmt.Errorf("trace: replay: the log uses %d distinct streams, more than the %d a replay takes on "+
			"(each is a stream of the replay device); merge its streams or split the log: %w", len(pr.streams), MaxStreams, ErrTooLarge)
	}
	if err := ctx.Err(); err != nil {
		return Result{}, fmt.Errorf("trace: replay: %w", err)
	}
	streams, err := makeStreams(ctx, opts.Device, pr.streams)
	if err != nil {
		return Result{}, err
	}
	defer closeStreams(streams)

	if r, ok := a.(alloc.PeakResetter); ok {
		r.ResetPeaks()
	}
	before := a.Stats()
	res := pr.result(len(events))
	n := min(opts.Samples, MaxSamples)
	stride := len(pr.steps) + 1
	if n > 0 && len(pr.steps) > 0 {
		stride = max(1, (len(pr.steps)+n-1)/n)
		res.Samples = make([]Sample, 0, n+1)
	}
	ptrs := make([]device.Ptr, pr.slots)
	sizes := make([]uint64, pr.slots)
	var live uint64
	for i := range pr.steps {
		if i%cancelCheck == 0 && ctx.Err() != nil {
			return res, fmt.Errorf("trace: replay stopped at step %d of %d: %w", i, len(pr.steps), ctx.Err())
		}
		st := &pr.steps[i]
		switch st.op {
		case opAlloc:
			p, err := a.Alloc(st.size, streams[st.stream])
			if err != nil {
				if errors.Is(err, device.ErrOutOfMemory) {
					res.FailedAllocs++
					break
				}
				return res, fmt.Errorf("trace: replay step %d: allocate %s on trace stream %d: %w",
					i, units.Format(st.size), pr.streams[st.stream], err)
			}
			ptrs[st.slot] = p
			sizes[st.slot] = st.size
			res.Allocs++
			live += st.size
			res.PeakLive = max(res.PeakLive, live)
		case opFree:
			p := ptrs[st.slot]
			if p == 0 { // its allocation failed
				break
			}
			if err := a.Free(p, streams[st.stream]); err != nil {
				return res, fmt.Errorf("trace: replay step %d: free %v (%s) on trace stream %d: %w",
					i, p, units.Format(sizes[st.slot]), pr.streams[st.stream], err)
			}
			ptrs[st.slot] = 0
			live -= sizes[st.slot]
			res.Frees++
		}
		last := i == len(pr.steps)-1
		if ((i+1)%stride == 0 || (n > 0 && last)) && (last || pr.steps[i+1].event != st.event) {
			s := a.Stats()
			res.Samples = append(res.Samples, Sample{Event: int(st.event), Live: live, InUse: s.InUse, Reserved: s.Reserved})
		}
	}
	res.finish(time.Since(start), before, a.Stats())
	return res, nil
}

// result is the Result of a replay of the program's events, before it
// runs: what the log says of itself.
func (pr *program) result(events int) Result {
	return Result{
		Events:         events,
		TraceFailures:  pr.failures,
		UnmatchedFrees: pr.unmatch,
		Reallocs:       pr.reallocs,
		ZeroSize:       pr.zero,
	}
}

// finish adds a replay's wall time and what the allocator did between
// its Stats before and after the replay.
func (r *Result) finish(wall time.Duration, before, after alloc.Stats) {
	r.Wall = wall
	if r.Wall > 0 {
		r.EventsPerSec = float64(r.Events) / r.Wall.Seconds()
	}
	r.Final = after
	r.PeakInUse = after.PeakInUse
	r.PeakReserved = after.PeakReserved
	r.DeviceAllocs = after.DeviceAllocs - before.DeviceAllocs
	r.DeviceFrees = after.DeviceFrees - before.DeviceFrees
	r.CacheHits = after.CacheHits - before.CacheHits
	r.Retries = after.Retries - before.Retries
}

// check refuses options a replay cannot run with.
func (opts Options) check() error {
	if opts.Device == nil {
		return fmt.Errorf("trace: replay needs Options.Device, the device the allocator was made on: %w", ErrOptions)
	}
	if opts.Samples < 0 {
		return fmt.Errorf("trace: replay with %d samples: want 0 to %d: %w", opts.Samples, MaxSamples, ErrOptions)
	}
	return nil
}

// makeStreams makes a stream of dev for each trace stream id (id 0 is the
// default stream), checking ctx every cancelCheck streams; on an error it
// closes those it made.
func makeStreams(ctx context.Context, dev device.Device, ids []uint64) ([]device.Stream, error) {
	streams := make([]device.Stream, len(ids))
	for i, id := range ids {
		if i%cancelCheck == 0 && ctx.Err() != nil {
			closeStreams(streams)
			return nil, fmt.Errorf("trace: replay: %w", ctx.Err())
		}
		if id == 0 {
			streams[i] = dev.DefaultStream()
			continue
		}
		s, err := dev.NewStream()
		if err != nil {
			closeStreams(streams)
			return nil, fmt.Errorf("trace: replay: make a stream for trace stream %d: %w", id, err)
		}
		streams[i] = s
	}
	return streams, nil
}

func closeStreams(streams []device.Stream) {
	for _, s := range streams {
		if s != nil {
			_ = s.Close() // the default stream's Close is a no-op
		}
	}
}
