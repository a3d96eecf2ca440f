/*
 * vram.h: the C contract of libvram, vram's memory manager as a shared
 * library (go build -buildmode=c-shared ./libvram). ABI version 2: version
 * 1's allocator API, unchanged, and the manager's client API (clients,
 * stream groups, requests, chunked allocation, copies, hooks; below the
 * framework hooks). A library serves programs built for its version and
 * every earlier one: check vram_abi_version() >= the version you need.
 * Within a version, a minor version adds entry points and fields at the
 * end of sized structs, and changes none (marked "(2.1)"): check
 * vram_abi_minor() too when you use them ("(2.2)" likewise).
 *
 * One manager per device per process: every framework that allocates on a
 * device through this library (PyTorch's pluggable allocator, CuPy's
 * allocator hook, Numba's EMM plugin, C code) draws from one pool and is
 * counted against one cap, which refuses an allocation before the device
 * is asked.
 *
 * Rules every function keeps:
 *   - It returns VRAM_OK (0) or a negative status; on failure the calling
 *     thread's last error (vram_last_error) says what and why, in one line.
 *   - A failed call changes nothing but the failure counters of the stats.
 *   - Every function is safe to call from any thread at any time.
 *   - It runs on the calling thread. On CUDA it uses the GPU's primary
 *     context (the one the CUDA runtime, PyTorch, CuPy and Numba use) and
 *     puts back whatever context was current on the thread before it
 *     returns; a thread whose current context is another context of the
 *     same GPU is refused (VRAM_EDEVICE): pointers are not valid across
 *     contexts.
 *   - In a process forked from the one that loaded the library every
 *     function but vram_abi_version, vram_strerror and vram_last_error
 *     fails with VRAM_EFORK without entering the Go runtime (which does not
 *     survive fork); the hooks return NULL or do nothing. Start children
 *     that use vram with exec (Python's multiprocessing "spawn"). The pid
 *     is compared in a pthread_atfork handler, which fork() runs; a child
 *     made by a raw clone system call is not detected. The same handler
 *     closes the child's copies of the connections to a broker
 *     (vram_open_lease), so that a lease ends with the process that
 *     holds it, not with the last of its children.
 *   - The library is never unloaded (Go's linker marks it -z nodelete:
 *     the Go runtime cannot be unloaded), installs no signal handlers
 *     beyond the Go runtime's own (SIGBUS, SIGFPE, SIGSEGV, SIGPIPE, and
 *     SIGURG for its goroutine preemption), keeps the program's, and
 *     writes nothing to stdout or stderr.
 *
 * Streams. A stream is named by its handle, the cudaStream_t (a CUstream)
 * of the framework; 0 is the legacy default stream. Memory allocated on a
 * stream may be used by work on that stream at once, and on another only
 * once that stream is ordered after the allocation (CUDA's stream-ordered
 * allocator contract). A free names the stream of the memory's last use;
 * the memory is reused on that stream at once and on other streams only
 * after an event recorded there at the free has completed.
 * VRAM_STREAM_UNORDERED is for callers that know no stream: the allocation
 * is memory no earlier work is pending on (fresh, or freed with an event
 * seen complete since), so it is safe on any stream; the free is ordered on
 * the legacy default stream, which follows all earlier work of every
 * blocking stream; work on a non-blocking stream must be synchronized
 * before its memory is freed unordered. An allocation on
 * cudaStreamPerThread (handle 2), one handle for every thread's own
 * stream, is made as an unordered one on CUDA. On the simulator
 * (no GPU) a handle is only a key: each distinct key has a stream of its
 * own, at most 256 of them.
 *
 * A budget from a node broker's lease (vram broker) comes from
 * vram_open_lease instead of vram_open; everything after opening is the
 * same.
 */
#ifndef VRAM_H
#define VRAM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define VRAM_ABI_VERSION 2
#define VRAM_ABI_MINOR 2

/* Status codes. */
enum vram_status {
	VRAM_OK = 0,
	VRAM_EINVAL = -1,   /* an argument out of range: NULL out-parameter, zero size, bad spec or source */
	VRAM_ENOMEM = -2,   /* out of memory: past the cap (refused before the device was asked), or the device full */
	VRAM_EHANDLE = -3,  /* no open manager has that handle, or none is open on the device a hook names */
	VRAM_EPTR = -4,     /* a pointer the manager did not hand out, one freed already, or freed with another size */
	VRAM_ENODEV = -5,   /* the device cannot be opened here: no driver, no GPU, no such ordinal */
	VRAM_EBUSY = -6,    /* a manager is already open on the device; or, closing, allocations are still live */
	VRAM_EFORK = -7,    /* called in a process forked from the one that loaded the library */
	VRAM_ERANGE = -8,   /* a buffer too small: *needed says how many bytes the text takes, with its NUL */
	VRAM_EDEVICE = -9,  /* any other device or driver error, or an internal error */
	VRAM_EFREED = -10,  /* (ABI 2) an array the manager has freed (a later allocation under its label, a free, an invalidation) or evicted for another group: queue and allocate again */
	VRAM_ENOTSUP = -11, /* (ABI 2) the device cannot do it: managed memory, the host address of a GPU's memory */
};

/* A manager: a handle > 0, never reused within a process. */
typedef int64_t vram_manager;

/* A stream handle: a cudaStream_t / CUstream value, 0 the legacy default stream. */
typedef uintptr_t vram_stream;
#define VRAM_STREAM_UNORDERED ((vram_stream)UINTPTR_MAX)

