package batch

// The chunk pipeline: Run runs every chunk of an allocated batch
// through copy in → compute → copy out, with 1, 2 or 3 buffers in flight.
//
// Streams and order. Copies go on the group's stream s (the stream every
// client of the group copies on). With one buffer the compute step runs
// on s too, so each chunk's three steps, and the next chunk's, follow one
// another. With k ≥ 2 buffers the compute step runs on a stream of the
// batch's own, and per-buffer events order the two: a compute waits for
// its chunk's copy in (inReady[b]); a copy out waits for its chunk's
// compute (kernDone[b]). On s the order is in(0) … in(k−2), then for each
// chunk i: in(i+k−1), out(i); so chunk i+k−1's inputs go in while chunk i
// computes. A buffer is refilled only after the compute that read it
// (s waited for that compute before the previous chunk's copy out, which
// precedes the refill on s), and a compute writes its outputs only after
// the copy that read that buffer's previous outputs (its inReady was
// recorded after that copy on s).
//
// The host stays lag = max(1, k−1) chunks ahead of the device: after
// enqueueing chunk i it waits for chunk i−lag to be copied out ("retires"
// it: drains its staged outputs, reports progress). Staging buffers (for
// pageable host arrays and fill/drain functions) are used in turn, lag+1
// per output and lag+k per input (filled k−1 chunks ahead), so a staging
// buffer is refilled only after the chunk that last used it has been
// retired.
//
// Cancellation is checked before each step; a batch stopped by its
// context waits for what was enqueued, retires the chunks that finished,
// frees what it made, and returns an error wrapping ctx.Err().

import (
	"context"
	"errors"
	"fmt"
	"github.com/vramkit/vram"
	"time"

	"github.com/vramkit/vram/device"
	"github.com/vramkit/vram/kernel"
)

// MaxBuffers is the most chunk buffers Run keeps in flight.
const MaxBuffers = 3

// Batch describes a batch to Run: the host side of each array and
// the compute step. A plain value.
type Batch struct {
	// Arrays are the batch's host sides, made with In, Out, InFunc and
	// OutFunc. Arrays of the responses that are not listed are neither
	// copied in nor out (scratch arrays).
	Arrays []Array
	// Compute enqueues chunk ch's work on ch.Stream (ch.Launch does it for
	// a portable kernel). It runs on Run's goroutine; it should
	// enqueue, not wait. Its error stops the batch.
	Compute func(ctx context.Context, ch *Chunk) error
	// Buffers is the number of chunk buffers in flight: 1, 2 or 3. The
	// responses must have been allocated with at least that many
	// (WithBuffers); 0 means as many as they were, at most 3. A batch of
	// one chunk uses one.
	Buffers int
	// Runs is the batch's number of runs when its plan counts none
	// (nothing was chunkable: a batch of one run); otherwise ignored.
	Runs int
	// Progress, when set, is called on Run's goroutine as each chunk
	// is back on the host.
	Progress func(Progress)
}

// Array is the host side of one device array of a batch. Make it
// with In, Out, InFunc or OutFunc. A plain value.
type Array struct {
	resp  *vram.ArrayResponse
	label string
	out   bool
	host  *vram.HostArray
	axis  int // for fill and drain; -1 to infer from host
	fill  func(sp vram.Span, stage *vram.HostArray) error
	drain func(sp vram.Span, stage *vram.HostArray) error
}

// In copies the full-length host array h into response r's array label
// before each chunk's compute: chunk i's runs along the chunk axis (the
// axis where h has the batch's runs and the device array the chunk
// length; an array allocated whole is copied once, before the first
// chunk). A pinned or mapped h is copied from directly; a pageable one is
// staged through pinned buffers.
func In(r *vram.ArrayResponse, label string, h *vram.HostArray) Array {
	return Array{resp: r, label: label, host: h, axis: -1}
}

// Out copies response r's array label into the full-length host array h
// after each chunk's compute, the reverse of In (an array allocated
// whole is copied once, after the last chunk).
func Out(r *vram.ArrayResponse, label string, h *vram.HostArray) Array {
	return Array{resp: r, label: label, host: h, out: true, axis: -1}
}

// InFunc fills response r's array label from a function: before each
// chunk, fill is called with the chunk's runs sp (along axis) and a
// pinned staging array shaped like the device array, whose first sp.Len
// runs along axis it must fill; they are then copied in. fill runs on
// Run's goroutine.
func InFunc(r *vram.ArrayResponse, label string, axis int, fill func(sp vram.Span, stage *vram.HostArray) error) Array {
	return Array{resp: r, label: label, axis: axis, fill: fill}
}

