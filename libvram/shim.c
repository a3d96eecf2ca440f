/*
 * shim.c: libvram's C entry points (vram.h). Each checks, before it enters
 * Go, that it runs in the process that loaded the library: after fork()
 * only the forking thread survives, and a call into the Go runtime, whose
 * threads did not, would hang or crash. The pid is compared in the child
 * once, by a pthread_atfork handler, and each call reads the result: a
 * getpid() per call would cost a system call, about as much as the rest of
 * the call's overhead (BENCHMARKS.md). fork(), Python's os.fork and
 * multiprocessing's fork all run the handler; a child made by a raw clone
 * system call, which runs no handler, is not detected.
 *
 * A forked child also closes its copies of the library's connections to a
 * node broker (vram_open_lease): a lease ends when its connection closes,
 * and a child that kept a copy open would keep its parent's lease alive
 * after the parent died (Python's multiprocessing forks by default).
 * close-on-exec does not help a child that does not exec. The handler
 * finds them in /proc/self/fd: Unix sockets whose peer is bound to a path
 * that names the socket file of a broker the library dialled (the same
 * file by device and inode, or the same path). A broker that bound a
 * relative path is matched only where the child's directory resolves it.
 *
 * Each call keeps the message of its failure as the calling thread's last
 * error (a thread-specific string, freed when the thread exits or the next
 * call replaces it).
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "internal.h"
#include "_cgo_export.h"

/* The pid of the process that loaded the library, set by the loader, and
 * whether this process is a child forked from it, set in the child. */
static pid_t loaded_pid;
static volatile int in_forked_child;

/* The broker sockets the library has dialled: written under
 * brokers_mu, read by the fork handler without it (the child has one
 * thread; the lock may have been held by another at the fork), so each
 * entry is whole before n_brokers counts it. */
#define MAX_BROKERS 16
static struct broker_socket {
	char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
	dev_t dev;
	ino_t ino;
} brokers[MAX_BROKERS];
static int n_brokers;
static pthread_mutex_t brokers_mu = PTHREAD_MUTEX_INITIALIZER;

void vram_broker_socket_(const char *path) {
	struct stat st;
	if (!path || strlen(path) >= sizeof brokers[0].path) return;
	pthread_mutex_lock(&brokers_mu);
	int n = __atomic_load_n(&n_brokers, __ATOMIC_RELAXED);
	for (int i = 0; i < n; i++)
		if (!strcmp(brokers[i].path, path)) goto out;
	if (n < MAX_BROKERS) {
		strcpy(brokers[n].path, path);
		if (stat(path, &st) == 0) brokers[n].dev = st.st_dev, brokers[n].ino = st.st_ino;
		__atomic_store_n(&n_brokers, n + 1, __ATOMIC_RELEASE);
	}
out:
	pthread_mutex_unlock(&brokers_mu);
}

/* is_broker reports whether fd is a connection to a broker the library
 * dialled. */
static int is_broker(int fd, int n) {
	struct sockaddr_un sa;
	socklen_t len = sizeof sa;
	memset(&sa, 0, sizeof sa);
	if (getpeername(fd, (struct sockaddr *)&sa, &len) != 0 || sa.sun_family != AF_UNIX ||
	    len <= offsetof(struct sockaddr_un, sun_path) || !sa.sun_path[0])
		return 0;
	struct stat st;
	int have = stat(sa.sun_path, &st) == 0;
	for (int i = 0; i < n; i++) {
		if (!strcmp(brokers[i].path, sa.sun_path)) return 1;
		if (have && brokers[i].ino && st.st_dev == brokers[i].dev && st.st_ino == brokers[i].ino) return 1;
	}
	return 0;
}

/* close_brokers closes the child's copies of the broker connections. */
static void close_brokers(void) {
	int n = __atomic_load_n(&n_brokers, __ATOMIC_ACQUIRE);
	if (n == 0) return;
	DIR *d = opendir("/proc/self/fd");
	if (!d) return;
	int fds[256], k = 0;
	struct dirent *e;
	while ((e = readdir(d)) && k < (int)(sizeof fds / sizeof fds[0])) {
		int fd = atoi(e->d_name);
		if (e->d_name[0] >= '0' && e->d_name[0] <= '9' && fd != dirfd(d) && is_broker(fd, n)) fds[k++] = fd;
	}
	closedir(d);
	for (int i = 0; i < k; i++) close(fds[i]);
}

static void vram_forked(void) {
	in_forked_child = getpid() != loaded_pid;
	if (in_forked_child) close_brokers();
}

__attribute__((constructor)) static void vram_loaded(void) {
	loaded_pid = getpid();
	pthread_atfork(NULL, NULL, vram_forked);
}

static pthread_key_t err_key;
static pthread_once_t err_once = PTHREAD_ONCE_INIT;
static void err_key_make(void) { pthread_key_create(&err_key, free); }

