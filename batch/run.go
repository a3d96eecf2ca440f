package batch

// The chunk pipeline: Run runs every chunk of an allocated batch through
// copy in → compute → copy out, with 1, 2 or 3 buffers in flight.
//
// Chunks. A run takes its chunks one by one from a queue of the batch's
// runs (runQueue, parts.go), each cut at the run's chunk length from
// what is left; on several devices the parts take from one queue, each
// at its own length. The length may change between chunks (a re-cut,
// elastic.go): the run then finishes the chunks it took, re-allocates
// and re-stages, and goes on.
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
// The host stays lag chunks ahead of the device (max(1, k−1) unless
// staging is short): after enqueueing chunk i it waits for chunk i−lag
// to be copied out ("retires" it) and hands it to the run's writer,
// which drains its staged outputs and reports progress while the run
// goes on (writer.go). Staging buffers (for pageable host arrays and
// fill/drain functions) are used in turn: lag+k per input (filled k−1
// chunks ahead), so an input's is refilled only after the chunk that
// last used it has been retired; an output's slots (lag+1, one more for
// the writer to drain behind) are refilled only once the writer has
// drained the chunk that last used them.
//
// Cancellation is checked before each step; a batch stopped by its
// context waits for what was enqueued, retires and drains the chunks
// that finished, frees what it made, and returns an error wrapping
// ctx.Err().

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/vramkit/vram"
	"github.com/vramkit/vram/device"
	"github.com/vramkit/vram/kernel"
)

// MaxBuffers is the most chunk buffers Run keeps in flight.
const MaxBuffers = 3

// Compute enqueues chunk ch's work on ch.Stream (ch.Launch does it for a
// portable kernel). It runs on Run's goroutine; it should enqueue, not
// wait. Its error stops the batch.
type Compute func(ctx context.Context, ch *Chunk) error

// Options tune Run and RunParts. The zero value chooses the buffers in
// flight, runs at the length the arrays were allocated with (shorter
// when the budget shrinks, or staging or write-behind need it), and
// reports no progress. A plain value.
type Options struct {
	// Buffers is the number of chunk buffers in flight: 1, 2 or 3 (the
	// arrays are allocated again for them when they were allocated with
	// fewer); 0 lets the run choose from what its first chunk cost
	// (choose.go) and says why in Report.BufferChoice. A batch of one
	// chunk uses one.
	Buffers int
	// MaxChunkLength, when positive, caps a chunk's runs below the chunk
	// length the arrays were allocated with: a batch allocated whole is
	// still cut (RunParts then spreads it over its devices).
	MaxChunkLength int
	// Grow lets a run whose group's budget grows (a cap raised, a claim
	// met) allocate its arrays again at the longer length the budget
	// then allows. A budget that shrinks always shrinks the chunks.
	Grow bool
	// Progress, when set, is called as each chunk is back on the host
	// (its outputs drained), on the run's writer goroutine, one call at
	// a time in chunk order; for RunParts one call at a time, counting
	// the whole batch's chunks.
	Progress func(Progress)
}

// Chunk is one chunk as the compute step sees it. Valid during the
// Compute call only.
type Chunk struct {
	Index  int // 0-based, in the batch's order
	Chunks int // the batch's chunks as now cut (it changes with a re-cut)
	// Start and Len are the chunk's runs: Start … Start+Len−1.
	Start, Len int
	// ChunkLength is the length of every chunked array along its chunk
	// axis as allocated, its stride there (Len or more: a chunk cut
	// shorter than the arrays, Options.MaxChunkLength, leaves the runs
	// past Len idle). It may change between chunks (a re-cut), with the
	// arrays: take them from the chunk (Array, Launch), not from before.
	ChunkLength int
	// Buffer is the buffer in flight the chunk uses (0 … buffers−1).
	Buffer int
	// Stream is where the compute step enqueues its work.
	Stream device.Stream
	// Device is the device the chunk runs on.
	Device device.Device

	b *Batch
}

// Array is a's device array in the chunk's buffer: its shape is the
// allocated one (the chunk length along the chunk axis), and a kernel's
// view of it knows that shape (kernel.Args.Shape). Nil for an array of
// another batch.
func (ch *Chunk) Array(a *Array) *vram.DeviceArray {
	if a == nil || a.b != ch.b {
		return nil
	}
	return a.Device(min(ch.Buffer, len(a.dev)-1))
}

