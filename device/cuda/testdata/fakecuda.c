/*
 * fakecuda.c: a stand-in for libcuda.so.1 used only by device/cuda's tests
 * on machines without a GPU (TestWithFakeDriver builds it with cc when one
 * is installed). It exports the driver entry points the backend binds, with
 * the same C signatures, and keeps "device memory" in host memory, so the
 * whole Go path — dlopen, symbol lookup, argument passing in registers and
 * on the stack, out-parameters, kernelParams, the JIT log buffers — runs for
 * real. It checks what it is given and fails the way the driver documents.
 * It is not a model of CUDA's timing or asynchrony: every operation is done
 * when its call returns. It does keep the rules a real driver would break
 * on silently, and counts each breach (vram_fake_count, for the tests):
 *   - cuMemFree of cuMemAllocAsync memory while work enqueued on some stream
 *     has not been waited for by cuCtxSynchronize ("free_unsynced"): the
 *     driver does no implicit synchronization for such memory;
 *   - cuMemFreeAsync of memory from cuMemAlloc ("freeasync_malloc");
 *   - cuMemHostRegister of a range that is still registered
 *     ("register_twice"; a context reset here keeps registrations, the
 *     worst a driver may do).
 * vram_fake_set("register_error", code) makes the next cuMemHostRegister
 * fail with code, as a system that refuses to pin more memory does.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <sys/mman.h>
#include <unistd.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;

enum {
	OK = 0, INVALID_VALUE = 1, OUT_OF_MEMORY = 2, NOT_INITIALIZED = 3,
	INVALID_DEVICE = 101, INVALID_CONTEXT = 201, INVALID_PTX = 218,
	INVALID_HANDLE = 400, NOT_FOUND = 500, NOT_READY = 600,
};

#define TOTAL (1ull << 30)
#define CONTEXT (64ull << 20)
#define GRAN (2ull << 20)
#define MAXALLOC 4096
/* Far below a real GPU's 2 GiB − 1, so that tests can reach it. */
#define MAX_PITCH (1 << 20)

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static int inited, refs, ctxgen = 1;
static unsigned long long used;            /* bytes taken from TOTAL, context included */
static unsigned long long pool_reserved, pool_used, pool_threshold;
struct alloc { void *p; unsigned long long n, charged; int async; };
static struct alloc allocs[MAXALLOC];
static int handles[1024];                  /* live stream/event/module/function handles */
static int unsynced;                       /* work enqueued since the last cuCtxSynchronize */
static int free_unsynced, freeasync_malloc, register_twice, register_error;
#define MAXREG 256
static struct { uintptr_t p; size_t n; } regs[MAXREG]; /* registered host ranges */

int vram_fake_count(const char *what) {
	pthread_mutex_lock(&mu);
	int v = -1, n = 0;
	if (!strcmp(what, "free_unsynced")) v = free_unsynced;
	else if (!strcmp(what, "freeasync_malloc")) v = freeasync_malloc;
	else if (!strcmp(what, "register_twice")) v = register_twice;
	else if (!strcmp(what, "registered")) {
		for (int i = 0; i < MAXREG; i++) n += regs[i].p != 0;
		v = n;
	}
	pthread_mutex_unlock(&mu);
	return v;
}
int vram_fake_set(const char *what, int v) {
	pthread_mutex_lock(&mu);
	int ok = 1;
	if (!strcmp(what, "register_error")) register_error = v;
	else ok = 0;
	pthread_mutex_unlock(&mu);
	return ok;
}
static void enqueued(void) { pthread_mutex_lock(&mu); unsynced = 1; pthread_mutex_unlock(&mu); }

static unsigned long long roundup(unsigned long long n, unsigned long long g) { return (n + g - 1) / g * g; }
static uintptr_t ctx_handle(void) { return 0x1000 + (uintptr_t)ctxgen; }

