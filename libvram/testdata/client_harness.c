/*
 * client_harness.c: the client API of vram.h (ABI 2) from C, linked
 * against libvram.so, on the simulator: two components in one stream
 * group, a batch bigger than the device chunked between them, each chunk
 * copied in, worked on in the simulated memory and copied out; the events
 * polled; one allocation in one call (2.2); every entry point with bad arguments; clients of their own on
 * several threads at once; and the ABI 1 entry points beside them.
 *
 *   client_harness
 *
 * Prints one "ok" or "not ok" line per check and exits with the number of
 * failures (libvram/client_test.go runs it).
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../vram.h"

static int failures;
#define CHECK(cond, ...)                      \
	do {                                  \
		if (cond) {                   \
			printf("ok - ");      \
		} else {                      \
			printf("not ok - ");  \
			failures++;           \
		}                             \
		printf(__VA_ARGS__);          \
		printf("\n");                 \
		fflush(stdout);               \
	} while (0)

static char errbuf[4096];
static const char *lasterr(void) {
	vram_last_error(errbuf, sizeof errbuf);
	return errbuf;
}

#define RUNS (3 << 20) /* 12 MiB of float32 per array, two arrays, a 16 MiB device */

static vram_client reg(vram_manager m, const char *name, const char *group, uint32_t hooks) {
	struct vram_client_options o = {.size = sizeof o, .name = name, .group = group, .hooks = hooks};
	vram_client c = 0;
	int rc = vram_register(m, &o, &c);
	CHECK(rc == VRAM_OK && c > 0, "register %s in %s: %d %s", name, group, rc, lasterr());
	return c;
}

static void queue1(vram_client c, const char *label, int64_t runs) {
	int64_t shape[] = {runs};
	struct vram_request r = {.label = label, .shape = shape, .ndim = 1, .dtype = VRAM_FLOAT32};
	int rc = vram_queue(c, &r, 1, sizeof r);
	CHECK(rc == VRAM_OK, "queue %s[%lld]: %d %s", label, (long long)runs, rc, lasterr());
}

