package main

/*
#include <stdlib.h>
#include "vram.h"

// vram_client_cycles makes n allocations of client c's group, as a
// program of the client API does: a request of 1024 float32s queued
// (replacing the arrays before), allocated, the allocation's event taken
// from manager m, both responses released. It returns the first failure's
// status (VRAM_OK: none).
static int vram_client_cycles(vram_manager m, vram_client c, int n) {
	int64_t shape[] = {1024};
	struct vram_request req = {.label = "x", .shape = shape, .ndim = 1, .dtype = VRAM_FLOAT32};
	for (int i = 0; i < n; i++) {
		vram_response r = 0;
		struct vram_event ev = {.size = sizeof ev};
		int rc = vram_queue(c, &req, 1, sizeof req);
		if (rc == VRAM_OK) rc = vram_allocate(c, 0, &r);
		if (rc == VRAM_OK) rc = vram_poll(m, &ev, 0, 0);
		if (rc == VRAM_OK && ev.response) rc = vram_response_release(ev.response);
		if (rc == VRAM_OK) rc = vram_response_release(r);
		if (rc != VRAM_OK) return rc;
	}
	return VRAM_OK;
}

// vram_one_call_cycles makes n allocations as vram_client_cycles does,
// each with one vram_queue_allocate (the client's own event taken, the
// response described with its arrays' simulator addresses) and the
// response's release.
static int vram_one_call_cycles(vram_client c, int n) {
	int64_t shape[] = {1024};
	struct vram_request req = {.label = "x", .shape = shape, .ndim = 1, .dtype = VRAM_FLOAT32};
	struct vram_plan plan = {.size = sizeof plan};
	struct vram_array arrays[1];
	void *hosts[1];
	struct vram_allocation a = {.size = sizeof a, .flags = VRAM_ALLOCATE_QUEUE | VRAM_ALLOCATE_TAKE_EVENT, .plan = &plan,
				    .arrays = arrays, .cap = 1, .array_size = sizeof arrays[0], .sim_hosts = hosts};
	for (int i = 0; i < n; i++) {
		int rc = vram_queue_allocate(c, &req, 1, sizeof req, &a);
		if (rc == VRAM_OK && (!a.event_taken || a.n != 1)) return VRAM_EINVAL;
		if (rc == VRAM_OK) rc = vram_response_release(a.response);
		if (rc != VRAM_OK) return rc;
	}
	return VRAM_OK;
}

// vram_copy_cycles copies the 1024 float32s of host into array "x" of
// response r, back, and waits for them, n times, on client c's stream.
static int vram_copy_cycles(vram_client c, vram_response r, float *host, int n) {
	int64_t shape[] = {1024};
	struct vram_host_desc h = {.data = host, .shape = shape, .ndim = 1, .dtype = VRAM_FLOAT32};
	for (int i = 0; i < n; i++) {
		int rc = vram_to_device(c, r, "x", 0, &h, 0);
		if (rc == VRAM_OK) rc = vram_from_device(c, r, "x", 0, &h, 0);
		if (rc == VRAM_OK) rc = vram_sync(c);
		if (rc != VRAM_OK) return rc;
	}
	return VRAM_OK;
}
*/
import "C"

import (
	"fmt"
	"unsafe"
)

// cClientCycles makes n allocations of client c's group through the C
// entry points (vram_client_cycles), as a program of the client API does:
// for the tests, which cannot use cgo themselves. Not part of the C API.
func cClientCycles(m, c int64, n int) error {
	return cStatus("the client cycle", C.vram_client_cycles(C.vram_manager(m), C.vram_client(c), C.int(n)))
}

// cOneCallCycles makes n allocations of client c's group, each with one
// vram_queue_allocate (vram_one_call_cycles).
func cOneCallCycles(c int64, n int) error {
	return cStatus("the one-call cycle", C.vram_one_call_cycles(C.vram_client(c), C.int(n)))
}

// cCopyCycles makes n round trips of 4 KiB through array "x" of response
// r of client c (vram_copy_cycles). host is 1024 float32s, C memory.
func cCopyCycles(c, r int64, host *C.float, n int) error {
	return cStatus("the copy cycle", C.vram_copy_cycles(C.vram_client(c), C.vram_response(r), host, C.int(n)))
}

// cFloats is n float32s of C memory, and the function that frees them.
func cFloats(n int) (*C.float, func()) {
	p := (*C.float)(C.calloc(C.size_t(n), 4))
	return p, func() { C.free(unsafe.Pointer(p)) }
}

// cStatus is the error of a helper's status, with the thread's last error.
func cStatus(what string, rc C.int) error {
	if rc == C.VRAM_OK {
		return nil
	}
	var buf [256]C.char
	C.vram_last_error(&buf[0], C.size_t(len(buf)))
	return fmt.Errorf("%s: status %d: %s", what, int(rc), C.GoString(&buf[0]))
}
