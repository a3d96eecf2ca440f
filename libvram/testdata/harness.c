/*
 * harness.c: loads libvram as a foreign program does (dlopen, no Go) and
 * calls every entry point of vram.h with good and bad arguments, from
 * several threads at once, and after a fork; checks that loading it left
 * the program's signal handlers alone and that dlclose does not unload it.
 *
 *   harness LIBVRAM sim [TORCH]    on the simulator; with TORCH, the path
 *                                  of libvram_torch.so, PyTorch's
 *                                  allocation hook too
 *   harness LIBVRAM bench [TORCH]  the cost of an alloc/free pair through
 *                                  the library (a cache hit), the CuPy
 *                                  and the torch hooks, and of getpid,
 *                                  for BENCHMARKS.md; checks nothing
 *   harness LIBVRAM cuda           on the stand-in CUDA driver
 *                                  (device/cuda/testdata/fakecuda.c as
 *                                  libcuda.so.1 on LD_LIBRARY_PATH): the
 *                                  thread's current context and borrowed
 *                                  streams
 *
 * Prints one "ok" or "not ok" line per check and exits with the number of
 * failures (libvram/libvram_test.go runs it).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../vram.h"

static int failures;
#define CHECK(cond, ...)                                   \
	do {                                               \
		if (cond) {                                \
			printf("ok - ");                   \
		} else {                                   \
			printf("not ok - ");               \
			failures++;                        \
		}                                          \
		printf(__VA_ARGS__);                       \
		printf("\n");                              \
		fflush(stdout);                            \
	} while (0)

/* The library's entry points, looked up by name as PyTorch and CuPy do. */
static struct {
	int (*abi_version)(void);
	const char *(*strerror)(int);
	size_t (*last_error)(char *, size_t);
	int (*open)(const char *, uint64_t, vram_manager *);
	int (*open_lease)(const char *, const char *, const char *, double, uint64_t, vram_manager *);
	int (*close)(vram_manager);
	int (*for_device)(int, vram_manager *);
	int (*alloc)(vram_manager, int, size_t, vram_stream, void **);
	int (*alloc_on_device)(int, int, size_t, vram_stream, void **);
	int (*free)(vram_manager, void *, size_t, vram_stream);
	int (*trim)(vram_manager);
	int (*trim_all)(void);
	int (*reset_peaks)(vram_manager);
	int (*stats)(vram_manager, struct vram_stats *);
	int (*stats_json)(vram_manager, char *, size_t, size_t *);
	int (*report)(vram_manager, char *, size_t, size_t *);
	int (*oom_report)(vram_manager, char *, size_t, size_t *);
	void *(*torch_alloc)(size_t, int, void *);
	void (*torch_free)(void *, size_t, int, void *);
	void (*torch_empty_cache)(void);
	void (*cupy_free)(void *, void *, int); /* vram_cupy_malloc is libvram_cupy.so's (cupy_harness.cc) */
} v;

static void *lib, *torchlib;

static void *sym(const char *name) {
	void *p = dlsym(lib, name);
	if (!p) {
		printf("not ok - dlsym %s: %s\n", name, dlerror());
		exit(100);
	}
	return p;
}

static void bind(void) {
	v.abi_version = sym("vram_abi_version");
	v.strerror = sym("vram_strerror");
	v.last_error = sym("vram_last_error");
	v.open = sym("vram_open");
	v.open_lease = sym("vram_open_lease");
	v.close = sym("vram_close");
	v.for_device = sym("vram_manager_for_device");
	v.alloc = sym("vram_alloc");
	v.alloc_on_device = sym("vram_alloc_on_device");
	v.free = sym("vram_free");
	v.trim = sym("vram_trim");
	v.trim_all = sym("vram_trim_all");
	v.reset_peaks = sym("vram_reset_peaks");
	v.stats = sym("vram_stats");
	v.stats_json = sym("vram_stats_json");
	v.report = sym("vram_report");
	v.oom_report = sym("vram_oom_report");
	if (torchlib) v.torch_alloc = dlsym(torchlib, "vram_torch_alloc");
	v.torch_free = sym("vram_torch_free");
	v.torch_empty_cache = sym("vram_torch_empty_cache");
	v.cupy_free = sym("vram_cupy_free");
}

