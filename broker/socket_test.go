package broker

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Listen refuses a directory others may write or another user owns:
// they could swap the socket. (A broker once listened in another user's
// directory, who swapped the socket under it.)
func TestListenRefusesAnOpenDirectory(t *testing.T) {
	for name, tc := range map[string]struct {
		setup func(t *testing.T, dir string)
		want  string
	}{
		"writable by all":       {func(t *testing.T, dir string) { chmod(t, dir, 0o777) }, "others may write it"},
		"writable by its group": {func(t *testing.T, dir string) { chmod(t, dir, 0o770) }, "others may write it"},
		"another user's": {func(t *testing.T, dir string) {
			uid, gid := otherUser(t)
			if err := os.Chown(dir, int(uid), int(gid)); err != nil {
				t.Fatal(err)
			}
		}, "is uid"},
	} {
		t.Run(name, func(t *testing.T) {
			path := socketPath(t)
			tc.setup(t, filepath.Dir(path))
			ln, err := Listen(path, 0o600, -1)
			if err == nil {
				_ = ln.Close()
				t.Fatal("Listen took the directory")
			}
			if !is(err, ErrPermission) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("got %v, want ErrPermission saying %q", err, tc.want)
			}
		})
	}
	t.Run("its own, 0755", func(t *testing.T) {
		path := socketPath(t)
		chmod(t, filepath.Dir(path), 0o755)
		ln, err := Listen(path, 0o600, -1)
		if err != nil {
			t.Fatal(err)
		}
		_ = ln.Close()
	})
}

func chmod(t *testing.T, path string, mode os.FileMode) {
	t.Helper()
	if err := os.Chmod(path, mode); err != nil {
		t.Fatal(err)
	}
}

// Closing the listener removes its own socket, never one put at the path
// since. (Stopping a broker once unlinked another's socket by its path.)
func TestCloseLeavesAnotherSocket(t *testing.T) {
	path := socketPath(t)
	ln, err := Listen(path, 0o600, -1)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(path, path+".old"); err != nil {
		t.Fatal(err)
	}
	other, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	other.(*net.UnixListener).SetUnlinkOnClose(false)
	defer other.Close()
	if err := ln.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(path); err != nil {
		t.Errorf("closing the listener removed the socket put at its path since: %v", err)
	}
	ln2, err := Listen(path+".2", 0o600, -1)
	if err != nil {
		t.Fatal(err)
	}
	_ = ln2.Close()
	if _, err := os.Lstat(path + ".2"); !os.IsNotExist(err) {
		t.Errorf("closing a listener left its own socket: %v", err)
	}
}

