//go:build unix

package userfile

import (
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// TestFIFO checks that a FIFO is refused, at once, as an output and as an
// input (opening one to read would wait for a writer for ever).
func TestFIFO(t *testing.T) {
	p := filepath.Join(t.TempDir(), "pipe.npy")
	if err := syscall.Mkfifo(p, 0o600); err != nil {
		t.Skip("no FIFOs here:", err)
	}
	tests := map[string]func() error{
		"Create": func() error {
			f, err := Create(p, Options{})
			if err == nil {
				f.Abort()
			}
			return err
		},
		"Open read-only":  func() error { f, err := Open(p, os.O_RDONLY); closeIf(f); return err },
		"Open read-write": func() error { f, err := Open(p, os.O_RDWR); closeIf(f); return err },
		"ReadBounded":     func() error { _, err := ReadBounded(p, 100); return err },
	}
	for name, call := range tests {
		t.Run(name, func(t *testing.T) {
			done := make(chan error, 1)
			go func() { done <- call() }()
			select {
			case err := <-done:
				if !errors.Is(err, ErrNotRegular) {
					t.Errorf("%v, want ErrNotRegular", err)
				}
			case <-time.After(10 * time.Second):
				// Unblock it: a writer lets the open return.
				if w, err := os.OpenFile(p, os.O_WRONLY|syscall.O_NONBLOCK, 0); err == nil {
					w.Close()
				}
				<-done
				t.Fatal("blocked on the FIFO")
			}
		})
	}
}

func closeIf(f *os.File) {
	if f != nil {
		f.Close()
	}
}