/* The framework an allocation is counted under. */
enum vram_source {
	VRAM_SOURCE_C = 0,
	VRAM_SOURCE_TORCH = 1,
	VRAM_SOURCE_CUPY = 2,
	VRAM_SOURCE_NUMBA = 3,
	VRAM_SOURCES = 4, /* the number of sources */
};

/* The ABI version the library was built for (VRAM_ABI_VERSION). */
int vram_abi_version(void);
/* (2.1) Its minor version (VRAM_ABI_MINOR); a library without this
 * function is 2.0. */
int vram_abi_minor(void);
/* A static description of a status code. */
const char *vram_strerror(int status);
/* Copies the calling thread's last error message (NUL-terminated, cut to
 * fit) into buf and returns its full length without the NUL; 0 when the
 * thread's last call succeeded or it made none. buf may be NULL when len
 * is 0. */
size_t vram_last_error(char *buf, size_t len);

/* Opens a manager on the device that spec names, as vram's device.Open
 * reads it: NULL or "" ($VRAM_DEVICE, else "auto"), "auto" (CUDA device 0
 * if there is a GPU, else the simulator), "cuda", "cuda:N", "sim",
 * "sim:vram=8GiB,ordinal=1". cap_bytes caps the bytes its allocations may
 * take, as the allocator charges them (0: $VRAM_ALLOC_CONF's limit, else no
 * cap). The allocator is the one $VRAM_ALLOC_CONF configures; by default
 * kind pool, which on a device that manages virtual memory (CUDA, the
 * simulator) is the expandable pool, address space mapped a granule at a
 * time, and elsewhere the segment pool; kind:async is refused. VRAM_EBUSY
 * when a manager is open on that device ordinal. */
int vram_open(const char *spec, uint64_t cap_bytes, vram_manager *out);
/* Opens a manager as vram_open does, whose budget is a lease of the node
 * broker (vram broker) on socket (NULL or "": $VRAM_BROKER, else the
 * broker's default, $XDG_RUNTIME_DIR/vram/broker.sock or
 * /run/vram/broker.sock), so that the processes on a GPU divide its memory
 * by the broker's rules. name labels the lease in `vram broker status`
 * (NULL or "": the program's name); proportion is its manual share of the
 * device, 0 < p <= 1, or 0 for the broker's auto pool; cap_bytes, when not
 * 0, bounds the lease. An allocation past the lease claims more from the
 * broker, waiting (up to the broker's reclaim deadline) for borrowers to
 * give memory back; one the broker cannot cover is VRAM_ENOMEM, refused
 * before the device is asked, with the holders named in the last error.
 * The lease ends with the manager (vram_close) or the process. VRAM_ENODEV
 * when no broker answers on socket or it serves no such device; VRAM_EINVAL
 * for a proportion or name the broker refuses. */
int vram_open_lease(const char *spec, const char *socket, const char *name, double proportion, uint64_t cap_bytes, vram_manager *out);
/* Closes a manager. VRAM_EBUSY, and nothing changes, while it has live
 * allocations. (ABI 2) Its clients are closed with it, their arrays freed,
 * and its host arrays (vram_host_array) freed; their handles, its
 * responses', work marks' and queued events' are forgotten. */
int vram_close(vram_manager m);
/* The manager open on device ordinal device. */
int vram_manager_for_device(int device, vram_manager *out);

/* Allocates size > 0 bytes for source, ordered on stream, into *out. */
int vram_alloc(vram_manager m, int source, size_t size, vram_stream stream, void **out);
/* vram_alloc through the manager open on device ordinal device, for hooks
 * that name only a device. */
int vram_alloc_on_device(int device, int source, size_t size, vram_stream stream, void **out);
/* Frees ptr, last used on stream. size is the size it was allocated with,
 * or 0 not to check it. */
int vram_free(vram_manager m, void *ptr, size_t size, vram_stream stream);
/* Returns the manager's cached free memory to the device (PyTorch's
 * empty_cache, CuPy's free_all_blocks). */
int vram_trim(vram_manager m);
/* Trims every open manager. */
int vram_trim_all(void);
/* Sets every peak (the allocator's and each source's) to its current value. */
int vram_reset_peaks(vram_manager m);

/* One source's allocations. Bytes as asked, before the allocator's rounding. */
struct vram_source_stats {
	uint64_t in_use;      /* bytes live */
	uint64_t peak_in_use; /* most bytes live at once since the last reset of peaks */
	uint64_t allocs;      /* successful allocations */
	uint64_t frees;       /* frees that took a pointer back */
	uint64_t ooms;        /* allocations refused for want of memory */
};

/* A manager's figures. Set size to sizeof(struct vram_stats) before the
 * call; a later ABI may add fields at the end, and fills only size bytes.
 * The allocator's bytes are as it spends them (after rounding). */
struct vram_stats {
	uint64_t size;
	int64_t manager;
	int32_t device;        /* the device ordinal */
	int32_t simulated;     /* 1 on the simulator, 0 on CUDA */
	uint64_t in_use;       /* bytes in live allocations */
	uint64_t peak_in_use;
	uint64_t reserved;     /* bytes held from the device: live plus cached */
	uint64_t peak_reserved;
	uint64_t allocs;
	uint64_t frees;
	uint64_t cache_hits;   /* allocations served without a device allocation */
	uint64_t device_allocs;
	uint64_t device_frees;
	uint64_t retries;      /* allocations retried after the device ran out of memory */
	uint64_t ooms;         /* allocations refused for want of memory, the cap's refusals included */
	uint64_t cap;          /* the cap in bytes, 0 if none */
	uint64_t cap_used;     /* bytes charged against the cap */
	uint64_t device_free;  /* the device's free memory, as its driver reports it */
	uint64_t device_total;
	uint64_t hook_errors;  /* hook calls that failed and could not say so (a free hook returns nothing) */
	struct vram_source_stats sources[VRAM_SOURCES];
};
int vram_stats(vram_manager m, struct vram_stats *out);
/* The same figures as one JSON object (the keys are vram_stats' field
 * names, sources an array of objects with a "source" name), into buf. */