// A client talks only to a broker of root or of its own user: another
// user's socket where it looks is refused, naming its uid. (Another user
// once swapped the socket and handed root's vram lease a 512 GiB lease.)
func TestClientRefusesAnUntrustedBroker(t *testing.T) {
	uid, gid := otherUser(t)
	dir := publicDir(t)
	sockDir := filepath.Join(dir, "theirs")
	if err := os.Mkdir(sockDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(sockDir, int(uid), int(gid)); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(sockDir, "b.sock")
	_, line := asUser(t, publicExe(t), uid, gid, "broker", []string{"VRAM_BROKER_TEST_SOCKET=" + path}, false)
	if line != "serving" {
		t.Fatalf("the other user's broker said %q", line)
	}
	chmod(t, path, 0o666) // its user opens it to all, as a trap would
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := Dial(ctx, path, WithLogger(quiet))
	if err == nil {
		_ = c.Close()
		t.Fatal("a client talked to another user's broker")
	}
	if want := "served by uid " + strconv.Itoa(int(uid)); !is(err, ErrNotTrusted) || !strings.Contains(err.Error(), want) {
		t.Errorf("got %v, want ErrNotTrusted saying %q", err, want)
	}
}

// The errors a user meets dialling a socket with no broker to talk to:
// one line each, the fix first, "broker:" once, never "is vram broker
// running?" for a broker that runs.
func TestDialMessages(t *testing.T) {
	dir := t.TempDir()
	stale := filepath.Join(dir, "stale.sock")
	ln, err := net.Listen("unix", stale)
	if err != nil {
		t.Fatal(err)
	}
	ln.(*net.UnixListener).SetUnlinkOnClose(false)
	_ = ln.Close()
	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	long := "/tmp/" + strings.Repeat("d", 120) + "/b.sock"
	for name, tc := range map[string]struct {
		path string
		want string
		is   error
	}{
		"no socket":   {filepath.Join(dir, "none.sock"), "broker: start vram broker, or point $VRAM_BROKER (--socket) at a broker's socket: there is no socket " + dir, ErrUnavailable},
		"stale":       {stale, "broker: start vram broker, or point $VRAM_BROKER (--socket) at a broker's socket: nothing serves " + stale + " (a broker that stopped left it)", ErrUnavailable},
		"a file":      {file, "broker: point $VRAM_BROKER (--socket) at the broker's socket: " + file + " is a regular file, not a socket", ErrInvalid},
		"path length": {long, "broker: socket path of 132 bytes: a Unix socket's path has at most 107", ErrInvalid},
	} {
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			start := time.Now()
			c, err := Dial(ctx, tc.path, WithLogger(quiet))
			if err == nil {
				_ = c.Close()
				t.Fatal("dialled")
			}
			msg := err.Error()
			if !strings.HasPrefix(msg, tc.want) || strings.Count(msg, "broker:") != 1 || strings.Contains(msg, "\n") || !is(err, tc.is) {
				t.Errorf("got %q, want one line starting %q, wrapping %v", msg, tc.want, tc.is)
			}
			if ctx.Err() != nil {
				t.Errorf("Dial waited %v, until its context ended: no retry mends this", time.Since(start))
			}
		})
	}
	t.Run("permission", func(t *testing.T) {
		uid, gid := otherUser(t)
		path := filepath.Join(publicDir(t), "b.sock")
		startServerAt(t, oneDevice(GiB), path) // 0600: root's alone
		_, out := asUser(t, publicExe(t), uid, gid, "dial", []string{"VRAM_BROKER_TEST_SOCKET=" + path}, true)
		want := "error: broker: ask the broker's administrator for access (the socket's group), or run a broker of your own: " + path + " (mode 0600, uid 0, gid 0) is closed to uid " + strconv.Itoa(int(uid))
		if !strings.HasPrefix(out, want) || strings.Contains(out, "running") {
			t.Errorf("got %q, want %q", out, want)
		}
	})
	t.Run("a live broker on the socket", func(t *testing.T) {
		_, path := startServer(t, oneDevice(GiB))
		ln, err := Listen(path, 0o600, -1)
		if err == nil {
			_ = ln.Close()
			t.Fatal("a second broker listened on a live one's socket")
		}
		if !is(err, ErrInUse) || strings.Contains(err.Error(), "lease id") || !strings.Contains(err.Error(), "a broker already serves "+path+": stop it first") {
			t.Errorf("got %v, want ErrInUse saying to stop the broker", err)
		}
	})
	t.Run("listen: path length", func(t *testing.T) {
		if _, err := Listen(long, 0o600, -1); !is(err, ErrInvalid) || !strings.Contains(err.Error(), "at most 107") {
			t.Errorf("got %v, want ErrInvalid naming the limit of 107 bytes", err)
		}
	})
}

// One device, one broker: a second broker of the user on a device (by
// its ID) is refused, naming the first; a list naming a device twice is
// refused. (Two brokers once promised 96 MiB of a 64 MiB device.)
func TestOneDeviceOneBroker(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "locks")
	dev := Device{Name: "sim:shared=w4", ID: "sim:shared=w4", Total: 64 * MiB}
	cfg := Config{Devices: []Device{dev}, LockDir: dir, Logger: quiet}
	first, err := NewServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := NewServer(cfg); !is(err, ErrInUse) || !strings.Contains(err.Error(), "pid "+strconv.Itoa(os.Getpid())) {
		t.Errorf("a second broker on the device: %v, want ErrInUse naming the first's pid", err)
	}
	other := cfg
	other.Devices = []Device{{Name: "sim:shared=other", ID: "sim:shared=other", Total: 64 * MiB}}
	s2, err := NewServer(other)
	if err != nil {
		t.Errorf("a broker of another device: %v", err)
	} else {
		s2.Stop()
	}
	first.Stop()
	third, err := NewServer(cfg)
	if err != nil {
		t.Fatalf("after the first stopped: %v", err)
	}
	third.Stop()
	for name, devs := range map[string][]Device{
		"the same id":   {dev, {Name: "again", ID: dev.ID, Total: 64 * MiB}},
		"the same name": {{Name: "sim", Total: GiB}, {Name: "sim", Total: GiB}},
	} {
		if _, err := NewServer(Config{Devices: devs, Logger: quiet}); !is(err, ErrInvalid) || !strings.Contains(err.Error(), "devices 0 and 1 are the same device") {
			t.Errorf("%s twice: %v, want ErrInvalid", name, err)
		}
	}
}
