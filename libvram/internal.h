/*
 * internal.h: what libvram's C files share and do not export. The public
 * contract is vram.h; the vramgo_* functions (_cgo_export.h) are the Go
 * side, called only from shim.c after its fork check.
 */
#ifndef VRAM_INTERNAL_H
#define VRAM_INTERNAL_H

#include "vram.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A hook's allocation: the fork check, the Go call, the thread's last
 * error. m 0 finds the manager by device. note_failure counts a failure in
 * the manager's hook errors (for hooks whose caller cannot be told). */
__attribute__((visibility("hidden")))
int vram_hook_alloc_(int source, int device, vram_manager m, size_t size, vram_stream stream, int note_failure, void **out);

/* The calls client.c makes through vramgo_client_do and vramgo_manager_do. */
enum vram_op_ {
	VRAM_OP_CHANGE_GROUP_,
	VRAM_OP_SET_MANUAL_PROPORTION_,
	VRAM_OP_SET_MANUAL_LIMIT_MODE_,
	VRAM_OP_SET_AUTO_LIMIT_MODE_,
	VRAM_OP_CLIENT_FREE_,
	VRAM_OP_SYNC_,
	VRAM_OP_SET_LIMIT_MODE_,
	VRAM_OP_FREE_LABEL_,
	VRAM_OP_FREE_ALL_,
	VRAM_OP_INVALIDATE_ALL_,
	VRAM_OP_REINIT_STREAMS_,
};

/* shim.c's helpers, which client.c's entry points use too: set_error
 * makes msg (malloc'd, or NULL: no error) the thread's last error; fail
 * sets a message of the library's own and returns status; forked reports
 * (with the last error set) a call in a forked child; copy_text copies a
 * Go text (malloc'd) into a caller's buffer and frees it; text_call runs
 * one of Go's text functions of a handle and copies its text. */
__attribute__((visibility("hidden"))) void set_error(char *msg);
__attribute__((visibility("hidden"), format(printf, 2, 3))) int fail(int status, const char *fmt, ...);
__attribute__((visibility("hidden"))) int forked(const char *op);
__attribute__((visibility("hidden"))) int copy_text(int status, char *text, char *buf, size_t len, size_t *needed);
__attribute__((visibility("hidden"))) int text_call(const char *op, int (*fn)(int64_t, char **, char **), int64_t h, char *buf,
                                                    size_t len, size_t *needed);

/* Notes path as the socket of a broker the library dials: a forked child
 * closes its copies of the connections to it (shim.c). */
__attribute__((visibility("hidden")))
void vram_broker_socket_(const char *path);

#ifdef __cplusplus
}
#endif

#endif /* VRAM_INTERNAL_H */