/* check_batch: x in, y = 2x computed in the simulated memory, y out. */
static void check_batch(vram_manager m) {
	vram_client in = reg(m, "in", "solver", VRAM_HOOK_ALLOCATED), out = reg(m, "out", "solver", VRAM_HOOK_ALLOCATED);
	queue1(in, "x", RUNS);
	queue1(out, "y", RUNS);
	vram_response r = 0, ri = 0;
	int rc = vram_allocate(out, 0, &r);
	CHECK(rc == VRAM_OK, "allocate the group: %d %s", rc, lasterr());
	struct vram_plan p = {.size = sizeof p};
	rc = vram_response_plan(r, &p);
	CHECK(rc == VRAM_OK && p.client == out && p.chunks >= 2 && p.total_runs == RUNS && p.arrays == 1,
	      "plan: client %lld, %lld chunks of %lld runs, %lld arrays", (long long)p.client, (long long)p.chunks,
	      (long long)p.chunk_length, (long long)p.arrays);
	rc = vram_response_member(r, in, &ri);
	CHECK(rc == VRAM_OK && ri > 0, "the input's response: %d %s", rc, lasterr());
	struct vram_array xa = {.size = sizeof xa}, ya = {.size = sizeof ya};
	vram_response_array(ri, "x", 0, &xa);
	vram_response_array(r, "y", 0, &ya);
	CHECK(xa.ndim == 1 && xa.shape[0] == p.chunk_length && xa.strides[0] == 4 && xa.chunk_axis == 0 && xa.device_ptr &&
		      !xa.host && xa.dtype == VRAM_FLOAT32 && xa.memory == VRAM_MEMORY_DEVICE,
	      "x is a device array of %lld runs at %#llx", (long long)xa.shape[0], (unsigned long long)xa.device_ptr);

	float *x = malloc(sizeof(float) * RUNS), *y = calloc(RUNS, sizeof(float));
	for (int i = 0; i < RUNS; i++) x[i] = (float)i;
	int64_t shape[] = {RUNS};
	struct vram_host_desc hx = {.data = x, .shape = shape, .ndim = 1, .dtype = VRAM_FLOAT32};
	struct vram_host_desc hy = {.data = y, .shape = shape, .ndim = 1, .dtype = VRAM_FLOAT32};
	float *dx = NULL, *dy = NULL;
	rc = vram_sim_host_address(ri, "x", 0, (void **)&dx);
	rc |= vram_sim_host_address(r, "y", 0, (void **)&dy);
	CHECK(rc == VRAM_OK && dx && dy, "the simulated memory's host addresses: %d %s", rc, lasterr());
	int bad = 0;
	for (int i = 0; i < p.chunks; i++) {
		struct vram_span sp;
		vram_response_span(r, i, 0, &sp);
		bad |= vram_to_device(in, ri, "x", 0, &hx, &sp);
		bad |= vram_sync(in);
		for (int64_t k = 0; k < sp.len; k++) dy[k] = 2 * dx[k]; /* the chunk's "kernel" */
		bad |= vram_from_device(out, r, "y", 0, &hy, &sp);
	}
	bad |= vram_sync(out);
	int wrong = -1;
	for (int i = 0; i < RUNS && wrong < 0; i++)
		if (y[i] != 2 * x[i]) wrong = i;
	CHECK(!bad && wrong < 0, "y = 2x over %d runs in %lld chunks (first wrong: %d) %s", RUNS, (long long)p.chunks, wrong,
	      bad ? lasterr() : "");

	/* Events: each member's allocation, in id order, with its own response
	 * (2.1: how many are queued behind, and the response's id: out's is
	 * the one vram_allocate gave, in's the one vram_response_member gave). */
	struct vram_event ev = {.size = sizeof ev};
	vram_client seen[2] = {0, 0};
	int64_t pending[2] = {-1, -1}, ids[2] = {0, 0};
	struct vram_plan pin = {.size = sizeof pin};
	vram_response_plan(ri, &pin);
	for (int i = 0; i < 2; i++) {
		vram_poll(m, &ev, NULL, 0);
		seen[i] = ev.kind == VRAM_EVENT_ALLOCATED ? ev.client : -1;
		pending[i] = ev.pending;
		ids[i] = ev.response_id;
		if (ev.response) vram_response_release(ev.response);
	}
	vram_poll(m, &ev, NULL, 0);
	CHECK(seen[0] == in && seen[1] == out && ev.kind == VRAM_EVENT_NONE, "events: allocated %lld, %lld, then none (%d)",
	      (long long)seen[0], (long long)seen[1], ev.kind);
	CHECK(pending[0] == 1 && pending[1] == 0 && ids[0] == pin.id && ids[1] == p.id && p.id != pin.id && p.sets == 1,
	      "2.1: pending %lld, %lld; ids %lld, %lld (the responses say %lld, %lld)", (long long)pending[0],
	      (long long)pending[1], (long long)ids[0], (long long)ids[1], (long long)pin.id, (long long)p.id);
	struct vram_array all[2];
	size_t n = 0;
	all[0].size = sizeof all[0];
	rc = vram_response_arrays(r, 0, all, 2, sizeof all[0], &n);
	CHECK(rc == VRAM_OK && n == 1 && !strcmp(all[0].label, "y") && all[0].device_ptr == ya.device_ptr && !strcmp(ya.label, "y"),
	      "2.1: the response's arrays: %d, %zu of them, %s %s", rc, n, n ? all[0].label : "", lasterr());
	rc = vram_response_arrays(r, 1, all, 2, sizeof all[0], &n);
	CHECK(rc == VRAM_EINVAL, "2.1: buffer 1 of a response of 1 is refused: %d", rc);

	/* An invalidation, and its reason. */
	vram_client quiet = reg(m, "quiet", "other", VRAM_HOOK_INVALIDATE);
	rc = vram_invalidate_all(m);
	char why[256];
	vram_poll(m, &ev, why, sizeof why);
	CHECK(rc == VRAM_OK && ev.kind == VRAM_EVENT_INVALIDATED && ev.client == quiet && strstr(why, "freed"),
	      "invalidate all: %d, event %d for %lld: %s", rc, ev.kind, (long long)ev.client, why);
	rc = vram_to_device(in, ri, "x", 0, &hx, NULL);
	CHECK(rc == VRAM_EFREED, "a copy into an invalidated array: %d %s", rc, lasterr());
	struct vram_array freed = {.size = sizeof freed};
	vram_response_array(ri, "x", 0, &freed);
	CHECK(freed.freed == 1 && freed.device_ptr == 0, "x is freed");
	free(x);
	free(y);
	CHECK(vram_response_release(r) == VRAM_OK && vram_response_release(ri) == VRAM_OK, "release the responses");
	CHECK(vram_response_release(r) == VRAM_EHANDLE, "a released response is refused: %s", lasterr());
	CHECK(vram_client_close(in) == VRAM_OK && vram_client_close(out) == VRAM_OK && vram_client_close(quiet) == VRAM_OK &&
		      vram_client_close(in) == VRAM_OK,
	      "close the clients (twice is no error)");
}

