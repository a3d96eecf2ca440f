//go:build linux

// Loading and calling the driver library on Linux, through purego (no cgo).

package cuda

import (
	"fmt"
	"runtime"
	"strings"

	"github.com/ebitengine/purego"
)

// dlopen is purego.Dlopen: dlopen, then dlerror when it fails. A variable
// so that tests can check which thread it runs on.
var dlopen = purego.Dlopen

// openLib dlopens the first of names that loads and resolves the symbol
// table in it. It is separate from load so tests can point it at other
// libraries.
//
// The loader reports why dlopen failed through dlerror, whose message is
// kept per OS thread; purego.Dlopen calls the two one after the other, so
// the goroutine is locked to its thread across them, else it may move
// between the calls and read another thread's (empty) message.
func openLib(names []string) (*lib, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var msgs []string
	for _, name := range names {
		h, err := dlopen(name, purego.RTLD_NOW|purego.RTLD_LOCAL)
		if err != nil {
			msgs = append(msgs, err.Error())
			continue
		}
		l := &lib{path: name}
		for i, sym := range symbolNames {
			p, err := purego.Dlsym(h, sym)
			if optionalSyms[i] {
				l.fn[i] = p // 0 when this driver lacks it
				continue
			}
			if err != nil || p == 0 {
				_ = purego.Dlclose(h)
				return nil, fmt.Errorf("%w: %s has no symbol %s (driver too old? vram needs CUDA 11.2 or newer)",
					errLoad, name, sym)
			}
			l.fn[i] = p
		}
		return l, nil
	}
	return nil, fmt.Errorf("%w (is the NVIDIA driver installed?): %s", errLoad, strings.Join(msgs, "; "))
}

// raw runs the driver function fn with args in the C ABI (lib.call is
// raw plus the note of its result).
//
//go:uintptrescapes
func (l *lib) raw(fn int, args ...uintptr) Result {
	r, _, _ := purego.SyscallN(l.fn[fn], args...)
	return Result(int32(uint32(r)))
}
