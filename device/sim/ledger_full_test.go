//go:build linux

package sim_test

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// A shared device's ledger on a full file system is an error that says
// so, in the process that opens it, and never a SIGBUS: the file gets its
// blocks before it is mapped. The file system is a tmpfs of 16 KiB,
// filled before the open (mounting one needs root); the open runs in a
// helper process, so that a SIGBUS would end the helper, not the test.
func TestSharedLedgerOnAFullFileSystem(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting a small tmpfs to fill needs root")
	}
	dir := t.TempDir()
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, "size=16k,mode=0700"); err != nil {
		t.Skipf("cannot mount a tmpfs on %s (%v): no full file system to try", dir, err)
	}
	t.Cleanup(func() {
		if err := syscall.Unmount(dir, 0); err != nil {
			t.Errorf("unmount %s: %v", dir, err)
		}
	})
	filler, err := os.Create(filepath.Join(dir, "filler"))
	if err != nil {
		t.Fatal(err)
	}
	block := make([]byte, 4096)
	for {
		if _, err := filler.Write(block); err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatalf("filling the tmpfs: %v", err)
			}
			break
		}
	}
	if err := filler.Close(); err != nil {
		t.Fatal(err)
	}
	spec := fmt.Sprintf("sim:shared=full%d,vram=64MiB,dir=%s", os.Getpid(), dir)
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"=open", helperSpec+"="+spec)
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 {
		t.Fatalf("opening %s on a full file system: %v; want exit status 1 and an error:\n%s", spec, err, out)
	}
	if !strings.HasPrefix(string(out), "err ") || !strings.Contains(string(out), "no space left on device") ||
		!strings.Contains(string(out), "dir=") {
		t.Errorf("the error: %s; want it to say the file system is full and where else the ledger may go", out)
	}
	t.Logf("the open said: %s", out)
}
