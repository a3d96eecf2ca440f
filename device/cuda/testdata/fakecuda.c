/*
 * fakecuda.c: a stand-in for libcuda.so.1 used only by device/cuda's tests
 * (and the rehearsal of scripts/gpu-check.sh) on machines without a GPU.
 * It exports the driver entry points the backend binds, with the same C
 * signatures, and keeps "device memory" in host memory, so the whole Go
 * path — dlopen, symbol lookup, argument passing in registers and on the
 * stack, out-parameters, kernelParams, the JIT log buffers — runs for real.
 *
 * It is as strict as the CUDA driver reference allows a driver to be, so
 * that what would fail on a GPU fails here first. Its rules (each has a
 * test in fakerules_linux_test.go that fails without it):
 *   1. Contexts. Every call that works in a context is refused unless the
 *      calling thread's current context is the primary context:
 *      CUDA_ERROR_INVALID_CONTEXT (201) with none or another one current.
 *      Each thread has a real context stack (cuCtxPushCurrent_v2,
 *      cuCtxPopCurrent_v2; cuCtxSetCurrent replaces the top, and NULL pops
 *      it).
 *   2. Reset. cuDevicePrimaryCtxReset_v2 keeps the context's handle and
 *      retain count but leaves it inactive: calls in it fail with
 *      CUDA_ERROR_CONTEXT_IS_DESTROYED (709) until it is retained again. It
 *      frees what the reference says it frees (allocations, streams,
 *      events, modules) and, as the worst a driver may do where the
 *      reference is silent, leaves the stream-ordered pool's reserved
 *      memory and every virtual memory object (physical memory,
 *      reservations, mappings) behind, still charged: counters
 *      reset_left_pool, reset_left_vmm (bytes) and reset_left_reservations.
 *   3. Faults. A kernel that touches memory it does not own, or any
 *      operation vram_fake_set("fault", code) arms, fails when it runs on
 *      its stream, not when it is enqueued: the launch returns success,
 *      and from then on every call in the context returns the code
 *      (sticky) until a reset.
 *   4. Lazy memory. The first copy, memset or launch of a context takes
 *      LAZY bytes (the driver's internal modules) and each live stream
 *      STREAM_BYTES, so free memory moves for reasons of the driver's own.
 *   5. Asynchrony. Work is queued per stream and runs in order, lazily (at
 *      the next driver call). A kernel named ..._spin or ..._wait with one
 *      pointer parameter holds its stream until the 32-bit word it points
 *      to (mapped host memory) is not zero, as the conformance suites'
 *      spin kernels do on a GPU; work behind it waits, events recorded
 *      behind it stay pending. cuMemFree of cuMemAlloc memory and
 *      cuMemHostUnregister wait for all work (implicit synchronization);
 *      copies to or from host memory that is not page-locked wait for
 *      their stream and run before the call returns, as on CUDA.
 *   6. Virtual memory as the reference allows it: cuMemAddressReserve with
 *      alignment 0 gives a 64 KiB-aligned range (deliberately not aligned
 *      to the 2 MiB granularity), cuMemAddressFree of a range with
 *      mappings in it succeeds and leaks them (addressfree_mapped).
 *   7. Versions. cuDriverGetVersion says 13000 (CUDA 13.0); the JIT
 *      refuses PTX newer than ISA 9.0 (CUDA_ERROR_UNSUPPORTED_PTX_VERSION)
 *      and targets above the device's sm_90. cuDeviceGetUuid is the pre-13
 *      entry point, which on a MIG slice names the whole GPU;
 *      cuDeviceGetUuid_v2 names the slice (vram_fake_set("mig", 1)).
 * It also counts what a real driver would let pass silently
 * (vram_fake_count): cuMemFree of cuMemAllocAsync memory while queued
 * work still uses it ("free_unsynced"), cuMemFreeAsync of cuMemAlloc memory
 * ("freeasync_malloc"), a second cuMemHostRegister of a range
 * ("register_twice"), a cuMemMap over a mapping ("map_over").
 * vram_fake_set("register_error", code) makes the next cuMemHostRegister
 * fail with code, as a system that refuses to pin more memory does.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;

enum {
	OK = 0, INVALID_VALUE = 1, OUT_OF_MEMORY = 2, NOT_INITIALIZED = 3,
	INVALID_DEVICE = 101, INVALID_CONTEXT = 201, INVALID_PTX = 218, UNSUPPORTED_PTX_VERSION = 222,
	INVALID_HANDLE = 400, NOT_FOUND = 500, NOT_READY = 600,
	ILLEGAL_ADDRESS = 700, LAUNCH_TIMEOUT = 702, CONTEXT_IS_DESTROYED = 709,
	HOST_MEMORY_ALREADY_REGISTERED = 712, HOST_MEMORY_NOT_REGISTERED = 713, UNKNOWN = 999,
};

#define TOTAL (1ull << 30)
#define CONTEXT (64ull << 20)
#define LAZY (6ull << 20)
#define STREAM_BYTES (1ull << 20)
#define GRAN (2ull << 20)
#define DEFAULT_ALIGN (64ull << 10)
#define MAXALLOC 4096
#define NHANDLE 1024
/* Far below a real GPU's 2 GiB − 1, so that tests can reach it. */
#define MAX_PITCH (1 << 20)
#define DRIVER_VERSION 13000
#define SM 90

/* Context handles: the primary context (the same across resets), and two
 * the stand-in never makes but a program calling vram may have current:
 * OTHER_CTX, a second context of device 0 (as cuCtxCreate makes), and
 * PEER_CTX, a context of a device 1 it has no other trace of. */
#define PRIMARY_CTX 0x1001
#define OTHER_CTX 0x7000
#define PEER_CTX 0x7040

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER; /* protects everything below but the thread's stack */
static int inited, refs, active, made, lazy_taken, mig;
static CUresult sticky, fault_next;
static unsigned long long used; /* bytes taken from TOTAL: context, lazy, streams, allocations, leaks */
static unsigned long long pool_reserved, pool_used, pool_threshold;
/* An allocation; a cuMemAllocAsync block freed with cuMemFreeAsync stays
 * here, reusable at once on the stream it was freed on (q, while its free
 * is pending) and on any stream once the free has run (cached), until the
 * pool gives its memory back. */
struct alloc {
	void *p;
	unsigned long long n, charged;
	int async, q, cached;
	struct op *pending; /* the queued OP_FREE */
};
static struct alloc allocs[MAXALLOC];
static int free_unsynced, freeasync_malloc, register_twice, register_error, map_over, addressfree_mapped;
static int no_context, destroyed_context;
static unsigned long long reset_left_pool, reset_left_vmm;
static int reset_left_reservations;
#define MAXREG 256
static struct { uintptr_t p; size_t n; unsigned int flags; } regs[MAXREG]; /* registered host ranges */

static __thread uintptr_t ctx_stack[16];
static __thread int ctx_depth;
static uintptr_t current_ctx(void) { return ctx_depth ? ctx_stack[ctx_depth - 1] : 0; }

static unsigned long long roundup(unsigned long long n, unsigned long long g) { return (n + g - 1) / g * g; }

/* Handles are small integers scaled so they look like pointers. */
enum { STREAM = 1, EVENT, MODULE, FUNCTION, ZOMBIE_STREAM };
static int handles[NHANDLE];
static char *module_text[NHANDLE];
static int function_module[NHANDLE];
static char function_name[NHANDLE][64];
static struct { unsigned long long recorded, completed, gen; } events[NHANDLE];
static int new_handle(int kind) {
	for (int i = 1; i < NHANDLE; i++)
		if (!handles[i]) { handles[i] = kind; return i; }
	return 0;
}
static void *h2p(int h) { return (void *)(uintptr_t)(h * 64); }
static int p2h(void *p, int kind) {
	uintptr_t v = (uintptr_t)p;
	if (v % 64 || v / 64 >= NHANDLE || handles[v / 64] != kind) return 0;
	return (int)(v / 64);
}