// Launch enqueues the portable kernel k over the chunk's Len runs on its
// stream. Arguments are as for kernel.Kernel.Launch, and an *Array of the
// batch is one: its device array in the chunk's buffer (its address on
// CUDA, its typed, shaped views on the simulator). An *Array of another
// batch, or a nil array, is an error wrapping kernel.ErrArgs.
func (ch *Chunk) Launch(k *kernel.Kernel, args ...any) error {
	vals := make([]any, len(args))
	for i, a := range args {
		vals[i] = a
		switch v := a.(type) {
		case *Array:
			d := ch.Array(v)
			if d == nil {
				return fmt.Errorf("kernel %s: argument %d is %v, which is not this batch's: %w", k.Name(), i, v, kernel.ErrArgs)
			}
			vals[i] = d
		case *vram.DeviceArray:
			if v == nil {
				return fmt.Errorf("kernel %s: argument %d is a nil *vram.DeviceArray: %w", k.Name(), i, kernel.ErrArgs)
			}
		}
	}
	return k.Launch(ch.Device, ch.Stream, ch.Len, vals...)
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
	Chunks      int // the chunks the run took (for a part of RunParts, those it took)
	ChunksDone  int // chunks back on the host, drained
	Runs        int // the runs of those chunks
	RunsLeft    int // the batch's runs no part took (0 once it is done)
	ChunkLength int // the runs of its longest chunk since its last re-cut: its length then, or its share of a queue shared with other parts
	Buffers     int // buffers in flight at the end (fewer than asked when staging buffers ran short)
	Lag         int // chunks the host stayed ahead of the device at the end (0 when staging buffers ran short)
	Staged      int // arrays staged through the staging pool
	BytesIn     uint64
	BytesOut    uint64
	// Wall is from the run's start (its staging taken) to the last chunk
	// drained.
	Wall time.Duration
	// Copy is the time the copy stream spent copying, Compute the time
	// the compute steps' work ran, ExposedCopy the part of Copy during
	// which no compute ran: what buffering failed to hide.
	Copy, Compute, ExposedCopy time.Duration
	// DeviceIdle is Wall less the time the device copied or computed
	// (Compute + ExposedCopy): what the host held it up, filling,
	// waiting for the writer, enqueueing, re-cutting.
	DeviceIdle time.Duration
	// Fill is the time the run spent filling staged inputs (Fill
	// functions, copies into staging); Write the writer's time draining
	// staged outputs (Drain functions, copies into pageable or
	// file-backed host arrays: writing the files), which overlaps the
	// device's work; WriteWait the part of it the run waited for (a
	// staging slot not yet drained; the device may have been busy
	// meanwhile with the chunks enqueued before).
	Fill, Write, WriteWait time.Duration
	// Pin is the time the run spent taking staging buffers from the
	// manager's staging pool, at its start and at each re-cut: pinning
	// the new ones (on a GPU about a millisecond a MiB), reusing the
	// pool's idle ones; PinnedBytes the bytes of those it pinned anew
	// (0 when the pool had them all: another batch's, an earlier run's).
	// Pin is part of Wall, and of DeviceIdle.
	Pin         time.Duration
	PinnedBytes uint64
	// Recuts lists each change of the chunk length or buffers between
	// chunks, in order (elastic.go).
	Recuts []Recut
	// BufferChoice says how the buffers, the host's lead and the
	// output slots were chosen after the first chunk ("" when they were
	// not: one chunk, or an explicit count and nothing staged).
	BufferChoice string
}

// Run runs every chunk of the allocated batch b and waits for the last:
// copy in, compute, copy out, with o.Buffers buffers in flight (see the
// file's overview above for the order). Every input and output needs a
// host side (In, Out, Use or MakeHosts). It returns when every chunk is
// back on the host, when a step fails, or when ctx is done; in the last
// two cases after the work already enqueued has finished, so that the
// arrays may be freed at once. The report counts what was done either
// way. Errors name the chunk (from 1) and the step; an error from ctx
// wraps ctx.Err(), and a panic in compute or in a host side's or
// o.Progress's function is an error wrapping ErrPanic.
//
// While it runs, the batch's clients, and every other member of their
// group that holds arrays, are marked busy (vram.Client.BeginWork), so
// that eviction never takes their arrays. The host arrays of inputs must
// not change, and those of outputs must not be read, until Run returns.
// Batches of different groups may run at once, from several goroutines.
func (b *Batch) Run(ctx context.Context, o Options, compute Compute) (Report, error) {
	r, err := newRun(ctx, b, compute, o, nil, 0, o.Progress)
	if err != nil {
		return Report{}, err
	}
	return r.runMarked()
}

// runMarked runs r with its clients marked busy, and cleans up.
func (r *batchRun) runMarked() (Report, error) {
	end, err := markBatch(r.b) // no eviction while it runs (work.go)
	if err != nil {
		return r.finish(err)
	}
	rep, err := r.finish(r.run())
	return rep, errors.Join(err, end())
}