// OutFunc drains response r's array label into a function: once chunk
// sp's outputs are back on the host, drain is called with a pinned
// staging array shaped like the device array whose first sp.Len runs
// along axis hold them. The staging array is reused after drain returns.
func OutFunc(r *vram.ArrayResponse, label string, axis int, drain func(sp vram.Span, stage *vram.HostArray) error) Array {
	return Array{resp: r, label: label, axis: axis, out: true, drain: drain}
}

// Chunk is one chunk as the compute step sees it. Valid during the
// Compute call only.
type Chunk struct {
	Index  int // 0-based
	Chunks int
	// Start and Len are the chunk's runs: Start … Start+Len−1.
	Start, Len int
	// ChunkLength is the length of every chunked array along its chunk
	// axis (its leading dimension); runs past Len are idle.
	ChunkLength int
	// Buffer is the buffer in flight the chunk uses (0 … buffers−1).
	Buffer int
	// Stream is where the compute step enqueues its work.
	Stream device.Stream

	dev  device.Device
	sets map[*vram.ArrayResponse]map[string]*vram.DeviceArray
}

// Array returns response r's device array label in the chunk's buffer
// (nil if it has none). r may be a response of the batch's allocation
// that no Array names (a client holding scratch arrays only).
func (ch *Chunk) Array(r *vram.ArrayResponse, label string) *vram.DeviceArray {
	if set, ok := ch.sets[r]; ok || r == nil {
		return set[label]
	}
	return deviceSet(r, ch.Buffer)[label]
}

// Launch enqueues the portable kernel k over the chunk's Len runs on its
// stream. Arguments are as for kernel.Kernel.Launch; a *DeviceArray is
// one (its address on CUDA, its typed views on the simulator). A nil
// *DeviceArray (a label Array did not find) is an error wrapping
// kernel.ErrArgs.
func (ch *Chunk) Launch(k *kernel.Kernel, args ...any) error {
	for i, a := range args {
		if d, ok := a.(*vram.DeviceArray); ok && d == nil {
			return fmt.Errorf("kernel %s: argument %d is a nil *DeviceArray: Chunk.Array found no array under that label in that response (check the label and pass the response of the client that holds it): %w",
				k.Name(), i, kernel.ErrArgs)
		}
	}
	return k.Launch(ch.dev, ch.Stream, ch.Len, args...)
}

// Progress is one chunk back on the host. A plain value.
type Progress struct {
	Chunk      int // chunks done so far (1 … Chunks)
	Chunks     int
	Start, Len int    // the runs of the chunk just done
	BytesIn    uint64 // bytes copied to the device so far
	BytesOut   uint64 // bytes copied back so far
	Elapsed    time.Duration
}

// Report is what a batch did, also when it stopped early. A plain
// value. Times are measured on the host from when each step's work
// finished on the device, so they include the host's wake-up latency
// (microseconds).
type Report struct {
	Chunks     int // the batch's chunks
	ChunksDone int // chunks back on the host
	Buffers    int // buffers in flight (fewer than asked when staging buffers ran short)
	Lag        int // chunks the host stayed ahead of the device (0 when staging buffers ran short)
	Staged     int // arrays staged through the staging pool
	BytesIn    uint64
	BytesOut   uint64
	// Wall is from the first step enqueued to the last chunk retired.
	Wall time.Duration
	// Copy is the time the copy stream spent copying, Compute the time
	// the compute steps' work ran, ExposedCopy the part of Copy during
	// which no compute ran: what buffering failed to hide.
	Copy, Compute, ExposedCopy time.Duration
}

// Run runs every chunk of the batch b, whose arrays belong to
// responses of one allocation in c's stream group, and waits for the
// last: copy in, compute, copy out, with b.Buffers buffers in flight
// (see the file's overview above for the order). It returns when every
// chunk is back on the host, when a step fails, or when ctx is done;
// in the last two cases after the work already enqueued has finished,
// so that the arrays may be freed at once. The report counts what was
// done either way. Errors name the chunk (from 1) and the step; an
// error from ctx wraps ctx.Err().
//
// The host arrays of In must not change, and those of Out must not be
// read, until Run returns. Run is safe to call from several
// goroutines for batches of different groups.
func Run(ctx context.Context, c *vram.Client, b Batch) (Report, error) {
	r, err := newBatchRun(ctx, c, b, nil)
	if err != nil {
		return Report{}, err
	}
	end, err := markBatch(c, b) // no eviction while it runs (batchwork.go)
	if err != nil {
		return r.finish(err)
	}
	rep, err := r.finish(r.run())
	return rep, errors.Join(err, end())
}
