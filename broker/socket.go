package broker

// The broker's Unix socket: where it lives by default, who may connect.
//
// Who may connect is the socket's file mode: 0600 (the default) lets only
// the broker's user in (root, for a node daemon; every leaseholder then
// runs as root, as in most containers); 0660 with a group (Listen's gid,
// `vram broker --socket-group`) lets that group's members in. A mode
// with bits for others is refused: every user of the node could then
// lease memory. Connecting needs write permission on the socket and
// search permission on its directory, which Listen makes 0755 if it has
// to make it.

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
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

// Listen makes the broker's socket at path with mode (0600 or 0660; no
// bits for others), owned by group gid when gid ≥ 0. A socket left at
// path by a broker that died is removed; one a live broker serves, or a
// file that is not a socket, is refused. The socket is removed when the
// listener closes.
func Listen(path string, mode fs.FileMode, gid int) (net.Listener, error) {
	if mode&^fs.ModePerm != 0 || mode&0o007 != 0 || mode&0o600 != 0o600 {
		return nil, fmt.Errorf("broker: socket mode %#o: want 0600 (the broker's user) or 0660 (and its group); bits for others would let every user of the node lease memory: %w", mode, ErrInvalid)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("broker: make the socket's directory: %w", err)
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
	ln.SetUnlinkOnClose(true)
	if gid >= 0 {
		if err := os.Chown(path, -1, gid); err != nil {
			_ = ln.Close()
			return nil, fmt.Errorf("broker: give the socket %s to group %d: %w", path, gid, err)
		}
	}
	if err := os.Chmod(path, mode); err != nil {
		_ = ln.Close()
		return nil, fmt.Errorf("broker: socket mode %#o on %s: %w", mode, path, err)
	}
	return ln, nil
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
		return fmt.Errorf("broker: %s is a %v, not a socket; give --socket another path: %w", path, fi.Mode().Type(), ErrInvalid)
	}
	c, err := net.DialTimeout("unix", path, time.Second)
	if err == nil {
		_ = c.Close()
		return fmt.Errorf("broker: a broker already serves %s; stop it first, or give --socket another path: %w", path, ErrExists)
	}
	if !errors.Is(err, syscall.ECONNREFUSED) && !errors.Is(err, syscall.ENOENT) {
		return fmt.Errorf("broker: socket %s: %w", path, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("broker: remove the stale socket %s: %w", path, err)
	}
	return nil
}