static char errbuf[4096];
static const char *lasterr(void) {
	v.last_error(errbuf, sizeof errbuf);
	return errbuf;
}

static struct vram_stats stats_of(vram_manager m) {
	struct vram_stats st;
	memset(&st, 0, sizeof st);
	st.size = sizeof st;
	int rc = v.stats(m, &st);
	if (rc != VRAM_OK) printf("# vram_stats(%lld) = %d: %s\n", (long long)m, rc, lasterr());
	return st;
}

#define MiB (1ull << 20)

/* Signals: the handlers the program had before the library loaded. */
static void on_signal(int sig) { (void)sig; }
static struct sigaction before[NSIG];

static void install_own_handlers(void) {
	struct sigaction sa;
	memset(&sa, 0, sizeof sa);
	sa.sa_handler = on_signal;
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGUSR1, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	for (int s = 1; s < NSIG; s++) sigaction(s, NULL, &before[s]);
}

/* check_signals: loading the library and calling into it changed the
 * handler of no signal but the Go runtime's own in a c-shared library: the
 * synchronous signals (SIGBUS, SIGFPE, SIGSEGV), SIGPIPE, and SIGURG, its
 * goroutine preemption signal (sigInstallGoHandler in the runtime's
 * signal_unix.go; os/signal's doc leaves SIGURG out); the program's own
 * handlers stay. */
static void check_signals(const char *when) {
	char changed[512] = "";
	int bad = 0;
	for (int s = 1; s < 32; s++) {
		struct sigaction now;
		if (sigaction(s, NULL, &now) != 0) continue;
		if (now.sa_handler == before[s].sa_handler) continue;
		int allowed = s == SIGSEGV || s == SIGBUS || s == SIGFPE || s == SIGPIPE || s == SIGURG;
		bad |= !allowed;
		snprintf(changed + strlen(changed), sizeof changed - strlen(changed), " %s%s", strsignal(s), allowed ? "" : "(!)");
	}
	CHECK(!bad, "%s: handlers changed only for the Go runtime's signals:%s", when, changed[0] ? changed : " none");
	struct sigaction now;
	sigaction(SIGINT, NULL, &now);
	CHECK(now.sa_handler == on_signal, "%s: the program's own SIGINT handler is kept", when);
}

static void check_basics(void) {
	CHECK(v.abi_version() == VRAM_ABI_VERSION, "vram_abi_version = %d", v.abi_version());
	CHECK(!strcmp(v.strerror(VRAM_ENOMEM), "out of memory") && !strcmp(v.strerror(42), "unknown status"),
	      "vram_strerror names the codes");
	vram_manager m = 0;
	CHECK(v.open("sim", 0, NULL) == VRAM_EINVAL && strstr(lasterr(), "out is NULL"), "vram_open with out NULL: %s", errbuf);
	CHECK(v.open("nosuch:0", 0, &m) == VRAM_EINVAL && strstr(lasterr(), "nosuch") && m == 0, "vram_open of a bad spec: %s", errbuf);
	CHECK(v.open("sim:vram=lots", 0, &m) == VRAM_EINVAL, "vram_open of a bad simulator option: %s", lasterr());
	CHECK(v.open_lease("sim", NULL, NULL, 0, 0, NULL) == VRAM_EINVAL && strstr(lasterr(), "out is NULL"), "vram_open_lease with out NULL: %s", errbuf);
	CHECK(v.open_lease("nosuch:0", "/nonexistent/b.sock", "h", 0, 0, &m) == VRAM_EINVAL && m == 0, "vram_open_lease of a bad spec: %s", lasterr());
	CHECK(v.open_lease("sim:vram=64MiB", "/nonexistent/b.sock", "h", 0, 0, &m) == VRAM_ENODEV && strstr(lasterr(), "/nonexistent/b.sock") && m == 0,
	      "vram_open_lease with no broker on the socket: %s", errbuf);
	CHECK(v.close(12345) == VRAM_EHANDLE, "vram_close of an unknown handle: %s", lasterr());
	CHECK(v.for_device(7, &m) == VRAM_EHANDLE && strstr(lasterr(), "device 7"), "no manager on device 7: %s", errbuf);
	CHECK(v.last_error(NULL, 0) > 0, "vram_last_error(NULL, 0) gives the length");
	CHECK(v.trim_all() == VRAM_OK && v.last_error(NULL, 0) == 0, "vram_trim_all with nothing open; a success clears the last error");
}