/* CUDA_MEMCPY2D as cuda.h declares it (CUDA_MEMCPY2D_v2): the compiler
 * lays it out, so a Go struct with other offsets copies the wrong bytes. */
typedef enum { MEMTYPE_HOST = 1, MEMTYPE_DEVICE = 2, MEMTYPE_ARRAY = 3, MEMTYPE_UNIFIED = 4 } CUmemorytype;
typedef struct {
	size_t srcXInBytes, srcY;
	CUmemorytype srcMemoryType;
	const void *srcHost;
	CUdeviceptr srcDevice;
	void *srcArray;
	size_t srcPitch;
	size_t dstXInBytes, dstY;
	CUmemorytype dstMemoryType;
	void *dstHost;
	CUdeviceptr dstDevice;
	void *dstArray;
	size_t dstPitch;
	size_t WidthInBytes, Height;
} CUDA_MEMCPY2D;
_Static_assert(sizeof(CUDA_MEMCPY2D) == 128, "CUDA_MEMCPY2D is 128 bytes on LP64");

/* Queued work. Each stream (the NULL stream, with CU_STREAM_LEGACY and
 * CU_STREAM_PER_THREAD, is queue 0) runs its operations in order. */
enum { OP_COPY = 1, OP_SET, OP_FILL, OP_SPIN, OP_FREE, OP_RECORD, OP_WAIT, OP_COPY2D, OP_NOP };
struct op {
	int kind;
	struct op *next;
	uintptr_t dst, src; /* OP_COPY: addresses; dev says which are device memory */
	size_t n;
	int dst_dev, src_dev;
	unsigned char v;
	unsigned int fn; /* OP_FILL: p = dst, n, a, b */
	float fa;
	double fb;
	int ev; /* OP_RECORD, OP_WAIT */
	unsigned long long seq, evgen;
	CUDA_MEMCPY2D c2;
};
static struct { struct op *head, *tail; } queues[NHANDLE];
static int busy;    /* queues with work */
static int waiters; /* calls waiting for queued work */

int vram_fake_count(const char *what) {
	pthread_mutex_lock(&mu);
	int v = -1, n = 0;
	if (!strcmp(what, "free_unsynced")) v = free_unsynced;
	else if (!strcmp(what, "freeasync_malloc")) v = freeasync_malloc;
	else if (!strcmp(what, "register_twice")) v = register_twice;
	else if (!strcmp(what, "map_over")) v = map_over;
	else if (!strcmp(what, "addressfree_mapped")) v = addressfree_mapped;
	else if (!strcmp(what, "no_context")) v = no_context;
	else if (!strcmp(what, "destroyed_context")) v = destroyed_context;
	else if (!strcmp(what, "reset_left_pool")) v = (int)reset_left_pool;
	else if (!strcmp(what, "reset_left_vmm")) v = (int)reset_left_vmm;
	else if (!strcmp(what, "reset_left_reservations")) v = reset_left_reservations;
	else if (!strcmp(what, "lazy")) v = lazy_taken ? (int)LAZY : 0;
	else if (!strcmp(what, "busy")) v = busy;
	else if (!strcmp(what, "waiters")) v = waiters;
	else if (!strcmp(what, "sticky")) v = sticky;
	else if (!strcmp(what, "registered")) {
		for (int i = 0; i < MAXREG; i++) n += regs[i].p != 0;
		v = n;
	} else if (!strcmp(what, "streams")) {
		for (int i = 1; i < NHANDLE; i++) n += handles[i] == STREAM || handles[i] == ZOMBIE_STREAM;
		v = n;
	}
	pthread_mutex_unlock(&mu);
	return v;
}
int vram_fake_set(const char *what, int v) {
	pthread_mutex_lock(&mu);
	int ok = 1;
	if (!strcmp(what, "register_error")) register_error = v;
	else if (!strcmp(what, "fault")) fault_next = v;
	else if (!strcmp(what, "mig")) mig = v;
	else ok = 0;
	pthread_mutex_unlock(&mu);
	return ok;
}

/* ---- ranges ---- */

static int vm_valid_range(CUdeviceptr p, size_t n);
/* reg_of is the registered range holding [p, p+n), or -1. Requires mu. */
static int reg_of(uintptr_t p, size_t n) {
	for (int i = 0; i < MAXREG; i++)
		if (regs[i].p && p >= regs[i].p && p + n <= regs[i].p + regs[i].n) return i;
	return -1;
}
/* A device range is valid when it lies in one allocation, in accessible
 * mapped virtual memory, or in host memory registered with
 * CU_MEMHOSTREGISTER_DEVICEMAP (whose device address is its host address
 * here). Requires mu. */
static int valid_range(CUdeviceptr p, size_t n) {
	for (int i = 0; i < MAXALLOC; i++) {
		CUdeviceptr b = (CUdeviceptr)(uintptr_t)allocs[i].p;
		if (allocs[i].p && !allocs[i].cached && p >= b && p + n <= b + allocs[i].n) return 1;
	}
	int r = reg_of((uintptr_t)p, n);
	if (r >= 0 && (regs[r].flags & 2)) return 1;
	return vm_valid_range(p, n);
}

/* ---- the queues ---- */

static void drop_queues_locked(void) {
	for (int q = 0; q < NHANDLE; q++) {
		while (queues[q].head) {
			struct op *o = queues[q].head;
			queues[q].head = o->next;
			free(o);
		}
		queues[q].tail = 0;
	}
	busy = 0;
	for (int i = 0; i < MAXALLOC; i++) allocs[i].pending = 0; /* their frees will not run */
}
static void fault_locked(CUresult code) {
	if (!sticky) sticky = code;
	drop_queues_locked();
}
static void free_alloc_locked(int i) {
	if (allocs[i].async && !allocs[i].cached) pool_used -= roundup(allocs[i].n, 512);
	used -= allocs[i].charged;
	free(allocs[i].p);
	memset(&allocs[i], 0, sizeof allocs[i]);
}
/* copy2d_locked runs a checked 2-D copy; 0 when a device row is not valid. */
static int copy2d_locked(const CUDA_MEMCPY2D *c) {
	const char *src = c->srcMemoryType == MEMTYPE_HOST ? (const char *)c->srcHost : (const char *)(uintptr_t)c->srcDevice;
	char *dst = c->dstMemoryType == MEMTYPE_HOST ? (char *)c->dstHost : (char *)(uintptr_t)c->dstDevice;
	src += c->srcY * c->srcPitch + c->srcXInBytes;
	dst += c->dstY * c->dstPitch + c->dstXInBytes;
	for (size_t r = 0; r < c->Height; r++) {
		if (c->srcMemoryType == MEMTYPE_DEVICE && !valid_range((CUdeviceptr)(uintptr_t)(src + r * c->srcPitch), c->WidthInBytes))
			return 0;
		if (c->dstMemoryType == MEMTYPE_DEVICE && !valid_range((CUdeviceptr)(uintptr_t)(dst + r * c->dstPitch), c->WidthInBytes))
			return 0;
	}
	for (size_t r = 0; r < c->Height; r++)
		memmove(dst + r * c->dstPitch, src + r * c->srcPitch, c->WidthInBytes);
	return 1;
}
/* side_ok: one side of a queued copy is still there when it runs. */
static int side_ok(uintptr_t a, size_t n, int dev) { return dev ? valid_range(a, n) : reg_of(a, n) >= 0; }

