package main

/*
#include "vram.h"

// vram_pairs makes n alloc/free pairs of size bytes on manager m, stream
// key 0x40, through the C API as a C program calls it; it returns the
// first failure's status (VRAM_OK: none).
static int vram_pairs(vram_manager m, size_t size, int n) {
	for (int i = 0; i < n; i++) {
		void *p = 0;
		int rc = vram_alloc(m, VRAM_SOURCE_C, size, 0x40, &p);
		if (rc != VRAM_OK) return rc;
		rc = vram_free(m, p, size, 0x40);
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

// cPairs makes n alloc/free pairs of size bytes on manager h through the
// C entry points (shim.c's vram_alloc and vram_free, then this package's
// exports), as a C program calls them: for the tests, which cannot use
// cgo themselves. Not part of the C API.
func cPairs(h int64, size uint64, n int) error {
	if rc := C.vram_pairs(C.vram_manager(h), C.size_t(size), C.int(n)); rc != C.VRAM_OK {
		var buf [256]C.char
		C.vram_last_error(&buf[0], C.size_t(len(buf)))
		return fmt.Errorf("vram_alloc or vram_free: status %d: %s", int(rc), C.GoString((*C.char)(unsafe.Pointer(&buf[0]))))
	}
	return nil
}