/* check_client_calls: the client's figures, group, shares, marks, host arrays. */
static void check_client_calls(vram_manager m) {
	vram_client a = reg(m, "a", "g", 0), b = reg(m, "b", "g", 0);
	int rc = vram_set_manual_proportion(a, 0.25);
	struct vram_client_info ia = {.size = sizeof ia};
	vram_client_info(a, &ia);
	double manual = 0, autop = 0;
	vram_shares(m, &manual, &autop);
	uint64_t fr = 0, total = 0;
	vram_mem_info(m, &fr, &total);
	CHECK(rc == VRAM_OK && ia.proportion == 0.25 && ia.cap == total / 4 && manual == 0.25 && autop == 0.75 &&
		      ia.grouped == 1 && ia.idle == 1 && ia.stream != 0 && ia.manager == m,
	      "a manual quarter: proportion %g, cap %llu of %llu, shares %g + %g", ia.proportion, (unsigned long long)ia.cap,
	      (unsigned long long)total, manual, autop);
	rc = vram_set_manual_proportion(b, 0.8);
	CHECK(rc == VRAM_EINVAL && strstr(lasterr(), "proportion"), "a proportion past the pools: %d %s", rc, errbuf);
	vram_client ids[4];
	size_t n = 0;
	rc = vram_group_members(m, "g", ids, 4, &n);
	CHECK(rc == VRAM_OK && n == 2 && ids[0] == a && ids[1] == b, "group g has a and b: %zu", n);
	rc = vram_change_group(b, "h");
	char g[16];
	size_t need = 0;
	vram_client_group(b, g, sizeof g, &need);
	CHECK(rc == VRAM_OK && !strcmp(g, "h") && need == 2, "b moved to %s", g);
	vram_work w = 0;
	rc = vram_begin_work(a, &w);
	vram_client_info(a, &ia);
	CHECK(rc == VRAM_OK && ia.idle == 0, "a work mark makes a busy");
	CHECK(vram_end_work(w) == VRAM_OK && vram_end_work(w) == VRAM_EINVAL, "end it, once");
	CHECK(vram_set_limit_mode(m, VRAM_ACTIVE) == VRAM_OK && vram_set_limit_mode(m, 9) == VRAM_EINVAL &&
		      vram_set_limit_mode(m, VRAM_PASSIVE) == VRAM_OK,
	      "limit modes");
	vram_host h = 0;
	double *d = NULL;
	int64_t hs[] = {3, 5};
	rc = vram_host_array(m, hs, 2, VRAM_FLOAT64, VRAM_MEMORY_PINNED, &h, (void **)&d);
	CHECK(rc == VRAM_OK && d && d[0] == 0 && d[14] == 0, "a pinned host array: %d %s", rc, lasterr());
	d[14] = 1;
	CHECK(vram_host_free(h) == VRAM_OK && vram_host_free(h) == VRAM_EINVAL, "free it, once");
	CHECK(vram_host_array(m, hs, 2, VRAM_FLOAT64, VRAM_MEMORY_DEVICE, &h, (void **)&d) == VRAM_EINVAL,
	      "a host array of device memory is refused: %s", lasterr());
	vram_client_close(a);
	vram_client_close(b);
}