/* run_locked runs one operation; a bad address faults the context. */
static void run_locked(struct op *o) {
	if (fault_next) {
		CUresult code = fault_next;
		fault_next = 0;
		fault_locked(code);
		return;
	}
	switch (o->kind) {
	case OP_COPY:
		if (!side_ok(o->dst, o->n, o->dst_dev) || !side_ok(o->src, o->n, o->src_dev)) { fault_locked(ILLEGAL_ADDRESS); return; }
		memmove((void *)o->dst, (void *)o->src, o->n);
		break;
	case OP_SET:
		if (!valid_range(o->dst, o->n)) { fault_locked(ILLEGAL_ADDRESS); return; }
		memset((void *)o->dst, o->v, o->n);
		break;
	case OP_FILL:
		if (o->fn && !valid_range(o->dst, (size_t)o->fn * 4)) { fault_locked(ILLEGAL_ADDRESS); return; }
		for (unsigned long long i = 0; i < o->n && i < o->fn; i++)
			((float *)o->dst)[i] = o->fa * (float)i + (float)o->fb;
		break;
	case OP_FREE:
		for (int i = 0; i < MAXALLOC; i++)
			if (allocs[i].p && allocs[i].pending == o) {
				allocs[i].pending = 0;
				allocs[i].cached = 1;
				pool_used -= roundup(allocs[i].n, 512);
				break;
			}
		break;
	case OP_RECORD:
		if (events[o->ev].gen == o->evgen && events[o->ev].completed < o->seq) events[o->ev].completed = o->seq;
		break;
	case OP_COPY2D:
		if (!copy2d_locked(&o->c2)) fault_locked(ILLEGAL_ADDRESS);
		break;
	}
}
/* runnable_locked: a spin holds until its flag is set, a wait until its
 * event has completed (or was destroyed). */
static int runnable_locked(struct op *o) {
	switch (o->kind) {
	case OP_SPIN:
		if (!valid_range(o->dst, 4)) return 1; /* progress_locked faults it */
		return __atomic_load_n((uint32_t *)o->dst, __ATOMIC_ACQUIRE) != 0;
	case OP_WAIT:
		return events[o->ev].gen != o->evgen || events[o->ev].completed >= o->seq;
	}
	return 1;
}
/* progress_locked runs every operation that can run, in stream order. */
static void progress_locked(void) {
	int moved = 1;
	while (moved && busy && !sticky) {
		moved = 0;
		for (int q = 0; q < NHANDLE && !sticky; q++) {
			while (queues[q].head && !sticky) {
				struct op *o = queues[q].head;
				if (!runnable_locked(o)) break;
				if (o->kind == OP_SPIN && !valid_range(o->dst, 4)) { fault_locked(ILLEGAL_ADDRESS); break; }
				queues[q].head = o->next;
				if (!queues[q].head) { queues[q].tail = 0; busy--; }
				run_locked(o);
				free(o);
				moved = 1;
			}
			if (handles[q] == ZOMBIE_STREAM && !queues[q].head) { handles[q] = 0; used -= STREAM_BYTES; }
		}
	}
}
/* touches_locked reports whether queued work reads or writes [b, b+n). */
static int touches_locked(uintptr_t b, size_t n) {
	for (int q = 0; q < NHANDLE; q++) {
		for (struct op *o = queues[q].head; o; o = o->next) {
			uintptr_t lo = o->dst, hi = o->dst + o->n, slo = o->src, shi = o->src + o->n;
			switch (o->kind) {
			case OP_FILL: hi = o->dst + (size_t)o->fn * 4; slo = shi = 0; break;
			case OP_SET: case OP_FREE: slo = shi = 0; if (o->kind == OP_FREE) hi = lo + 1; break;
			case OP_COPY2D: return 1; /* rows: counted as touching everything */
			case OP_COPY: break;
			default: continue;
			}
			if ((lo < b + n && b < hi) || (slo < b + n && b < shi)) return 1;
		}
	}
	return 0;
}
static void enqueue_locked(int q, struct op *o) {
	o->next = 0;
	if (queues[q].tail) queues[q].tail->next = o;
	else { queues[q].head = o; busy++; }
	queues[q].tail = o;
	progress_locked();
}
/* wait_locked waits, with mu released between tries, until queue q (all
 * queues when q < 0) is empty; the context's sticky error if it breaks. */
static CUresult wait_locked(int q) {
	for (;;) {
		progress_locked();
		if (sticky) return sticky;
		if (q < 0 ? busy == 0 : queues[q].head == 0) return OK;
		waiters++;
		pthread_mutex_unlock(&mu);
		usleep(50);
		pthread_mutex_lock(&mu);
		waiters--;
	}
}
static struct op *new_op(int kind) {
	struct op *o = calloc(1, sizeof *o);
	if (o) o->kind = kind;
	return o;
}
/* qof is the queue of stream s, or -1 when s is no live stream. 0 is the
 * NULL stream; 1 and 2 are CU_STREAM_LEGACY and CU_STREAM_PER_THREAD,
 * which the driver takes wherever a stream goes. */
static int qof(void *s) {
	if ((uintptr_t)s <= 2) return 0;
	int h = p2h(s, STREAM);
	return h ? h : -1;
}

/* ---- entering a context ---- */

/* enter locks mu and checks what every call that works in a context needs:
 * the driver initialized, the thread's current context the primary one,
 * active, not broken by a fault. On failure mu is unlocked again. */
static CUresult enter(void) {
	pthread_mutex_lock(&mu);
	CUresult r = OK;
	if (!inited) r = NOT_INITIALIZED;
	else if (current_ctx() != PRIMARY_CTX) { no_context++; r = INVALID_CONTEXT; }
	else if (!active) { destroyed_context++; r = CONTEXT_IS_DESTROYED; }
	else {
		progress_locked();
		r = sticky;
	}
	if (r) pthread_mutex_unlock(&mu);
	return r;
}
static CUresult leave(CUresult r) { pthread_mutex_unlock(&mu); return r; }
/* take_lazy charges the memory a context's first copy, memset or launch
 * takes. Requires mu. */
static void take_lazy_locked(void) {
	if (!lazy_taken && used + LAZY <= TOTAL) { used += LAZY; lazy_taken = 1; }
}

static void release_pool_locked(unsigned long long keep) {
	unsigned long long floor = roundup(pool_used, GRAN), target = pool_reserved;
	if (target > keep) target = keep > floor ? roundup(keep, GRAN) : floor;
	if (target < pool_reserved) {
		used -= pool_reserved - target;
		pool_reserved = target;
		for (int i = 0; i < MAXALLOC; i++)
			if (allocs[i].p && allocs[i].cached) free_alloc_locked(i);
	}
}
static void sync_point_locked(void) { release_pool_locked(pool_threshold); }

/* ---- init, device, errors ---- */

