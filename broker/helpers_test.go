package broker

import (
	"context"
	"errors"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"
)

const (
	GiB = 1 << 30
	MiB = 1 << 20
)

// quiet is a logger for tests that expect warnings.
var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// socketPath is a short socket path (a Unix socket's path has at most 107
// bytes, which t.TempDir's may pass), removed after the test.
func socketPath(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "vb")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	return filepath.Join(dir, "b.sock")
}

// startServer serves cfg on a new socket until the test ends, checking
// the table's invariants after every change.
func startServer(t testing.TB, cfg Config) (*Server, string) {
	t.Helper()
	path := socketPath(t)
	return startServerAt(t, cfg, path), path
}

func startServerAt(t testing.TB, cfg Config, path string) *Server {
	t.Helper()
	return startServerWith(t, cfg, path, 0o600, -1)
}

// startServerWith is startServerAt with the socket's mode and group.
func startServerWith(t testing.TB, cfg Config, path string, mode fs.FileMode, gid int) *Server {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = quiet
	}
	s, err := NewServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, bench := t.(*testing.B); !bench { // a benchmark measures the broker alone
		s.CheckInvariants()
	}
	ln, err := Listen(path, mode, gid)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Serve(ln) }()
	t.Cleanup(func() {
		s.Stop()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
		if b := s.Broken(); len(b) > 0 {
			t.Errorf("invariants broken: %q", b)
		}
	})
	return s
}

// oneDevice is a broker of one device of total bytes and no context.
func oneDevice(total uint64) Config {
	return Config{Devices: []Device{{Name: "sim", Total: total}}}
}

func dial(t testing.TB, path string) *Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := Dial(ctx, path, WithLogger(quiet), WithBackoff(10*time.Millisecond, 200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func acquire(t testing.TB, c *Client, o LeaseOptions) *Lease {
	t.Helper()
	l, err := c.Acquire(ctxT(t), o)
	if err != nil {
		t.Fatalf("acquire %+v: %v", o, err)
	}
	return l
}

// ctxT is a context that ends with the test (or after a minute).
func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// waitFor polls cond every few milliseconds until it holds or d passes.
func waitFor(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if cond() {
			return true
		}
		time.Sleep(2 * time.Millisecond)
	}
	return cond()
}

// leaseOf finds a lease in a status by id.
func leaseOf(st Status, id string) (LeaseStatus, bool) {
	for _, d := range st.Devices {
		for _, l := range d.Leases {
			if l.ID == id {
				return l, true
			}
		}
	}
	return LeaseStatus{}, false
}

func is(err, target error) bool { return errors.Is(err, target) }
