package main

import (
	"path/filepath"
	"strings"
	"testing"
)

// TestRunWithNoBroker: a job told to lease from a socket nothing serves
// fails in one short line, the broker's own: the fix first, the socket,
// "broker:" once, nothing of the device or the manager around it.
func TestRunWithNoBroker(t *testing.T) {
	socket := filepath.Join(t.TempDir(), "none.sock")
	_, stderr, code := cli(t, "", "run", "--runs", "100", "--steps", "2", "--samples", "3", "--socket", socket)
	msg := errorText(stderr)
	want := "vram: broker: start vram broker, or point $VRAM_BROKER (--socket) at a broker's socket: there is no socket " + socket
	if code != exitFailure || msg != want || strings.Count(msg, "broker:") != 1 {
		t.Fatalf("exit %d, error %q; want exit 1 and the one line %q", code, msg, want)
	}
	for _, never := range []string{"memory manager on", "lease from the broker on"} {
		if strings.Contains(msg, never) {
			t.Errorf("the error %q says %q", msg, never)
		}
	}
}