CUresult cuInit(unsigned int flags) {
	if (flags) return INVALID_VALUE;
	pthread_mutex_lock(&mu); inited = 1; pthread_mutex_unlock(&mu);
	return OK;
}
CUresult cuDriverGetVersion(int *v) { if (!v) return INVALID_VALUE; *v = DRIVER_VERSION; return OK; }
static const char *err_name(CUresult e) {
	switch (e) {
	case OK: return "CUDA_SUCCESS";
	case INVALID_VALUE: return "CUDA_ERROR_INVALID_VALUE";
	case OUT_OF_MEMORY: return "CUDA_ERROR_OUT_OF_MEMORY";
	case NOT_INITIALIZED: return "CUDA_ERROR_NOT_INITIALIZED";
	case INVALID_DEVICE: return "CUDA_ERROR_INVALID_DEVICE";
	case INVALID_CONTEXT: return "CUDA_ERROR_INVALID_CONTEXT";
	case INVALID_PTX: return "CUDA_ERROR_INVALID_PTX";
	case UNSUPPORTED_PTX_VERSION: return "CUDA_ERROR_UNSUPPORTED_PTX_VERSION";
	case INVALID_HANDLE: return "CUDA_ERROR_INVALID_HANDLE";
	case NOT_FOUND: return "CUDA_ERROR_NOT_FOUND";
	case NOT_READY: return "CUDA_ERROR_NOT_READY";
	case ILLEGAL_ADDRESS: return "CUDA_ERROR_ILLEGAL_ADDRESS";
	case LAUNCH_TIMEOUT: return "CUDA_ERROR_LAUNCH_TIMEOUT";
	case CONTEXT_IS_DESTROYED: return "CUDA_ERROR_CONTEXT_IS_DESTROYED";
	case HOST_MEMORY_ALREADY_REGISTERED: return "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED";
	case HOST_MEMORY_NOT_REGISTERED: return "CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED";
	case UNKNOWN: return "CUDA_ERROR_UNKNOWN";
	}
	return 0;
}
CUresult cuGetErrorName(CUresult e, const char **s) {
	*s = err_name(e);
	return *s ? OK : INVALID_VALUE;
}
CUresult cuGetErrorString(CUresult e, const char **s) {
	switch (e) {
	case OUT_OF_MEMORY: *s = "fake: out of memory"; return OK;
	case INVALID_VALUE: *s = "fake: invalid argument"; return OK;
	case INVALID_PTX: *s = "fake: a PTX JIT compilation failed"; return OK;
	case INVALID_HANDLE: *s = "fake: invalid resource handle"; return OK;
	case NOT_FOUND: *s = "fake: named symbol not found"; return OK;
	case OK: *s = "fake: no error"; return OK;
	}
	*s = err_name(e);
	return *s ? OK : INVALID_VALUE;
}
CUresult cuDeviceGetCount(int *n) { if (!inited) return NOT_INITIALIZED; *n = 1; return OK; }
CUresult cuDeviceGet(CUdevice *d, int ordinal) {
	if (!inited) return NOT_INITIALIZED;
	if (ordinal != 0) return INVALID_DEVICE;
	*d = 0; return OK;
}
CUresult cuDeviceGetName(char *name, int len, CUdevice d) {
	if (d != 0) return INVALID_DEVICE;
	if (len < 32) return INVALID_VALUE;
	strcpy(name, "vram fake CUDA device"); return OK;
}
/* The pre-13 entry point: the physical GPU's UUID, also on a MIG slice. */
CUresult cuDeviceGetUuid(unsigned char *uuid, CUdevice d) {
	if (d != 0) return INVALID_DEVICE;
	for (int i = 0; i < 16; i++) uuid[i] = (unsigned char)(0xa0 + i);
	return OK;
}
/* The slice's own UUID on a MIG slice, the GPU's otherwise. */
CUresult cuDeviceGetUuid_v2(unsigned char *uuid, CUdevice d) {
	if (d != 0) return INVALID_DEVICE;
	pthread_mutex_lock(&mu);
	int m = mig;
	pthread_mutex_unlock(&mu);
	for (int i = 0; i < 16; i++) uuid[i] = (unsigned char)((m ? 0xb0 : 0xa0) + i);
	return OK;
}
CUresult cuDeviceGetAttribute(int *v, int attr, CUdevice d) {
	if (d != 0) return INVALID_DEVICE;
	switch (attr) {
	case 75: *v = SM / 10; return OK; /* compute capability major */
	case 76: *v = SM % 10; return OK; /* minor */
	case 11: *v = MAX_PITCH; return OK; /* max pitch for cuMemcpy2D */
	case 115: *v = 1; return OK;  /* memory pools supported */
	case 102: *v = 1; return OK;  /* virtual memory management supported */
	}
	return INVALID_VALUE;
}
CUresult cuDeviceTotalMem_v2(size_t *n, CUdevice d) { *n = TOTAL; return d ? INVALID_DEVICE : OK; }

/* ---- the primary context ---- */

static void vm_destroy_all_locked(void);
static unsigned long long vm_phys_bytes_locked(void);
static int vm_reservations_locked(void);
/* destroy_locked frees what a context reset frees. */
static void destroy_locked(void) {
	drop_queues_locked();
	for (int i = 0; i < MAXALLOC; i++)
		if (allocs[i].p) free_alloc_locked(i);
	for (int i = 1; i < NHANDLE; i++) {
		if (handles[i] == STREAM || handles[i] == ZOMBIE_STREAM) used -= STREAM_BYTES;
		if (handles[i] == EVENT) events[i].gen++;
		free(module_text[i]);
		module_text[i] = 0;
	}
	memset(handles, 0, sizeof handles);
	if (lazy_taken) { used -= LAZY; lazy_taken = 0; }
	sticky = fault_next = 0;
}
CUresult cuDevicePrimaryCtxRetain(void **ctx, CUdevice d) {
	if (d != 0) return INVALID_DEVICE;
	pthread_mutex_lock(&mu);
	if (!inited) return leave(NOT_INITIALIZED);
	refs++;
	if (!made) { used += CONTEXT; made = 1; }
	active = 1;
	*ctx = (void *)(uintptr_t)PRIMARY_CTX;
	return leave(OK);
}
CUresult cuDevicePrimaryCtxRelease_v2(CUdevice d) {
	if (d != 0) return INVALID_DEVICE;
	pthread_mutex_lock(&mu);
	if (refs == 0) return leave(INVALID_CONTEXT);
	if (--refs == 0) {
		destroy_locked();
		vm_destroy_all_locked();
		pool_reserved = pool_used = pool_threshold = 0;
		used = 0;
		made = active = 0;
	}
	return leave(OK);
}
CUresult cuDevicePrimaryCtxReset_v2(CUdevice d) {
	if (d != 0) return INVALID_DEVICE;
	pthread_mutex_lock(&mu);
	if (!inited) return leave(NOT_INITIALIZED);
	destroy_locked();
	/* Left behind, still charged: the pool's reservation (its blocks are
	 * gone with the allocations) and every virtual memory object. */
	reset_left_pool += pool_reserved;
	pool_reserved = pool_used = pool_threshold = 0;
	reset_left_vmm += vm_phys_bytes_locked();
	reset_left_reservations += vm_reservations_locked();
	active = 0;
	return leave(OK);
}
CUresult cuDeviceGetDefaultMemPool(void **pool, CUdevice d) { *pool = (void *)0x2000; return d ? INVALID_DEVICE : OK; }

/* ---- the thread's context stack ---- */

static int known_ctx(uintptr_t c) { return c == PRIMARY_CTX || c == OTHER_CTX || c == PEER_CTX; }
CUresult cuCtxSetCurrent(void *ctx) {
	uintptr_t c = (uintptr_t)ctx;
	if (c == 0) {
		if (ctx_depth) ctx_depth--;
		return OK;
	}
	if (!known_ctx(c)) return INVALID_CONTEXT;
	if (ctx_depth == 0) ctx_depth = 1;
	ctx_stack[ctx_depth - 1] = c;
	return OK;
}
CUresult cuCtxGetCurrent(void **ctx) {
	if (!ctx) return INVALID_VALUE;
	*ctx = (void *)current_ctx();
	return OK;
}
CUresult cuCtxPushCurrent_v2(void *ctx) {
	uintptr_t c = (uintptr_t)ctx;
	if (!known_ctx(c)) return INVALID_CONTEXT;
	if (ctx_depth == (int)(sizeof ctx_stack / sizeof ctx_stack[0])) return OUT_OF_MEMORY;
	ctx_stack[ctx_depth++] = c;
	return OK;
}
CUresult cuCtxPopCurrent_v2(void **ctx) {
	if (!ctx_depth) return INVALID_CONTEXT;
	uintptr_t c = ctx_stack[--ctx_depth];
	if (ctx) *ctx = (void *)c;
	return OK;
}
CUresult cuCtxGetDevice(CUdevice *d) {
	if (!d) return INVALID_VALUE;
	if (!current_ctx()) return INVALID_CONTEXT;
	*d = current_ctx() == PEER_CTX ? 1 : 0;
	return OK;
}
CUresult cuCtxSynchronize(void) {
	CUresult r = enter();
	if (r) return r;
	r = wait_locked(-1);
	sync_point_locked();
	return leave(r);
}
CUresult cuMemGetInfo_v2(size_t *free, size_t *total) {
	CUresult r = enter();
	if (r) return r;
	*free = TOTAL - used; *total = TOTAL;
	return leave(OK);
}

/* ---- memory ---- */