/* check_bad: every entry point's refusals. */
static void check_bad(vram_manager m) {
	vram_client c = reg(m, "bad", "bad", 0);
	struct vram_client_options small = {.size = 8};
	vram_client out = 0;
	CHECK(vram_register(m, &small, &out) == VRAM_EINVAL && strstr(lasterr(), "sizeof"), "options too small: %s", errbuf);
	CHECK(vram_register(m, NULL, &out) == VRAM_EINVAL, "no options");
	struct vram_client_options o = {.size = sizeof o};
	CHECK(vram_register(9999, &o, &out) == VRAM_EHANDLE, "an unknown manager: %s", lasterr());
	CHECK(vram_client_info(9999, &(struct vram_client_info){.size = 64}) == VRAM_EHANDLE, "an unknown client");
	int64_t big[] = {1 << 30};
	struct vram_request r = {.label = "huge", .shape = big, .ndim = 1, .dtype = VRAM_FLOAT32, .unchunkable = 1};
	vram_queue(c, &r, 1, sizeof r);
	vram_response resp = 0;
	int rc = vram_allocate(c, 0, &resp);
	CHECK(rc == VRAM_ENOMEM && strstr(lasterr(), "GiB"), "4 GiB unchunkable on 16 MiB: %d %s", rc, errbuf);
	r.memory = VRAM_MEMORY_MANAGED;
	CHECK(vram_queue(c, &r, 1, sizeof r) == VRAM_ENOTSUP, "managed memory: %s", lasterr());
	r.memory = VRAM_MEMORY_DEVICE;
	r.dtype = 99;
	CHECK(vram_queue(c, &r, 1, sizeof r) == VRAM_EINVAL && strstr(lasterr(), "huge"), "a bad dtype names its label: %s", errbuf);
	r.label = NULL;
	CHECK(vram_queue(c, &r, 1, sizeof r) == VRAM_EINVAL, "no label: %s", lasterr());
	CHECK(vram_queue(c, &r, 1, 8) == VRAM_EINVAL, "requests too small: %s", lasterr());
	CHECK(vram_queue(c, NULL, 0, 0) == VRAM_OK, "an empty queue");
	CHECK(vram_allocate(c, 0, &resp) == VRAM_EINVAL && strstr(lasterr(), "nothing queued"), "nothing queued: %s", errbuf);
	CHECK(vram_allocate(c, -1, &resp) == VRAM_EINVAL, "negative buffers");
	CHECK(vram_response_plan(9999, &(struct vram_plan){.size = sizeof(struct vram_plan)}) == VRAM_EHANDLE, "an unknown response");
	CHECK(vram_end_work(9999) == VRAM_EINVAL && vram_host_free(9999) == VRAM_EINVAL, "unknown marks and host arrays");
	struct vram_event ev = {.size = 4};
	CHECK(vram_poll(m, &ev, NULL, 0) == VRAM_EINVAL, "an event too small");
	size_t n = 0;
	CHECK(vram_group_members(m, "bad", NULL, 2, &n) == VRAM_EINVAL, "members into NULL");
	CHECK(vram_client_free(c, NULL) == VRAM_EINVAL && vram_free_label(m, NULL) == VRAM_EINVAL, "free of no label");
	CHECK(vram_client_free(c, "never") == VRAM_OK && vram_free_label(m, "never") == VRAM_OK && vram_free_all(m) == VRAM_OK &&
		      vram_reinit_streams(m) == VRAM_OK,
	      "frees of nothing, fresh streams");
	vram_client_close(c);
}

/* check_queue_allocate: (2.2) one call queues, allocates and describes
 * what the steps would; the caller's own event taken when asked; a bad
 * call refused, and a refused queue allocates nothing. */
