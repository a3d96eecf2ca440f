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
//   - The handle: everything about one component is a method of its
//     *Client (Queue, Allocate, the copies, Stream, Sync, its share and
//     its group); the Manager keeps what concerns the whole process
//     (Register, the allocator, the limit mode, invalidation, streams
//     after a reset, memory info, Close).
//   - ArrayRequest{Shape, DType, Memory, ChunkAxis, Unchunkable,
//     TotalRuns}: one array. Client.Queue queues a client's requests
//     (replacing what it had queued);
//     Client.Allocate plans everything queued in the client's group
//     together (Plan) and hands each requester an ArrayResponse with its
//     DeviceArrays and HostArrays and the chunk parameters; the other
//     members (notaries) get the chunk parameters alone. Arrays queued
//     again under a label they already hold are replaced: the old ones
//     are freed once the new ones are in, so a failed Allocate leaves
//     them (only when the plan needs their memory are they freed first,
//     and a failure then calls their owners' OnInvalidate).
//   - Plan: the chunk planner, a pure function (also behind `vram plan`).
//     Its budget is in the bytes the allocator charges (each array rounded
//     to the allocator's granularity, 512 B for the Pool), so a plan that
//     fits its budget fits an allocator or alloc.Limit with that much to
//     give; with PlanOptions.Cost it bounds what the allocator says the
//     arrays take from the device instead.
//   - The budget Allocate plans a group with, once: the device's free
//     memory (the allocator's cache trimmed only when the plan falls
//     short for want of memory: trim.go) plus the arrays being
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
//   - Copies: Client.ToDevice, FromDevice, and ToDeviceChunk /
//     FromDeviceChunk, which move one chunk's runs between a full-length
//     host array and a chunk-length device array, all ordered on the
//     client's stream; Client.Sync waits for them.
//   - SetAllocator(Direct | Pool | AsyncPool) frees everything, calls every
//     OnInvalidate and gives every group a fresh stream. The Pool kind is
//     alloc.Expandable (expandable segments) where the device manages
//     virtual memory (device.VirtualMemory: the simulator, CUDA), else the
//     segment alloc.Pool; WithExpandable chooses, and a WithPoolConfig
//     configuration asks for the segment Pool.
//   - Eviction: when Allocate cannot fit a group, or chunks it more than
//     the memory of idle clients of other groups would allow, it frees
//     those clients' arrays, least recently used first and only as many
//     as the plan needs, and calls their OnInvalidate with a reason
//     wrapping ErrEvicted; their arrays then fail with ErrEvicted until
//     they allocate again. Idle means no work mark open
//     (Client.BeginWork … Work.End, which records an event) and the GPU
//     done with the work before each End; RunBatch marks its clients.
//     ClientOptions.NoEvict opts out.
//   - Warnings through the manager's log/slog logger: a group past 95% of
//     its caps in Active mode, and a client's requests more than 20 times
//     the memory its group could plan with.
//
// # Batches
//
// RunBatch(ctx, c, Batch{...}) runs an allocated batch chunk by chunk:
// for each chunk it copies the inputs in, calls the Compute step (which
// enqueues the chunk's kernels, usually Chunk.Launch of a portable
// kernel), and copies the outputs back, then waits for each chunk a
// buffer or two behind the one it enqueues. The host side of each array
// is a full-length host array (In, Out; pinned or mapped ones are copied
// from directly, pageable and file-backed ones staged through the
// manager's staging pool of pinned chunk buffers, Host().Staging()) or a function that fills
// or drains a pinned staging buffer chunk by chunk (InFunc, OutFunc).
// When the pool cannot give every buffer the batch wants (a host limit
// below two chunks), the batch keeps fewer chunks ahead
// (BatchReport.Lag) and, if need be, fewer buffers in flight. With one buffer every step runs on the group's
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
// RunBatches(ctx, parts, MultiOptions{...}) runs one batch on several
// devices: one BatchPart (a client and its Batch) per device's manager.
// One chunking of the runs is dealt to whichever device has a buffer
// free, each device's pipeline on its own goroutine locked to its OS
// thread; each chunk lands at its runs, so the results do not depend on
// the dealing. The MultiReport says how many chunks each device took.
//
// # Host memory
//
// Manager.Host().Alloc puts a host array on the host ladder: pinned while the
// pinned bytes stay under HostOptions.PinnedLimit (by default
// DefaultPinnedFraction of the host's RAM), then pageable while the host
// limit (HostOptions.Limit) and the RAM available allow, then a
// memory-mapped .npy file in the spill directory (HostOptions.SpillDir or
// $VRAM_SPILL_DIR), removed when the array is freed unless kept.
// HostArray.Placement says which rung and why (also logged at debug
// level); Host().Stats counts each rung, and a Free takes off exactly what
// the array took. Host().Open maps an existing .npy file. Package npy
// reads and writes .npy files in parts, at offsets.
//
// Kernels that run on both the simulator and CUDA come from package
// kernel: one value with PTX for CUDA and a Go function, given typed,
// little-endian views of the same arrays, for the simulator.
//
// # Concurrency
//
// A Manager, its Clients and the arrays' accessors are safe for
// concurrent use. Registration, Close, share changes and group lookups
// cost O(1) in the number of clients. Allocate calls are serialized
// from reading the device's free memory to their last allocation, so two
// groups never plan against the same free memory; copies, frees and
// registration run in parallel with them. No
// hook is ever called with a lock held, so hooks may call the manager. A
// client's hooks come one at a time, in the order of their events (an
// OnAllocated before the OnInvalidate of a later invalidation), on the
// goroutine whose call caused them (Allocate, SetAllocator,
// InvalidateAll) unless another is delivering that client's earlier hook,
// which then delivers the later one too. Device memory follows the stream
// contract of package device: work on one stream is ordered; an array
// used on two streams needs an event or a Sync between the uses, and a
// host array must stay untouched while a copy that uses it is in flight
// (until Sync). The manager frees an array ordered after the stream it
// was last copied on, even when its client has moved to another group
// since. A stream group lives while it has clients: the last one to leave
// (Close, ChangeStreamGroup) removes it, and its stream is closed in the
// background once the stream's work is done (the call does not wait for
// it).
// Errors wrap package sentinels (ErrOutOfMemory, ErrUnchunkable,
// ErrRunTooLarge, ErrProportion, …) with the figures that explain them;
// test them with errors.Is. A call that fails leaves the manager as it
// was, except where its documentation says otherwise.
//
// # Context
//
// Every call that may wait takes a context.Context first:
// Client.Allocate (it may wait behind another allocation of its group, or
// of any group while that one plans and allocates, and for the trim of
// the allocator's cache), Client.Sync, the four copies (a copy into
// pageable host memory returns, on CUDA, only once it is done) and
// RunBatch. A cancelled call returns an error wrapping ctx.Err() and
// leaves the queue, every client's arrays and the registry as they were
// (an Allocate cancelled after its plan may have trimmed the allocator's
// cache, giving cached free memory back to the device). The allocator itself never
// waits for memory (it fails with ErrOutOfMemory), so Allocate checks
// ctx before it starts, while it waits for its locks, while it trims the
// cache (only when its plan falls short for want of memory: a trim waits
// for the streams the cached blocks were last used on, another group's
// too; abandoned, it finishes in the background) and once more after its
// plan, before it frees or allocates anything; past that it completes. A cancelled Sync returns at once; the device work goes on,
// and SetAllocator, ReinitStreams and Close still wait for it. A copy
// checks ctx before it enqueues; a driver call in progress cannot be
// abandoned. The calls that take no context do not wait for device
// work, except for work already enqueued on a stream they close or
// replace (Manager.Close, SetAllocator, ReinitStreams, a free ordered
// after the stream of a group left empty) and, for SetAllocator,
// ReinitStreams and Manager.Close, for a Sync, copy, trim or Allocate in
// progress: they must finish to leave the
// manager consistent, so they cannot be abandoned half-way. Under the
// Direct allocator every free (Free, FreeAll, Close, a re-allocation, an
// eviction) also waits, as cuMemFree does, for the work of every stream
// of the device; the pools free without waiting.
//
// # Usage
//
//	m, err := vram.Default()                   // or vram.New(dev)
//	c, err := m.Register(vram.ClientOptions{Name: "solver", Group: "batch"})
//	defer c.Close()
//	err = c.Queue(map[string]vram.ArrayRequest{
//		"state": {Shape: []int{2, runs}, DType: vram.Float32, ChunkAxis: 1},
//		"consts": {Shape: []int{16}, DType: vram.Float32, Unchunkable: true},
//	})
//	resp, err := c.Allocate(ctx)                // plans, chunks if needed
//	host, err := m.NewHostArray([]int{2, runs}, vram.Float32, vram.Pinned, nil)
//	for i := range resp.Chunks {
//		sp, err := resp.Span(i, 1)             // runs of chunk i along axis 1
//		err = c.ToDeviceChunk(ctx, resp.Arrays["state"], host, sp)
//		// … launch kernels on c.Stream() over sp.Len runs …
//		err = c.FromDeviceChunk(ctx, host, resp.Arrays["state"], sp)
//	}
//	err = c.Sync(ctx)
//
// RunBatch does the loop above with buffers in flight, staging and
// progress.
//
// # From cubie
//
// Each name of cubie.memory (the MemoryManager, default_memmgr,
// StreamGroups and the allocator plugins) and its counterpart here; an
// instance argument of cubie's is the *Client a method is called on.
//
//	cubie.memory                               vram
//	default_memmgr                             Default()
//	MemoryManager(...)                         New(dev, opts...)
//	register(instance, proportion,             Manager.Register(ClientOptions{Proportion,
//	  invalidate_cache_hook,                     OnInvalidate, OnAllocated, Group}) → *Client
//	  allocation_ready_hook, stream_group)
//	set_allocator(name)                        Manager.SetAllocator(Pool | AsyncPool | Direct)
//	set_limit_mode(mode)                       Manager.SetLimitMode(Passive | Active)
//	get_memory_info()                          Manager.MemInfo()
//	manual_pool_proportion                     Manager.Shares().Manual
//	auto_pool_proportion                       Manager.Shares().Auto
//	invalidate_all()                           Manager.InvalidateAll()
//	reinit_streams()                           Manager.ReinitStreams()
//	free(array_label)                          Manager.Free(label); one client's: Client.Free(label)
//	free_all()                                 Manager.FreeAll()
//	create_host_array(shape, dtype,            Manager.NewHostArray(shape, dtype, mem, like)
//	  memory_type, like)
//	(newer) host memory chosen per array      Manager.Host().Alloc(shape, dtype, HostArrayOptions{})
//	(newer) ChunkBufferPool                    Manager.Host().Staging(): Acquire(ctx, n), AcquireSet, Release
//	queue_request(instance, requests)          Client.Queue(requests)
//	allocate_queue(triggering_instance)        Client.Allocate(ctx, opts...)
//	to_device(instance, from, to)              Client.ToDevice(ctx, dst, src), ToDeviceChunk
//	from_device(instance, from, to)            Client.FromDevice(ctx, dst, src), FromDeviceChunk
//	sync_stream(instance)                      Client.Sync(ctx)
//	get_stream(instance)                       Client.Stream()
//	get_stream_group(instance)                 Client.Group()
//	change_stream_group(instance, group)       Client.ChangeStreamGroup(group)
//	is_grouped(instance)                       Client.IsGrouped()
//	proportion(instance)                       Client.Proportion()
//	cap(instance)                              Client.Cap()
//	set_manual_proportion(instance, p)         Client.SetManualProportion(p)
//	set_manual_limit_mode(instance, p)         Client.SetManualLimitMode(p)
//	set_auto_limit_mode(instance)              Client.SetAutoLimitMode()
//	StreamGroups.add_instance(i, group)        ClientOptions.Group at Register
//	StreamGroups.change_group(i, group)        Client.ChangeStreamGroup(group)
//	StreamGroups.get_group(i)                  Client.Group()
//	StreamGroups.get_instances_in_group(g)     Manager.GroupMembers(group)
//	StreamGroups.get_stream(i)                 Client.Stream()
//	StreamGroups.reinit_streams()              Manager.ReinitStreams()
//	ArrayRequest, ArrayResponse                ArrayRequest, ArrayResponse
//	CuPySyncNumbaManager                       Pool (alloc.Expandable with virtual
//	                                             memory, else alloc.Pool)
//	CuPyAsyncNumbaManager                      AsyncPool (alloc.AsyncPool)
//	Numba's default memory manager             Direct (alloc.Direct)
//	current_cupy_stream(nb_stream)             none: launch on Client.Stream()
//	(newer) idle-owner eviction                Allocate's evict step; ClientOptions.NoEvict,
//	                                             OnInvalidate(reason) with ErrEvicted
//	(newer) work marks                         Client.BeginWork() → *Work; Work.End(); Client.Idle()
//	(newer) cap and large-request warnings     the manager's slog logger (WithLogger)
//	allocator names cupy, cupy_async, default  ParseAllocatorKind: Pool, AsyncPool, Direct
//
// Where vram follows cubie: Queue replaces the client's queued set;
// setting a client's limit mode to the one it has does nothing; a chunk
// index out of range is an error (ErrChunkRange), as it is an IndexError
// in Python. Where vram differs on purpose:
//
//   - Chunk lengths are balanced: the runs are split into the fewest
//     chunks that fit, each of ⌈runs/chunks⌉ runs, so the last is not a
//     sliver (rather than chunks filled to the budget and a short last
//     one): the passes take even time.
//   - The chunk axis is 0 by default (ArrayRequest.ChunkAxis): the
//     first axis of a row-major array of runs; a request names another.
//   - Host arrays (Pinned, Mapped, Pageable) are not charged to the
//     device budget or to a client's cap: they spend host memory, which
//     the host ladder and its limits govern.
//   - Chunkable requests planned together that disagree on their number
//     of runs are refused (ErrRunsMismatch) instead of chunked by the
//     first one's count, which would copy the wrong runs of the others.
//
// The package owns clients, shares, requests, plans and arrays. It does
// not own allocation strategy (package alloc), stream groups' bookkeeping
// (package streams) or the hardware (package device and its backends,
// which importing this package links).
package vram
