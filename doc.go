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
// # Files
//
//	manager.go, options.go  the Manager, New's options and the allocator kinds; report.go, allocconf.go
//	client.go, group.go     clients and shares; stream groups, one record each, and their queues
//	request.go, array.go    what a client asks for (ArrayRequest) and gets (DeviceArray, HostArray)
//	allocate.go, alloctx.go Client.Allocate and ArrayResponse; the transaction, step by step
//	budget.go, trim.go      the budget's rules and figures; when the allocator's cache is given back
//	plan.go, planerror.go   the chunk planner (Plan), why a plan does not fit; requestset.go, its input as JSON; errors.go, and warnings
//	evict.go, replan.go     eviction of idle clients; a budget that changes (SetCap, claims, PlanNow)
//	lease.go, leasetx.go    a budget from the node broker's lease (WithLease); its steps in Allocate
//	copy.go, hooks.go       copies on the client's stream; OnAllocated, OnInvalidate; workmarks.go, idle
//	host.go, host_ladder.go host memory: the pinned pool, the ladder; staging.go; doc.go, this map
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
//     proportion of the device's total memory. In the Active LimitMode
//     each requester's arrays fit its own cap (less what it holds beside
//     the arrays being replaced) and a group's the sum of its members'
//     caps, the group chunked as its most bound member needs; in Passive
//     (the default) caps bound nothing and a group plans within the
//     device's free memory.
//   - The handle: everything about one component is a method of its
//     *Client (Queue, Allocate, the copies, Stream, Sync, its share and
//     its group); the Manager keeps what concerns the whole process
//     (Register, the allocator, the limit mode, invalidation, streams
//     after a reset, memory info, Close).
//   - ArrayRequest{Shape, DType, Memory, ChunkAxis, Unchunkable,
//     TotalRuns}: one array (an empty Shape is a scalar). Client.Queue
//     queues a client's requests (replacing what it had queued);
//     Client.Allocate plans everything queued in the client's group
//     together (Plan) and hands each requester an ArrayResponse with its
//     DeviceArrays and HostArrays and the chunk parameters; the other
//     members (notaries) get the chunk parameters alone. Arrays queued
//     again under a label they already hold are replaced: the old ones
//     are freed once the new ones are in, so a failed Allocate leaves
//     them (only when the plan needs their memory are they freed first,
//     and a failure then calls their owners' OnInvalidate). An Allocate
//     with nothing queued sends every member the group's last plan again,
//     with no arrays.
//   - Plan: the chunk planner, a pure function (also behind `vram plan`).
//     Its budget is in the bytes the allocator charges (each array rounded
//     to the allocator's granularity, 512 B for the Pool), so a plan that
//     fits its budget fits an allocator or alloc.Limit with that much to
//     give; with PlanOptions.Cost it bounds what the allocator says the
//     arrays take from the device instead.
//   - The budget Allocate plans a group with: the device's free memory
//     (the arrays being replaced counted free) as the allocator states
//     what the arrays take from it, and, in Active mode and under a cap,
//     the room those leave; the plan has the fewest chunks that fit. The
//     rules are stated once, in budget.go; a refusal names each figure
//     and what would raise the one that binds.
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
//     done with the work before each End; package batch marks its clients.
//     ClientOptions.NoEvict opts out, and a client with no OnInvalidate
//     is never evicted.
//   - A budget that changes while the manager runs (replan.go): SetCap
//     sets the cap (the door a broker's lease drives), and a group whose
//     Allocate fails for want of memory busy groups hold claims it back.
//     Each change is a BudgetChange (counted, explained; WaitBudgetChange
//     waits for the next); PlanNow says what a group's arrays would be
//     planned at now, which a running batch asks between chunks, and
//     WaitWithinCap waits until the arrays are back within a lowered cap.
//   - Warnings through the manager's log/slog logger, before the plan: a
//     group that holds more than 95% of its caps in Active mode, and a
//     group whose requests are more than 20 times the device's free
//     memory.
//
// # Batches
//
// Package batch (github.com/vramkit/vram/batch) runs an allocated batch
// chunk by chunk, with buffers in flight, staging through the staging
// pool, outputs written behind the device, cancellation, progress and a
// report, on one device or several, re-planning its chunks between them
// when the budget changes; it is built on this package's exported API
// alone, and this package does not import it.
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
// package batch's runs. A cancelled call returns an error wrapping ctx.Err() and
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
//	for i := range resp.Plan.Chunks {
//		sp, err := resp.Span(i, 1)             // runs of chunk i along axis 1
//		err = c.ToDeviceChunk(ctx, resp.Arrays()["state"], host, sp)
//		// … launch kernels on c.Stream() over sp.Len runs …
//		err = c.FromDeviceChunk(ctx, host, resp.Arrays()["state"], sp)
//	}
//	err = c.Sync(ctx)
//
// Package batch does the loop above with buffers in flight, staging and
// progress.
//
// # From cubie
//
// Each name of cubie.memory (ccam80/cubie, src/cubie/memory: the
// MemoryManager, default_memmgr, StreamGroups, ArrayRequest and
// ArrayResponse, ChunkBufferPool) and its counterpart here; an instance
// argument of cubie's is the *Client a method is called on.
//
//	cubie.memory                               vram
//	default_memmgr                             Default()
//	MemoryManager(...)                         New(dev, opts...)
//	register(instance, proportion,             Manager.Register(ClientOptions{Proportion,
//	  invalidate_cache_hook,                     OnInvalidate, OnAllocated, Group}) → *Client
//	  allocation_ready_hook, stream_group)
//	register(..., owner=...)                   none: the unit of eviction is the client
//	register(..., host_spill_threshold,        HostOptions (WithHostOptions), per manager
//	  spill_directory)
//	set_limit_mode(mode)                       Manager.SetLimitMode(Passive | Active)
//	get_memory_info()                          Manager.MemInfo()
//	get_available_memory(group)                ArrayResponse.Plan.Budget, the budget Allocate planned with
//	manual_pool_proportion                     Manager.Shares().Manual
//	auto_pool_proportion                       Manager.Shares().Auto
//	invalidate_all()                           Manager.InvalidateAll()
//	reinit_streams()                           Manager.ReinitStreams()
//	free(array_label)                          Manager.Free(label); one client's: Client.Free(label)
//	free_all()                                 Manager.FreeAll()
//	create_host_array(shape, dtype,            Manager.NewHostArray(shape, dtype, mem, like),
//	  memory_type, like)                         mem Pinned or Pageable ("host"); "memmap": Host().Alloc
//	                                             with HostArrayOptions{Rung: RungFile}
//	choose_host_memory_type(nbytes, ...)       Manager.Host().Alloc(shape, dtype, HostArrayOptions{})
//	release_host_array(array)                  HostArray.Free()
//	pinned_max_bytes                           HostOptions.PinnedLimit (of all pinned bytes)
//	ChunkBufferPool: acquire, release, clear   Manager.Host().Staging(): Acquire(ctx, n), Release, Trim
//	queue_request(instance, requests)          Client.Queue(requests)
//	allocate_queue(triggering_instance)        Client.Allocate(ctx, opts...)
//	get_chunk_parameters(requests, ...)        Plan(requests, budget, opts)
//	compute_chunked_shapes(...)                ChunkPlan.ChunkedShapes, ArrayResponse.ChunkedShapes()
//	is_request_chunkable(request)              ArrayRequest.Chunkable()
//	get_portioned_request_size(requests)       ChunkPlan.UnchunkableBytes, FullBytes
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
//	begin_work(owner)                          Client.BeginWork() → *Work
//	end_work(owner, stream)                    Work.End(); Client.Idle()
//	(idle-owner eviction)                      Allocate's evict step; ClientOptions.NoEvict,
//	                                             OnInvalidate(reason) with ErrEvicted
//	(its warnings)                             the manager's slog logger (WithLogger)
//	StreamGroups.add_instance(i, group)        ClientOptions.Group at Register
//	StreamGroups.change_group(i, group)        Client.ChangeStreamGroup(group)
//	StreamGroups.get_group(i)                  Client.Group()
//	StreamGroups.get_instances_in_group(g)     Manager.GroupMembers(group)
//	StreamGroups.get_stream(i)                 Client.Stream()
//	StreamGroups.get_group_stream(g)           streams.Groups.Ensure(group) (package streams)
//	StreamGroups.reinit_streams()              Manager.ReinitStreams()
//	ArrayRequest, ArrayResponse                ArrayRequest, ArrayResponse
//	CuPyAsyncNumbaManager (its one allocator)  AsyncPool (alloc.AsyncPool); see "Allocator"
//	current_cupy_stream(nb_stream)             none: launch on Client.Stream()
//	(none)                                     Manager.SetAllocator(Pool | AsyncPool | Direct)
//
// Where vram follows cubie: Queue replaces the client's queued set;
// setting a client's limit mode to the one it has does nothing; the
// Passive mode computes caps and enforces none; the auto pool splits what
// manual clients leave equally and keeps 5% (MinAutoPool) while it has
// clients, and a manual total past 95% with no auto client is allowed
// with a warning; an empty shape is a scalar, never chunked; a request is
// unchunkable when marked so, when its shape has no chunk axis or when
// that axis has length 1; like is broadcast as NumPy broadcasts arr[:] =
// like; Client.Free of a label the client holds nothing under warns, and
// Manager.Free of a label nobody holds is silent; an Allocate with
// nothing queued sends the group's last plan again; eviction frees whole
// idle clients of other groups, least recently used first, never one
// with work in flight; the warnings are checked before the plan; a chunk
// index out of range is an error (ErrChunkRange), as it is an IndexError
// in Python.
//
// Where vram differs from cubie, and why (the ported tests in
// cubie_test.go that meet a difference check vram's rule and skip, naming
// its entry here):
//
//   - Balanced chunks: cubie fills each chunk to the budget
//     (⌊runs/ratio⌋ runs) and leaves a short last one; vram splits the
//     runs into the fewest chunks that fit, each of ⌈runs/chunks⌉, so the
//     passes take even time.
//   - Chunk axis: cubie's chunk_axis_index defaults to 2, the run axis of
//     its (time, variable, run) arrays, and None makes a request
//     unchunkable; vram's ChunkAxis is 0 unless set and an unchunkable
//     request says Unchunkable. Go's zero value is 0: a default of 2 would
//     make ChunkAxis: 0 impossible to write. A request whose TotalRuns is
//     another axis' length (a cubie request ported with no axis) is
//     refused naming that axis; one with no TotalRuns is chunked along
//     axis 0, so a port names its run axis.
//   - Runs: cubie takes the runs from the first request's total_runs (≥ 1,
//     default 1) and chunks every request by it, cutting one of another
//     length to the wrong shape; vram's TotalRuns 0 means the length of
//     the chunk axis, and chunkable requests planned together that
//     disagree are refused (ErrRunsMismatch).
//   - Element types: cubie takes float64, float32 and int32 only; vram
//     also int64, uint8, uint32, complex64 and complex128, and refuses
//     what it does not know.
//   - Memory types: cubie's requests are device or pinned; vram's are also
//     Mapped (pinned memory kernels reach) and Pageable; both refuse
//     managed memory.
//   - Host arrays and the budget: cubie counts pinned requests in the
//     device budget; vram counts device arrays only: pinned, mapped and
//     pageable arrays spend host memory, which the host ladder's limits
//     govern.
//   - Budget: cubie plans with the larger of its two estimates (free
//     memory, or the group's caps less what it holds) and counts arrays
//     at their bytes; vram plans with the smallest of the device's free
//     memory (after trimming the allocator's cache), the Active caps and
//     an allocation cap, and counts each array as the allocator charges
//     and the device pages it (so a plan that says it fits does fit).
//   - Held bytes: cubie's allocated_bytes sums the arrays' nbytes; vram's
//     Client.Held sums them as the allocator charges them (rounded to its
//     granularity), the figure caps are counted in.
//   - Active mode: cubie bounds a group by the sum of its members' caps;
//     vram bounds each requester by its own cap as well (a 50% client
//     once held 37 MiB of a 64 MiB device beside an idle 50% member), the
//     group chunked as the most bound member needs, so that a proportion
//     means something for one client.
//   - Proportions: cubie's set_manual_proportion takes 0, and a refusal
//     leaves the instance in no pool; vram's takes 0 < p ≤ 1 (0 is the
//     auto pool) and a refusal changes nothing. cubie compares the float
//     1 − (its sum of manual proportions) with 5% and refuses an auto
//     client unless it is above: where exactly 5% is left, it takes one
//     when the sum rounds to 0.95 or below (0.95; 0.5 + 0.45) and refuses
//     one when it rounds above (0.9 + 0.05); vram sums in fixed point
//     (10⁻¹² of the total) and takes it in every such case.
//   - Clients with no OnInvalidate: cubie refuses queue_request from an
//     instance registered without a live invalidate hook, since it could
//     be evicted unawares; vram lets it queue and never evicts it (as
//     NoEvict). A refusal is defeated by a hook that does nothing, which
//     makes the eviction silent again; the missing hook is the one honest
//     sign that the client cannot drop its arrays, and a program of one
//     client needs none.
//   - Handles, not objects: cubie keys its registry by id(instance), so
//     an instance registered twice is refused and a collected one's id
//     may be reused; Register returns a new handle each time, with an id
//     never reused, so neither can happen.
//   - Close, not the collector: cubie releases a collected instance's
//     share and arrays at its next call; vram releases them at
//     Client.Close only. The registry holds every open client (its group,
//     its queue), so none is unreachable before Close, and a release timed
//     by the collector would free device memory at a moment nobody chose;
//     Manager.Clients lists the open ones, to find one never closed.
//   - Eviction: cubie may evict an idle member of the allocating group
//     that queued nothing; vram never evicts the group's own members, who
//     are planned and run with it (evicting one moves the shortage to the
//     group's next Allocate). cubie evicts in the Active mode only when
//     the whole request would fit the cap; vram evicts whenever freeing
//     memory lowers the plan's chunk count, so where the cap binds it
//     evicts nothing (as cubie) and where the device binds under the cap
//     it does. cubie's least-recently-used clock counts begin_work only;
//     vram's counts allocations, BeginWork and End, so a client allocated
//     a moment ago is not the first to go. When eviction cannot avoid
//     chunking, cubie evicts every candidate; vram only those the fewest
//     chunks it can reach need. cubie evicts an owner's registrations
//     together; vram evicts clients, its unit of everything.
//   - Work marks: cubie's begin_work and end_work set one flag, so
//     begin, begin, end leaves it idle; vram's marks nest (each BeginWork
//     returns a Work whose End closes it), since goroutines sharing a
//     client would otherwise mark it idle under each other's work.
//   - Nothing queued: cubie's allocate_queue with nothing queued and no
//     cached plan does nothing; vram's Allocate returns ErrNothingQueued,
//     saying so. With a plan, cubie sends it to the owner's peers and vram
//     to every member of the group.
//   - Re-planning: cubie keeps a partition cached per (group, owner) and
//     reuses it while a peer that is not reallocating holds arrays laid
//     out for it, whatever memory is free now; vram plans the group afresh
//     each time, against the memory there is, and tells every member the
//     new plan; a member holding chunked arrays queues them again with its
//     group.
//   - Allocator: cubie's only allocator is CuPy's stream-ordered async
//     pool; vram's default is Pool (a caching allocator: expandable
//     segments where the device has virtual memory management), which
//     holds less beside the live bytes on the traces in BENCHMARKS.md and
//     is measured there; AsyncPool is cubie's (WithAllocator(AsyncPool),
//     or $VRAM_ALLOC_CONF), and SetAllocator changes it at run time.
//   - Host ladder: cubie's limits are per array (pinned up to
//     pinned_max_bytes, 1 GiB; a memmap above 80% of the total RAM);
//     vram's count what is live (pinned while the pinned total stays under
//     PinnedLimit, a quarter of RAM; a file once the RAM available less
//     RAM/16, or the host Limit, is used up). Pinned memory is a host-wide
//     resource: ten arrays of 1 GiB pin 10 GiB under a per-array cap, so
//     only a total bounds it; and a pageable array that does not fit the
//     RAM available swaps or has the process killed, whatever the total
//     RAM says. So a 2 GiB array is pinned when the total allows it, where
//     cubie makes it pageable and stages it.
//   - Staging: cubie's pool keys buffers by array name, shape and dtype,
//     always makes a label's first buffer (past its RAM headroom) and
//     stages in blocks of at most 64 MiB; vram's buffers are bytes, any
//     one large enough serves (so a chunk's shorter last piece needs no new
//     one), a request that cannot fit with nothing in use fails at once
//     with ErrOutOfMemory naming the limits (a buffer past them is how a
//     batch gets the process killed), and a chunk is staged whole, one
//     copy per array, with fewer chunks ahead when the limits allow fewer
//     buffers. cubie's clear forgets every buffer, those in use too (they
//     are freed when their users drop them); vram's Trim frees the idle
//     ones, and a buffer in use comes back idle at its Release, for the
//     next Trim: the pool never loses count of pinned memory it made.
//   - Staging growth: cubie grows its pool while the RAM available after
//     the new buffer stays above 20% of the total RAM, counting no pinned
//     total, and past that bound for an array name, shape and dtype none
//     of whose buffers is in flight, even while other names' buffers are;
//     vram grows while the pinned limit, the host limit and RAM/16 of
//     headroom allow (idle buffers of other sizes giving way), and past
//     them for nobody: a request waits for any buffer in use to come back,
//     since a buffer past the limits is one more pinned buffer the host
//     cannot spare, whichever array it is for.
//   - Moving a queue: cubie keeps queued requests under the stream group
//     they were queued in, so change_stream_group strands them: the old
//     group's next allocate_queue allocates them and the new group's never
//     sees them; ChangeStreamGroup moves them with the client, to its new
//     group's next Allocate.
//   - Empty requests: cubie's queue_request with an empty dict queues it,
//     and the next allocate_queue answers it with no arrays and a plan of
//     one chunk of one run, which replaces the group's stored plan; vram's
//     Queue with an empty map drops the client's queue, so an Allocate
//     with nothing else queued sends the group's last plan again.
//   - Pinned arrays: cubie's response holds pinned arrays in arr beside
//     the device arrays; vram's Arrays holds the device arrays and Host
//     the pinned, mapped and pageable ones: a HostArray is host memory, a
//     different type from a DeviceArray, that a kernel cannot be given as
//     one.
//   - Copy shapes: cubie's to_device and from_device copy the host array's
//     bytes whatever the two shapes (on a GPU, as many bytes as the host
//     array holds, so a larger one runs past the device array); vram's
//     copies refuse a dtype or shape mismatch (ErrMismatch) with nothing
//     enqueued.
//   - Leaving a group: cubie's StreamGroups.remove_instance of an id in no
//     group does nothing; streams.Groups.Remove fails with ErrNotGrouped,
//     since a remove of what is not there is a caller's bookkeeping gone
//     wrong.
//   - Work after eviction: cubie's begin_work marks an evicted owner busy
//     like any other; vram's BeginWork of a client whose arrays were
//     evicted fails with ErrEvicted and marks nothing, since the work it
//     announces would use freed memory: the client queues and allocates
//     again first.
//   - Warnings: as cubie's (the 95% of the caps in Active mode, before the
//     plan; the group's whole request against the device's free memory,
//     20 times, on a refused plan too), except that the arrays being
//     replaced count as free in the 95%, as the budget counts them, so a
//     repeat run of the same arrays is not warned of.
//   - Arrays come from Allocate: cubie's allocate and allocate_all make
//     arrays beside the plan; every vram device array is planned and
//     counted, through Queue and Allocate.
//   - Responses: an ArrayResponse is made by Allocate (its zero value is
//     no response), and carries more than cubie's: the host arrays, every
//     buffer, the whole plan, the runs.
//   - Stream groups: cubie keeps a group and its stream once made, even
//     with no member, and get_group_stream makes one for a name; vram's
//     group lives while it has members (streams.Groups.Ensure makes one
//     without), and the last member to leave closes its stream.
//   - No device: cubie's manager made where CUDA is missing warns and
//     manages 1 byte; New returns the device's error (device.Open("auto")
//     falls back to the simulator, which is a device).
//   - Python machinery: what has no Go counterpart: Numba and CuPy stream
//     wrappers and their pointers, attrs validators of Python types
//     (tuples, None, negative integers where Go's types cannot hold
//     them), weak references to bound methods, CUDA context checks.
//
// vram.cubie, the Python drop-in for cubie.memory served by this package
// through libvram, follows cubie where vram's rule does not protect the
// user: Chunk axis, Element types, Memory types, Held bytes, Clients with
// no OnInvalidate, Handles not objects, Close not the collector (at the
// drop-in's next call), Work marks, Nothing queued (with no plan), Host
// ladder, Staging, Staging growth, Pinned arrays, Leaving a group,
// Warnings, Arrays come from Allocate, Responses, Stream groups, No device
// and Python machinery. It keeps vram's rule, planned and decided here,
// on Balanced chunks, Runs, Host arrays and the budget, Budget, Active
// mode, Proportions, Eviction, Nothing queued (with a plan), Re-planning,
// Allocator, Moving a queue, Empty requests, Copy shapes (Numba's checked
// copies) and Work after eviction. docs/cubie.md says how each shows.
//
// The package owns clients, shares, requests, plans and arrays. It does
// not own allocation strategy (package alloc), stream groups' bookkeeping
// (package streams) or the hardware (package device and its backends,
// which importing this package links).
package vram