static void check_queue_allocate(vram_manager m) {
	vram_client c = reg(m, "qa", "qa", VRAM_HOOK_ALLOCATED | VRAM_HOOK_INVALIDATE);
	int64_t shape[] = {4, 1000}, pshape[] = {8};
	struct vram_request reqs[] = {
		{.label = "x", .shape = shape, .ndim = 2, .dtype = VRAM_FLOAT32, .chunk_axis = 1},
		{.label = "p", .shape = pshape, .ndim = 1, .dtype = VRAM_FLOAT64, .memory = VRAM_MEMORY_PINNED, .unchunkable = 1},
	};
	struct vram_plan plan = {.size = sizeof plan};
	struct vram_array arrays[2];
	void *hosts[2] = {0, 0};
	struct vram_allocation a = {.size = sizeof a, .flags = VRAM_ALLOCATE_QUEUE | VRAM_ALLOCATE_TAKE_EVENT | VRAM_ALLOCATE_MEM_INFO,
				    .plan = &plan, .arrays = arrays, .cap = 2, .array_size = sizeof arrays[0], .sim_hosts = hosts};
	int rc = vram_queue_allocate(c, reqs, 2, sizeof reqs[0], &a);
	CHECK(rc == VRAM_OK && a.response > 0 && a.event_taken == 1 && a.pending == 0 && a.n == 2 && a.total_bytes == 16 << 20 &&
		      a.free_bytes > 0,
	      "queue + allocate in one call: %d %s; response %lld, event taken %d, %lld pending, %zu arrays, %llu of %llu free", rc,
	      lasterr(), (long long)a.response, a.event_taken, (long long)a.pending, a.n, (unsigned long long)a.free_bytes,
	      (unsigned long long)a.total_bytes);
	struct vram_plan want = {.size = sizeof want};
	vram_response_plan(a.response, &want);
	CHECK(plan.size == sizeof plan && !memcmp(&plan, &want, sizeof plan) && plan.arrays == 2 && plan.client == c,
	      "its plan is vram_response_plan's");
	struct vram_array wa[2];
	size_t n = 0;
	vram_response_arrays(a.response, 0, wa, 2, sizeof wa[0], &n);
	CHECK(n == 2 && !memcmp(arrays, wa, sizeof wa) && !strcmp(arrays[0].label, "p") && !strcmp(arrays[1].label, "x"),
	      "its arrays are vram_response_arrays': %s, %s", arrays[0].label, arrays[1].label);
	void *want_host = NULL;
	vram_sim_host_address(a.response, "x", 0, &want_host);
	CHECK(hosts[0] == NULL && hosts[1] == want_host && want_host != NULL, "x's host address is vram_sim_host_address's: %p",
	      hosts[1]);
	struct vram_event ev = {.size = sizeof ev};
	CHECK(vram_poll(m, &ev, NULL, 0) == VRAM_OK && ev.kind == VRAM_EVENT_NONE, "no event left to poll");
	CHECK(vram_response_release(a.response) == VRAM_OK, "release the response");

	/* Without TAKE_EVENT, or QUEUE: the event stays; nothing queued, the last plan comes again. */
	struct vram_allocation b = {.size = sizeof b};
	rc = vram_queue_allocate(c, NULL, 0, 0, &b);
	CHECK(rc == VRAM_OK && b.event_taken == 0 && b.pending == 1, "nothing queued: the last plan, its event queued: %d %s; %d taken, %lld pending, %zu arrays",
	      rc, lasterr(), b.event_taken, (long long)b.pending, b.n);
	CHECK(vram_poll(m, &ev, NULL, 0) == VRAM_OK && ev.kind == VRAM_EVENT_ALLOCATED && ev.client == c, "the event polled");
	vram_response_release(ev.response);
	vram_response_release(b.response);

	struct vram_allocation small = {.size = 8};
	CHECK(vram_queue_allocate(c, reqs, 2, sizeof reqs[0], &small) == VRAM_EINVAL && strstr(lasterr(), "sizeof"),
	      "a struct too small: %s", errbuf);
	CHECK(vram_queue_allocate(c, reqs, 2, sizeof reqs[0], NULL) == VRAM_EINVAL, "no struct");
	struct vram_allocation q = {.size = sizeof q, .flags = VRAM_ALLOCATE_QUEUE, .cap = 2, .array_size = sizeof arrays[0]};
	CHECK(vram_queue_allocate(c, reqs, 2, sizeof reqs[0], &q) == VRAM_EINVAL, "arrays NULL with a cap: %s", lasterr());
	q.cap = 0;
	CHECK(vram_queue_allocate(c, NULL, 2, sizeof reqs[0], &q) == VRAM_EINVAL, "requests NULL: %s", lasterr());
	reqs[0].dtype = 99;
	CHECK(vram_queue_allocate(c, reqs, 2, sizeof reqs[0], &q) == VRAM_EINVAL && strstr(lasterr(), "queue x") &&
		      vram_poll(m, &ev, NULL, 0) == VRAM_OK && ev.kind == VRAM_EVENT_NONE,
	      "a bad request names its label and allocates nothing: %s", errbuf);
	vram_client_close(c);
}