int vram_stats_json(vram_manager m, char *buf, size_t len, size_t *needed);
/* The manager's memory report as text: allocator, cap, each source, hook
 * errors. */
int vram_report(vram_manager m, char *buf, size_t len, size_t *needed);
/* The manager's report at its last out of memory (the cap's refusals
 * included); an empty string when there has been none. */
int vram_oom_report(vram_manager m, char *buf, size_t len, size_t *needed);

/*
 * Framework hooks: each has exactly the signature its framework calls, and
 * finds the manager open on the device it is given (open one first).
 *
 * PyTorch, torch.cuda.memory.CUDAPluggableAllocator(path of
 * libvram_torch.so, "vram_torch_alloc", "vram_torch_free"), which casts
 * them to void*(size_t, int, cudaStream_t) and void(void*, size_t, int,
 * cudaStream_t) (torch/csrc/cuda/Module.cpp, _cuda_customAllocator; the
 * docstring of torch/cuda/memory.py's CUDAPluggableAllocator gives the
 * size as ssize_t and leaves the free's device out, but the cast is what
 * PyTorch calls). vram_torch_alloc is in libvram_torch.so, a C++ library
 * beside libvram.so (libvram/torch/vram_torch.cc): it throws a
 * std::runtime_error with the last error's message when it cannot
 * allocate (PyTorch raises it as RuntimeError: its pluggable allocator
 * does not check for NULL); a request of 0 bytes returns NULL.
 * vram_torch_free, in libvram.so and found through libvram_torch.so,
 * never throws; a failure counts in hook_errors. vram_torch_empty_cache is
 * for the allocator's set_reset_fn (void()), which torch.cuda.empty_cache
 * calls: it trims every manager.
 */
void *vram_torch_alloc(size_t size, int device, void *stream); /* libvram_torch.so */
void vram_torch_free(void *ptr, size_t size, int device, void *stream);
void vram_torch_empty_cache(void);
/*
 * PyTorch's other route, torch.cuda.MemPool(CUDAPluggableAllocator(path of
 * libvram.so, "vram_torch_pool_alloc", "vram_torch_free").allocator()):
 * PyTorch's own caching allocator keeps the pool's blocks and asks the
 * hook for whole segments through raw_alloc, on the current stream, and
 * checks the result (c10/cuda/CUDACachingAllocator.cpp, allocPrimitive:
 * NULL is cudaErrorMemoryAllocation). So vram_torch_pool_alloc returns
 * NULL when it cannot allocate, as vram_alloc_on_device refuses (the
 * message is the last error's; it is not a hook error): PyTorch then
 * frees its other cached blocks, asks again, and raises its
 * OutOfMemoryError. A request of 0 bytes returns NULL.
 */
void *vram_torch_pool_alloc(size_t size, int device, void *stream);

/*
 * CuPy, cupy.cuda.memory.CFunctionAllocator(param, malloc, free, owner):
 * void*(void* param, size_t size, int device) and
 * void(void* param, void* ptr, int device) (cupy/cuda/memory.pyx). param
 * is NULL, or the handle of the manager open on device cast to a pointer.
 * Both are unordered (CuPy names no stream). CuPy uses whatever malloc
 * returns, so vram_cupy_malloc, in libvram_cupy.so (C++, beside
 * libvram.so: libvram/cupy/vram_cupy.cc), never returns NULL for a
 * request it cannot serve: it throws, a std::bad_alloc with the last
 * error's message when out of memory (Python's MemoryError), else a
 * std::runtime_error. CuPy 14.2 and newer declare the hook `except +` and
 * raise what it throws; an older CuPy would end the process, and vram's
 * Python package refuses to install it there (its default, CuPy's
 * PythonFunctionAllocator, works on every version). vram_cupy_free, in
 * libvram.so, never throws; a failure counts in hook_errors.
 */
void *vram_cupy_malloc(void *param, size_t size, int device); /* libvram_cupy.so */
void vram_cupy_free(void *param, void *ptr, int device);

