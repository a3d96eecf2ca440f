// Package vram manages GPU memory for programs that run large batches of
// work on a GPU.
//
// Components of a program register with a Manager as clients. The manager
// gives each a share of the device's memory, puts each on a stream group
// (clients in one group share a stream and are planned together), and
// serves their array requests from a pooled, stream-ordered allocator
// (package alloc). When a group's batch of runs does not fit in the
// memory the group may use, the manager chunks it along the run axis: the
// arrays are allocated for a chunk of runs, the program makes several
// passes, and copies each chunk in and out of full-length host arrays.
// It is a Go reimagining of the memory subsystem of the cubie batch
// integrator (its MemoryManager, StreamGroups, ArrayRequest and
// ArrayResponse).
//
// # Pieces
//
//   - Manager: New(dev, opts...) for a device, or Default() for the
//     process-wide one on device.Open("auto") (CUDA when a GPU and driver
//     are present, else the simulator, so programs and tests run anywhere).
//   - Client: a handle from Register(ClientOptions{...}), with a manual
//     Proportion of memory (0 < p ≤ 1) or a place in the auto pool, a
//     stream group, and two hooks: OnAllocated (arrays are ready) and
//     OnInvalidate (arrays were taken away; ask again).
//   - Shares: manual clients keep their proportion; auto clients split the
//     rest equally, rebalanced on every change. The auto pool never drops
//     under MinAutoPool (5%) while it has clients. A client's Cap is its
//     proportion of the device's total memory. In the Active LimitMode a
//     group plans within its members' caps; in Passive (the default)
//     within the device's free memory.
//   - ArrayRequest{Shape, DType, Memory, ChunkAxis, Unchunkable,
//     TotalRuns}: one array. QueueRequest queues a client's requests;
//     AllocateQueue plans everything queued in the client's group together
//     (Plan) and hands each requester an ArrayResponse with its
//     DeviceArrays and HostArrays and the chunk parameters; the other
//     members (notaries) get the chunk parameters alone. Arrays queued
//     again under a label they already hold are replaced: the old ones
//     are freed once the new ones are in, so a failed AllocateQueue
//     leaves them (only when the plan needs their memory are they freed
//     first, and a failure then calls their owners' OnInvalidate).
//   - Plan: the chunk planner, a pure function (also behind `vram plan`).
//     Its budget is in the bytes the allocator charges (each array rounded
//     to the allocator's granularity, 512 B for the Pool), so a plan that
//     fits its budget fits an allocator or alloc.Limit with that much to
//     give; with PlanOptions.Cost it bounds what the allocator says the
//     arrays take from the device instead.
//   - The budget AllocateQueue plans a group with, once: the device's free
//     memory (after trimming the allocator's cache) plus the arrays being
//     replaced, against what the allocator states the arrays take from
//     the device (alloc.Coster: the device hands out 2 MiB pages, so an
//     array above the Pool's small-request size may cost its bytes rounded
//     up to a page and the small ones share pages), and at most, in
//     Active mode, the members' caps less what they hold and, under a cap
//     (WithCap, or an alloc.Limit), the room it leaves. The plan has the
//     fewest chunks that fit all of these. The arrays are allocated with
//     alloc.AllocExact, so the Pool grows by no more than it stated; an
//     allocator that states nothing is counted a page per array and, if
//     it still runs the device out, the group is planned again with what
//     it took kept back. A refusal names each figure and what would raise
//     the one that binds.
//   - Copies: ToDevice, FromDevice, and ToDeviceChunk / FromDeviceChunk,
//     which move one chunk's runs between a full-length host array and a
//     chunk-length device array, all ordered on the client's stream; Sync
//     waits for them.
//   - SetAllocator(Direct | Pool | AsyncPool) frees everything, calls every
//     OnInvalidate and gives every group a fresh stream.
//
// # Batches
//
// RunBatch(ctx, c, Batch{...}) runs an allocated batch chunk by chunk:
// for each chunk it copies the inputs in, calls the Compute step (which
// enqueues the chunk's kernels, usually Chunk.Launch of a portable
// kernel), and copies the outputs back, then waits for each chunk a
// buffer or two behind the one it enqueues. The host side of each array
// is a full-length host array (In, Out; pinned or mapped ones are copied
// from directly, pageable ones staged through pinned buffers) or a
// function that fills or drains a pinned staging buffer chunk by chunk
// (InFunc, OutFunc). With one buffer every step runs on the group's
// stream in turn; with two or three (allocated with WithBuffers) the
// compute runs on a stream of the batch's own, events order the two
// streams, and copies of one chunk overlap the compute of another. The
// context is checked between any two steps; a cancelled batch waits for
// what it enqueued, reports the chunks that finished and frees every
// stream, event and staging buffer it made. Progress is called as each
// chunk is back on the host; the BatchReport gives bytes moved, the copy
// and compute times measured from the device's completions, and the copy
// time no compute hid. RunBatch takes the client whose group runs the
// batch and the responses whose arrays it moves; it keeps no state after
// it returns.
//
// Kernels that run on both the simulator and CUDA come from package
// kernel: one value with PTX for CUDA and a Go function, given typed,
// little-endian views of the same arrays, for the simulator.
//
// # Concurrency
//
// A Manager, its Clients and the arrays' accessors are safe for
// concurrent use. Registration, Close, share changes and group lookups
// cost O(1) in the number of clients. AllocateQueue calls are serialized
// from reading the device's free memory to their last allocation, so two
// groups never plan against the same free memory; copies, frees and
// registration run in parallel with them. No
// hook is ever called with a lock held, so hooks may call the manager. A
// client's hooks come one at a time, in the order of their events (an
// OnAllocated before the OnInvalidate of a later invalidation), on the
// goroutine whose call caused them (AllocateQueue, SetAllocator,
// InvalidateAll) unless another is delivering that client's earlier hook,
// which then delivers the later one too. Device memory follows the stream
// contract of package device: work on one stream is ordered; an array
// used on two streams needs an event or a Sync between the uses, and a
// host array must stay untouched while a copy that uses it is in flight
// (until Sync). The manager frees an array ordered after the stream it
// was last copied on, even when its client has moved to another group
// since. A stream group lives while it has clients: the last one to leave
// (Close, ChangeStreamGroup) removes it and closes its stream, waiting
// for the stream's work.
// Errors wrap package sentinels (ErrOutOfMemory, ErrUnchunkable,
// ErrRunTooLarge, ErrProportion, …) with the figures that explain them;
// test them with errors.Is. A call that fails leaves the manager as it
// was, except where its documentation says otherwise.
//
// # Usage
//
//	m, err := vram.Default()                   // or vram.New(dev)
//	c, err := m.Register(vram.ClientOptions{Name: "solver", Group: "batch"})
//	defer c.Close()
//	err = m.QueueRequest(c, map[string]vram.ArrayRequest{
//		"state": {Shape: []int{2, runs}, DType: vram.Float32, ChunkAxis: 1},
//		"consts": {Shape: []int{16}, DType: vram.Float32, Unchunkable: true},
//	})
//	resp, err := m.AllocateQueue(c)             // plans, chunks if needed
//	host, err := m.NewHostArray([]int{2, runs}, vram.Float32, vram.Pinned, nil)
//	for i := range resp.Chunks {
//		sp := resp.Span(i, 1)                  // runs of chunk i along axis 1
//		err = m.ToDeviceChunk(c, resp.Arrays["state"], host, sp)
//		// … launch kernels on m.Stream(c) over sp.Len runs …
//		err = m.FromDeviceChunk(c, host, resp.Arrays["state"], sp)
//	}
//	err = m.Sync(c)
//
// The package owns clients, shares, requests, plans and arrays. It does
// not own allocation strategy (package alloc), stream groups' bookkeeping
// (package streams) or the hardware (package device and its backends,
// which importing this package links).
package vram
