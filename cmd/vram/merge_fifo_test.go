//go:build unix

package main

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestMergeFIFO gives vram merge a part, a manifest or an OUT that is a
// FIFO: each is refused at once, instead of merge waiting for a writer
// for ever.
func TestMergeFIFO(t *testing.T) {
	tests := map[string]string{
		"a part":     "r.shard-1-of-2.npy",
		"a manifest": "r.shard-1-of-2.json",
		"OUT":        "r.npy",
	}
	for name, file := range tests {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			out := writeParts(t, dir, 200, 2)
			p := filepath.Join(dir, file)
			os.Remove(p)
			if err := syscall.Mkfifo(p, 0o600); err != nil {
				t.Skip("no FIFOs here:", err)
			}
			done := make(chan string, 1)
			go func() {
				_, stderr, code := cli(t, "", "merge", out)
				if code == exitOK {
					stderr = "exit 0"
				}
				done <- stderr
			}()
			select {
			case stderr := <-done:
				if !strings.Contains(stderr, "not a regular file") {
					t.Errorf("merge with %s a FIFO: %s; want it refused as not a regular file", name, stderr)
				}
			case <-time.After(20 * time.Second):
				if w, err := os.OpenFile(p, os.O_WRONLY|syscall.O_NONBLOCK, 0); err == nil {
					w.Close()
				}
				<-done
				t.Fatalf("merge with %s a FIFO blocked", name)
			}
		})
	}
}