/*
 * The client API (ABI 2): vram's Manager and Client (the Go package's
 * documentation has the whole story; cubie.memory's MemoryManager is its
 * model). Components of a program register with a manager as clients; each
 * gets a share of the device's memory (a manual proportion, or a part of
 * the auto pool) and joins a stream group, whose members share a stream and
 * are planned together. A client queues array requests; an allocation plans
 * everything queued in its group within the group's budget and, when the
 * batch does not fit, chunks it along each request's run axis: every
 * chunkable array is allocated for a chunk of runs, and the program makes
 * one pass per chunk, copying each chunk in and out of full-length host
 * arrays. Device memory for clients comes from the same allocator, and
 * counts against the same budget, as vram_alloc's.
 *
 * Handles. Clients, responses, work marks and host arrays are named by
 * handles > 0, never reused within a process. A client's handle is its id,
 * the number in its name in plans and errors ("solver#3"). Closing the
 * manager (vram_close) closes its clients and frees their arrays; their
 * handles, and its responses', are refused afterwards (VRAM_EHANDLE).
 *
 * Hooks. The manager tells a client that its arrays are ready (a member of
 * its group allocated) or were taken away (freed by an invalidation, a
 * failed allocation that had to free them first, or evicted for another
 * group). It never calls into the program for that: each such event is
 * queued on the manager, in the order the events happened, for the clients
 * that asked for it at registration (vram_client_options.hooks), and
 * vram_poll hands them out one at a time, on whichever thread calls it.
 * Poll after each call that can cause events (vram_allocate,
 * vram_invalidate_all, vram_change_group, vram_free_all, ...); an event
 * may come after the call that caused it returns when another thread is
 * delivering the same client's earlier events, so poll again later too. A
 * client registered without VRAM_HOOK_INVALIDATE is never evicted (nothing
 * could tell it its arrays were gone).
 *
 * Arrays. A device array's memory is the manager's: it is freed by a later
 * allocation under the same label, vram_client_free, vram_free_label,
 * vram_free_all, the client's close, an invalidation or an eviction. Work
 * that uses it after that is undefined; copies through a freed array fail
 * with VRAM_EFREED. Arrays are row-major (C order). Copies are ordered on
 * the client's stream and return once enqueued: host memory passed to one
 * must stay valid, and unchanged (or, copied into, unread), until
 * vram_sync. Memory used on another stream needs that stream ordered after
 * the client's (an event) or a vram_sync first.
 */

/* A client, a response, a work mark, a host array: handles > 0. */
typedef int64_t vram_client;
typedef int64_t vram_response;
typedef int64_t vram_work;
typedef int64_t vram_host;

/* Element types (vram's DType; NumPy's names). */
enum vram_dtype {
	VRAM_FLOAT64 = 1,
	VRAM_FLOAT32 = 2,
	VRAM_INT32 = 3,
	VRAM_INT64 = 4,
	VRAM_UINT8 = 5,
	VRAM_UINT32 = 6,
	VRAM_COMPLEX64 = 7,
	VRAM_COMPLEX128 = 8,
};

/* Where an array lives (vram's MemoryType). */
enum vram_memory {
	VRAM_MEMORY_DEVICE = 0,   /* device memory, from the manager's allocator; counts against the group's budget */
	VRAM_MEMORY_PINNED = 1,   /* page-locked host memory, for asynchronous copies */
	VRAM_MEMORY_MAPPED = 2,   /* pinned host memory that kernels also reach at a device address */
	VRAM_MEMORY_MANAGED = 3,  /* refused (VRAM_ENOTSUP) */
	VRAM_MEMORY_PAGEABLE = 4, /* ordinary host memory */
};

/* How much memory a stream group may plan with (vram's LimitMode). */
enum vram_limit_mode {
	VRAM_PASSIVE = 0, /* the default: caps are computed, not enforced; a group plans within the device's free memory */
	VRAM_ACTIVE = 1,  /* each requester within its own cap, a group within the sum of its members' */
};

/* The events a client asks vram_poll to report (vram_client_options.hooks). */
enum vram_hook {
	VRAM_HOOK_ALLOCATED = 1,  /* its group was allocated: its arrays, or the plan alone */
	VRAM_HOOK_INVALIDATE = 2, /* its arrays were freed behind its back */
};

/* A client to register. Set size to sizeof(struct vram_client_options); a
 * later ABI may add fields at the end. */
struct vram_client_options {
	uint64_t size;
	const char *name;  /* labels the client in errors and plans; NULL or "": "client" */
	const char *group; /* the stream group to join, made if new; NULL or "": "default" */
	double proportion; /* a manual share of the device's memory, 0 < p <= 1; 0: the auto pool */
	int32_t no_evict;  /* non-zero: its arrays are never evicted for another group */
	uint32_t hooks;    /* VRAM_HOOK_* bits */
};

/* Registers a client of manager m. A manual proportion that would take the
 * manual total over 1, or leave the auto pool under 5% while it has
 * clients, is refused (VRAM_EINVAL); so is an auto client when the manual
 * clients leave less than 5%. */
int vram_register(vram_manager m, const struct vram_client_options *o, vram_client *out);
/* Frees the client's arrays, drops its queue and takes it out of its group
 * and the pools; its queued events are dropped. A second close is VRAM_OK. */
int vram_client_close(vram_client c);

/* A client's figures. Set size to sizeof(struct vram_client_info). */
struct vram_client_info {
	uint64_t size;
	vram_manager manager;
	double proportion;  /* its manual proportion, or its equal part of the auto pool */
	uint64_t cap;       /* proportion x the device's total memory, in bytes */
	uint64_t held;      /* device bytes its arrays take, as the allocator charges them */
	vram_stream stream; /* its group's stream: a CUstream on CUDA; on the simulator a number naming it, not a key of vram_alloc's (0 once closed) */
	int32_t closed;
	int32_t evicted;    /* its arrays were evicted and it has not been allocated since */
	int32_t idle;       /* no work mark open and the device done with the work before each end */
	int32_t grouped;    /* it shares a named stream group (not "default") with another client */
};
int vram_client_info(vram_client c, struct vram_client_info *out);
/* The name of the client's stream group. */
int vram_client_group(vram_client c, char *buf, size_t len, size_t *needed);
/* Moves the client to group (NULL or "": "default"), made if new, with
 * what it has queued; its arrays stay valid (synchronize the old group's
 * stream before using them on the new one's). */
int vram_change_group(vram_client c, const char *group);
/* Gives the client the manual proportion p (0 < p <= 1), out of the auto
 * pool if it is there; a refusal (VRAM_EINVAL) changes nothing. */
int vram_set_manual_proportion(vram_client c, double p);
/* Moves an auto client to the manual pool with proportion p; a manual
 * client keeps its proportion. */