struct job {
	vram_manager m;
	int i, rc;
};

static void *job(void *arg) {
	struct job *j = arg;
	char group[16];
	snprintf(group, sizeof group, "t%d", j->i);
	struct vram_client_options o = {.size = sizeof o, .name = group, .group = group};
	vram_client c = 0;
	j->rc = vram_register(j->m, &o, &c);
	float host[4096];
	int64_t shape[] = {4096};
	struct vram_request r = {.label = "v", .shape = shape, .ndim = 1, .dtype = VRAM_FLOAT32};
	struct vram_host_desc hd = {.data = host, .shape = shape, .ndim = 1, .dtype = VRAM_FLOAT32};
	for (int k = 0; k < 20 && j->rc == VRAM_OK; k++) {
		for (int i = 0; i < 4096; i++) host[i] = (float)(i + k);
		vram_response resp = 0;
		j->rc = vram_queue(c, &r, 1, sizeof r);
		if (!j->rc) j->rc = vram_allocate(c, 0, &resp);
		if (!j->rc) j->rc = vram_to_device(c, resp, "v", 0, &hd, NULL);
		if (!j->rc) j->rc = vram_sync(c); /* host is the copy's until then */
		memset(host, 0, sizeof host);
		if (!j->rc) j->rc = vram_from_device(c, resp, "v", 0, &hd, NULL);
		if (!j->rc) j->rc = vram_sync(c);
		if (!j->rc && host[4095] != (float)(4095 + k)) j->rc = -100;
		if (resp) vram_response_release(resp);
	}
	if (!j->rc) j->rc = vram_client_close(c);
	return NULL;
}

static void check_threads(vram_manager m) {
	pthread_t t[4];
	struct job jobs[4];
	for (int i = 0; i < 4; i++) {
		jobs[i] = (struct job){.m = m, .i = i};
		pthread_create(&t[i], NULL, job, &jobs[i]);
	}
	int bad = 0;
	for (int i = 0; i < 4; i++) {
		pthread_join(t[i], NULL);
		bad |= jobs[i].rc;
	}
	CHECK(bad == 0, "4 threads, a client each, 20 allocations and round trips: %d", bad);
}

/* (2.1) The pipeline from C, kernels on the host: y = 3x, chunk by chunk,
 * two buffers; each chunk's x is in place when it is handed over. */