/* reuse_locked hands out a freed pool block of n bytes' size again: on the
 * stream it was freed on at once (its queued free is dropped), on any
 * stream once the free has run. */
static int reuse_locked(CUdeviceptr *dp, size_t n, int q) {
	for (int i = 0; i < MAXALLOC; i++) {
		struct alloc *a = &allocs[i];
		if (!a->p || roundup(a->n, 512) != roundup(n, 512) || !(a->cached || (a->pending && a->q == q))) continue;
		if (a->cached) {
			if (pool_used + roundup(n, 512) > pool_reserved) return 0;
			pool_used += roundup(n, 512);
		} else {
			a->pending->kind = OP_NOP;
		}
		a->cached = 0;
		a->pending = 0;
		a->n = n;
		a->q = q;
		*dp = (CUdeviceptr)(uintptr_t)a->p;
		return 1;
	}
	return 0;
}
static CUresult do_alloc_locked(CUdeviceptr *dp, size_t n, int async) {
	if (!dp || n == 0) return INVALID_VALUE;
	unsigned long long charge = async ? 0 : roundup(n, GRAN);
	if (async && pool_used + roundup(n, 512) > pool_reserved) {
		unsigned long long need = roundup(pool_used + roundup(n, 512), GRAN) - pool_reserved;
		if (used + need > TOTAL) sync_point_locked();
		if (used + need > TOTAL) return OUT_OF_MEMORY;
		used += need; pool_reserved += need;
	}
	if (!async && used + charge > TOTAL) return OUT_OF_MEMORY;
	int slot = -1;
	for (int i = 0; i < MAXALLOC; i++) if (!allocs[i].p) { slot = i; break; }
	void *p = slot < 0 ? 0 : aligned_alloc(512, roundup(n, 512));
	if (!p) return OUT_OF_MEMORY;
	allocs[slot] = (struct alloc){p, n, charge, async, 0, 0, 0};
	used += charge;
	if (async) pool_used += roundup(n, 512);
	*dp = (CUdeviceptr)(uintptr_t)p;
	return OK;
}
static int alloc_at(CUdeviceptr dp) {
	for (int i = 0; i < MAXALLOC; i++)
		if (allocs[i].p && !allocs[i].cached && (CUdeviceptr)(uintptr_t)allocs[i].p == dp) return i;
	return -1;
}
CUresult cuMemAlloc_v2(CUdeviceptr *dp, size_t n) {
	CUresult r = enter();
	if (r) return r;
	return leave(do_alloc_locked(dp, n, 0));
}
/* cuMemFree waits for all work first (implicit synchronization) — but not
 * for cuMemAllocAsync memory, which the driver frees under the work that
 * still uses it (refused here, and counted). */
CUresult cuMemFree_v2(CUdeviceptr dp) {
	CUresult r = enter();
	if (r) return r;
	int i = alloc_at(dp);
	if (i < 0 || allocs[i].pending) return leave(INVALID_VALUE);
	if (allocs[i].async && touches_locked((uintptr_t)dp, allocs[i].n)) {
		free_unsynced++;
		return leave(UNKNOWN); /* a real driver frees it under running work */
	}
	if (!allocs[i].async && (r = wait_locked(-1)) != OK) return leave(r);
	if ((i = alloc_at(dp)) >= 0) free_alloc_locked(i);
	return leave(OK);
}
CUresult cuMemAllocAsync(CUdeviceptr *dp, size_t n, void *s) {
	CUresult r = enter();
	if (r) return r;
	int q = qof(s);
	if (q < 0) return leave(INVALID_HANDLE);
	if (dp && n && reuse_locked(dp, n, q)) return leave(OK);
	r = do_alloc_locked(dp, n, 1);
	if (r == OK) allocs[alloc_at(*dp)].q = q;
	return leave(r);
}
CUresult cuMemFreeAsync(CUdeviceptr dp, void *s) {
	CUresult r = enter();
	if (r) return r;
	int q = qof(s), i = alloc_at(dp);
	if (q < 0) return leave(INVALID_HANDLE);
	if (i < 0 || allocs[i].pending) return leave(INVALID_VALUE);
	if (!allocs[i].async) { freeasync_malloc++; return leave(INVALID_VALUE); }
	struct op *o = new_op(OP_FREE);
	if (!o) return leave(OUT_OF_MEMORY);
	allocs[i].pending = o;
	allocs[i].q = q;
	o->dst = (uintptr_t)dp;
	enqueue_locked(q, o);
	return leave(OK);
}
CUresult cuMemPoolSetAttribute(void *pool, int attr, void *v) {
	CUresult r = enter();
	if (r) return r;
	if ((uintptr_t)pool != 0x2000 || attr != 4) return leave(INVALID_VALUE);
	pool_threshold = *(unsigned long long *)v;
	return leave(OK);
}
CUresult cuMemPoolGetAttribute(void *pool, int attr, void *v) {
	CUresult r = enter();
	if (r) return r;
	if ((uintptr_t)pool != 0x2000) return leave(INVALID_VALUE);
	switch (attr) {
	case 4: *(unsigned long long *)v = pool_threshold; break;
	case 5: *(unsigned long long *)v = pool_reserved; break;
	case 7: *(unsigned long long *)v = pool_used; break;
	default: r = INVALID_VALUE;
	}
	return leave(r);
}
CUresult cuMemPoolTrimTo(void *pool, size_t keep) {
	CUresult r = enter();
	if (r) return r;
	if ((uintptr_t)pool != 0x2000) return leave(INVALID_VALUE);
	release_pool_locked(keep);
	return leave(OK);
}
CUresult cuMemHostRegister_v2(void *p, size_t n, unsigned int flags) {
	if (!p || n == 0 || ((uintptr_t)p & 4095) || (flags & ~3u)) return INVALID_VALUE;
	CUresult r = enter();
	if (r) return r;
	int slot = -1;
	if (register_error) { r = register_error; register_error = 0; return leave(r); }
	for (int i = 0; i < MAXREG; i++) {
		if (regs[i].p && (uintptr_t)p < regs[i].p + regs[i].n && regs[i].p < (uintptr_t)p + n) {
			register_twice++;
			return leave(HOST_MEMORY_ALREADY_REGISTERED);
		}
		if (!regs[i].p && slot < 0) slot = i;
	}
	if (slot < 0) return leave(OUT_OF_MEMORY);
	regs[slot].p = (uintptr_t)p; regs[slot].n = n; regs[slot].flags = flags;
	return leave(OK);
}
/* Unregistering waits for all work, which may still copy to or from it. */
CUresult cuMemHostUnregister(void *p) {
	if (!p) return INVALID_VALUE;
	CUresult r = enter();
	if (r) return r;
	if ((r = wait_locked(-1)) != OK) return leave(r);
	r = HOST_MEMORY_NOT_REGISTERED;
	for (int i = 0; i < MAXREG; i++)
		if (regs[i].p == (uintptr_t)p) { regs[i].p = 0; r = OK; break; }
	return leave(r);
}
CUresult cuMemHostGetDevicePointer_v2(CUdeviceptr *dp, void *p, unsigned int flags) {
	if (flags || !p) return INVALID_VALUE;
	CUresult r = enter();
	if (r) return r;
	int i = reg_of((uintptr_t)p, 1);
	if (i < 0 || !(regs[i].flags & 2)) return leave(INVALID_VALUE);
	*dp = (CUdeviceptr)(uintptr_t)p;
	return leave(OK);
}

/* ---- copies ---- */

/* copy_locked queues a copy of n bytes on q when its host side (if any)
 * is page-locked, else waits for q and copies at once. */