/* check_manager: every entry point on one simulated manager with a cap. */
static vram_manager check_manager(void) {
	vram_manager m = 0, m2 = 0, found = 0;
	int rc = v.open("sim:vram=64MiB", 16 * MiB, &m);
	CHECK(rc == VRAM_OK && m > 0, "vram_open(sim:vram=64MiB, cap 16 MiB) = %d, handle %lld: %s", rc, (long long)m, lasterr());
	CHECK(v.open("sim:vram=32MiB", 0, &m2) == VRAM_EBUSY && m2 == 0 && strstr(lasterr(), "one budget"),
	      "a second manager on device 0 is refused: %s", errbuf);
	CHECK(v.for_device(0, &found) == VRAM_OK && found == m, "vram_manager_for_device(0) = %lld", (long long)found);

	void *p = NULL, *q = NULL;
	CHECK(v.alloc(m, VRAM_SOURCE_C, 0, 0, &p) == VRAM_EINVAL, "alloc of 0 bytes: %s", lasterr());
	CHECK(v.alloc(m, 9, MiB, 0, &p) == VRAM_EINVAL && strstr(lasterr(), "source 9"), "alloc for source 9: %s", errbuf);
	CHECK(v.alloc(m, VRAM_SOURCE_C, MiB, 0, NULL) == VRAM_EINVAL, "alloc with out NULL");
	CHECK(v.alloc(999, VRAM_SOURCE_C, MiB, 0, &p) == VRAM_EHANDLE, "alloc on an unknown handle");
	CHECK(v.alloc_on_device(5, VRAM_SOURCE_C, MiB, 0, &p) == VRAM_EHANDLE && strstr(lasterr(), "device 5"), "alloc on device 5, which has no manager: %s", errbuf);
	CHECK(v.alloc_on_device(0, VRAM_SOURCE_C, MiB, 0, NULL) == VRAM_EINVAL, "alloc on a device with out NULL");
	for (int bad = 0; bad < 4; bad++) { /* no source taken modulo 256 */
		int src = (int[]){256 + VRAM_SOURCE_C, 256 + VRAM_SOURCE_TORCH, -1, VRAM_SOURCES}[bad];
		p = NULL;
		CHECK(v.alloc_on_device(0, src, MiB, 0, &p) == VRAM_EINVAL && p == NULL && strstr(lasterr(), "source"),
		      "alloc on a device for source %d: %s", src, errbuf);
	}
	CHECK(v.alloc_on_device(0, VRAM_SOURCE_C, MiB, 0, &p) == VRAM_OK && v.free(m, p, MiB, 0) == VRAM_OK, "alloc on device 0 and free by handle");
	rc = v.alloc(m, VRAM_SOURCE_C, 10 * MiB, 0, &p);
	CHECK(rc == VRAM_OK && p, "alloc 10 MiB = %d, %p: %s", rc, p, lasterr());
	struct vram_stats st = stats_of(m);
	CHECK(st.manager == m && st.simulated == 1 && st.cap == 16 * MiB && st.cap_used >= 10 * MiB && st.in_use >= 10 * MiB &&
		      st.sources[VRAM_SOURCE_C].in_use == 10 * MiB && st.device_total == 64 * MiB,
	      "stats after 10 MiB: in use %llu, cap %llu, cap used %llu, c in use %llu", (unsigned long long)st.in_use,
	      (unsigned long long)st.cap, (unsigned long long)st.cap_used, (unsigned long long)st.sources[VRAM_SOURCE_C].in_use);

	/* The cap: refused before the device is asked. */
	uint64_t dev_allocs = st.device_allocs, dev_free = st.device_free;
	rc = v.alloc(m, VRAM_SOURCE_NUMBA, 8 * MiB, VRAM_STREAM_UNORDERED, &q);
	CHECK(rc == VRAM_ENOMEM && q == NULL && strstr(lasterr(), "cap"), "8 MiB more passes the 16 MiB cap: %s", errbuf);
	st = stats_of(m);
	CHECK(st.device_allocs == dev_allocs && st.device_free == dev_free && st.sources[VRAM_SOURCE_NUMBA].ooms == 1 && st.ooms >= 1,
	      "the refusal did not reach the device (device allocs %llu, free %llu) and counts for numba",
	      (unsigned long long)st.device_allocs, (unsigned long long)st.device_free);
	size_t need = 0;
	char small[8];
	CHECK(v.oom_report(m, small, sizeof small, &need) == VRAM_ERANGE && need > 100, "oom report into 8 bytes: ERANGE, needs %zu", need);
	char *rep = malloc(need);
	CHECK(v.oom_report(m, rep, need, &need) == VRAM_OK && strstr(rep, "cap"), "the oom report names the cap");
	free(rep);

	/* Frees: bad ones change nothing. */
	CHECK(v.free(m, (char *)p + 64, 0, 0) == VRAM_EPTR, "free of a pointer not handed out: %s", lasterr());
	CHECK(v.free(m, p, 3 * MiB, 0) == VRAM_EPTR && strstr(lasterr(), "size"), "free with another size: %s", errbuf);
	CHECK(v.close(m) == VRAM_EBUSY && strstr(lasterr(), "still live"), "close with a live allocation: %s", errbuf);
	CHECK(v.free(m, p, 10 * MiB, 0) == VRAM_OK, "free with its size");
	CHECK(v.free(m, p, 10 * MiB, 0) == VRAM_EPTR, "double free: %s", lasterr());

	/* Streams: keys on the simulator; unordered. */
	CHECK(v.alloc(m, VRAM_SOURCE_TORCH, 2 * MiB, 0x1230, &p) == VRAM_OK && v.free(m, p, 0, 0x1230) == VRAM_OK,
	      "alloc and free on stream key 0x1230");
	CHECK(v.alloc(m, VRAM_SOURCE_CUPY, 2 * MiB, VRAM_STREAM_UNORDERED, &p) == VRAM_OK &&
		      v.free(m, p, 2 * MiB, VRAM_STREAM_UNORDERED) == VRAM_OK,
	      "alloc and free unordered");

	/* Peaks, trim, report. */
	st = stats_of(m);
	CHECK(st.peak_in_use >= 10 * MiB && st.reserved > 0, "peak %llu and reserved %llu before a reset and a trim",
	      (unsigned long long)st.peak_in_use, (unsigned long long)st.reserved);
	CHECK(v.reset_peaks(m) == VRAM_OK && v.trim(m) == VRAM_OK, "reset peaks and trim");
	st = stats_of(m);
	CHECK(st.peak_in_use == 0 && st.reserved == 0 && st.sources[VRAM_SOURCE_C].peak_in_use == 0,
	      "after both: peak %llu, reserved %llu", (unsigned long long)st.peak_in_use, (unsigned long long)st.reserved);
	CHECK(v.reset_peaks(4242) == VRAM_EHANDLE && v.trim(4242) == VRAM_EHANDLE, "reset peaks and trim of an unknown handle");
	struct vram_stats old;
	memset(&old, 0xff, sizeof old);
	old.size = 64; /* a caller built against a smaller struct */
	CHECK(v.stats(m, &old) == VRAM_OK && old.size == 64 && old.manager == m && ((unsigned char *)&old)[64] == 0xff,
	      "stats into a 64-byte struct fills 64 bytes");
	old.size = 0;
	CHECK(v.stats(m, &old) == VRAM_EINVAL && v.stats(m, NULL) == VRAM_EINVAL, "stats with size 0 or NULL: %s", lasterr());
	char json[4096], text[8192];
	CHECK(v.stats_json(m, json, sizeof json, &need) == VRAM_OK && strstr(json, "\"cap\":16777216") && strstr(json, "\"numba\""),
	      "stats as JSON: %.80s…", json);
	CHECK(v.report(m, text, sizeof text, &need) == VRAM_OK && strstr(text, "framework") && strstr(text, "torch"),
	      "the report has each framework");
	CHECK(v.report(m, NULL, 0, &need) == VRAM_ERANGE && need > 0, "report into no buffer: ERANGE, needs %zu", need);
	return m;
}

