package main

/*
#include <stdlib.h>
#include "internal.h"
*/
import "C"

import (
	"path/filepath"
	"unsafe"
)

// noteBrokerSocket tells shim.c's fork handler of a broker socket the
// library dials, by its path as given and as an absolute path: a forked
// child closes its copies of the connections to it, so that a lease ends
// with the process that holds it.
func noteBrokerSocket(socket string) {
	paths := []string{socket}
	if abs, err := filepath.Abs(socket); err == nil && abs != socket {
		paths = append(paths, abs)
	}
	for _, p := range paths {
		cs := C.CString(p)
		C.vram_broker_socket_(cs)
		C.free(unsafe.Pointer(cs))
	}
}
