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

/* Notes path as the socket of a broker the library dials: a forked child
 * closes its copies of the connections to it (shim.c). */
__attribute__((visibility("hidden")))
void vram_broker_socket_(const char *path);

#ifdef __cplusplus
}
#endif

#endif /* VRAM_INTERNAL_H */