static void check_pipeline(vram_manager m) {
	vram_client c = reg(m, "piped", "pipe", 0);
	float *x = malloc(sizeof(float) * RUNS), *y = calloc(RUNS, sizeof(float));
	for (int i = 0; i < RUNS; i++) x[i] = (float)(i % 1000);
	int64_t shape[] = {RUNS};
	struct vram_batch_array decl[2] = {
		{.client = c, .request = {.label = "x", .shape = shape, .ndim = 1, .dtype = VRAM_FLOAT32}, .direction = VRAM_BATCH_IN, .host = x},
		{.client = c, .request = {.label = "y", .shape = shape, .ndim = 1, .dtype = VRAM_FLOAT32}, .direction = VRAM_BATCH_OUT, .host = y},
	};
	struct vram_batch_options o = {.size = sizeof o, .buffers = 2, .host_kernels = 1};
	vram_batch b = 0;
	int rc = vram_batch_start(m, decl, 2, sizeof decl[0], &o, &b);
	CHECK(rc == VRAM_OK && b > 0, "start a batch: %d %s", rc, lasterr());
	struct vram_batch_chunk ch = {.size = sizeof ch};
	struct vram_array arrays[2];
	arrays[0].size = sizeof arrays[0];
	void *hosts[2];
	int done = 0, chunks = 0, misplaced = 0;
	while ((rc = vram_batch_next(b, &ch, arrays, 2, sizeof arrays[0], hosts, &done)) == VRAM_OK && !done) {
		float *dx = hosts[0], *dy = hosts[1];
		for (int64_t i = 0; i < ch.len; i++) {
			misplaced += dx[i] != x[ch.start + i];
			dy[i] = 3 * dx[i];
		}
		misplaced += strcmp(arrays[0].label, "x") != 0 || arrays[1].shape[0] != ch.chunk_length;
		chunks++;
	}
	CHECK(rc == VRAM_OK && done && chunks >= 2 && !misplaced, "the batch: %d, %d chunks, %d misplaced %s", rc, chunks, misplaced,
	      lasterr());
	int wrong = -1;
	for (int i = 0; i < RUNS && wrong < 0; i++)
		if (y[i] != 3 * x[i]) wrong = i;
	char rep[4096];
	size_t need = 0;
	rc = vram_batch_report_json(b, rep, sizeof rep, &need);
	CHECK(wrong < 0 && rc == VRAM_OK && strstr(rep, "\"chunks_done\""), "y = 3x (first wrong %d); report %s", wrong, rep);
	CHECK(vram_batch_close(b) == VRAM_OK && vram_batch_close(b) == VRAM_EHANDLE, "close the batch, once");
	vram_client_close(c);
	free(x);
	free(y);
}

int main(void) {
	CHECK(vram_abi_version() >= 2, "ABI version %d", vram_abi_version());
	CHECK(vram_abi_version() > 2 || vram_abi_minor() >= 2, "ABI version 2.%d", vram_abi_minor());
	CHECK(!strcmp(vram_strerror(VRAM_EFREED), "array freed") && !strcmp(vram_strerror(VRAM_ENOTSUP), "not supported"),
	      "the new statuses have their words");
	vram_manager m = 0;
	int rc = vram_open("sim:vram=16MiB", 0, &m);
	CHECK(rc == VRAM_OK, "open: %d %s", rc, lasterr());
	void *p = NULL;
	CHECK(vram_alloc(m, VRAM_SOURCE_C, 1 << 20, 0, &p) == VRAM_OK, "ABI 1's allocation beside the clients");
	check_batch(m);
	check_client_calls(m);
	check_bad(m);
	check_queue_allocate(m);
	check_threads(m);
	check_pipeline(m);
	CHECK(vram_close(m) == VRAM_EBUSY, "close refused while ABI 1's allocation is live: %s", lasterr());
	CHECK(vram_free(m, p, 1 << 20, 0) == VRAM_OK, "free it");

	/* Closing the manager closes what the client API holds on it. */
	vram_client c = reg(m, "last", "last", VRAM_HOOK_ALLOCATED);
	queue1(c, "z", 1024);
	vram_response r = 0;
	vram_allocate(c, 0, &r);
	vram_host h = 0;
	void *d = NULL;
	int64_t hs[] = {16};
	vram_host_array(m, hs, 1, VRAM_UINT8, VRAM_MEMORY_PINNED, &h, &d);
	rc = vram_close(m);
	CHECK(rc == VRAM_OK, "close with a client, a response, an event and a host array: %d %s", rc, lasterr());
	CHECK(vram_client_close(c) == VRAM_OK && vram_response_release(r) == VRAM_EHANDLE && vram_host_free(h) == VRAM_EINVAL,
	      "their handles are gone");
	printf("# %d failures\n", failures);
	return failures;
}
