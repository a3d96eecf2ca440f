package broker

// Helpers for the tests of two users: a second uid, made with useradd
// when the tests run as root (CI does), and children of the test binary
// that run as it. Without root the tests that need it skip, saying why.

import (
	"errors"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
)

// otherUserName is the second user's name.
const otherUserName = "vram-broker-test"

var otherUserOnce struct {
	sync.Once
	uid, gid uint32
	skip     string
}

// otherUser is the second user's uid and gid, made with useradd the first
// time; the test skips where there can be none.
func otherUser(t testing.TB) (uid, gid uint32) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root, to make a second user (useradd) and run a child process as it")
	}
	o := &otherUserOnce
	o.Do(func() {
		u, err := user.Lookup(otherUserName)
		if err != nil {
			out, aerr := exec.Command("useradd", "--system", "--no-create-home", "--user-group", "--shell", "/usr/sbin/nologin", otherUserName).CombinedOutput()
			if u, err = user.Lookup(otherUserName); err != nil {
				o.skip = "no second user: useradd " + otherUserName + ": " + errString(aerr) + ": " + strings.TrimSpace(string(out))
				return
			}
		}
		uid, _ := strconv.ParseUint(u.Uid, 10, 32)
		gid, _ := strconv.ParseUint(u.Gid, 10, 32)
		o.uid, o.gid = uint32(uid), uint32(gid)
	})
	if o.skip != "" {
		t.Skip(o.skip)
	}
	return o.uid, o.gid
}

func errString(err error) string {
	if err == nil {
		return "no error"
	}
	return err.Error()
}

// publicExe is a copy of the test binary that every user may run, in a
// directory of the test's.
func publicExe(t testing.TB) string {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir := publicDir(t)
	data, err := os.ReadFile(exe)
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "broker.test")
	if err := os.WriteFile(bin, data, 0o755); err != nil {
		t.Fatal(err)
	}
	return bin
}

// publicDir is a directory of root's that every user may search, removed
// after the test.
func publicDir(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "vbu")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// startSharedServer serves cfg on a socket of mode 0660 whose group is
// gid, in a directory every user may search: root and the group connect.
func startSharedServer(t *testing.T, cfg Config, gid uint32) (*Server, string) {
	t.Helper()
	path := filepath.Join(publicDir(t), "b.sock")
	return startServerWith(t, cfg, path, 0o660, int(gid)), path
}

// asUser runs the test binary (exe, from publicExe) in helper mode as
// uid, gid and returns it with its output, once it has ended or said its
// first line (wait false).
func asUser(t *testing.T, exe string, uid, gid uint32, mode string, env []string, wait bool) (*exec.Cmd, string) {
	t.Helper()
	cmd := exec.Command(exe, "-test.run=^$")
	cmd.Env = append(append(os.Environ(), helperEnv+"="+mode), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: gid}}
	cmd.Dir = filepath.Dir(exe)
	if wait {
		out, err := cmd.CombinedOutput()
		var ee *exec.ExitError
		if err != nil && !errors.As(err, &ee) {
			t.Fatalf("%s as uid %d: %v", mode, uid, err)
		}
		return cmd, string(out)
	}
	cmd.Stderr = os.Stderr
	return cmd, firstLine(t, cmd, mode)
}
