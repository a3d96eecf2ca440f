//go:build linux || darwin

package safecopy

import (
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// TestCopyFromShrunkMapping maps a file, truncates it under the mapping
// and copies from and to the pages past its new end: both are errors
// wrapping ErrFault, and the process goes on.
func TestCopyFromShrunkMapping(t *testing.T) {
	path := filepath.Join(t.TempDir(), "mapped")
	const n = 1 << 20
	if err := os.WriteFile(path, make([]byte, n), 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	m, err := syscall.Mmap(int(f.Fd()), 0, n, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Munmap(m)
	if err := f.Truncate(4096); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64<<10)
	tests := map[string]func() error{
		"read past the end":  func() error { return Copy(buf, m[n/2:]) },
		"write past the end": func() error { return Copy(m[n/2:], buf) },
	}
	for name, call := range tests {
		t.Run(name, func(t *testing.T) {
			if err := call(); !errors.Is(err, ErrFault) {
				t.Errorf("%v, want ErrFault", err)
			}
		})
	}
	if err := Copy(buf[:4096], m[:4096]); err != nil {
		t.Errorf("the page still in the file: %v", err)
	}
}

// TestDoPassesOtherPanics lets a panic that is not a fault go on.
func TestDoPassesOtherPanics(t *testing.T) {
	defer func() {
		if r := recover(); r != "boom" {
			t.Errorf("recovered %v, want the panic passed on", r)
		}
	}()
	_ = Do(func() { panic("boom") })
}