/* set_error makes msg (malloc'd, or NULL: no error) the thread's last
 * error, freeing the one before. */
void set_error(char *msg) {
	pthread_once(&err_once, err_key_make);
	char *old = pthread_getspecific(err_key);
	if (pthread_setspecific(err_key, msg) != 0) {
		free(msg);
		return;
	}
	free(old);
}

/* fail sets a message of the library's own and returns status. */
int fail(int status, const char *fmt, ...) {
	char *msg = NULL;
	va_list ap;
	va_start(ap, fmt);
	if (vasprintf(&msg, fmt, ap) < 0) msg = NULL;
	va_end(ap);
	set_error(msg);
	return status;
}

/* forked reports, with the thread's last error set, a call in a process
 * forked from the one that loaded the library. */
int forked(const char *op) {
	if (__builtin_expect(!in_forked_child, 1)) return 0;
	pid_t pid = getpid();
	fail(VRAM_EFORK, "vram: %s in process %d, forked from process %d which loaded libvram: the Go runtime does not survive fork; "
	     "use vram in a child only after exec (Python: multiprocessing's \"spawn\" or \"forkserver\" start method)",
	     op, (int)pid, (int)loaded_pid);
	return 1;
}

/* copy_text copies text (malloc'd by Go, NULL for none) into buf and frees
 * it: VRAM_ERANGE, with *needed set, when it does not fit. */
int copy_text(int status, char *text, char *buf, size_t len, size_t *needed) {
	if (status != VRAM_OK) {
		free(text);
		return status;
	}
	size_t n = text ? strlen(text) + 1 : 1;
	if (needed) *needed = n;
	if (!buf || len < n) {
		free(text);
		return fail(VRAM_ERANGE, "vram: the text takes %zu bytes with its NUL; the buffer has %zu", n, buf ? len : 0);
	}
	memcpy(buf, text ? text : "", n);
	free(text);
	return VRAM_OK;
}

int vram_abi_version(void) { return VRAM_ABI_VERSION; }

const char *vram_strerror(int status) {
	switch (status) {
	case VRAM_OK: return "success";
	case VRAM_EINVAL: return "invalid argument";
	case VRAM_ENOMEM: return "out of memory";
	case VRAM_EHANDLE: return "no such manager";
	case VRAM_EPTR: return "pointer not allocated by this manager";
	case VRAM_ENODEV: return "no device";
	case VRAM_EBUSY: return "busy";
	case VRAM_EFORK: return "called in a forked child";
	case VRAM_ERANGE: return "buffer too small";
	case VRAM_EDEVICE: return "device error";
	case VRAM_EFREED: return "array freed";
	case VRAM_ENOTSUP: return "not supported";
	}
	return "unknown status";
}

size_t vram_last_error(char *buf, size_t len) {
	pthread_once(&err_once, err_key_make);
	const char *msg = pthread_getspecific(err_key);
	if (!msg) {
		if (buf && len) buf[0] = 0;
		return 0;
	}
	size_t n = strlen(msg);
	if (buf && len) {
		size_t k = n < len - 1 ? n : len - 1;
		memcpy(buf, msg, k);
		buf[k] = 0;
	}
	return n;
}

int vram_open(const char *spec, uint64_t cap_bytes, vram_manager *out) {
	if (forked("vram_open")) return VRAM_EFORK;
	if (!out) return fail(VRAM_EINVAL, "vram_open: out is NULL");
	char *err = NULL;
	int64_t h = 0;
	int rc = vramgo_open((char *)(spec ? spec : ""), cap_bytes, &h, &err);
	set_error(err);
	if (rc == VRAM_OK) *out = h;
	return rc;
}

int vram_open_lease(const char *spec, const char *socket, const char *name, double proportion, uint64_t cap_bytes, vram_manager *out) {
	if (forked("vram_open_lease")) return VRAM_EFORK;
	if (!out) return fail(VRAM_EINVAL, "vram_open_lease: out is NULL");
	char *err = NULL;
	int64_t h = 0;
	int rc = vramgo_open_lease((char *)(spec ? spec : ""), (char *)(socket ? socket : ""), (char *)(name ? name : ""), proportion, cap_bytes, &h, &err);
	set_error(err);
	if (rc == VRAM_OK) *out = h;
	return rc;
}

int vram_close(vram_manager m) {
	if (forked("vram_close")) return VRAM_EFORK;
	char *err = NULL;
	int rc = vramgo_close(m, &err);
	set_error(err);
	return rc;
}

int vram_manager_for_device(int device, vram_manager *out) {
	if (forked("vram_manager_for_device")) return VRAM_EFORK;
	if (!out) return fail(VRAM_EINVAL, "vram_manager_for_device: out is NULL");
	char *err = NULL;
	int64_t h = 0;
	int rc = vramgo_manager_for_device(device, &h, &err);
	set_error(err);
	if (rc == VRAM_OK) *out = h;
	return rc;
}