int vram_set_manual_limit_mode(vram_client c, double p);
/* Moves a manual client to the auto pool; an auto client stays. */
int vram_set_auto_limit_mode(vram_client c);

/* One array to request. */
struct vram_request {
	const char *label;     /* the array's name, unique among the client's requests */
	const int64_t *shape;  /* ndim lengths (NULL when ndim is 0: a scalar, never chunked) */
	int32_t ndim;
	int32_t dtype;         /* enum vram_dtype */
	int32_t memory;        /* enum vram_memory */
	int32_t chunk_axis;    /* the run axis, chunked when the batch does not fit */
	int32_t unchunkable;   /* non-zero: never chunked */
	int32_t reserved;      /* 0 */
	int64_t total_runs;    /* 0: the chunk axis' length, which a non-zero value must equal */
};
/* Queues n requests, each request_size bytes apart (sizeof(struct
 * vram_request): a later ABI may add fields), replacing everything the
 * client had queued; n 0 drops its queue. An invalid request queues
 * nothing (VRAM_EINVAL, naming it; VRAM_ENOTSUP for managed memory). */
int vram_queue(vram_client c, const struct vram_request *requests, size_t n, size_t request_size);
/* Plans everything queued in the client's group together, allocates it
 * (chunked if it must be) with buffers chunk buffers in flight (0 or 1:
 * one; 2 for double buffering), and returns the client's response. Every
 * member that asked for VRAM_HOOK_ALLOCATED gets an event with its own.
 * With nothing queued it sends every member the group's last plan again,
 * allocating nothing. On failure (VRAM_ENOMEM: it does not fit, even
 * chunked, with the figures in the last error) the queue and the arrays
 * being replaced are as they were, unless the plan needed the latter's
 * memory: then the last error names them and their owners are sent
 * VRAM_HOOK_INVALIDATE events. It waits behind other allocations of the
 * manager. */
int vram_allocate(vram_client c, int buffers, vram_response *out);

/* A response's plan: the group's chunk parameters. Set size to
 * sizeof(struct vram_plan). */
struct vram_plan {
	uint64_t size;
	vram_client client;         /* the client the response is for */
	int64_t chunks;             /* passes the runs take, >= 1 */
	int64_t chunk_length;       /* runs per chunk: the length of every chunkable array's chunk axis */
	int64_t last_chunk_length;  /* runs in the last chunk */
	int64_t total_runs;
	int64_t buffers;            /* sets of chunkable arrays in flight */
	uint64_t budget;            /* the device bytes the group was planned within */
	uint64_t unchunkable_bytes; /* device bytes of the unchunkable arrays */
	uint64_t chunk_bytes;       /* device bytes of one buffer of the chunkable arrays */
	uint64_t device_bytes;      /* what the plan's device arrays take from the device */
	uint64_t full_bytes;        /* device bytes of everything unchunked */
	uint64_t host_bytes;        /* host bytes of one buffer (pinned, mapped, pageable) */
	int64_t arrays;             /* the client's arrays in buffer 0 (0 for a member that queued nothing) */
	/* (2.1) A 2.0 library leaves these out (out->size says what it filled). */
	uint64_t granularity;       /* the unit the device bytes were counted in */
	uint64_t bytes_per_chunk;   /* unchunkable_bytes + buffers x chunk_bytes */
	int64_t id;                 /* the response's id: the same under each of its handles (vram_allocate's, its event's, vram_response_member's), never another response's */
	int32_t sets;               /* the buffer sets the response holds: buffers, or 1 for a member that queued nothing */
	int32_t free_error;         /* 1 when freeing the arrays it replaced failed (vram_response_json's "free_error" says how); the allocation stands */
};
/* The response's plan. One response may be given under several handles
 * (vram_allocate's, the allocated event's, vram_response_member's): each
 * is released on its own, and each says the same id. */
int vram_response_plan(vram_response r, struct vram_plan *out);

#define VRAM_MAX_NDIM 32

/* One array of a response. Set size to sizeof(struct vram_array). */
struct vram_array {
	uint64_t size;
	int32_t dtype;              /* enum vram_dtype */
	int32_t memory;             /* enum vram_memory */
	int32_t ndim;
	int32_t chunk_axis;         /* its request's run axis; -1 when it is not chunkable */
	uint64_t device_ptr;        /* device and mapped arrays: the device address; else 0 */
	void *host;                 /* pinned, mapped and pageable arrays: the host bytes; else NULL */
	uint64_t bytes;             /* elements x element size */
	int64_t shape[VRAM_MAX_NDIM];   /* as allocated: the chunk axis cut to the chunk length when chunked */
	int64_t strides[VRAM_MAX_NDIM]; /* row-major, in bytes */
	int32_t freed;              /* the manager has freed it since */
	int32_t reserved;
	const char *label;          /* (2.1) its label, NUL-terminated, valid while the response is held */
};
/* The array under label in buffer buffer (0 <= buffer < plan.buffers) of
 * the response; VRAM_EINVAL when it has none. A host array's bytes stay
 * valid while the response is held and the array is not freed. */
int vram_response_array(vram_response r, const char *label, int buffer, struct vram_array *out);
/* (2.1) Every array of buffer buffer of the response, sorted by label,
 * each described as vram_response_array does: up to cap of them into out,
 * array_size bytes apart (sizeof(struct vram_array); a 2.0 caller's
 * smaller struct is filled as far as it goes); *n gets how many there are
 * (more than cap: call again with room for *n). One call where
 * vram_response_plan's arrays says how many to expect. */
