//go:build unix

package vram

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestHostOpenFIFO opens a FIFO as a host array: refused at once, as not
// a regular file, instead of waiting for a writer for ever.
func TestHostOpenFIFO(t *testing.T) {
	m, _, _ := newManager(t, 64*MiB)
	p := filepath.Join(t.TempDir(), "pipe.npy")
	if err := syscall.Mkfifo(p, 0o600); err != nil {
		t.Skip("no FIFOs here:", err)
	}
	for _, writable := range []bool{false, true} {
		done := make(chan error, 1)
		go func() {
			h, err := m.Host().Open(p, writable)
			if err == nil {
				h.Free()
			}
			done <- err
		}()
		select {
		case err := <-done:
			if err == nil || !strings.Contains(err.Error(), "not a regular file") {
				t.Errorf("Open(FIFO, writable %v): %v; want it refused as not a regular file", writable, err)
			}
		case <-time.After(10 * time.Second):
			if w, err := os.OpenFile(p, os.O_WRONLY|syscall.O_NONBLOCK, 0); err == nil {
				w.Close() // let the blocked open return
			}
			<-done
			t.Fatalf("Open(FIFO, writable %v) blocked", writable)
		}
	}
}