static CUresult copy_locked(int q, uintptr_t dst, int dst_dev, uintptr_t src, int src_dev, size_t n) {
	take_lazy_locked();
	int pinned = (dst_dev || reg_of(dst, n) >= 0) && (src_dev || reg_of(src, n) >= 0);
	if (!pinned) {
		CUresult r = wait_locked(q);
		if (r) return r;
		memmove((void *)dst, (void *)src, n);
		return OK;
	}
	struct op *o = new_op(OP_COPY);
	if (!o) return OUT_OF_MEMORY;
	o->dst = dst; o->dst_dev = dst_dev; o->src = src; o->src_dev = src_dev; o->n = n;
	enqueue_locked(q, o);
	return OK;
}
CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t n, void *s) {
	CUresult r = enter();
	if (r) return r;
	int q = qof(s);
	if (q < 0) return leave(INVALID_HANDLE);
	if (!valid_range(dst, n)) return leave(INVALID_VALUE);
	return leave(copy_locked(q, (uintptr_t)dst, 1, (uintptr_t)src, 0, n));
}
CUresult cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t n, void *s) {
	CUresult r = enter();
	if (r) return r;
	int q = qof(s);
	if (q < 0) return leave(INVALID_HANDLE);
	if (!valid_range(src, n)) return leave(INVALID_VALUE);
	return leave(copy_locked(q, (uintptr_t)dst, 0, (uintptr_t)src, 1, n));
}
CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t n, void *s) {
	CUresult r = enter();
	if (r) return r;
	int q = qof(s);
	if (q < 0) return leave(INVALID_HANDLE);
	if (!valid_range(dst, n) || !valid_range(src, n)) return leave(INVALID_VALUE);
	return leave(copy_locked(q, (uintptr_t)dst, 1, (uintptr_t)src, 1, n));
}
/* Host↔device 2-D copies only (no arrays, no unified addresses); every
 * device row must lie in an allocation, like the 1-D copies here. */
CUresult cuMemcpy2DAsync_v2(const CUDA_MEMCPY2D *c, void *s) {
	if (!c) return INVALID_VALUE;
	CUresult r = enter();
	if (r) return r;
	int q = qof(s);
	if (q < 0) return leave(INVALID_HANDLE);
	if (c->srcArray || c->dstArray) return leave(INVALID_VALUE);
	if (c->srcMemoryType != MEMTYPE_HOST && c->srcMemoryType != MEMTYPE_DEVICE) return leave(INVALID_VALUE);
	if (c->dstMemoryType != MEMTYPE_HOST && c->dstMemoryType != MEMTYPE_DEVICE) return leave(INVALID_VALUE);
	if (c->srcPitch < c->WidthInBytes || c->dstPitch < c->WidthInBytes) return leave(INVALID_VALUE);
	if (c->srcPitch > MAX_PITCH || c->dstPitch > MAX_PITCH) return leave(INVALID_VALUE);
	if (c->WidthInBytes == 0 || c->Height == 0) return leave(OK);
	const char *src = c->srcMemoryType == MEMTYPE_HOST ? (const char *)c->srcHost : (const char *)(uintptr_t)c->srcDevice;
	char *dst = c->dstMemoryType == MEMTYPE_HOST ? (char *)c->dstHost : (char *)(uintptr_t)c->dstDevice;
	if (!src || !dst) return leave(INVALID_VALUE);
	take_lazy_locked();
	size_t ext_s = (c->Height - 1) * c->srcPitch + c->WidthInBytes, ext_d = (c->Height - 1) * c->dstPitch + c->WidthInBytes;
	uintptr_t s0 = (uintptr_t)src + c->srcY * c->srcPitch + c->srcXInBytes, d0 = (uintptr_t)dst + c->dstY * c->dstPitch + c->dstXInBytes;
	int pinned = (c->srcMemoryType == MEMTYPE_DEVICE || reg_of(s0, ext_s) >= 0) &&
		     (c->dstMemoryType == MEMTYPE_DEVICE || reg_of(d0, ext_d) >= 0);
	if (!pinned) {
		if ((r = wait_locked(q)) != OK) return leave(r);
		return leave(copy2d_locked(c) ? OK : INVALID_VALUE);
	}
	struct op *o = new_op(OP_COPY2D);
	if (!o) return leave(OUT_OF_MEMORY);
	o->c2 = *c;
	enqueue_locked(q, o);
	return leave(OK);
}
CUresult cuMemsetD8Async(CUdeviceptr dst, unsigned char v, size_t n, void *s) {
	CUresult r = enter();
	if (r) return r;
	int q = qof(s);
	if (q < 0) return leave(INVALID_HANDLE);
	if (!valid_range(dst, n)) return leave(INVALID_VALUE);
	take_lazy_locked();
	struct op *o = new_op(OP_SET);
	if (!o) return leave(OUT_OF_MEMORY);
	o->dst = (uintptr_t)dst; o->v = v; o->n = n;
	enqueue_locked(q, o);
	return leave(OK);
}

/* ---- streams and events ---- */

CUresult cuStreamCreate(void **s, unsigned int flags) {
	if (flags != 1) return INVALID_VALUE;
	CUresult r = enter();
	if (r) return r;
	if (used + STREAM_BYTES > TOTAL) return leave(OUT_OF_MEMORY);
	int h = new_handle(STREAM);
	if (!h) return leave(OUT_OF_MEMORY);
	used += STREAM_BYTES;
	*s = h2p(h);
	return leave(OK);
}
CUresult cuStreamQuery(void *s) {
	CUresult r = enter();
	if (r) return r;
	int q = qof(s);
	if (q < 0) return leave(INVALID_HANDLE);
	return leave(queues[q].head ? NOT_READY : OK);
}
CUresult cuStreamSynchronize(void *s) {
	CUresult r = enter();
	if (r) return r;
	int q = qof(s);
	if (q < 0) return leave(INVALID_HANDLE);
	r = wait_locked(q);
	sync_point_locked();
	return leave(r);
}
/* A stream destroyed with work queued lives on until the work is done. */
CUresult cuStreamDestroy_v2(void *s) {
	CUresult r = enter();
	if (r) return r;
	int h = p2h(s, STREAM);
	if (!h) return leave(INVALID_HANDLE);
	if (queues[h].head) handles[h] = ZOMBIE_STREAM;
	else { handles[h] = 0; used -= STREAM_BYTES; }
	return leave(OK);
}
CUresult cuStreamWaitEvent(void *s, void *e, unsigned int flags) {
	CUresult r = enter();
	if (r) return r;
	int q = qof(s), h = p2h(e, EVENT);
	if (q < 0 || !h || flags) return leave(INVALID_HANDLE);
	struct op *o = new_op(OP_WAIT);
	if (!o) return leave(OUT_OF_MEMORY);
	o->ev = h; o->seq = events[h].recorded; o->evgen = events[h].gen;
	enqueue_locked(q, o);
	return leave(OK);
}
CUresult cuEventCreate(void **e, unsigned int flags) {
	if (flags != 2) return INVALID_VALUE;
	CUresult r = enter();
	if (r) return r;
	int h = new_handle(EVENT);
	if (!h) return leave(OUT_OF_MEMORY);
	events[h].gen++;
	events[h].recorded = events[h].completed = 0;
	*e = h2p(h);
	return leave(OK);
}
CUresult cuEventRecord(void *e, void *s) {
	CUresult r = enter();
	if (r) return r;
	int h = p2h(e, EVENT), q = qof(s);
	if (!h || q < 0) return leave(INVALID_HANDLE);
	struct op *o = new_op(OP_RECORD);
	if (!o) return leave(OUT_OF_MEMORY);
	o->ev = h; o->seq = ++events[h].recorded; o->evgen = events[h].gen;
	enqueue_locked(q, o);
	return leave(OK);
}
CUresult cuEventQuery(void *e) {
	CUresult r = enter();
	if (r) return r;
	int h = p2h(e, EVENT);
	if (!h) return leave(INVALID_HANDLE);
	return leave(events[h].completed >= events[h].recorded ? OK : NOT_READY);
}
CUresult cuEventSynchronize(void *e) {
	CUresult r = enter();
	if (r) return r;
	int h = p2h(e, EVENT);
	if (!h) return leave(INVALID_HANDLE);
	unsigned long long want = events[h].recorded, gen = events[h].gen;
	for (;;) {
		progress_locked();
		if (sticky) return leave(sticky);
		if (events[h].gen != gen || events[h].completed >= want) break;
		waiters++;
		pthread_mutex_unlock(&mu);
		usleep(50);
		pthread_mutex_lock(&mu);
		waiters--;
	}
	sync_point_locked();
	return leave(OK);
}
CUresult cuEventDestroy_v2(void *e) {
	CUresult r = enter();
	if (r) return r;
	int h = p2h(e, EVENT);
	if (!h) return leave(INVALID_HANDLE);
	handles[h] = 0;
	events[h].gen++;
	return leave(OK);
}