int vram_response_arrays(vram_response r, int buffer, struct vram_array *out, size_t cap, size_t array_size, size_t *n);
/* A range of runs along an axis: runs [start, start+len) of axis axis. */
struct vram_span {
	int64_t axis;
	int64_t start;
	int64_t len;
};
/* Chunk chunk (0 <= chunk < plan.chunks) of the plan, along axis. */
int vram_response_span(vram_response r, int chunk, int axis, struct vram_span *out);
/* The response the same allocation gave client c, a member of r's group
 * (its arrays, or the plan alone), as a new response to release;
 * VRAM_EINVAL when it gave c none. */
int vram_response_member(vram_response r, vram_client c, vram_response *out);
/* The whole response as one JSON object: "client", "plan" (the chunk
 * plan, as `vram plan` prints it), "free_error" and "buffers", a list of
 * objects label -> {"dtype", "memory", "shape", "strides", "chunk_axis",
 * "device_ptr", "host", "bytes", "freed"}. */
int vram_response_json(vram_response r, char *buf, size_t len, size_t *needed);
/* Forgets the response (its arrays stay the client's). Every response
 * vram_allocate, vram_response_member and vram_poll give must be
 * released. */
int vram_response_release(vram_response r);
/* On the simulator, the host address of the bytes of a device array of
 * the response: a program that runs its kernels on the host (Numba's CUDA
 * simulator) reads and writes the simulated device memory there. The
 * address is valid while the response is held and the array is not freed:
 * a use after the free is undefined, as on a GPU (the bytes may be another
 * array's, or unmapped: the process can end). VRAM_ENOTSUP on a GPU and on
 * an address-only simulator (backed=false). */
int vram_sim_host_address(vram_response r, const char *label, int buffer, void **out);

/* (2.2) One allocation in one call: what vram_queue, vram_allocate,
 * vram_response_plan, vram_response_arrays (buffer 0),
 * vram_sim_host_address for each of its device arrays and vram_mem_info
 * would give, in that order and with their errors, for a program whose
 * every cycle queues, allocates and reads the arrays. */
enum vram_allocate_flags {
	VRAM_ALLOCATE_QUEUE = 1,      /* queue the requests first, as vram_queue (n 0 drops the queue); else they are not read */
	VRAM_ALLOCATE_TAKE_EVENT = 2, /* the caller's own allocated event, when it is the first queued on the manager, is taken out: response is its handle, event_taken 1 (deliver it, then poll for the rest) */
	VRAM_ALLOCATE_MEM_INFO = 4,   /* free_bytes and total_bytes: the device's memory just before the allocation */
};
/* Set size to sizeof(struct vram_allocation); "in" fields are read, "out"
 * ones filled. */
struct vram_allocation {
	uint64_t size;
	uint32_t flags;            /* in: VRAM_ALLOCATE_* bits */
	int32_t buffers;           /* in: as vram_allocate's */
	struct vram_plan *plan;    /* in: NULL, or the plan to fill (its size set), as vram_response_plan */
	struct vram_array *arrays; /* in: room for cap arrays of buffer 0, array_size bytes apart, as vram_response_arrays fills them */
	size_t cap;                /* in */
	size_t array_size;         /* in: sizeof(struct vram_array) */
	void **sim_hosts;          /* in: NULL, or room for cap addresses: each array's vram_sim_host_address, NULL for a host array and on a GPU */
	vram_response response;    /* out: the client's response, to release */
	size_t n;                  /* out: arrays in buffer 0 (more than cap: read them with vram_response_arrays) */
	int64_t pending;           /* out: events queued on the manager when the call returned: poll when > 0 */
	int32_t event_taken;       /* out: 1 when VRAM_ALLOCATE_TAKE_EVENT took the caller's own event */
	int32_t reserved;
	uint64_t free_bytes;       /* out, with VRAM_ALLOCATE_MEM_INFO */
	uint64_t total_bytes;
};
/* Queues the n requests (request_size bytes apart) for c when a->flags
 * has VRAM_ALLOCATE_QUEUE, allocates c's group with a->buffers buffers and
 * describes the response into *a. A refused queue allocates nothing; a
 * failed allocation leaves what vram_allocate's does (the queue queued).
 * Without VRAM_ALLOCATE_TAKE_EVENT every event stays queued, as after
 * vram_allocate. */
int vram_queue_allocate(vram_client c, const struct vram_request *requests, size_t n, size_t request_size,
			struct vram_allocation *a);

/* Host memory given by the caller for a copy: C-contiguous elements. */
struct vram_host_desc {
	void *data;
	const int64_t *shape;
	int32_t ndim;
	int32_t dtype; /* enum vram_dtype: the device array's */
};
/* Copies src into the device array under label in buffer buffer of
 * response r, ordered on client c's stream (the array must be c's, or a
 * member's of c's group). span NULL copies the whole array (the shapes must
 * be equal); otherwise the runs span of the full-length src go to the first
 * span->len runs along span->axis of the chunk-length array. */
int vram_to_device(vram_client c, vram_response r, const char *label, int buffer, const struct vram_host_desc *src, const struct vram_span *span);
/* The reverse: the device array (or its first span->len runs) into dst
 * (at the runs span). Read dst after vram_sync. */
int vram_from_device(vram_client c, vram_response r, const char *label, int buffer, const struct vram_host_desc *dst, const struct vram_span *span);
/* Waits for the work enqueued on the client's stream; returns its first error. */
int vram_sync(vram_client c);
/* Frees the client's arrays under label (every buffer); none is not an error. */
int vram_client_free(vram_client c, const char *label);