static int new_handle(int kind) {
	for (int i = 1; i < 1024; i++)
		if (!handles[i]) { handles[i] = kind; return i; }
	return 0;
}
/* Handles are small integers scaled so they look like pointers. */
static void *h2p(int h) { return (void *)(uintptr_t)(h * 64); }
static int p2h(void *p, int kind) {
	uintptr_t v = (uintptr_t)p;
	if (v % 64 || v / 64 >= 1024 || handles[v / 64] != kind) return 0;
	return (int)(v / 64);
}
enum { STREAM = 1, EVENT, MODULE, FUNCTION };
static char module_text[64][64 << 10]; /* PTX texts of live modules */
static int function_module[1024];
static char function_name[1024][64];

static void release_pool_locked(unsigned long long keep) {
	unsigned long long floor = roundup(pool_used, GRAN), target = pool_reserved;
	if (target > keep) target = keep > floor ? roundup(keep, GRAN) : floor;
	if (target < pool_reserved) { used -= pool_reserved - target; pool_reserved = target; }
}
static void sync_point_locked(void) { release_pool_locked(pool_threshold); }

static void destroy_all_locked(void) {
	for (int i = 0; i < MAXALLOC; i++)
		if (allocs[i].p) { free(allocs[i].p); allocs[i].p = 0; }
	memset(handles, 0, sizeof handles);
	used = CONTEXT; pool_reserved = pool_used = 0;
	ctxgen++;
}

