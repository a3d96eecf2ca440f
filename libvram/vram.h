/*
 * vram.h: the C contract of libvram, vram's memory manager as a shared
 * library (go build -buildmode=c-shared ./libvram). ABI version 1.
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

#define VRAM_ABI_VERSION 1

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
 * cap). The allocator is the one $VRAM_ALLOC_CONF configures (pool by
 * default; kind:async is refused). VRAM_EBUSY when a manager is open on
 * that device ordinal. */
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
 * allocations. */
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
 * CuPy, cupy.cuda.memory.CFunctionAllocator(param, malloc, free, owner):
 * void*(void* param, size_t size, int device) and
 * void(void* param, void* ptr, int device) (cupy/cuda/memory.pyx). param
 * is a manager handle cast to a pointer, or NULL for the manager open on
 * device. Both are unordered (CuPy names no stream). CuPy does not check
 * malloc's result: a failure returns NULL and counts in hook_errors, so
 * prefer vram's Python package, which raises CuPy's OutOfMemoryError.
 */
void *vram_cupy_malloc(void *param, size_t size, int device);
void vram_cupy_free(void *param, void *ptr, int device);

#ifdef __cplusplus
}
#endif

#endif /* VRAM_H */