/* ---- modules and kernels ---- */

/* jit_fail writes msg to the JIT's error log, when the caller gave one. */
static void jit_fail(unsigned int nopt, const int *opts, void **vals, const char *msg) {
	char *log = 0;
	size_t size = 0;
	int size_at = -1;
	for (unsigned int i = 0; i < nopt; i++) {
		if (opts[i] == 5) log = vals[i];
		if (opts[i] == 6) { size = (size_t)(uintptr_t)vals[i]; size_at = (int)i; }
	}
	if (!log || size <= strlen(msg)) return;
	strcpy(log, msg);
	vals[size_at] = (void *)(uintptr_t)strlen(msg);
}
/* The JIT: takes text with ".version" (ISA 9.0 at most, CUDA 13.0's) and
 * an ".entry", a ".target" no higher than the device; "bogus" in it is a
 * compile error. Errors go to the error log option. */
CUresult cuModuleLoadDataEx(void **m, const void *image, unsigned int nopt, int *opts, void **vals) {
	const char *text = image;
	for (unsigned int i = 0; i < nopt; i++)
		if (opts[i] < 0 || opts[i] > 30) return INVALID_VALUE;
	if (!text) return INVALID_VALUE;
	CUresult r = enter();
	if (r) return r;
	char msg[160];
	const char *v = strstr(text, ".version"), *t = strstr(text, ".target");
	int major = 0, minor = 0, sm = 0;
	if (!v || sscanf(v, ".version %d.%d", &major, &minor) != 2 || !strstr(text, ".entry") || strstr(text, "bogus")) {
		jit_fail(nopt, opts, vals, "ptxas fatal   : fake JIT: unknown instruction 'bogus'");
		return leave(INVALID_PTX);
	}
	if (major > 9 || (major == 9 && minor > 0)) {
		snprintf(msg, sizeof msg, "ptxas fatal   : fake JIT: Unsupported .version %d.%d; current version is '9.0'", major, minor);
		jit_fail(nopt, opts, vals, msg);
		return leave(UNSUPPORTED_PTX_VERSION);
	}
	if (t && sscanf(t, ".target sm_%d", &sm) == 1 && sm > SM) {
		snprintf(msg, sizeof msg, "ptxas fatal   : fake JIT: .target sm_%d is higher than the device's sm_%d", sm, SM);
		jit_fail(nopt, opts, vals, msg);
		return leave(INVALID_PTX);
	}
	int h = new_handle(MODULE);
	if (!h) return leave(OUT_OF_MEMORY);
	module_text[h] = strdup(text);
	*m = h2p(h);
	return leave(OK);
}
CUresult cuModuleGetFunction(void **f, void *m, const char *name) {
	CUresult r = enter();
	if (r) return r;
	int mh = p2h(m, MODULE);
	if (!mh) return leave(INVALID_HANDLE);
	char want[80];
	if (strlen(name) > 60) return leave(NOT_FOUND);
	snprintf(want, sizeof want, ".entry %s(", name);
	if (!strstr(module_text[mh], want)) return leave(NOT_FOUND);
	int h = new_handle(FUNCTION);
	if (!h) return leave(OUT_OF_MEMORY);
	function_module[h] = mh;
	strcpy(function_name[h], name);
	*f = h2p(h);
	return leave(OK);
}
CUresult cuModuleUnload(void *m) {
	CUresult r = enter();
	if (r) return r;
	int h = p2h(m, MODULE);
	if (!h) return leave(INVALID_HANDLE);
	handles[h] = 0;
	free(module_text[h]);
	module_text[h] = 0;
	return leave(OK);
}
static int ends_with(const char *s, const char *suffix) {
	size_t n = strlen(s), k = strlen(suffix);
	return n >= k && !strcmp(s + n - k, suffix);
}
/* Runs the "fill" kernel of the Go tests: p[i] = a*i + (float)b for i < n,
 * over every thread of the grid; holds the stream for a ..._spin or
 * ..._wait kernel. Any other kernel runs and does nothing. */
CUresult cuLaunchKernel(void *f, unsigned int gx, unsigned int gy, unsigned int gz,
	unsigned int bx, unsigned int by, unsigned int bz, unsigned int shared,
	void *s, void **params, void **extra) {
	CUresult r = enter();
	if (r) return r;
	int fh = p2h(f, FUNCTION), q = qof(s);
	if (!fh || !p2h(h2p(function_module[fh]), MODULE) || q < 0) return leave(INVALID_HANDLE);
	if (!gx || !gy || !gz || !bx || !by || !bz || bx * by * bz > 1024 || shared > 48 * 1024 || extra) return leave(INVALID_VALUE);
	const char *name = function_name[fh];
	struct op *o = new_op(OP_NOP);
	if (!o) return leave(OUT_OF_MEMORY);
	if (!strcmp(name, "fill")) {
		if (!params) { free(o); return leave(INVALID_VALUE); }
		o->kind = OP_FILL;
		o->dst = (uintptr_t) * (CUdeviceptr *)params[0];
		o->fn = *(unsigned int *)params[1];
		o->fa = *(float *)params[2];
		o->fb = *(double *)params[3];
		o->n = (unsigned long long)gx * bx;
	} else if (ends_with(name, "_spin") || ends_with(name, "_wait")) {
		if (!params) { free(o); return leave(INVALID_VALUE); }
		o->kind = OP_SPIN;
		o->dst = (uintptr_t) * (CUdeviceptr *)params[0];
	}
	take_lazy_locked();
	enqueue_locked(q, o);
	return leave(OK); /* a fault shows in a later call */
}

/* ---- virtual memory management ----
 * A reservation is host address space mapped PROT_NONE; physical memory is
 * a memfd, so mapping it (MAP_SHARED | MAP_FIXED into the reservation)
 * shows the same bytes wherever it is mapped, as on a GPU; unmapping maps
 * PROT_NONE again. Layouts as cuda.h declares them on LP64, checked by
 * size. */
typedef struct { int type; int id; } CUmemLocation;
typedef struct {
	int type;                 /* CU_MEM_ALLOCATION_TYPE_PINNED = 1 */
	int requestedHandleTypes; /* 0: none */
	CUmemLocation location;   /* CU_MEM_LOCATION_TYPE_DEVICE = 1, device 0 */
	void *win32HandleMetaData;
	struct { unsigned char compressionType, gpuDirectRDMACapable; unsigned short usage; unsigned char reserved[4]; } allocFlags;
} CUmemAllocationProp;
_Static_assert(sizeof(CUmemAllocationProp) == 32, "CUmemAllocationProp is 32 bytes on LP64");
typedef struct { CUmemLocation location; int flags; } CUmemAccessDesc;
_Static_assert(sizeof(CUmemAccessDesc) == 12, "CUmemAccessDesc is 12 bytes");

#define MAXVM 1024
struct vres { CUdeviceptr p; size_t n; void *m; size_t mlen; };
struct vphys { int fd; size_t n; int released, maps; };
struct vmap { CUdeviceptr p; size_t n; int phys, access; };
static struct vres vres[MAXVM];
static struct vphys vphys[MAXVM]; /* handle h is slot h-1 */
static struct vmap vmaps[MAXVM];