/* check_hooks: the framework entry points on device 0's manager m. */
static void check_hooks(vram_manager m) {
	if (!v.torch_alloc) {
		printf("# no libvram_torch.so given: PyTorch's allocation hook is not checked\n");
		void *keep = NULL;
		CHECK(v.alloc(m, VRAM_SOURCE_TORCH, MiB, 0, &keep) == VRAM_OK, "a torch MiB through vram_alloc, kept live");
		return;
	}
	void *p = v.torch_alloc(3 * MiB, 0, (void *)0x4440);
	CHECK(p != NULL, "vram_torch_alloc(3 MiB, device 0, stream 0x4440) = %p", p);
	CHECK(v.torch_alloc(0, 0, NULL) == NULL, "vram_torch_alloc of 0 bytes is NULL, as cudaMalloc(0)");
	struct vram_stats st = stats_of(m);
	CHECK(st.sources[VRAM_SOURCE_TORCH].in_use == 3 * MiB, "torch's 3 MiB counted under torch");
	v.torch_free(p, 3 * MiB, 0, (void *)0x4440);
	v.torch_free(NULL, 0, 0, NULL);
	st = stats_of(m);
	CHECK(st.sources[VRAM_SOURCE_TORCH].in_use == 0 && st.hook_errors == 0, "vram_torch_free gives it back");
	v.torch_free(p, 3 * MiB, 0, (void *)0x4440); /* a double free: nobody to tell but the books */
	st = stats_of(m);
	CHECK(st.hook_errors == 1, "a double free through the torch hook counts as a hook error (%llu)", (unsigned long long)st.hook_errors);

	CHECK(dlsym(lib, "vram_cupy_malloc") == NULL, "libvram.so has no vram_cupy_malloc (libvram_cupy.so's throws; one here could only return NULL)");
	void *c = NULL, *c2 = NULL;
	CHECK(v.alloc(m, VRAM_SOURCE_CUPY, 5 * MiB, VRAM_STREAM_UNORDERED, &c) == VRAM_OK &&
	      v.alloc(m, VRAM_SOURCE_CUPY, MiB, VRAM_STREAM_UNORDERED, &c2) == VRAM_OK, "two unordered allocations for cupy: %s", lasterr());
	st = stats_of(m);
	CHECK(st.sources[VRAM_SOURCE_CUPY].in_use == 6 * MiB, "cupy's 6 MiB counted under cupy");
	v.cupy_free(NULL, c, 0);
	v.cupy_free((void *)(intptr_t)m, c2, 0);
	v.cupy_free(NULL, NULL, 0);
	st = stats_of(m);
	CHECK(st.sources[VRAM_SOURCE_CUPY].in_use == 0, "vram_cupy_free gives them back");
	CHECK(st.reserved > 0, "cached memory before vram_torch_empty_cache: %llu", (unsigned long long)st.reserved);
	v.torch_empty_cache();
	st = stats_of(m);
	CHECK(st.reserved == 0, "vram_torch_empty_cache trims: reserved %llu", (unsigned long long)st.reserved);
	void *keep = v.torch_alloc(MiB, 0, NULL);
	CHECK(keep != NULL, "torch alloc on the default stream, kept live");
}