/* Marks work on the client's arrays begun: until vram_end_work, and then
 * until the device has finished the work enqueued on the client's stream
 * before it, the client is busy and never evicted. VRAM_EFREED when its
 * arrays were evicted: allocate again first. */
int vram_begin_work(vram_client c, vram_work *out);
/* Ends the mark (records an event on the client's stream; never waits). */
int vram_end_work(vram_work w);

/* Sets the limit mode (enum vram_limit_mode) for later allocations. */
int vram_set_limit_mode(vram_manager m, int mode);
/* How the manager divides memory: the sum of the manual proportions, and
 * what the auto clients split (0 with none); either pointer may be NULL. */
int vram_shares(vram_manager m, double *manual, double *auto_pool);
/* The device's free and total memory; either pointer may be NULL. */
int vram_mem_info(vram_manager m, uint64_t *free_bytes, uint64_t *total_bytes);
/* The open clients of group (NULL or "": "default"), by id: up to cap of
 * them into out (which may be NULL when cap is 0), and how many there are
 * into *n. */
int vram_group_members(vram_manager m, const char *group, vram_client *out, size_t cap, size_t *n);
/* Frees every client's arrays under label. */
int vram_free_label(vram_manager m, const char *label);
/* Frees every client's arrays (no events). */
int vram_free_all(vram_manager m);
/* Frees every client's arrays and sends each a VRAM_HOOK_INVALIDATE event:
 * after a device reset, or to start over. */
int vram_invalidate_all(vram_manager m);
/* Gives every stream group a fresh stream (after a device reset; call
 * vram_invalidate_all too), closing the old ones once their work is done. */
int vram_reinit_streams(vram_manager m);

/* Event kinds. */
enum vram_event_kind {
	VRAM_EVENT_NONE = 0,        /* no event was queued */
	VRAM_EVENT_ALLOCATED = 1,   /* response: the client's arrays, or the plan alone */
	VRAM_EVENT_INVALIDATED = 2, /* the client's arrays were freed behind its back; the reason is in reason */
};
/* An event. Set size to sizeof(struct vram_event). */
struct vram_event {
	uint64_t size;
	int32_t kind;           /* enum vram_event_kind */
	int32_t evicted;        /* INVALIDATED: 1 for an eviction for another group */
	vram_client client;
	vram_response response; /* ALLOCATED: a response to release; else 0 */
	int64_t pending;        /* (2.1) the events queued behind this one when it was taken: poll again while it is > 0 (others may come meanwhile) */
	int64_t response_id;    /* (2.1) ALLOCATED: the response's id (struct vram_plan's), to tell a response already held under another handle */
};
/* Takes the manager's oldest event into *out (kind VRAM_EVENT_NONE when
 * there is none) and, for an invalidation, its reason into reason (cut to
 * len bytes with its NUL; reason may be NULL when len is 0). */
int vram_poll(vram_manager m, struct vram_event *out, char *reason, size_t len);

/* Makes a host array of shape and dtype in memory (pinned, mapped or
 * pageable), zeroed, and its bytes into *data. Pinned and mapped arrays are
 * for copies that overlap the device's work; free each with vram_host_free
 * before the manager is closed (vram_close frees those left). */
int vram_host_array(vram_manager m, const int64_t *shape, int ndim, int dtype, int memory, vram_host *out, void **data);
/* Frees a host array; its bytes must not be used afterwards. */
int vram_host_free(vram_host h);

/*
 * (2.1) The chunk pipeline (the Go batch package) driven chunk by chunk:
 * the program's thread launches each chunk's kernels, nothing calls into
 * the program. vram_batch_start declares a batch's arrays on clients of one
 * stream group, allocates them with one allocation of the group (planned
 * and chunked by the manager) and starts the pipeline on a thread of the
 * library's own: each chunk's inputs are copied in on the group's stream,
 * its kernels wait for them (an event) on the chunk's stream, its outputs
 * are copied out behind them; with 2 or 3 buffers in flight the kernels
 * run on a stream of the batch's own, so that the copies of one chunk go
 * beside the kernels of another, and the program stays a buffer or two
 * ahead of the device. Pageable host arrays are staged through the
 * manager's pinned staging pool, pinned ones (vram_host_array) copied from
 * directly. Between chunks the pipeline re-cuts them when the group's
 * budget changes (a cap, another group's claim: the arrays are allocated
 * again at the new length, and each chunk describes its own), and may
 * choose its buffers after the first chunk (buffers 0). The batch's
 * clients are busy (never evicted) while it runs.
 *
 * vram_batch_next hands over one chunk at a time: its runs, its buffer,
 * the stream its kernels go on, and the batch's arrays in that buffer, in
 * the order they were declared. The program enqueues the chunk's kernels
 * on that stream and calls vram_batch_next again: that call tells the
 * pipeline they are enqueued (their chunk's copies out are enqueued after
 * them) and waits for the next chunk. When every chunk is back on the host
 * it reports done; a failure of the pipeline is its status then, with the
 * chunk and the step in the last error. The arrays a chunk describes are
 * valid until the next call. vram_batch_cancel stops the pipeline between
 * two steps from any thread; vram_batch_close stops it if it runs, waits
 * for the work it enqueued, and frees its device arrays and its handle.
 *
 * Kernels on the host (host_kernels): a program whose kernels run on the
 * host at their launch (Numba's CUDA simulator, over the simulated memory
 * of vram's simulator) is handed a chunk only once its copies in are
 * done, and each chunk gives the simulated memory's host address of every
 * array (sim_hosts). The copies out of a chunk follow the next
 * vram_batch_next call, so they read what the kernels wrote.
 */
