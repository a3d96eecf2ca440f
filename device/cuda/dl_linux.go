//go:build linux

// Loading and calling the driver library on Linux, through purego (no cgo).

package cuda

import (
	"fmt"
	"strings"

	"github.com/ebitengine/purego"
)

// openLib dlopens the first of names that loads and resolves the symbol
// table in it. It is separate from load so tests can point it at other
// libraries.
func openLib(names []string) (*lib, error) {
	var msgs []string
	for _, name := range names {
		h, err := purego.Dlopen(name, purego.RTLD_NOW|purego.RTLD_LOCAL)
		if err != nil {
			msgs = append(msgs, err.Error())
			continue
		}
		l := &lib{path: name}
		for i, sym := range symbolNames {
			p, err := purego.Dlsym(h, sym)
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

// call runs the driver function fn with args in the C ABI.
//
//go:uintptrescapes
func (l *lib) call(fn int, args ...uintptr) Result {
	r, _, _ := purego.SyscallN(l.fn[fn], args...)
	return Result(int32(uint32(r)))
}