/* Threads: every worker allocates and frees through its own source and
 * stream key, and the books come back to zero. */
struct worker {
	vram_manager m;
	int id, errors;
};
static void *work(void *arg) {
	struct worker *w = arg;
	for (int i = 0; i < 300; i++) {
		size_t n = 4096 * (1 + (w->id * 37 + i * 11) % 128);
		void *p = NULL;
		int src = w->id % VRAM_SOURCES;
		vram_stream s = w->id % 3 == 0 ? VRAM_STREAM_UNORDERED : (vram_stream)(0x100 * (w->id % 3));
		if (v.alloc(w->m, src, n, s, &p) != VRAM_OK || v.free(w->m, p, n, s) != VRAM_OK) {
			w->errors++;
			break;
		}
		if (i % 50 == 0) {
			struct vram_stats st;
			st.size = sizeof st;
			char buf[256];
			size_t need;
			if (v.stats(w->m, &st) != VRAM_OK || v.report(w->m, buf, sizeof buf, &need) != VRAM_ERANGE) w->errors++;
		}
	}
	return NULL;
}

static void check_threads(vram_manager m) {
	enum { N = 8 };
	pthread_t t[N];
	struct worker w[N];
	struct vram_stats st0 = stats_of(m);
	for (int i = 0; i < N; i++) {
		w[i] = (struct worker){m, i, 0};
		pthread_create(&t[i], NULL, work, &w[i]);
	}
	int errs = 0;
	for (int i = 0; i < N; i++) {
		pthread_join(t[i], NULL);
		errs += w[i].errors;
	}
	struct vram_stats st = stats_of(m);
	CHECK(errs == 0 && st.allocs - st0.allocs == N * 300 && st.in_use == st0.in_use,
	      "%d threads × 300 alloc/free pairs: %d errors, %llu allocs, in use back to %llu", N, errs,
	      (unsigned long long)(st.allocs - st0.allocs), (unsigned long long)st.in_use);
}

