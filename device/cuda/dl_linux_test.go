//go:build linux

package cuda

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"syscall"
	"testing"
	"time"
)

// TestLoadErrorKeepsReason: openLib runs the loader's dlopen and dlerror on
// one OS thread. dlerror's message is kept per thread, so a goroutine that
// moved to another thread between the two read an empty message (about one
// load error in twenty-five lost its reason). The stand-in loader here
// plays dlopen failing, a blocking system call (during which the runtime
// hands the goroutine's P to others, so the goroutine may come back on
// another thread), and dlerror, which only knows the message on the
// thread that failed.
func TestLoadErrorKeepsReason(t *testing.T) {
	real := dlopen
	defer func() { dlopen = real }()
	dlopen = func(name string, mode int) (uintptr, error) {
		failedOn := syscall.Gettid() // dlopen fails here and sets this thread's message
		ts := syscall.NsecToTimespec(int64(2 * time.Millisecond))
		syscall.Nanosleep(&ts, nil) // a system call long enough to lose the P
		if syscall.Gettid() != failedOn {
			return 0, errors.New("") // dlerror on another thread: no message
		}
		return 0, fmt.Errorf("%s: cannot open shared object file", name)
	}
	stop := make(chan struct{})
	var busy sync.WaitGroup
	for range 2 * runtime.GOMAXPROCS(0) { // keep every P busy, yielding
		busy.Add(1)
		go func() {
			defer busy.Done()
			for {
				select {
				case <-stop:
					return
				default:
					runtime.Gosched()
				}
			}
		}()
	}
	defer func() { close(stop); busy.Wait() }()
	const tries = 100
	lost := 0
	for range tries {
		_, err := openLib([]string{"libcuda-missing.so.1"})
		if !errors.Is(err, errLoad) {
			t.Fatalf("openLib = %v; want errLoad", err)
		}
		want := "libcuda-missing.so.1: cannot open shared object file"
		if s := err.Error(); len(s) < len(want) || s[len(s)-len(want):] != want {
			lost++
		}
	}
	if lost > 0 {
		t.Errorf("%d of %d load errors lost the loader's reason: dlopen and dlerror ran on different threads", lost, tries)
	}
}
