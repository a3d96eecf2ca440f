package main

import (
	"path/filepath"
	"strings"
	"testing"
)

// TestRunWithNoBroker: a job told to lease from a socket nothing serves
// fails in one line that is the broker's own, naming the socket, with
// nothing of the device or the manager wrapped around it.
func TestRunWithNoBroker(t *testing.T) {
	socket := filepath.Join(t.TempDir(), "none.sock")
	_, stderr, code := cli(t, "", "run", "--runs", "100", "--steps", "2", "--samples", "3", "--socket", socket)
	msg := errorText(stderr)
	if code != exitFailure || strings.Count(msg, "\n") != 0 || !strings.HasPrefix(msg, "vram: broker: ") || !strings.Contains(msg, socket) {
		t.Fatalf("exit %d, error %q; want exit 1 and one line, the broker's, naming %s", code, msg, socket)
	}
	for _, never := range []string{"memory manager on", "lease from the broker on"} {
		if strings.Contains(msg, never) {
			t.Errorf("the error %q says %q", msg, never)
		}
	}
}
