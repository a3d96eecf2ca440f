// Package safecopy touches host memory that may fault — a memory-mapped
// file that shrank under its mapping, or whose disk filled — and turns
// the fault into an error instead of letting it end the process.
//
// A fault on such memory is a SIGBUS, which Go treats as fatal unless the
// goroutine asked to panic on faults (runtime/debug.SetPanicOnFault). Do
// asks for the duration of one call and recovers the panic; it owns
// nothing else. Memory that faults stays unusable: the caller reports
// the error and stops using it.
package safecopy

import (
	"errors"
	"fmt"
	"runtime/debug"
)

// ErrFault is wrapped by the errors of Do and Copy when host memory
// faulted.
var ErrFault = errors.New("host memory faulted (a memory-mapped file shrank under its mapping, or its disk is full)")

// addrError is the runtime.Error a fault panics with.
type addrError interface {
	error
	Addr() uintptr
}

// Do runs f, returning an error wrapping ErrFault if it faults on
// memory; any other panic goes on.
func Do(f func()) (err error) {
	old := debug.SetPanicOnFault(true)
	defer debug.SetPanicOnFault(old)
	defer func() {
		if r := recover(); r != nil {
			ae, ok := r.(addrError)
			if !ok {
				panic(r)
			}
			err = fmt.Errorf("at address %#x: %w", ae.Addr(), ErrFault)
		}
	}()
	f()
	return nil
}

// Copy is copy(dst, src) under Do.
func Copy(dst, src []byte) error {
	return Do(func() { copy(dst, src) })
}