static unsigned long long vm_phys_bytes_locked(void) {
	unsigned long long n = 0;
	for (int i = 0; i < MAXVM; i++) n += vphys[i].n;
	return n;
}
static int vm_reservations_locked(void) {
	int n = 0;
	for (int i = 0; i < MAXVM; i++) n += vres[i].p != 0;
	return n;
}
/* vm_destroy_all_locked frees every virtual memory object (the context is
 * gone: the process lets its device go). */
static void vm_destroy_all_locked(void) {
	for (int i = 0; i < MAXVM; i++) {
		if (vphys[i].n) close(vphys[i].fd);
		if (vres[i].p) munmap(vres[i].m, vres[i].mlen);
	}
	memset(vphys, 0, sizeof vphys);
	memset(vres, 0, sizeof vres);
	memset(vmaps, 0, sizeof vmaps);
}
static int prop_ok(const CUmemAllocationProp *p) {
	return p && p->type == 1 && p->requestedHandleTypes == 0 && p->location.type == 1 && p->location.id == 0 && !p->win32HandleMetaData;
}
CUresult cuMemGetAllocationGranularity(size_t *g, const CUmemAllocationProp *prop, int option) {
	if (!g || !prop_ok(prop) || (option != 0 && option != 1)) return INVALID_VALUE;
	*g = GRAN; return OK;
}
/* The size must be a multiple of the host page; the alignment a power of
 * two, or 0 for the driver's default, which here is 64 KiB and, on
 * purpose, never 2 MiB: a caller that needs granularity-aligned ranges
 * must ask for them. */
CUresult cuMemAddressReserve(CUdeviceptr *p, size_t n, size_t align, CUdeviceptr addr, unsigned long long flags) {
	(void)addr; /* a hint the driver may ignore */
	if (!p || n == 0 || n % 4096 || flags || (align & (align - 1))) return INVALID_VALUE;
	CUresult r = enter();
	if (r) return r;
	size_t a = align ? align : DEFAULT_ALIGN, big = a > GRAN ? a : GRAN;
	int slot = -1;
	for (int i = 0; i < MAXVM; i++) if (!vres[i].p) { slot = i; break; }
	size_t mlen = n + 2 * big;
	void *m = slot < 0 ? MAP_FAILED : mmap(0, mlen, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (m == MAP_FAILED) return leave(OUT_OF_MEMORY);
	CUdeviceptr base = roundup((CUdeviceptr)(uintptr_t)m, big);
	if (a < GRAN) base += a; /* aligned to a, and not to the granularity */
	vres[slot] = (struct vres){base, n, m, mlen};
	*p = base;
	return leave(OK);
}
/* Freeing a range with mappings in it succeeds (the reference does not
 * refuse it) and leaks them. */
CUresult cuMemAddressFree(CUdeviceptr p, size_t n) {
	CUresult r = enter();
	if (r) return r;
	r = INVALID_VALUE;
	for (int i = 0; i < MAXVM; i++) {
		if (vres[i].p == p && vres[i].n == n) {
			int mapped = 0;
			for (int j = 0; j < MAXVM; j++) mapped |= vmaps[j].n && vmaps[j].p >= p && vmaps[j].p < p + n;
			if (mapped) addressfree_mapped++; /* the mappings and their host range stay */
			else munmap(vres[i].m, vres[i].mlen);
			memset(&vres[i], 0, sizeof vres[i]);
			r = OK;
			break;
		}
	}
	return leave(r);
}
CUresult cuMemCreate(unsigned long long *h, size_t n, const CUmemAllocationProp *prop, unsigned long long flags) {
	if (!h || n == 0 || n % GRAN || flags || !prop_ok(prop)) return INVALID_VALUE;
	CUresult r = enter();
	if (r) return r;
	int slot = -1;
	for (int i = 0; i < MAXVM; i++) if (!vphys[i].n) { slot = i; break; }
	if (slot < 0 || used + n > TOTAL) return leave(OUT_OF_MEMORY);
	int fd = memfd_create("fakecuda", 0);
	if (fd < 0 || ftruncate(fd, (off_t)n) != 0) { if (fd >= 0) close(fd); return leave(OUT_OF_MEMORY); }
	vphys[slot] = (struct vphys){fd, n, 0, 0};
	used += n;
	*h = (unsigned long long)slot + 1;
	return leave(OK);
}
static struct vphys *phys_of(unsigned long long h) {
	return h >= 1 && h <= MAXVM && vphys[h - 1].n && !vphys[h - 1].released ? &vphys[h - 1] : 0;
}
static void drop_phys_locked(struct vphys *ph) {
	close(ph->fd); used -= ph->n; memset(ph, 0, sizeof *ph);
}
CUresult cuMemRelease(unsigned long long h) {
	CUresult r = enter();
	if (r) return r;
	struct vphys *ph = phys_of(h);
	if (ph) { ph->released = 1; if (!ph->maps) drop_phys_locked(ph); }
	return leave(ph ? OK : INVALID_VALUE);
}
CUresult cuMemMap(CUdeviceptr p, size_t n, size_t off, unsigned long long h, unsigned long long flags) {
	if (n == 0 || n % GRAN || p % GRAN || off || flags) return INVALID_VALUE;
	CUresult r = enter();
	if (r) return r;
	struct vphys *ph = phys_of(h);
	int inres = 0, overlap = 0, slot = -1;
	for (int i = 0; i < MAXVM; i++) {
		inres |= vres[i].p && p >= vres[i].p && p + n <= vres[i].p + vres[i].n;
		overlap |= vmaps[i].n && p < vmaps[i].p + vmaps[i].n && vmaps[i].p < p + n;
		if (!vmaps[i].n && slot < 0) slot = i;
	}
	if (overlap) map_over++;
	if (!ph || n != ph->n || !inres || overlap || slot < 0) return leave(INVALID_VALUE);
	if (mmap((void *)(uintptr_t)p, n, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, ph->fd, 0) == MAP_FAILED)
		return leave(OUT_OF_MEMORY);
	vmaps[slot] = (struct vmap){p, n, (int)h, 0};
	ph->maps++;
	return leave(OK);
}
CUresult cuMemUnmap(CUdeviceptr p, size_t n) {
	CUresult r = enter();
	if (r) return r;
	r = INVALID_VALUE;
	for (int i = 0; i < MAXVM; i++) {
		if (vmaps[i].n && vmaps[i].p == p && vmaps[i].n == n) {
			mmap((void *)(uintptr_t)p, n, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
			struct vphys *ph = &vphys[vmaps[i].phys - 1];
			if (--ph->maps == 0 && ph->released) drop_phys_locked(ph);
			memset(&vmaps[i], 0, sizeof vmaps[i]);
			r = OK;
			break;
		}
	}
	return leave(r);
}
CUresult cuMemSetAccess(CUdeviceptr p, size_t n, const CUmemAccessDesc *desc, size_t count) {
	if (!desc || count != 1 || desc->location.type != 1 || desc->location.id != 0 || desc->flags != 3) return INVALID_VALUE;
	CUresult r = enter();
	if (r) return r;
	int ok = 1;
	for (CUdeviceptr at = p; ok && at < p + n;) {
		ok = 0;
		for (int i = 0; i < MAXVM; i++)
			if (vmaps[i].n && vmaps[i].p == at) { vmaps[i].access = 1; at += vmaps[i].n; ok = 1; break; }
	}
	return leave(ok ? OK : INVALID_VALUE);
}
/* [p, p+n) lies in accessible mappings. Requires mu. */
static int vm_valid_range(CUdeviceptr p, size_t n) {
	for (CUdeviceptr at = p; at < p + n;) {
		int found = 0;
		for (int i = 0; i < MAXVM; i++)
			if (vmaps[i].n && vmaps[i].access && at >= vmaps[i].p && at < vmaps[i].p + vmaps[i].n) { at = vmaps[i].p + vmaps[i].n; found = 1; break; }
		if (!found) return 0;
	}
	return n > 0;
}
