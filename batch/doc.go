// Package batch is vram's chunk pipeline: it runs an allocated batch
// chunk by chunk, on one device or several, built on package vram's
// exported API alone (vram does not import it).
//
// # One device
//
// Run(ctx, c, Batch{...}) runs an allocated batch chunk by chunk: for
// each chunk it copies the inputs in, calls the Compute step (which
// enqueues the chunk's kernels, usually Chunk.Launch of a portable
// kernel), and copies the outputs back, then waits for each chunk a
// buffer or two behind the one it enqueues. The host side of each array
// is a full-length host array (In, Out; pinned or mapped ones are copied
// from directly, pageable and file-backed ones staged through the
// manager's staging pool of pinned chunk buffers, Host().Staging()) or a
// function that fills or drains a pinned staging buffer chunk by chunk
// (InFunc, OutFunc). When the pool cannot give every buffer the batch
// wants (a host limit below two chunks), the batch keeps fewer chunks
// ahead (Report.Lag) and, if need be, fewer buffers in flight. With one
// buffer every step runs on the group's stream in turn; with two or
// three (allocated with vram.WithBuffers) the compute runs on a stream of
// the batch's own, events order the two streams, and copies of one chunk
// overlap the compute of another. The context is checked between any two
// steps; a cancelled batch waits for what it enqueued, reports the chunks
// that finished and frees every stream, event and staging buffer it
// made. Progress is called as each chunk is back on the host; the Report
// gives bytes moved, the copy and compute times measured from the
// device's completions, and the copy time no compute hid. Run takes the
// client whose group runs the batch and the responses whose arrays it
// moves; it keeps no state after it returns. While it runs, the clients
// whose arrays it uses are marked busy (vram.Client.BeginWork), so that
// eviction never takes them.
//
// # Several devices
//
// RunParts(ctx, parts, PartsOptions{...}) runs one batch on several
// devices: one Part (a client and its Batch) per device's manager. One
// chunking of the runs is dealt to whichever device has a buffer free,
// each device's pipeline on its own goroutine locked to its OS thread;
// each chunk lands at its runs, so the results do not depend on the
// dealing. The PartsReport says how many chunks each device took.
package batch
