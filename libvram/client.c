/*
 * client.c: the C entry points of the client API (vram.h, ABI 2). Each
 * checks the fork (shim.c's forked) and its pointers before it enters Go
 * (client.go), and keeps its failure's message as the thread's last error.
 * Structs the caller fills carry their size: a struct of a later ABI,
 * larger, is read as far as this one knows it; one the caller gets is
 * filled only as far as its size says.
 */
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "_cgo_export.h"

/* ENTER checks the fork, and each pointer that must not be NULL. */
#define ENTER(op)                                                  \
	do {                                                       \
		if (forked(op)) return VRAM_EFORK;                 \
	} while (0)
#define NOT_NULL(op, p)                                              \
	do {                                                         \
		if (!(p)) return fail(VRAM_EINVAL, "%s: " #p " is NULL", op); \
	} while (0)
#define SIZED(op, p, type)                                                                                      \
	do {                                                                                                    \
		NOT_NULL(op, p);                                                                                \
		if ((p)->size < sizeof(type))                                                                   \
			return fail(VRAM_EINVAL, "%s: " #p "->size is %llu; set it to sizeof(" #type "), %zu", op, \
				    (unsigned long long)(p)->size, sizeof(type));                               \
	} while (0)
/* GO runs a Go call that takes the error out-parameter last and keeps its
 * message; it evaluates to the call's status. */
#define GO(call, ...)                                   \
	({                                              \
		char *err_ = NULL;                      \
		int rc_ = call(__VA_ARGS__, &err_);     \
		set_error(err_);                        \
		rc_;                                    \
	})

static char *str(const char *s) { return (char *)(s ? s : ""); }

int vram_register(vram_manager m, const struct vram_client_options *o, vram_client *out) {
	ENTER("vram_register");
	SIZED("vram_register", o, struct vram_client_options);
	NOT_NULL("vram_register", out);
	int64_t h = 0;
	int rc = GO(vramgo_register, m, str(o->name), str(o->group), o->proportion, o->no_evict, o->hooks, &h);
	if (rc == VRAM_OK) *out = h;
	return rc;
}

int vram_client_close(vram_client c) {
	ENTER("vram_client_close");
	return GO(vramgo_client_close, c);
}

int vram_client_info(vram_client c, struct vram_client_info *out) {
	ENTER("vram_client_info");
	NOT_NULL("vram_client_info", out);
	if (out->size < sizeof out->size + sizeof out->manager)
		return fail(VRAM_EINVAL, "vram_client_info: out->size is %llu; set it to sizeof(struct vram_client_info), %zu",
			    (unsigned long long)out->size, sizeof(struct vram_client_info));
	struct vram_client_info info;
	memset(&info, 0, sizeof info);
	int rc = GO(vramgo_client_info, c, &info);
	if (rc != VRAM_OK) return rc;
	size_t n = out->size < sizeof info ? (size_t)out->size : sizeof info;
	info.size = n;
	memcpy(out, &info, n);
	return VRAM_OK;
}

int vram_client_group(vram_client c, char *buf, size_t len, size_t *needed) {
	return text_call("vram_client_group", vramgo_client_group, c, buf, len, needed);
}

static int client_do(const char *op, vram_client c, int call, const char *arg, double p) {
	ENTER(op);
	return GO(vramgo_client_do, c, call, str(arg), p);
}

int vram_change_group(vram_client c, const char *group) {
	return client_do("vram_change_group", c, VRAM_OP_CHANGE_GROUP_, group, 0);
}

int vram_set_manual_proportion(vram_client c, double p) {
	return client_do("vram_set_manual_proportion", c, VRAM_OP_SET_MANUAL_PROPORTION_, NULL, p);
}

int vram_set_manual_limit_mode(vram_client c, double p) {
	return client_do("vram_set_manual_limit_mode", c, VRAM_OP_SET_MANUAL_LIMIT_MODE_, NULL, p);
}

int vram_set_auto_limit_mode(vram_client c) {
	return client_do("vram_set_auto_limit_mode", c, VRAM_OP_SET_AUTO_LIMIT_MODE_, NULL, 0);
}

int vram_client_free(vram_client c, const char *label) {
	if (!label) return fail(VRAM_EINVAL, "vram_client_free: label is NULL");
	return client_do("vram_client_free", c, VRAM_OP_CLIENT_FREE_, label, 0);
}

int vram_sync(vram_client c) { return client_do("vram_sync", c, VRAM_OP_SYNC_, NULL, 0); }

int vram_queue(vram_client c, const struct vram_request *requests, size_t n, size_t request_size) {
	ENTER("vram_queue");
	if (n > 0) NOT_NULL("vram_queue", requests);
	return GO(vramgo_queue, c, (void *)requests, n, request_size);
}

int vram_allocate(vram_client c, int buffers, vram_response *out) {
	ENTER("vram_allocate");
	NOT_NULL("vram_allocate", out);
	int64_t r = 0;
	int rc = GO(vramgo_allocate, c, buffers, &r);
	if (rc == VRAM_OK) *out = r;
	return rc;
}

int vram_queue_allocate(vram_client c, const struct vram_request *requests, size_t n, size_t request_size,
			struct vram_allocation *a) {
	ENTER("vram_queue_allocate");
	SIZED("vram_queue_allocate", a, struct vram_allocation);
	if ((a->flags & VRAM_ALLOCATE_QUEUE) && n > 0) NOT_NULL("vram_queue_allocate", requests);
	if (a->cap > 0) {
		NOT_NULL("vram_queue_allocate", a->arrays);
		if (a->array_size < sizeof a->arrays->size)
			return fail(VRAM_EINVAL, "vram_queue_allocate: a->array_size is %zu; set it to sizeof(struct vram_array), %zu",
				    a->array_size, sizeof(struct vram_array));
	}
	if (a->plan && a->plan->size < sizeof a->plan->size)
		return fail(VRAM_EINVAL, "vram_queue_allocate: a->plan->size is %llu; set it to sizeof(struct vram_plan), %zu",
			    (unsigned long long)a->plan->size, sizeof(struct vram_plan));
	struct vram_plan p;
	memset(&p, 0, sizeof p);
	int rc = GO(vramgo_queue_allocate, c, (void *)requests, n, request_size, a, &p);
	if (rc != VRAM_OK || !a->plan) return rc;
	size_t k = a->plan->size < sizeof p ? (size_t)a->plan->size : sizeof p;
	p.size = k;
	memcpy(a->plan, &p, k);
	return VRAM_OK;
}

static int plan_call(const char *op, int (*fn)(int64_t, struct vram_plan *, char **), int64_t h, struct vram_plan *out) {
	ENTER(op);
	NOT_NULL(op, out);
	if (out->size < sizeof out->size)
		return fail(VRAM_EINVAL, "%s: out->size is %llu; set it to sizeof(struct vram_plan), %zu", op,
			    (unsigned long long)out->size, sizeof(struct vram_plan));
	struct vram_plan p;
	memset(&p, 0, sizeof p);
	int rc = GO(fn, h, &p);
	if (rc != VRAM_OK) return rc;
	size_t n = out->size < sizeof p ? (size_t)out->size : sizeof p;
	p.size = n;
	memcpy(out, &p, n);
	return VRAM_OK;
}

int vram_response_plan(vram_response r, struct vram_plan *out) {
	return plan_call("vram_response_plan", vramgo_response_plan, r, out);
}

int vram_response_array(vram_response r, const char *label, int buffer, struct vram_array *out) {
	ENTER("vram_response_array");
	NOT_NULL("vram_response_array", label);
	NOT_NULL("vram_response_array", out);
	if (out->size < sizeof out->size)
		return fail(VRAM_EINVAL, "vram_response_array: out->size is %llu; set it to sizeof(struct vram_array), %zu",
			    (unsigned long long)out->size, sizeof(struct vram_array));
	struct vram_array a;
	memset(&a, 0, sizeof a);
	int rc = GO(vramgo_response_array, r, str(label), buffer, &a);
	if (rc != VRAM_OK) return rc;
	size_t n = out->size < sizeof a ? (size_t)out->size : sizeof a;
	a.size = n;
	memcpy(out, &a, n);
	return VRAM_OK;
}

int vram_response_arrays(vram_response r, int buffer, struct vram_array *out, size_t cap, size_t array_size, size_t *n) {
	ENTER("vram_response_arrays");
	NOT_NULL("vram_response_arrays", n);
	if (cap > 0) {
		NOT_NULL("vram_response_arrays", out);
		if (array_size < sizeof out->size)
			return fail(VRAM_EINVAL, "vram_response_arrays: array_size is %zu; set it to sizeof(struct vram_array), %zu",
				    array_size, sizeof(struct vram_array));
	}
	return GO(vramgo_response_arrays, r, buffer, out, cap, array_size, n);
}

int vram_response_span(vram_response r, int chunk, int axis, struct vram_span *out) {
	ENTER("vram_response_span");
	NOT_NULL("vram_response_span", out);
	return GO(vramgo_response_span, r, chunk, axis, out);
}

int vram_response_member(vram_response r, vram_client c, vram_response *out) {
	ENTER("vram_response_member");
	NOT_NULL("vram_response_member", out);
	int64_t h = 0;
	int rc = GO(vramgo_response_member, r, c, &h);
	if (rc == VRAM_OK) *out = h;
	return rc;
}

int vram_response_json(vram_response r, char *buf, size_t len, size_t *needed) {
	return text_call("vram_response_json", vramgo_response_json, r, buf, len, needed);
}

int vram_response_release(vram_response r) {
	ENTER("vram_response_release");
	return GO(vramgo_response_release, r);
}

int vram_sim_host_address(vram_response r, const char *label, int buffer, void **out) {
	ENTER("vram_sim_host_address");
	NOT_NULL("vram_sim_host_address", label);
	NOT_NULL("vram_sim_host_address", out);
	uintptr_t p = 0;
	int rc = GO(vramgo_sim_host_address, r, str(label), buffer, &p);
	if (rc == VRAM_OK) *out = (void *)p;
	return rc;
}

static int copy(const char *op, int to_device, vram_client c, vram_response r, const char *label, int buffer,
		const struct vram_host_desc *host, const struct vram_span *span) {
	ENTER(op);
	NOT_NULL(op, label);
	NOT_NULL(op, host);
	return GO(vramgo_copy, to_device, c, r, str(label), buffer, (struct vram_host_desc *)host, (struct vram_span *)span);
}

int vram_to_device(vram_client c, vram_response r, const char *label, int buffer, const struct vram_host_desc *src,
		   const struct vram_span *span) {
	return copy("vram_to_device", 1, c, r, label, buffer, src, span);
}

int vram_from_device(vram_client c, vram_response r, const char *label, int buffer, const struct vram_host_desc *dst,
		     const struct vram_span *span) {
	return copy("vram_from_device", 0, c, r, label, buffer, dst, span);
}

int vram_begin_work(vram_client c, vram_work *out) {
	ENTER("vram_begin_work");
	NOT_NULL("vram_begin_work", out);
	int64_t w = 0;
	int rc = GO(vramgo_begin_work, c, &w);
	if (rc == VRAM_OK) *out = w;
	return rc;
}

int vram_end_work(vram_work w) {
	ENTER("vram_end_work");
	return GO(vramgo_end_work, w);
}

static int manager_do(const char *op, vram_manager m, int call, const char *arg, int n) {
	ENTER(op);
	return GO(vramgo_manager_do, m, call, str(arg), n);
}

int vram_set_limit_mode(vram_manager m, int mode) {
	return manager_do("vram_set_limit_mode", m, VRAM_OP_SET_LIMIT_MODE_, NULL, mode);
}

int vram_free_label(vram_manager m, const char *label) {
	if (!label) return fail(VRAM_EINVAL, "vram_free_label: label is NULL");
	return manager_do("vram_free_label", m, VRAM_OP_FREE_LABEL_, label, 0);
}

int vram_free_all(vram_manager m) { return manager_do("vram_free_all", m, VRAM_OP_FREE_ALL_, NULL, 0); }

int vram_invalidate_all(vram_manager m) { return manager_do("vram_invalidate_all", m, VRAM_OP_INVALIDATE_ALL_, NULL, 0); }

int vram_reinit_streams(vram_manager m) { return manager_do("vram_reinit_streams", m, VRAM_OP_REINIT_STREAMS_, NULL, 0); }

int vram_shares(vram_manager m, double *manual, double *auto_pool) {
	ENTER("vram_shares");
	double a = 0, b = 0;
	int rc = GO(vramgo_shares, m, &a, &b);
	if (rc == VRAM_OK) {
		if (manual) *manual = a;
		if (auto_pool) *auto_pool = b;
	}
	return rc;
}

int vram_mem_info(vram_manager m, uint64_t *free_bytes, uint64_t *total_bytes) {
	ENTER("vram_mem_info");
	uint64_t f = 0, t = 0;
	int rc = GO(vramgo_mem_info, m, &f, &t);
	if (rc == VRAM_OK) {
		if (free_bytes) *free_bytes = f;
		if (total_bytes) *total_bytes = t;
	}
	return rc;
}

int vram_group_members(vram_manager m, const char *group, vram_client *out, size_t cap, size_t *n) {
	ENTER("vram_group_members");
	NOT_NULL("vram_group_members", n);
	if (cap > 0) NOT_NULL("vram_group_members", out);
	return GO(vramgo_group_members, m, str(group), out, cap, n);
}

int vram_poll(vram_manager m, struct vram_event *out, char *reason, size_t len) {
	ENTER("vram_poll");
	NOT_NULL("vram_poll", out);
	if (out->size < sizeof out->size)
		return fail(VRAM_EINVAL, "vram_poll: out->size is %llu; set it to sizeof(struct vram_event), %zu",
			    (unsigned long long)out->size, sizeof(struct vram_event));
	if (len > 0) NOT_NULL("vram_poll", reason);
	struct vram_event ev;
	memset(&ev, 0, sizeof ev);
	char *why = NULL;
	int rc = GO(vramgo_poll, m, &ev, &why);
	if (rc != VRAM_OK) return rc;
	if (len > 0) {
		size_t k = why ? strlen(why) : 0;
		if (k > len - 1) k = len - 1;
		if (k) memcpy(reason, why, k);
		reason[k] = 0;
	}
	free(why);
	size_t n = out->size < sizeof ev ? (size_t)out->size : sizeof ev;
	ev.size = n;
	memcpy(out, &ev, n);
	return VRAM_OK;
}

int vram_host_array(vram_manager m, const int64_t *shape, int ndim, int dtype, int memory, vram_host *out, void **data) {
	ENTER("vram_host_array");
	NOT_NULL("vram_host_array", out);
	NOT_NULL("vram_host_array", data);
	int64_t h = 0;
	uintptr_t p = 0;
	int rc = GO(vramgo_host_array, m, (int64_t *)shape, ndim, dtype, memory, &h, &p);
	if (rc == VRAM_OK) {
		*out = h;
		*data = (void *)p;
	}
	return rc;
}

int vram_host_free(vram_host h) {
	ENTER("vram_host_free");
	return GO(vramgo_host_free, h);
}

/* (2.1) The chunk pipeline. */

int vram_batch_start(vram_manager m, const struct vram_batch_array *arrays, size_t n, size_t decl_size,
		     const struct vram_batch_options *o, vram_batch *out) {
	ENTER("vram_batch_start");
	NOT_NULL("vram_batch_start", out);
	if (n > 0) NOT_NULL("vram_batch_start", arrays);
	struct vram_batch_options opts;
	memset(&opts, 0, sizeof opts);
	if (o) {
		if (o->size < sizeof o->size + sizeof o->buffers)
			return fail(VRAM_EINVAL, "vram_batch_start: o->size is %llu; set it to sizeof(struct vram_batch_options), %zu",
				    (unsigned long long)o->size, sizeof(struct vram_batch_options));
		memcpy(&opts, o, o->size < sizeof opts ? (size_t)o->size : sizeof opts);
	}
	int64_t b = 0;
	int rc = GO(vramgo_batch_start, m, (void *)arrays, n, decl_size, &opts, &b);
	if (rc == VRAM_OK) *out = b;
	return rc;
}

int vram_batch_next(vram_batch b, struct vram_batch_chunk *chunk, struct vram_array *arrays, size_t cap,
		    size_t array_size, void **sim_hosts, int *done) {
	ENTER("vram_batch_next");
	NOT_NULL("vram_batch_next", done);
	SIZED("vram_batch_next", chunk, struct vram_batch_chunk);
	if (cap > 0) {
		NOT_NULL("vram_batch_next", arrays);
		if (array_size < sizeof arrays->size)
			return fail(VRAM_EINVAL, "vram_batch_next: array_size is %zu; set it to sizeof(struct vram_array), %zu",
				    array_size, sizeof(struct vram_array));
	}
	if (cap == 0) sim_hosts = NULL;
	uint64_t size = chunk->size;
	memset(chunk, 0, sizeof *chunk);
	chunk->size = size;
	*done = 0;
	return GO(vramgo_batch_next, b, chunk, arrays, cap, array_size, sim_hosts, done);
}

int vram_batch_plan(vram_batch b, struct vram_plan *out) { return plan_call("vram_batch_plan", vramgo_batch_plan, b, out); }

int vram_batch_cancel(vram_batch b) {
	ENTER("vram_batch_cancel");
	return GO(vramgo_batch_do, b, VRAM_OP_BATCH_CANCEL_);
}

int vram_batch_report_json(vram_batch b, char *buf, size_t len, size_t *needed) {
	return text_call("vram_batch_report_json", vramgo_batch_report_json, b, buf, len, needed);
}

int vram_batch_close(vram_batch b) {
	ENTER("vram_batch_close");
	return GO(vramgo_batch_do, b, VRAM_OP_BATCH_CLOSE_);
}
