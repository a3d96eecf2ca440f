package broker

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// A uid at its limit of connections is refused with an error that names
// the limit (not "is vram broker running?"); another uid is served. (One
// client's connections once locked every other out.)
func TestConnLimitPerUID(t *testing.T) {
	cfg := oneDevice(GiB)
	cfg.MaxConnsPerUID = 2
	s, path := startServer(t, cfg)
	dial(t, path)
	dial(t, path)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := Dial(ctx, path, WithLogger(quiet))
	if err == nil {
		_ = c.Close()
		t.Fatal("a third connection of the uid was served past its limit of 2")
	}
	me := strconv.Itoa(os.Geteuid())
	if !is(err, ErrLimit) || !strings.Contains(err.Error(), "uid "+me+" has 2 connections to the broker, its limit per uid") || strings.Contains(err.Error(), "running") {
		t.Errorf("the refusal: %v; want ErrLimit naming uid %s and its limit", err, me)
	}
	if n := s.admit.served(uint32(os.Geteuid())); n != 2 {
		t.Errorf("%d connections of the uid served, want 2", n)
	}
	t.Run("another uid", func(t *testing.T) {
		uid, gid := otherUser(t)
		_, path := startSharedServer(t, cfg, gid)
		dial(t, path)
		dial(t, path)
		_, out := asUser(t, publicExe(t), uid, gid, "dial", []string{"VRAM_BROKER_TEST_SOCKET=" + path}, true)
		if !strings.Contains(out, "dialed") {
			t.Errorf("uid %d beside uid %s at its limit: %s", uid, me, out)
		}
	})
}

// A connection that never speaks, or sends its preface and never calls,
// is closed (after the handshake and the idle timeouts), and one that
// speaks another protocol at once; none holds a slot of its uid
// meanwhile that a real client needs: the broker serves others beside
// them.
func TestSilentConnectionsAreClosed(t *testing.T) {
	cfg := oneDevice(GiB)
	cfg.HandshakeTimeout = 200 * time.Millisecond
	cfg.IdleTimeout = 300 * time.Millisecond
	_, path := startServer(t, cfg)
	for name, speak := range map[string]func(c net.Conn) error{
		"silent": func(net.Conn) error { return nil },
		"preface only": func(c net.Conn) error {
			_, err := io.WriteString(c, preface)
			return err
		},
		"an older client's gRPC": func(c net.Conn) error {
			// HTTP/2's client preface and an empty SETTINGS frame (RFC
			// 9113 3.4, 6.5): length 0, type 4, no flags, stream 0.
			_, err := io.WriteString(c, "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00")
			return err
		},
	} {
		t.Run(name, func(t *testing.T) {
			c, err := net.Dial("unix", path)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if err := speak(c); err != nil {
				t.Fatal(err)
			}
			served := dial(t, path) // beside it
			if _, err := served.Status(ctxT(t)); err != nil {
				t.Fatal(err)
			}
			// The read ends when the broker closes the connection; the
			// deadline only bounds a broker that never does.
			_ = c.SetReadDeadline(time.Now().Add(time.Minute))
			_, err = io.Copy(io.Discard, c)
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				t.Fatalf("the broker kept a %s connection open for a minute", name)
			}
		})
	}
}

// The limit in all closes connections at once; a client says the broker
// is full, not that it may not be running.
func TestConnLimitInAll(t *testing.T) {
	cfg := oneDevice(GiB)
	cfg.MaxConns = 2
	_, path := startServer(t, cfg)
	dial(t, path)
	dial(t, path)
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	c, err := Dial(ctx, path, WithLogger(quiet))
	if err == nil {
		_ = c.Close()
		t.Fatal("a third connection was served past MaxConns of 2")
	}
	if !is(err, ErrUnavailable) || !strings.Contains(err.Error(), "at its limit of connections") || strings.Contains(err.Error(), "running") {
		t.Errorf("the refusal: %v", err)
	}
}

// listenBacklog listens on path with a backlog of n, so that connections
// past it are refused at connect (EAGAIN) while the broker is busy.
func listenBacklog(t *testing.T, path string, n int) net.Listener {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Bind(fd, &syscall.SockaddrUnix{Name: path}); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Listen(fd, n); err != nil {
		t.Fatal(err)
	}
	f := os.NewFile(uintptr(fd), path)
	defer f.Close()
	ln, err := net.FileListener(f)
	if err != nil {
		t.Fatal(err)
	}
	return ln
}

// slowListener accepts one connection each delay: a broker busy with
// other work.
type slowListener struct {
	net.Listener
	delay time.Duration
}

func (l slowListener) Accept() (net.Conn, error) {
	time.Sleep(l.delay)
	return l.Listener.Accept()
}

// Many clients dialling a busy broker at once are all served: those its
// backlog refuses (EAGAIN) and those it greets late (after seconds in its
// queue) try again, within their Dial's context. (64 processes dialling
// at once once got "broker: unavailable".)
func TestBusyBrokerServesEveryone(t *testing.T) {
	for name, tc := range map[string]struct {
		clients, backlog int
		delay            time.Duration // between accepts
	}{
		"a full backlog":  {48, 1, 10 * time.Millisecond},
		"a late greeting": {24, 64, 100 * time.Millisecond}, // the last waits 2.4 s
	} {
		t.Run(name, func(t *testing.T) {
			s, err := NewServer(Config{Devices: []Device{{Name: "a", Total: 8 * GiB}}, Logger: quiet})
			if err != nil {
				t.Fatal(err)
			}
			path := socketPath(t)
			ln := listenBacklog(t, path, tc.backlog)
			done := make(chan error, 1)
			go func() { done <- s.Serve(slowListener{ln, tc.delay}) }()
			defer func() {
				s.Stop()
				if err := <-done; err != nil {
					t.Errorf("Serve: %v", err)
				}
			}()
			errs := make(chan error, tc.clients)
			for range tc.clients {
				go func() { errs <- busyClient(path) }()
			}
			for range tc.clients {
				if err := <-errs; err != nil {
					t.Error(err)
				}
			}
		})
	}
}

// busyClient dials path, acquires a lease and hangs up.
func busyClient(path string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := Dial(ctx, path, WithLogger(quiet), WithBackoff(10*time.Millisecond, 100*time.Millisecond))
	if err != nil {
		return err
	}
	_, err = c.Acquire(ctx, LeaseOptions{Name: "x", Proportion: 0.01})
	return errors.Join(err, c.Close())
}
