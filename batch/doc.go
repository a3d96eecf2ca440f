// Package batch is vram's chunk pipeline: a batch of runs larger than the
// device, declared once, allocated by the manager in chunks, and run
// chunk by chunk on one device or several. It is built on package vram's
// exported API alone (vram does not import it).
//
// # Declare, allocate, run
//
// A Batch holds the batch's arrays, each declared once with its client,
// label and request: In (copied in before each chunk's compute), Out
// (copied out after it), InOut (both, at the same runs of one host array)
// and Scratch (the compute step's own). The clients may be the batch's own
// (Register: closed with the batch). Allocate
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
// staged through the manager's staging pool (Host().Staging()). Pinning
// is dear (on a GPU about a millisecond a MiB), so a run pins late and
// reuses: one buffer per staged array for its first chunk, the rest once
// it has chosen its shape (which counts what pinning them costs), its
// old buffers again at a re-cut, another batch's idle ones; the time and
// bytes are Report.Pin and PinnedBytes (staging.go). When the pool
// cannot give every buffer the batch wants (a host limit below two
// chunks), the batch keeps fewer output slots and chunks ahead
// (Report.Lag) and, if need be, fewer buffers in flight; when it cannot
// give one per array, the chunks shrink (below).
//
// Run calls the Compute step for each chunk, which enqueues the chunk's
// kernels (usually Chunk.Launch of a portable kernel, given the batch's
// *Array values: each is the chunk's buffer's device array, whose Go
// views know their shape), between the copies in and out, and waits for
// each chunk a buffer or two behind the one it enqueues. With one buffer
// every step runs on the group's stream in turn; with two or three the
// compute runs on a stream of the batch's own, events order the two
// streams, and copies of one chunk overlap the compute of another.
// Staged outputs are drained (Drain functions called, pageable and
// file-backed host arrays written) by a writer goroutine of the run's
// own while the device goes on, within the output's staging slots
// (write-behind, writer.go).
//
// # Elastic runs
//
// A run takes its chunks from a queue of the batch's runs, each cut at
// the run's chunk length from what is left, and that length may change
// between chunks (elastic.go): the run finishes the chunks it took,
// allocates its chunkable arrays again (its unchunkable ones stay, with
// what they hold) and goes on. It does so
//   - after its first chunk, which runs alone and timed, when the buffers
//     are its to choose (Options.Buffers 0) or it stages arrays: it picks
//     1, 2 or 3 buffers, the host's lead and the output slots from that
//     chunk's copy, compute, fill and write times and the chunk length
//     each costs (choose.go), and says why (Report.BufferChoice); an
//     explicit count wins. Four chunks later it looks again (look.go):
//     a change that did not make the runs faster is undone;
//   - when the manager's budget changes (its account's SetCap, another
//     group's claim; account.Account.LastChange) and vram.Client.PlanNow
//     gives its arrays another length: shorter always, longer with
//     Options.Grow;
//   - when the staging pool cannot hold a chunk's staging (a host limit,
//     the RAM available): the chunks shrink until it can, down to one
//     run, and below that the run fails with the figures.
//
// The results do not depend on the lengths: each chunk lands at its runs.
// Report.Recuts lists each change: when, from what length to what, why.
//
// The context is checked between any two steps; a cancelled batch waits
// for what it enqueued, reports the chunks that finished and frees every
// stream, event and staging buffer it made. A panic in the compute step
// or in a host side's or Progress's function is the batch's error
// (ErrPanic, a *PanicError), with the same clean-up. Progress is called
// as each chunk is back on the host (drained); the Report gives bytes
// moved, the copy and compute times measured from the device's
// completions, the copy time no compute hid, and the fill and write
// times. While it runs, the clients whose arrays it uses are marked busy
// (vram.Client.BeginWork), so that eviction never takes them.
//
// # Several devices
//
// RunParts(ctx, parts, Options{...}) runs one batch on several devices:
// one Part (a Batch allocated on that device's manager, declaring the
// same arrays with the same host sides, and its Compute) per device. The
// runs are dealt from one queue to whichever device has a buffer free,
// each device's chunks at its own length and at most its share of half
// the runs left by its measured rate (weighted factoring: a small probe
// first; a device whose chunk would end after the others finish
// everything takes no more), each device's pipeline on its own
// goroutine locked to its OS thread; each chunk lands at its runs, so
// the results do not depend on the dealing. The PartsReport says how many
// chunks and runs each device took, at what length and at what rate.
//
// # Files
//
// batch.go: the Batch, its arrays and host sides, Allocate. run.go: the
// pipeline's order, Run, Chunk, the Report. setup.go, staging.go,
// steps.go, timeline.go, work.go, writer.go: a run's resources, staging,
// steps, timing, work marks and write-behind. elastic.go, choose.go,
// look.go: the re-cuts between chunks, the choice of a run's shape and
// the second look at it. parts.go: the
// queue of runs and RunParts. errors.go: the sentinels and PanicError.
package batch