/* Fork: the child gets VRAM_EFORK at once, never a hang. */
static void check_fork(vram_manager m) {
	pid_t pid = fork();
	if (pid == 0) {
		alarm(10); /* a hang is a failure, not a stuck test */
		void *p = NULL;
		char msg[512];
		int bad = 0;
		bad |= v.alloc(m, VRAM_SOURCE_C, MiB, 0, &p) != VRAM_EFORK || p != NULL;
		v.last_error(msg, sizeof msg);
		bad |= !strstr(msg, "forked") || !strstr(msg, "spawn");
		bad |= v.open("sim", 0, &m) != VRAM_EFORK;
		bad |= v.trim_all() != VRAM_EFORK;
		v.torch_free((void *)0x1000, 1, 0, NULL);
		v.cupy_free(NULL, (void *)0x1000, 0);
		bad |= v.abi_version() != VRAM_ABI_VERSION;
		printf("# child: %s\n", msg);
		fflush(stdout);
		_exit(bad ? 3 : 0);
	}
	int status = 0;
	CHECK(pid > 0 && waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0,
	      "a forked child's calls return VRAM_EFORK at once (exit status %d, signal %d)", WIFEXITED(status) ? WEXITSTATUS(status) : -1,
	      WIFSIGNALED(status) ? WTERMSIG(status) : 0);
	void *p = NULL;
	CHECK(v.alloc(m, VRAM_SOURCE_C, MiB, 0, &p) == VRAM_OK && v.free(m, p, MiB, 0) == VRAM_OK, "the parent still works after the fork");
}

/* The stand-in CUDA driver's entry points the harness calls as a framework
 * would, and its handles for contexts it never makes (fakecuda.c). */
