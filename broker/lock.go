package broker

// One device, one broker: a broker locks each device it serves by the
// device's identity (Device.ID, the same in every process of the node),
// so that a second broker of the same user on the same device is refused
// rather than promise its memory twice. A lock is a file in
// Config.LockDir (DefaultLockDir for `vram broker`), named for the
// identity, held with flock(2): the kernel lets it go when the broker
// exits, kill -9 included, and a stale file locks nothing. The file says
// which process holds it, for the error of the broker refused.
//
// The directory must be the broker's user's and closed to others, as the
// socket's: root's brokers lock in /run/vram/devices, another user's in
// $XDG_RUNTIME_DIR/vram/devices (or a directory of theirs under the
// system's temporary directory). A user may still run a broker of their
// own beside root's on a device (as they may use the device without a
// broker); each user's brokers keep to one a device.

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// DefaultLockDir is where `vram broker` locks its devices: /run/vram/devices
// for root, $XDG_RUNTIME_DIR/vram/devices for another user when that is
// set, else vram-UID/devices in the system's temporary directory.
func DefaultLockDir() string {
	uid := os.Geteuid()
	switch dir := os.Getenv("XDG_RUNTIME_DIR"); {
	case uid == 0:
		return "/run/vram/devices"
	case dir != "":
		return filepath.Join(dir, "vram", "devices")
	}
	return filepath.Join(os.TempDir(), "vram-"+strconv.Itoa(uid), "devices")
}

// deviceLocks are the locks a server holds.
type deviceLocks []*os.File

// unlock lets every lock go.
func (ls deviceLocks) unlock() {
	for _, f := range ls {
		_ = f.Close()
	}
}

// lockDevices locks each device of devs that has an ID in dir, made
// 0700 if missing; on failure it holds none.
func lockDevices(dir string, devs []Device) (deviceLocks, error) {
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return nil, fmt.Errorf("broker: make the device locks' directory: %w", err)
	}
	if err := os.Mkdir(dir, 0o700); err != nil && !os.IsExist(err) {
		return nil, fmt.Errorf("broker: make the device locks' directory: %w", err)
	}
	if err := checkDir(dir, "the device locks' directory"); err != nil {
		return nil, err
	}
	var held deviceLocks
	for i, d := range devs {
		if d.ID == "" {
			continue // a private device: no other process can reach it
		}
		f, err := lockDevice(filepath.Join(dir, lockName(d.ID)), i, d)
		if err != nil {
			held.unlock()
			return nil, err
		}
		held = append(held, f)
	}
	return held, nil
}

// lockName is the lock file of a device identity: a hash, as an ID may
// hold any character.
func lockName(id string) string {
	sum := sha256.Sum256([]byte(id))
	return hex.EncodeToString(sum[:12]) + ".lock"
}

// lockDevice takes the lock at path for device i, d, and writes who holds
// it; a lock another process holds is ErrInUse, naming it.
func lockDevice(path string, i int, d Device) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|oNoFollow, 0o600)
	if err != nil {
		return nil, fmt.Errorf("broker: lock device %d (%s): %w", i, d.Name, err)
	}
	fi, err := f.Stat()
	if err == nil {
		err = checkOwn(fi, path, "device lock")
	}
	if err == nil {
		err = tryLock(f)
	}
	if err == errLocked {
		holder, _ := os.ReadFile(path)
		err = errorf(ErrInUse, "broker: device %d (%s, id %s) is served by another broker already (%s): stop it, or leave the device out of --devices",
			i, d.Name, clip(d.ID), describeHolder(string(holder)))
	}
	if err != nil {
		_ = f.Close()
		return nil, err
	}
	note := fmt.Sprintf("pid %d\nid %s\n", os.Getpid(), d.ID)
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt([]byte(note), 0)
	}
	return f, nil
}

// describeHolder reads a lock file's note: "pid 4242", or what is known.
func describeHolder(note string) string {
	line, _, _ := strings.Cut(note, "\n")
	if pid, ok := strings.CutPrefix(line, "pid "); ok {
		if _, err := strconv.Atoi(pid); err == nil {
			return "pid " + pid
		}
	}
	return "its lock file names no pid"
}
