package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vramkit/vram/broker"
)

// TestBrokerSocketDirs: a broker whose --socket is in directories that do
// not exist makes them, and when it stops removes those it left empty;
// one that keeps its key there stays, and the broker says so and how to
// remove it.
func TestBrokerSocketDirs(t *testing.T) {
	for name, tc := range map[string]struct {
		keyElsewhere bool
		stays        bool
	}{
		"the key beside the socket": {stays: true},
		"the key elsewhere":         {keyElsewhere: true},
	} {
		t.Run(name, func(t *testing.T) {
			root, err := os.MkdirTemp("", "vbd")
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = os.RemoveAll(root) })
			socket := filepath.Join(root, "made", "here", "b.sock")
			args := []string{"broker", "--devices", "sim:vram=1GiB", "--socket", socket, "--lock-dir", filepath.Join(root, "locks")}
			if tc.keyElsewhere {
				args = append(args, "--key-file", filepath.Join(root, "b.key"))
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			var stderr bytes.Buffer
			done := make(chan int, 1)
			go func() { done <- runContext(ctx, args, strings.NewReader(""), &bytes.Buffer{}, &stderr) }()
			for deadline := time.Now().Add(patience(t)); ; time.Sleep(10 * time.Millisecond) {
				c, err := broker.Dial(ctx, socket)
				if err == nil {
					_ = c.Close()
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("vram broker does not answer: %v", err)
				}
			}
			cancel()
			if code := <-done; code != exitOK {
				t.Fatalf("vram broker exited %d:\n%s", code, stderr.String())
			}
			made := filepath.Join(root, "made")
			_, err = os.Stat(made)
			said := strings.Contains(stderr.String(), "vram broker: "+made+" stays, made for the socket: it holds the broker's key, kept for a restart (rm -r "+made+" when done)")
			if tc.stays != (err == nil) || tc.stays != said {
				t.Errorf("%s there: %v, said so: %v; want both %v:\n%s", made, err == nil, said, tc.stays, stderr.String())
			}
		})
	}
}