typedef int (*cu_fn)();
#define OTHER_CTX ((void *)0x7000)
#define PEER_CTX ((void *)0x7040)

static void check_cuda(void) {
	void *cu = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
	CHECK(cu != NULL, "dlopen libcuda.so.1 (the stand-in): %s", cu ? "" : dlerror());
	if (!cu) return;
	int (*cuInit)(unsigned) = dlsym(cu, "cuInit");
	int (*ctxSet)(void *) = dlsym(cu, "cuCtxSetCurrent");
	int (*ctxGet)(void **) = dlsym(cu, "cuCtxGetCurrent");
	int (*retain)(void **, int) = dlsym(cu, "cuDevicePrimaryCtxRetain");
	int (*streamCreate)(void **, unsigned) = dlsym(cu, "cuStreamCreate");
	int (*streamQuery)(void *) = dlsym(cu, "cuStreamQuery");
	void *primary = NULL, *cur = NULL, *stream = NULL;
	cuInit(0);
	retain(&primary, 0);
	ctxSet(primary);
	streamCreate(&stream, 1); /* the framework's own stream */
	ctxSet(PEER_CTX);         /* the framework's thread is on another GPU */

	vram_manager m = 0;
	int rc = v.open("cuda:0", 64 * MiB, &m);
	ctxGet(&cur);
	CHECK(rc == VRAM_OK && cur == PEER_CTX, "vram_open(cuda:0) = %d, and the thread's context is put back (%p): %s", rc, cur, lasterr());
	void *p = NULL;
	rc = v.alloc_on_device(0, VRAM_SOURCE_TORCH, 4 * MiB, (vram_stream)stream, &p);
	ctxGet(&cur);
	CHECK(rc == VRAM_OK && p != NULL && cur == PEER_CTX, "alloc on the framework's stream %p = %p; context put back (%p)", stream, p, cur);
	v.torch_free(p, 4 * MiB, 0, stream);
	ctxGet(&cur);
	struct vram_stats st = stats_of(m);
	CHECK(cur == PEER_CTX && st.hook_errors == 0 && st.in_use == 0 && st.simulated == 0,
	      "torch free on the borrowed stream; context put back");
	ctxSet(primary); /* the driver answers for a stream only in its context */
	CHECK(streamQuery(stream) == 0, "the framework's stream is alive: vram never destroys a borrowed stream");
	ctxSet(PEER_CTX);
	/* cudaStreamPerThread: one handle, each thread's own stream. A block
	 * freed on it must not go at once to an allocation on it (maybe
	 * another thread's stream): the allocation is made unordered. */
	rc = v.alloc_on_device(0, VRAM_SOURCE_TORCH, 2 * MiB, 2, &p);
	void *q2 = NULL;
	CHECK(rc == VRAM_OK && v.free(m, p, 2 * MiB, 2) == VRAM_OK && v.alloc_on_device(0, VRAM_SOURCE_TORCH, 2 * MiB, 2, &q2) == VRAM_OK,
	      "alloc, free and alloc again on cudaStreamPerThread: %s", lasterr());
	CHECK(v.free(m, q2, 2 * MiB, 2) == VRAM_OK, "free on cudaStreamPerThread");
	ctxSet(NULL);
	CHECK(v.alloc(m, VRAM_SOURCE_NUMBA, MiB, VRAM_STREAM_UNORDERED, &p) == VRAM_OK && (ctxGet(&cur), cur == NULL),
	      "with no context current: alloc works and leaves none current");
	ctxSet(OTHER_CTX); /* a second context of GPU 0: its pointers are not vram's */
	void *q = NULL;
	rc = v.alloc(m, VRAM_SOURCE_C, MiB, 0, &q);
	ctxGet(&cur);
	CHECK(rc == VRAM_EDEVICE && q == NULL && strstr(lasterr(), "primary") && cur == OTHER_CTX,
	      "a second context of the GPU current is refused, and left current: %s", errbuf);
	ctxSet(primary);
	CHECK(v.free(m, p, MiB, VRAM_STREAM_UNORDERED) == VRAM_OK && v.close(m) == VRAM_OK, "free and close on CUDA: %s", lasterr());
	ctxGet(&cur);
	CHECK(cur == primary, "the primary context is still current after close");
}

