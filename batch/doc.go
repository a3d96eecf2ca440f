// Package batch is vram's chunk pipeline: a batch of runs larger than the
// device, declared once, allocated by the manager in chunks, and run
// chunk by chunk on one device or several. It is built on package vram's
// exported API alone (vram does not import it).
//
// # Declare, allocate, run
//
// A Batch holds the batch's arrays, each declared once with its client,
// label and request: In (copied in before each chunk's compute), Out
// (copied out after it) and Scratch (the compute step's own). Allocate
// queues them with their clients (who must share a stream group) and
// allocates the group with one Client.Allocate, planned and chunked by
// the manager; every member's arrays come from the response it returns
// (vram.ArrayResponse.Member), so no OnAllocated hook is needed. An
// array's chunk axis is its request's, so nothing about it is said twice.
//
// Each input and output has a host side: a full-length host array
// (Host; MakeHosts makes one from each request on the manager's host
// ladder), or a function that fills (Fill) or drains (Drain) a pinned
// staging array chunk by chunk. Pinned and mapped host arrays are copied
// from directly; pageable and file-backed ones, and the functions, are
// staged through the manager's staging pool (Host().Staging()). When the
// pool cannot give every buffer the batch wants (a host limit below two
// chunks), the batch keeps fewer chunks ahead (Report.Lag) and, if need
// be, fewer buffers in flight.
//
// Run calls the Compute step for each chunk, which enqueues the chunk's
// kernels (usually Chunk.Launch of a portable kernel, given the batch's
// *Array values: each is the chunk's buffer's device array, whose Go
// views know their shape), between the copies in and out, and waits for
// each chunk a buffer or two behind the one it enqueues. With one buffer
// every step runs on the group's stream in turn; with two or three
// (allocated with vram.WithBuffers) the compute runs on a stream of the
// batch's own, events order the two streams, and copies of one chunk
// overlap the compute of another. A run takes its chunks from a queue of
// the batch's runs, each cut at the run's chunk length (the arrays', or
// Options.MaxChunkLength when shorter).
//
// The context is checked between any two steps; a cancelled batch waits
// for what it enqueued, reports the chunks that finished and frees every
// stream, event and staging buffer it made. A panic in the compute step
// or in a host side's or Progress's function is the batch's error
// (ErrPanic, a *PanicError), with the same clean-up. Progress is called
// as each chunk is back on the host; the Report gives bytes moved, the
// copy and compute times measured from the device's completions, and
// the copy time no compute hid. While it runs, the clients whose arrays
// it uses are marked busy (vram.Client.BeginWork), so that eviction never
// takes them.
//
// # Several devices
//
// RunParts(ctx, parts, Options{...}) runs one batch on several devices:
// one Part (a Batch allocated on that device's manager, declaring the
// same arrays with the same host sides, and its Compute) per device. The
// runs are dealt from one queue to whichever device has a buffer free,
// each device's pipeline on its own goroutine locked to its OS thread;
// each chunk lands at its runs, so the results do not depend on the
// dealing. The PartsReport says how many chunks each device took.
//
// # Files
//
// batch.go: the Batch, its arrays and host sides, Allocate. run.go: the
// pipeline's order, Run, Chunk, the Report. setup.go, staging.go,
// steps.go, timeline.go, work.go: a run's resources, staging, steps,
// timing and work marks. parts.go: the queue of runs and RunParts.
// errors.go: the sentinels and PanicError.
package batch
