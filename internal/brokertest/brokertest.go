// Package brokertest serves a node broker for the tests of packages that
// lease from one (libvram, its capi): one device, the one a device spec
// opens (a sim:shared device, whose ID every process knows), on a socket
// in a directory of the test's own, until the test ends.
package brokertest

import (
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/vramkit/vram/broker"
	"github.com/vramkit/vram/device"
)

// Serve serves a broker of the device spec opens, of total bytes, with
// the reclaim deadline reclaim, and returns its socket.
func Serve(t testing.TB, spec string, total uint64, reclaim time.Duration) (socket string) {
	t.Helper()
	probe, err := device.Open(spec)
	if err != nil {
		t.Fatal(err)
	}
	id := probe.Info().ID
	if err := probe.Close(); err != nil {
		t.Fatal(err)
	}
	srv, err := broker.NewServer(broker.Config{Devices: []broker.Device{{Name: "shared", ID: id, Total: total}},
		ReclaimTimeout: reclaim, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	socket = filepath.Join(t.TempDir(), "b.sock")
	ln, err := broker.Listen(socket, 0o600, -1)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	t.Cleanup(func() {
		srv.Stop()
		if err := <-done; err != nil {
			t.Errorf("the broker's Serve: %v", err)
		}
	})
	return socket
}