static double now_ns(void) {
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec * 1e9 + t.tv_nsec;
}

/* bench prints the cost of an alloc/free pair of 1 MiB, a cache hit, on
 * one thread: through vram_alloc/vram_free and through the CuPy hooks
 * (unordered), and of getpid(), the system call a per-call fork check
 * would make. */
static void bench(void) {
	enum { N = 200000 };
	vram_manager m = 0;
	if (v.open("sim:vram=1GiB", 0, &m) != VRAM_OK) {
		printf("not ok - open: %s\n", lasterr());
		failures++;
		return;
	}
	void *p = NULL;
	v.alloc(m, VRAM_SOURCE_C, MiB, 0x40, &p); /* warm: the block is cached from here on */
	v.free(m, p, MiB, 0x40);
	double t0 = now_ns();
	for (int i = 0; i < N; i++) {
		v.alloc(m, VRAM_SOURCE_C, MiB, 0x40, &p);
		v.free(m, p, MiB, 0x40);
	}
	double t1 = now_ns();
	double t2 = now_ns();
	for (int i = 0; v.torch_alloc && i < N; i++) v.torch_free(v.torch_alloc(MiB, 0, (void *)0x40), MiB, 0, (void *)0x40);
	double t2b = now_ns();
	volatile pid_t sink = 0;
	for (int i = 0; i < N; i++) sink += getpid();
	double t3 = now_ns();
	if (v.torch_alloc) printf("bench alloc+free 1 MiB via the torch hooks (libvram_torch.so): %.0f ns/pair\n", (t2b - t2) / N);
	printf("bench alloc+free 1 MiB via vram_alloc/vram_free: %.0f ns/pair\n", (t1 - t0) / N);
	printf("bench getpid: %.0f ns/call\n", (t3 - t2b) / N);
	v.close(m);
}

int main(int argc, char **argv) {
	if (argc < 3 || argc > 4) {
		fprintf(stderr, "usage: harness LIBVRAM sim|cuda|bench [LIBVRAM_TORCH]\n");
		return 100;
	}
	install_own_handlers();
	lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
	if (!lib) {
		printf("not ok - dlopen %s: %s\n", argv[1], dlerror());
		return 100;
	}
	if (argc == 4 && !(torchlib = dlopen(argv[3], RTLD_NOW | RTLD_LOCAL))) {
		printf("not ok - dlopen %s: %s\n", argv[3], dlerror());
		return 100;
	}
	bind();
	check_signals("after loading");
	if (!strcmp(argv[2], "bench")) {
		bench();
	} else if (!strcmp(argv[2], "cuda")) {
		check_cuda();
	} else {
		check_basics();
		vram_manager m = check_manager();
		check_hooks(m);
		check_threads(m);
		check_fork(m);
		check_signals("after the calls");
		v.for_device(0, &m);
		/* The torch allocation check_hooks left live: close refuses, then succeeds. */
		struct vram_stats st = stats_of(m);
		CHECK(st.sources[VRAM_SOURCE_TORCH].in_use == MiB, "one torch MiB still live");
		CHECK(v.close(m) == VRAM_EBUSY, "close refused while torch holds memory");
		vram_manager h = m;
		/* dlclose does not unload the Go runtime. */
		CHECK(dlclose(lib) == 0, "dlclose");
		void *again = dlopen(argv[1], RTLD_NOW | RTLD_NOLOAD);
		CHECK(again != NULL, "the library is still loaded after dlclose (nodelete)");
		CHECK(v.for_device(0, &m) == VRAM_OK && m == h, "and its managers are still there");
	}
	printf("# %d failures\n", failures);
	return failures;
}