typedef int64_t vram_batch;

/* What the pipeline does with an array. */
enum vram_batch_dir {
	VRAM_BATCH_IN = 0,      /* copied in before each chunk's kernels (an unchunkable one once, before the first) */
	VRAM_BATCH_OUT = 1,     /* copied out after them (an unchunkable one once, after the last) */
	VRAM_BATCH_INOUT = 2,   /* both, at the same runs of one host array */
	VRAM_BATCH_SCRATCH = 3, /* neither: the kernels' own; no host side */
};

/* One array of a batch. */
struct vram_batch_array {
	vram_client client;          /* its client: every array's is of one stream group */
	struct vram_request request; /* its label and request (memory: device), at the batch's full length */
	int32_t direction;           /* enum vram_batch_dir */
	int32_t reserved;            /* 0 */
	void *host;                  /* its full-length host array, C-contiguous, of the request's shape and dtype (staged) */
	vram_host host_array;        /* or, host NULL, a host array of vram_host_array of that shape and dtype (pinned: copied from directly) */
};

/* How a batch runs. Set size to sizeof(struct vram_batch_options). */
struct vram_batch_options {
	uint64_t size;
	int32_t buffers;          /* buffers in flight, 1 to 3; 0: the pipeline chooses after its first chunk */
	int32_t host_kernels;     /* non-zero: kernels run on the host at their launch (above) */
	int64_t max_chunk_length; /* > 0: at most this many runs a chunk */
	int32_t grow;             /* non-zero: longer chunks when the budget grows (shorter ones always when it shrinks) */
	int32_t reserved;
};

/* A chunk handed over. Set size to sizeof(struct vram_batch_chunk). */
struct vram_batch_chunk {
	uint64_t size;
	int64_t index;        /* 0-based, in the batch's order */
	int64_t chunks;       /* the batch's chunks as now cut (a re-cut changes it) */
	int64_t start, len;   /* the chunk's runs: start ... start+len-1 */
	int64_t chunk_length; /* every chunked array's length along its chunk axis now (len or more) */
	int64_t buffer;       /* the buffer in flight it uses */
	vram_stream stream;   /* where its kernels go: a CUstream on CUDA; on the simulator a number naming it */
	int64_t arrays;       /* the batch's arrays (how many vram_batch_next describes) */
};

/* Declares n arrays (each decl_size bytes apart: sizeof(struct
 * vram_batch_array)) on m's clients, allocates them and starts the
 * pipeline; o may be NULL (buffers 0). A bad declaration (no host side, a
 * host array of another shape, clients of two groups) or a failed
 * allocation (VRAM_ENOMEM, with the figures) starts nothing. */
int vram_batch_start(vram_manager m, const struct vram_batch_array *arrays, size_t n, size_t decl_size,
		     const struct vram_batch_options *o, vram_batch *out);
/* The plan the batch's arrays were allocated by (struct vram_plan; client
 * is the batch's first client, arrays its arrays, id 0): its chunks,
 * chunk length and buffers, the budget and bytes. A re-cut allocates them
 * again: then the plan of the latest allocation. */
int vram_batch_plan(vram_batch b, struct vram_plan *out);
/* Tells the batch the kernels of the chunk it handed over last are
 * enqueued, and waits for the next: *chunk, and its arrays (up to cap,
 * array_size bytes apart, as vram_response_arrays fills them; the labels
 * stay while the batch does) and, when sim_hosts is not NULL, their host
 * addresses with host_kernels on the simulator (else NULL). *done is 1,
 * and nothing is handed over, once the batch has ended: VRAM_OK when
 * every chunk is back on the host, else the pipeline's failure. */
int vram_batch_next(vram_batch b, struct vram_batch_chunk *chunk, struct vram_array *arrays, size_t cap,
		    size_t array_size, void **sim_hosts, int *done);
/* Stops the batch between two steps (from any thread): its next
 * vram_batch_next reports it ended, with the chunks finished named. */
int vram_batch_cancel(vram_batch b);
/* What the batch did, once it has ended, as one JSON object (the Go
 * batch.Report: "chunks", "chunks_done", "runs", "chunk_length",
 * "buffers", "lag", "staged", "bytes_in", "bytes_out", times in seconds,
 * "recuts" and "buffer_choice"). VRAM_EINVAL while it runs. */
int vram_batch_report_json(vram_batch b, char *buf, size_t len, size_t *needed);
/* Stops the batch if it runs, waits for the work it enqueued, and frees
 * its device arrays and its handle. Every started batch must be closed
 * (vram_close closes those left). */
int vram_batch_close(vram_batch b);

/* The planner alone (the Go vram.Plan), with no manager: request_json is
 * {"requests": {owner: {label: {"shape": [...], "dtype": "float32",
 * "memory": "device", "chunk_axis": 0, "unchunkable": false, "total_runs":
 * 0}}}, "budget": bytes, "granularity": bytes, "buffers": k,
 * "max_chunk_length": n}; buf gets {"plan": {...}} (the ChunkPlan as the Go
 * package marshals it) or, when no plan fits or the requests disagree,
 * {"error": {"kind": "unchunkable" | "run_too_large" | "runs_mismatch" |
 * "invalid_request", "message": ..., "figures": {...}}}, as
 * vram_stats_json hands its text. VRAM_EINVAL for JSON it cannot read. */
int vram_plan(const char *request_json, char *buf, size_t len, size_t *needed);

#ifdef __cplusplus
}
#endif

#endif /* VRAM_H */
