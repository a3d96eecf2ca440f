package broker

// The broker's Unix socket: where it lives by default, who may connect,
// and the directory it lives in.
//
// Who may connect is the socket's file mode: 0600 (the default) lets only
// the broker's user in; 0660 with a group (Listen's gid, `vram broker
// --socket-group`) lets that group's members in. A mode with bits for
// others is refused: every user of the node could then lease memory.
// Connecting needs write permission on the socket and search permission
// on its directory.
//
// The directory must be the broker's user's and writable by no one else
// (checkDir): whoever may write there may swap the socket for one of
// their own, or plant a file where the broker's key goes. Listen makes it
// 0755 when there is none. A client checks the other way: the broker it
// reaches must run as root or as the client's own user (dial.go).
//
// Closing the listener removes the socket only while the path is still
// the socket it made.

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"
)

// EnvSocket names the environment variable that gives the socket's path
// to the broker and its clients alike.
const EnvSocket = "VRAM_BROKER"

// DefaultSocket is where the broker listens and clients dial: $VRAM_BROKER
// if set, else $XDG_RUNTIME_DIR/vram/broker.sock when XDG_RUNTIME_DIR is
// set (a user's own broker), else /run/vram/broker.sock (the node's).
func DefaultSocket() string {
	if p := os.Getenv(EnvSocket); p != "" {
		return p
	}
	if dir := os.Getenv("XDG_RUNTIME_DIR"); dir != "" {
		return filepath.Join(dir, "vram", "broker.sock")
	}
	return "/run/vram/broker.sock"
}

// DefaultSocketMode lets only the broker's user connect.
const DefaultSocketMode fs.FileMode = 0o600

// checkSocketPath refuses a path longer than a Unix socket's address
// holds.
func checkSocketPath(path string) error {
	if len(path) > maxSocketPath {
		return errorf(ErrInvalid, "broker: socket path of %d bytes: a Unix socket's path has at most %d; give a shorter one (--socket, $%s): %s",
			len(path), maxSocketPath, EnvSocket, clip(path))
	}
	return nil
}

// Listen makes the broker's socket at path with mode (0600 or 0660; no
// bits for others), owned by group gid when gid ≥ 0, in a directory of
// the broker's user that no one else may write (made 0755 if missing). A
// socket left at path by a broker that died is removed; one a live broker
// serves, or a file that is not a socket, is refused. The socket is
// removed when the listener closes, if it is still there.
func Listen(path string, mode fs.FileMode, gid int) (net.Listener, error) {
	if mode&^fs.ModePerm != 0 || mode&0o007 != 0 || mode&0o600 != 0o600 {
		return nil, errorf(ErrInvalid, "broker: socket mode %#o: want 0600 (the broker's user) or 0660 (and its group); bits for others would let every user of the node lease memory", mode)
	}
	if err := checkSocketPath(path); err != nil {
		return nil, err
	}
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("broker: make the socket's directory: %w", err)
	}
	if err := checkDir(dir, "the socket's directory"); err != nil {
		return nil, err
	}
	if err := removeStale(path); err != nil {
		return nil, err
	}
	old := umask(0o177) // the socket is born 0600, never briefly open to others
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	umask(old)
	if err != nil {
		return nil, fmt.Errorf("broker: listen on %s: %w", path, err)
	}
	ln.SetUnlinkOnClose(false) // Close removes it, if it is still ours
	sl := &socketListener{UnixListener: ln, path: path}
	if sl.made, err = os.Lstat(path); err != nil {
		_ = ln.Close()
		return nil, fmt.Errorf("broker: the new socket %s: %w", path, err)
	}
	if gid >= 0 {
		if err := os.Chown(path, -1, gid); err != nil {
			_ = sl.Close()
			return nil, fmt.Errorf("broker: give the socket %s to group %d: %w", path, gid, err)
		}
	}
	if err := os.Chmod(path, mode); err != nil {
		_ = sl.Close()
		return nil, fmt.Errorf("broker: socket mode %#o on %s: %w", mode, path, err)
	}
	return sl, nil
}

// socketListener removes its socket when closed, if the path is still
// the socket it made (not one put there since).
type socketListener struct {
	*net.UnixListener
	path string
	made fs.FileInfo
	once sync.Once
}

func (l *socketListener) Close() error {
	err := l.UnixListener.Close()
	l.once.Do(func() {
		if fi, lerr := os.Lstat(l.path); lerr == nil && os.SameFile(fi, l.made) {
			_ = os.Remove(l.path)
		}
	})
	return err
}

// removeStale removes a socket at path that no one listens on.
func removeStale(path string) error {
	fi, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("broker: socket path %s: %w", path, err)
	}
	if fi.Mode()&fs.ModeSocket == 0 {
		return errorf(ErrInvalid, "broker: %s is a %v, not a socket; give --socket another path", path, fi.Mode().Type())
	}
	c, err := net.DialTimeout("unix", path, time.Second)
	if err == nil {
		_ = c.Close()
		return errorf(ErrInUse, "broker: a broker already serves %s: stop it first, or give --socket another path", path)
	}
	if !errors.Is(err, syscall.ECONNREFUSED) && !errors.Is(err, syscall.ENOENT) {
		return fmt.Errorf("broker: socket %s: %w", path, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("broker: remove the stale socket %s: %w", path, err)
	}
	return nil
}

// checkDir refuses a directory (what names it in the error) that is not
// the broker's user's, or that others may write: they could swap what
// the broker puts there.
func checkDir(dir, what string) error {
	fi, err := os.Stat(dir)
	if err != nil {
		return fmt.Errorf("broker: %s %s: %w", what, dir, err)
	}
	if !fi.IsDir() {
		return errorf(ErrInvalid, "broker: %s %s is a %v, not a directory", what, dir, fi.Mode().Type())
	}
	if err := checkOwn(fi, dir, what); err != nil {
		return err
	}
	if fi.Mode().Perm()&0o022 != 0 {
		return errorf(ErrPermission, "broker: %s %s has mode %#o: others may write it, and so swap the socket; use a directory writable by the broker's user alone (chmod go-w, or another --socket)",
			what, dir, fi.Mode().Perm())
	}
	return nil
}

// checkOwn refuses a file (what, at path) that is not the process's
// user's.
func checkOwn(fi fs.FileInfo, path, what string) error {
	uid, ok := fileUID(fi)
	if !ok {
		return nil // no owners here
	}
	if me := os.Geteuid(); uid != uint32(me) {
		return errorf(ErrPermission, "broker: %s %s is uid %d's, not the broker's user's (uid %d): use one of your own (another --socket)",
			what, path, uid, me)
	}
	return nil
}