CUresult cuInit(unsigned int flags) {
	if (flags) return INVALID_VALUE;
	inited = 1; return OK;
}
CUresult cuDriverGetVersion(int *v) { if (!v) return INVALID_VALUE; *v = 12040; return OK; }
CUresult cuGetErrorName(CUresult e, const char **s) {
	switch (e) {
	case OK: *s = "CUDA_SUCCESS"; return OK;
	case INVALID_VALUE: *s = "CUDA_ERROR_INVALID_VALUE"; return OK;
	case OUT_OF_MEMORY: *s = "CUDA_ERROR_OUT_OF_MEMORY"; return OK;
	case INVALID_PTX: *s = "CUDA_ERROR_INVALID_PTX"; return OK;
	case NOT_FOUND: *s = "CUDA_ERROR_NOT_FOUND"; return OK;
	case INVALID_HANDLE: *s = "CUDA_ERROR_INVALID_HANDLE"; return OK;
	}
	*s = 0; return INVALID_VALUE;
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
	*s = 0; return INVALID_VALUE;
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
CUresult cuDeviceGetUuid(unsigned char *uuid, CUdevice d) {
	if (d != 0) return INVALID_DEVICE;
	for (int i = 0; i < 16; i++) uuid[i] = (unsigned char)(0xa0 + i);
	return OK;
}
CUresult cuDeviceGetAttribute(int *v, int attr, CUdevice d) {
	if (d != 0) return INVALID_DEVICE;
	switch (attr) {
	case 75: *v = 9; return OK;   /* compute capability major */
	case 76: *v = 0; return OK;   /* minor */
	case 11: *v = MAX_PITCH; return OK; /* max pitch for cuMemcpy2D */
	case 115: *v = 1; return OK;  /* memory pools supported */
	case 102: *v = 1; return OK;  /* virtual memory management supported */
	}
	return INVALID_VALUE;
}
CUresult cuDeviceTotalMem_v2(size_t *n, CUdevice d) { *n = TOTAL; return d ? INVALID_DEVICE : OK; }
CUresult cuDevicePrimaryCtxRetain(void **ctx, CUdevice d) {
	if (d != 0) return INVALID_DEVICE;
	pthread_mutex_lock(&mu);
	if (refs++ == 0) used = CONTEXT;
	*ctx = (void *)ctx_handle();
	pthread_mutex_unlock(&mu);
	return OK;
}
CUresult cuDevicePrimaryCtxRelease_v2(CUdevice d) {
	if (d != 0) return INVALID_DEVICE;
	pthread_mutex_lock(&mu);
	CUresult r = OK;
	if (refs == 0) r = INVALID_CONTEXT;
	else if (--refs == 0) { destroy_all_locked(); used = 0; }
	pthread_mutex_unlock(&mu);
	return r;
}
CUresult cuDevicePrimaryCtxReset_v2(CUdevice d) {
	if (d != 0) return INVALID_DEVICE;
	pthread_mutex_lock(&mu);
	destroy_all_locked();
	pthread_mutex_unlock(&mu);
	return OK;
}
CUresult cuDeviceGetDefaultMemPool(void **pool, CUdevice d) { *pool = (void *)0x2000; return d ? INVALID_DEVICE : OK; }
/* The context current on each thread (0: none). Besides the primary
 * context, two handles stand for contexts the fake never makes but that a
 * program calling vram may have current: OTHER_CTX, a second context of
 * device 0 (as cuCtxCreate makes), and PEER_CTX, a context of a device 1
 * the fake has no other trace of. */
#define OTHER_CTX 0x7000
#define PEER_CTX 0x7040
static __thread uintptr_t current_ctx;
CUresult cuCtxSetCurrent(void *ctx) {
	uintptr_t c = (uintptr_t)ctx;
	if (c != 0 && c != ctx_handle() && c != OTHER_CTX && c != PEER_CTX) return INVALID_CONTEXT;
	current_ctx = c;
	return OK;
}
CUresult cuCtxGetCurrent(void **ctx) {
	if (!ctx) return INVALID_VALUE;
	*ctx = (void *)current_ctx;
	return OK;
}
CUresult cuCtxGetDevice(CUdevice *d) {
	if (!d) return INVALID_VALUE;
	if (!current_ctx) return INVALID_CONTEXT;
	*d = current_ctx == PEER_CTX ? 1 : 0;
	return OK;
}
CUresult cuCtxSynchronize(void) {
	pthread_mutex_lock(&mu); sync_point_locked(); unsynced = 0; pthread_mutex_unlock(&mu);
	return OK;
}
CUresult cuMemGetInfo_v2(size_t *free, size_t *total) {
	pthread_mutex_lock(&mu);
	*free = TOTAL - used; *total = TOTAL;
	pthread_mutex_unlock(&mu);
	return OK;
}

static CUresult do_alloc(CUdeviceptr *dp, size_t n, int async) {
	if (!dp || n == 0) return INVALID_VALUE;
	pthread_mutex_lock(&mu);
	unsigned long long charge = async ? 0 : roundup(n, GRAN);
	if (async && pool_used + roundup(n, 512) > pool_reserved) {
		unsigned long long need = roundup(pool_used + roundup(n, 512), GRAN) - pool_reserved;
		if (used + need > TOTAL) { sync_point_locked(); }
		if (used + need > TOTAL) { pthread_mutex_unlock(&mu); return OUT_OF_MEMORY; }
		used += need; pool_reserved += need;
	}
	if (!async && used + charge > TOTAL) { pthread_mutex_unlock(&mu); return OUT_OF_MEMORY; }
	int slot = -1;
	for (int i = 0; i < MAXALLOC; i++) if (!allocs[i].p) { slot = i; break; }
	void *p = slot < 0 ? 0 : aligned_alloc(512, roundup(n, 512));
	if (!p) { pthread_mutex_unlock(&mu); return OUT_OF_MEMORY; }
	allocs[slot] = (struct alloc){p, n, charge, async};
	used += charge;
	if (async) pool_used += roundup(n, 512);
	*dp = (CUdeviceptr)(uintptr_t)p;
	pthread_mutex_unlock(&mu);
	return OK;
}
/* how: 0 cuMemFree, 1 cuMemFreeAsync */
static CUresult do_free(CUdeviceptr dp, int how) {
	pthread_mutex_lock(&mu);
	for (int i = 0; i < MAXALLOC; i++) {
		if (allocs[i].p && (CUdeviceptr)(uintptr_t)allocs[i].p == dp) {
			if (how == 0 && allocs[i].async && unsynced) {
				free_unsynced++;
				pthread_mutex_unlock(&mu);
				return 999; /* a real driver frees it under running work */
			}
			if (how == 1 && !allocs[i].async) {
				freeasync_malloc++;
				pthread_mutex_unlock(&mu);
				return INVALID_VALUE;
			}
			if (allocs[i].async) pool_used -= roundup(allocs[i].n, 512);
			used -= allocs[i].charged;
			free(allocs[i].p);
			allocs[i].p = 0;
			pthread_mutex_unlock(&mu);
			return OK;
		}
	}
	pthread_mutex_unlock(&mu);
	return INVALID_VALUE;
}
static int vm_valid_range(CUdeviceptr p, size_t n);
/* A device range is valid when it lies in one allocation or is host memory
 * the test registered (mapped buffers use their host address). */
static int valid_range(CUdeviceptr p, size_t n) {
	pthread_mutex_lock(&mu);
	int ok = 0;
	for (int i = 0; i < MAXALLOC && !ok; i++) {
		CUdeviceptr b = (CUdeviceptr)(uintptr_t)allocs[i].p;
		ok = allocs[i].p && p >= b && p + n <= b + allocs[i].n;
	}
	if (!ok) ok = vm_valid_range(p, n);
	pthread_mutex_unlock(&mu);
	return ok;
}
/* 0 is the NULL stream; 1 and 2 are CU_STREAM_LEGACY and
 * CU_STREAM_PER_THREAD, which the driver takes wherever a stream goes. */
static int valid_stream(void *s) { return (uintptr_t)s <= 2 || p2h(s, STREAM); }

CUresult cuMemAlloc_v2(CUdeviceptr *dp, size_t n) { return do_alloc(dp, n, 0); }
CUresult cuMemFree_v2(CUdeviceptr dp) { return do_free(dp, 0); }
CUresult cuMemAllocAsync(CUdeviceptr *dp, size_t n, void *s) {
	if (!valid_stream(s)) return INVALID_HANDLE;
	enqueued();
	return do_alloc(dp, n, 1);
}
CUresult cuMemFreeAsync(CUdeviceptr dp, void *s) {
	if (!valid_stream(s)) return INVALID_HANDLE;
	enqueued();
	return do_free(dp, 1);
}
CUresult cuMemPoolSetAttribute(void *pool, int attr, void *v) {
	if ((uintptr_t)pool != 0x2000 || attr != 4) return INVALID_VALUE;
	pthread_mutex_lock(&mu); pool_threshold = *(unsigned long long *)v; pthread_mutex_unlock(&mu);
	return OK;
}
CUresult cuMemPoolGetAttribute(void *pool, int attr, void *v) {
	if ((uintptr_t)pool != 0x2000) return INVALID_VALUE;
	pthread_mutex_lock(&mu);
	CUresult r = OK;
	switch (attr) {
	case 4: *(unsigned long long *)v = pool_threshold; break;
	case 5: *(unsigned long long *)v = pool_reserved; break;
	case 7: *(unsigned long long *)v = pool_used; break;
	default: r = INVALID_VALUE;
	}
	pthread_mutex_unlock(&mu);
	return r;
}
CUresult cuMemPoolTrimTo(void *pool, size_t keep) {
	if ((uintptr_t)pool != 0x2000) return INVALID_VALUE;
	pthread_mutex_lock(&mu); release_pool_locked(keep); pthread_mutex_unlock(&mu);
	return OK;
}
CUresult cuMemHostRegister_v2(void *p, size_t n, unsigned int flags) {
	if (!p || n == 0 || ((uintptr_t)p & 4095) || (flags & ~3u)) return INVALID_VALUE;
	pthread_mutex_lock(&mu);
	CUresult r = OK;
	int slot = -1;
	if (register_error) { r = register_error; register_error = 0; goto out; }
	for (int i = 0; i < MAXREG; i++) {
		if (regs[i].p && (uintptr_t)p < regs[i].p + regs[i].n && regs[i].p < (uintptr_t)p + n) {
			register_twice++;
			r = 712; /* CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED */
			goto out;
		}
		if (!regs[i].p && slot < 0) slot = i;
	}
	if (slot < 0) { r = OUT_OF_MEMORY; goto out; }
	regs[slot].p = (uintptr_t)p; regs[slot].n = n;
out:
	pthread_mutex_unlock(&mu);
	return r;
}
CUresult cuMemHostUnregister(void *p) {
	if (!p) return INVALID_VALUE;
	pthread_mutex_lock(&mu);
	CUresult r = 713; /* CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED */
	for (int i = 0; i < MAXREG; i++)
		if (regs[i].p == (uintptr_t)p) { regs[i].p = 0; r = OK; break; }
	pthread_mutex_unlock(&mu);
	return r;
}
CUresult cuMemHostGetDevicePointer_v2(CUdeviceptr *dp, void *p, unsigned int flags) {
	if (flags || !p) return INVALID_VALUE;
	*dp = (CUdeviceptr)(uintptr_t)p; return OK;
}
CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t n, void *s) {
	if (!valid_stream(s)) return INVALID_HANDLE;
	enqueued();
	if (!valid_range(dst, n)) return INVALID_VALUE;
	memcpy((void *)(uintptr_t)dst, src, n); return OK;
}
CUresult cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t n, void *s) {
	if (!valid_stream(s)) return INVALID_HANDLE;
	enqueued();
	if (!valid_range(src, n)) return INVALID_VALUE;
	memcpy(dst, (void *)(uintptr_t)src, n); return OK;
}
CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t n, void *s) {
	if (!valid_stream(s)) return INVALID_HANDLE;
	enqueued();
	/* src may be a mapped host buffer, which the fake does not track */
	if (!valid_range(dst, n)) return INVALID_VALUE;
	memmove((void *)(uintptr_t)dst, (void *)(uintptr_t)src, n); return OK;
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

/* Host↔device 2-D copies only (no arrays, no unified addresses); every
 * device row must lie in an allocation, like the 1-D copies here. */
CUresult cuMemcpy2DAsync_v2(const CUDA_MEMCPY2D *c, void *s) {
	if (!c) return INVALID_VALUE;
	if (!valid_stream(s)) return INVALID_HANDLE;
	if (c->srcArray || c->dstArray) return INVALID_VALUE;
	enqueued();
	if (c->srcMemoryType != MEMTYPE_HOST && c->srcMemoryType != MEMTYPE_DEVICE) return INVALID_VALUE;
	if (c->dstMemoryType != MEMTYPE_HOST && c->dstMemoryType != MEMTYPE_DEVICE) return INVALID_VALUE;
	if (c->srcPitch < c->WidthInBytes || c->dstPitch < c->WidthInBytes) return INVALID_VALUE;
	if (c->srcPitch > MAX_PITCH || c->dstPitch > MAX_PITCH) return INVALID_VALUE;
	if (c->WidthInBytes == 0 || c->Height == 0) return OK;
	const char *src = c->srcMemoryType == MEMTYPE_HOST ? (const char *)c->srcHost : (const char *)(uintptr_t)c->srcDevice;
	char *dst = c->dstMemoryType == MEMTYPE_HOST ? (char *)c->dstHost : (char *)(uintptr_t)c->dstDevice;
	if (!src || !dst) return INVALID_VALUE;
	src += c->srcY * c->srcPitch + c->srcXInBytes;
	dst += c->dstY * c->dstPitch + c->dstXInBytes;
	for (size_t r = 0; r < c->Height; r++) {
		if (c->srcMemoryType == MEMTYPE_DEVICE && !valid_range((CUdeviceptr)(uintptr_t)(src + r * c->srcPitch), c->WidthInBytes))
			return INVALID_VALUE;
		if (c->dstMemoryType == MEMTYPE_DEVICE && !valid_range((CUdeviceptr)(uintptr_t)(dst + r * c->dstPitch), c->WidthInBytes))
			return INVALID_VALUE;
	}
	for (size_t r = 0; r < c->Height; r++)
		memmove(dst + r * c->dstPitch, src + r * c->srcPitch, c->WidthInBytes);
	return OK;
}
CUresult cuMemsetD8Async(CUdeviceptr dst, unsigned char v, size_t n, void *s) {
	if (!valid_stream(s)) return INVALID_HANDLE;
	enqueued();
	if (!valid_range(dst, n)) return INVALID_VALUE;
	memset((void *)(uintptr_t)dst, v, n); return OK;
}
static CUresult make(void **out, int kind) {
	pthread_mutex_lock(&mu);
	int h = new_handle(kind);
	pthread_mutex_unlock(&mu);
	if (!h) return OUT_OF_MEMORY;
	*out = h2p(h); return OK;
}
static CUresult destroy(void *p, int kind) {
	pthread_mutex_lock(&mu);
	int h = p2h(p, kind);
	if (h) handles[h] = 0;
	pthread_mutex_unlock(&mu);
	return h ? OK : INVALID_HANDLE;
}
CUresult cuStreamCreate(void **s, unsigned int flags) { return flags != 1 ? INVALID_VALUE : make(s, STREAM); }
CUresult cuStreamQuery(void *s) { return valid_stream(s) ? OK : INVALID_HANDLE; }
CUresult cuStreamSynchronize(void *s) {
	if (!valid_stream(s)) return INVALID_HANDLE;
	pthread_mutex_lock(&mu); sync_point_locked(); pthread_mutex_unlock(&mu);
	return OK;
}
CUresult cuStreamDestroy_v2(void *s) { return destroy(s, STREAM); }
CUresult cuStreamWaitEvent(void *s, void *e, unsigned int flags) {
	return valid_stream(s) && p2h(e, EVENT) && flags == 0 ? OK : INVALID_HANDLE;
}
CUresult cuEventCreate(void **e, unsigned int flags) { return flags != 2 ? INVALID_VALUE : make(e, EVENT); }
CUresult cuEventRecord(void *e, void *s) { return p2h(e, EVENT) && valid_stream(s) ? OK : INVALID_HANDLE; }
CUresult cuEventQuery(void *e) { return p2h(e, EVENT) ? OK : INVALID_HANDLE; }
CUresult cuEventSynchronize(void *e) {
	if (!p2h(e, EVENT)) return INVALID_HANDLE;
	pthread_mutex_lock(&mu); sync_point_locked(); pthread_mutex_unlock(&mu);
	return OK;
}
CUresult cuEventDestroy_v2(void *e) { return destroy(e, EVENT); }

/* The JIT: accepts text with ".version" and an ".entry"; "bogus" in it is a
 * compile error, reported through the error log option. */
CUresult cuModuleLoadDataEx(void **m, const void *image, unsigned int nopt, int *opts, void **vals) {
	const char *text = image;
	char *errlog = 0;
	size_t errsize = 0;
	for (unsigned int i = 0; i < nopt; i++) {
		if (opts[i] == 5) errlog = vals[i];
		if (opts[i] == 6) errsize = (size_t)(uintptr_t)vals[i];
		if (opts[i] < 0 || opts[i] > 30) return INVALID_VALUE;
	}
	if (!text || strlen(text) >= sizeof module_text[0]) return INVALID_VALUE;
	if (!strstr(text, ".version") || !strstr(text, ".entry") || strstr(text, "bogus")) {
		if (errlog && errsize > 64) {
			strcpy(errlog, "ptxas fatal   : fake JIT: unknown instruction 'bogus'");
			vals[1] = (void *)(uintptr_t)strlen(errlog);
		}
		return INVALID_PTX;
	}
	CUresult r = make(m, MODULE);
	if (r == OK) strcpy(module_text[p2h(*m, MODULE) % 64], text);
	return r;
}
CUresult cuModuleGetFunction(void **f, void *m, const char *name) {
	int mh = p2h(m, MODULE);
	if (!mh) return INVALID_HANDLE;
	char want[80];
	if (strlen(name) > 60) return NOT_FOUND;
	strcpy(want, ".entry ");
	strcat(want, name);
	strcat(want, "(");
	if (!strstr(module_text[mh % 64], want)) return NOT_FOUND;
	CUresult r = make(f, FUNCTION);
	if (r == OK) {
		function_module[p2h(*f, FUNCTION)] = mh;
		strcpy(function_name[p2h(*f, FUNCTION)], name);
	}
	return r;
}
CUresult cuModuleUnload(void *m) { return destroy(m, MODULE); }

/* Runs the "fill" kernel of the Go tests: p[i] = a*i + (float)b for i < n,
 * over every thread of the grid. Any other kernel runs and does nothing. */
CUresult cuLaunchKernel(void *f, unsigned int gx, unsigned int gy, unsigned int gz,
	unsigned int bx, unsigned int by, unsigned int bz, unsigned int shared,
	void *s, void **params, void **extra) {
	int fh = p2h(f, FUNCTION);
	if (!fh || !p2h(h2p(function_module[fh]), MODULE)) return INVALID_HANDLE;
	if (!valid_stream(s)) return INVALID_HANDLE;
	if (!gx || !gy || !gz || !bx || !by || !bz || bx * by * bz > 1024 || shared > 48 * 1024 || extra) return INVALID_VALUE;
	enqueued();
	if (strcmp(function_name[fh], "fill") != 0) return OK;
	if (!params) return INVALID_VALUE;
	CUdeviceptr p = *(CUdeviceptr *)params[0];
	unsigned int n = *(unsigned int *)params[1];
	float a = *(float *)params[2];
	double b = *(double *)params[3];
	unsigned long long threads = (unsigned long long)gx * bx;
	if (n && !valid_range(p, (size_t)n * 4)) return 700; /* CUDA_ERROR_ILLEGAL_ADDRESS */
	for (unsigned long long i = 0; i < threads && i < n; i++)
		((float *)(uintptr_t)p)[i] = a * (float)i + (float)b;
	return OK;
}

/* Virtual memory management. A reservation is host address space mapped
 * PROT_NONE; physical memory is a memfd, so mapping it (MAP_SHARED |
 * MAP_FIXED into the reservation) shows the same bytes wherever it is mapped,
 * as on a GPU; unmapping maps PROT_NONE again. Layouts as cuda.h declares
 * them on LP64, checked by size. */
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
struct vres { CUdeviceptr p; size_t n; };
struct vphys { int fd; size_t n; int released, maps; };
struct vmap { CUdeviceptr p; size_t n; int phys, access; };
static struct vres vres[MAXVM];
static struct vphys vphys[MAXVM]; /* handle h is slot h-1 */
static struct vmap vmaps[MAXVM];

static int prop_ok(const CUmemAllocationProp *p) {
	return p && p->type == 1 && p->requestedHandleTypes == 0 && p->location.type == 1 && p->location.id == 0 && !p->win32HandleMetaData;
}
CUresult cuMemGetAllocationGranularity(size_t *g, const CUmemAllocationProp *prop, int option) {
	if (!g || !prop_ok(prop) || (option != 0 && option != 1)) return INVALID_VALUE;
	*g = GRAN; return OK;
}
CUresult cuMemAddressReserve(CUdeviceptr *p, size_t n, size_t align, CUdeviceptr addr, unsigned long long flags) {
	if (!p || n == 0 || n % GRAN || flags || addr || (align && align % GRAN)) return INVALID_VALUE;
	pthread_mutex_lock(&mu);
	int slot = -1;
	for (int i = 0; i < MAXVM; i++) if (!vres[i].p) { slot = i; break; }
	void *m = slot < 0 ? MAP_FAILED : mmap(0, n + GRAN, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (m == MAP_FAILED) { pthread_mutex_unlock(&mu); return OUT_OF_MEMORY; }
	CUdeviceptr a = roundup((CUdeviceptr)(uintptr_t)m, GRAN); /* aligned; the slack is left mapped PROT_NONE */
	vres[slot] = (struct vres){a, n};
	*p = a;
	pthread_mutex_unlock(&mu);
	return OK;
}
CUresult cuMemAddressFree(CUdeviceptr p, size_t n) {
	pthread_mutex_lock(&mu);
	CUresult r = INVALID_VALUE;
	for (int i = 0; i < MAXVM; i++) {
		if (vres[i].p == p && vres[i].n == n) {
			int busy = 0;
			for (int j = 0; j < MAXVM; j++) busy |= vmaps[j].n && vmaps[j].p >= p && vmaps[j].p < p + n;
			if (!busy) { mmap((void *)(uintptr_t)p, n, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0); vres[i].p = 0; r = OK; }
			break;
		}
	}
	pthread_mutex_unlock(&mu);
	return r;
}
CUresult cuMemCreate(unsigned long long *h, size_t n, const CUmemAllocationProp *prop, unsigned long long flags) {
	if (!h || n == 0 || n % GRAN || flags || !prop_ok(prop)) return INVALID_VALUE;
	pthread_mutex_lock(&mu);
	int slot = -1;
	for (int i = 0; i < MAXVM; i++) if (!vphys[i].n) { slot = i; break; }
	if (slot < 0 || used + n > TOTAL) { pthread_mutex_unlock(&mu); return OUT_OF_MEMORY; }
	int fd = memfd_create("fakecuda", 0);
	if (fd < 0 || ftruncate(fd, (off_t)n) != 0) { if (fd >= 0) close(fd); pthread_mutex_unlock(&mu); return OUT_OF_MEMORY; }
	vphys[slot] = (struct vphys){fd, n, 0, 0};
	used += n;
	*h = (unsigned long long)slot + 1;
	pthread_mutex_unlock(&mu);
	return OK;
}
static struct vphys *phys_of(unsigned long long h) {
	return h >= 1 && h <= MAXVM && vphys[h - 1].n && !vphys[h - 1].released ? &vphys[h - 1] : 0;
}
static void drop_phys_locked(struct vphys *ph) {
	close(ph->fd); used -= ph->n; memset(ph, 0, sizeof *ph);
}
CUresult cuMemRelease(unsigned long long h) {
	pthread_mutex_lock(&mu);
	struct vphys *ph = phys_of(h);
	if (ph) { ph->released = 1; if (!ph->maps) drop_phys_locked(ph); }
	pthread_mutex_unlock(&mu);
	return ph ? OK : INVALID_VALUE;
}
CUresult cuMemMap(CUdeviceptr p, size_t n, size_t off, unsigned long long h, unsigned long long flags) {
	if (n == 0 || n % GRAN || p % GRAN || off || flags) return INVALID_VALUE;
	pthread_mutex_lock(&mu);
	struct vphys *ph = phys_of(h);
	int inres = 0, overlap = 0, slot = -1;
	for (int i = 0; i < MAXVM; i++) {
		inres |= vres[i].p && p >= vres[i].p && p + n <= vres[i].p + vres[i].n;
		overlap |= vmaps[i].n && p < vmaps[i].p + vmaps[i].n && vmaps[i].p < p + n;
		if (!vmaps[i].n && slot < 0) slot = i;
	}
	if (!ph || n != ph->n || !inres || overlap || slot < 0) { pthread_mutex_unlock(&mu); return INVALID_VALUE; }
	if (mmap((void *)(uintptr_t)p, n, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, ph->fd, 0) == MAP_FAILED) {
		pthread_mutex_unlock(&mu); return OUT_OF_MEMORY;
	}
	vmaps[slot] = (struct vmap){p, n, (int)h, 0};
	ph->maps++;
	pthread_mutex_unlock(&mu);
	return OK;
}
CUresult cuMemUnmap(CUdeviceptr p, size_t n) {
	pthread_mutex_lock(&mu);
	CUresult r = INVALID_VALUE;
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
	pthread_mutex_unlock(&mu);
	return r;
}
CUresult cuMemSetAccess(CUdeviceptr p, size_t n, const CUmemAccessDesc *desc, size_t count) {
	if (!desc || count != 1 || desc->location.type != 1 || desc->location.id != 0 || desc->flags != 3) return INVALID_VALUE;
	pthread_mutex_lock(&mu);
	int ok = 1;
	for (CUdeviceptr at = p; ok && at < p + n;) {
		ok = 0;
		for (int i = 0; i < MAXVM; i++)
			if (vmaps[i].n && vmaps[i].p == at) { vmaps[i].access = 1; at += vmaps[i].n; ok = 1; break; }
	}
	pthread_mutex_unlock(&mu);
	return ok ? OK : INVALID_VALUE;
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
