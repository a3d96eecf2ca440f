package broker

// Dialling the broker: the connection the client makes (and makes again
// after the broker restarts), checked before a byte is sent, and the
// errors a user reads when there is no broker to talk to.
//
// Who serves. The broker's uid, from SO_PEERCRED on the connection, must
// be root's or the client's own: a socket another user put where the
// client looks (a directory they may write, a stale $VRAM_BROKER) is
// refused with ErrNotTrusted, so no one else's process hands this one a
// lease of its choosing.
//
// Busy is not gone. Dial waits, under its context, for the broker's
// greeting, trying the connection again with backoff: a broker that
// accepts late (its backlog full: EAGAIN), or is slow to greet, or closed
// the connection at its limit, is tried again until Dial's context ends
// (defaultDialTimeout when it has no deadline). What no retry mends ends
// the wait at once: no socket, a refused connection (a broker that died
// left its socket), a socket the user may not open, an untrusted server.
// Each says what to do first, in one line.

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"sync"
	"syscall"
	"time"
)

// defaultDialTimeout bounds Dial's wait for a greeting when its context
// has no deadline.
const defaultDialTimeout = 30 * time.Second

// dialer makes the client's connections to the broker's socket.
type dialer struct {
	path string

	mu   sync.Mutex // protects last
	last error      // the last attempt's error; nil after one succeeded
}

// dial makes a Unix connection to the socket, of a trusted broker.
func (d *dialer) dial(ctx context.Context) (net.Conn, error) {
	var nd net.Dialer
	c, err := nd.DialContext(ctx, "unix", d.path)
	if err == nil {
		if err = checkServer(c, d.path); err != nil {
			_ = c.Close()
			c = nil
		}
	} else {
		err = d.explain(err)
	}
	d.mu.Lock()
	d.last = err
	d.mu.Unlock()
	return c, err
}

// lastErr is the last attempt's error, or nil.
func (d *dialer) lastErr() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.last
}

// explain turns a failed connect into what the user should do: a
// *plainError for what no retry mends, else err itself (tried again).
func (d *dialer) explain(err error) error {
	p := d.path
	switch {
	case errors.Is(err, syscall.ENOENT), errors.Is(err, syscall.ENOTDIR):
		return &plainError{fmt.Sprintf("broker: start vram broker, or point $%s (--socket) at a broker's socket: there is no socket %s", EnvSocket, p),
			[]error{ErrUnavailable, err}}
	case errors.Is(err, syscall.ECONNREFUSED):
		return &plainError{fmt.Sprintf("broker: start vram broker, or point $%s (--socket) at a broker's socket: nothing serves %s (a broker that stopped left it)", EnvSocket, p),
			[]error{ErrUnavailable, err}}
	case errors.Is(err, syscall.EACCES), errors.Is(err, syscall.EPERM):
		return &plainError{fmt.Sprintf("broker: ask the broker's administrator for access (the socket's group), or run a broker of your own: %s (%s) is closed to uid %d",
			p, describeFile(p), os.Geteuid()), []error{ErrPermission, err}}
	}
	return err
}

// describeFile is a file's mode and owners, for errors: "mode 0660, uid
// 0, gid 2000".
func describeFile(path string) string {
	fi, err := os.Stat(path)
	if err != nil {
		return "not readable"
	}
	s := fmt.Sprintf("mode %#o", fi.Mode().Perm())
	if uid, ok := fileUID(fi); ok {
		s += fmt.Sprintf(", uid %d", uid)
	}
	if gid, ok := fileGID(fi); ok {
		s += fmt.Sprintf(", gid %d", gid)
	}
	return s
}

// checkServer refuses a connection whose server runs as neither root nor
// the client's user.
func checkServer(c net.Conn, path string) error {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return fmt.Errorf("broker: connection of %T: want a Unix socket", c)
	}
	cred, err := readPeerCred(sc)
	if err != nil {
		return &plainError{fmt.Sprintf("broker: cannot tell who serves %s: %v", path, err), []error{ErrNotTrusted, err}}
	}
	if me := uint32(os.Geteuid()); cred.uid != 0 && cred.uid != me {
		return &plainError{fmt.Sprintf("broker: check $%s (--socket): %s is served by uid %d (pid %d), neither root nor this process's uid %d, so it is not trusted",
			EnvSocket, path, cred.uid, cred.pid, me), []error{ErrNotTrusted}}
	}
	return nil
}

// checkDialPath refuses a socket path no connection can reach.
func checkDialPath(path string) error {
	if err := checkSocketPath(path); err != nil {
		return err
	}
	if fi, err := os.Stat(path); err == nil && fi.Mode()&fs.ModeSocket == 0 {
		return &plainError{fmt.Sprintf("broker: point $%s (--socket) at the broker's socket: %s is a %v, not a socket", EnvSocket, path, modeType(fi)),
			[]error{ErrInvalid}}
	}
	return nil
}

func modeType(fi fs.FileInfo) string {
	if fi.Mode().IsRegular() {
		return "regular file"
	}
	return fi.Mode().Type().String()
}