int vram_alloc(vram_manager m, int source, size_t size, vram_stream stream, void **out) {
	if (forked("vram_alloc")) return VRAM_EFORK;
	if (!out) return fail(VRAM_EINVAL, "vram_alloc: out is NULL");
	char *err = NULL;
	uintptr_t p = 0;
	int rc = vramgo_alloc(m, source, size, stream, &p, &err);
	set_error(err);
	if (rc == VRAM_OK) *out = (void *)p;
	return rc;
}

int vram_alloc_on_device(int device, int source, size_t size, vram_stream stream, void **out) {
	if (!out) return fail(VRAM_EINVAL, "vram_alloc_on_device: out is NULL");
	return vram_hook_alloc_(source, device, 0, size, stream, 0, out);
}

int vram_free(vram_manager m, void *ptr, size_t size, vram_stream stream) {
	if (forked("vram_free")) return VRAM_EFORK;
	char *err = NULL;
	int rc = vramgo_free(m, (uintptr_t)ptr, size, stream, &err);
	set_error(err);
	return rc;
}

int vram_trim(vram_manager m) {
	if (forked("vram_trim")) return VRAM_EFORK;
	char *err = NULL;
	int rc = vramgo_trim(m, &err);
	set_error(err);
	return rc;
}

int vram_trim_all(void) {
	if (forked("vram_trim_all")) return VRAM_EFORK;
	char *err = NULL;
	int rc = vramgo_trim_all(&err);
	set_error(err);
	return rc;
}

int vram_reset_peaks(vram_manager m) {
	if (forked("vram_reset_peaks")) return VRAM_EFORK;
	char *err = NULL;
	int rc = vramgo_reset_peaks(m, &err);
	set_error(err);
	return rc;
}

int vram_stats(vram_manager m, struct vram_stats *out) {
	if (forked("vram_stats")) return VRAM_EFORK;
	if (!out) return fail(VRAM_EINVAL, "vram_stats: out is NULL");
	if (out->size < sizeof out->size + sizeof out->manager)
		return fail(VRAM_EINVAL, "vram_stats: out->size is %llu; set it to sizeof(struct vram_stats), %zu",
			    (unsigned long long)out->size, sizeof(struct vram_stats));
	struct vram_stats st;
	memset(&st, 0, sizeof st);
	char *err = NULL;
	int rc = vramgo_stats(m, &st, &err);
	set_error(err);
	if (rc != VRAM_OK) return rc;
	size_t n = out->size < sizeof st ? (size_t)out->size : sizeof st;
	st.size = n;
	memcpy(out, &st, n);
	return VRAM_OK;
}

/* text_call runs one of Go's text functions and copies its text to buf. */
int text_call(const char *op, int (*fn)(int64_t, char **, char **), vram_manager m, char *buf, size_t len, size_t *needed) {
	if (forked(op)) return VRAM_EFORK;
	char *err = NULL, *text = NULL;
	int rc = fn(m, &text, &err);
	set_error(err);
	return copy_text(rc, text, buf, len, needed);
}

int vram_stats_json(vram_manager m, char *buf, size_t len, size_t *needed) {
	return text_call("vram_stats_json", vramgo_stats_json, m, buf, len, needed);
}

int vram_report(vram_manager m, char *buf, size_t len, size_t *needed) {
	return text_call("vram_report", vramgo_report, m, buf, len, needed);
}

int vram_oom_report(vram_manager m, char *buf, size_t len, size_t *needed) {
	return text_call("vram_oom_report", vramgo_oom_report, m, buf, len, needed);
}

/* Hooks. */

int vram_hook_alloc_(int source, int device, vram_manager m, size_t size, vram_stream stream, int note_failure, void **out) {
	*out = NULL;
	if (forked("an allocator hook")) return VRAM_EFORK;
	char *err = NULL;
	uintptr_t p = 0;
	int rc = vramgo_hook_alloc(source, device, m, size, stream, note_failure, &p, &err);
	set_error(err);
	if (rc == VRAM_OK) *out = (void *)p;
	return rc;
}

static void hook_free(int device, vram_manager m, void *ptr, size_t size, vram_stream stream) {
	if (forked("a free hook")) return;
	char *err = NULL;
	vramgo_hook_free(device, m, (uintptr_t)ptr, size, stream, &err);
	set_error(err);
}

void vram_torch_free(void *ptr, size_t size, int device, void *stream) {
	if (ptr) hook_free(device, 0, ptr, size, (vram_stream)stream);
}

void vram_torch_empty_cache(void) { vram_trim_all(); }

void vram_cupy_free(void *param, void *ptr, int device) {
	if (ptr) hook_free(device, (vram_manager)(intptr_t)param, ptr, 0, VRAM_STREAM_UNORDERED);
}
