package mapfile_test

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/vramkit/vram/internal/mapfile"
)

// TestReserveMapUnmap: a reserved file has its bytes (zeros), and what is
// written through a writable mapping is in the file once unmapped; a
// read-only mapping sees it.
func TestReserveMapUnmap(t *testing.T) {
	if !mapfile.Supported {
		t.Skip("no memory-mapped files on this system")
	}
	tests := map[string]struct{ n int64 }{
		"one page":     {4096},
		"odd size":     {12345},
		"past one MiB": {3<<20 + 17},
		"two bytes":    {2},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			f, err := os.Create(filepath.Join(t.TempDir(), "f"))
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			if err := mapfile.Reserve(f, tc.n); err != nil {
				t.Fatal(err)
			}
			if st, err := f.Stat(); err != nil || st.Size() < tc.n {
				t.Fatalf("reserved file of %d bytes (%v), want at least %d", st.Size(), err, tc.n)
			}
			b, err := mapfile.Map(f, tc.n, true)
			if err != nil {
				t.Fatal(err)
			}
			if len(b) != int(tc.n) || bytes.IndexFunc(b, func(r rune) bool { return r != 0 }) >= 0 {
				t.Fatalf("mapping of %d bytes, not all zero; want %d zero bytes", len(b), tc.n)
			}
			b[0], b[len(b)-1] = 7, 9
			if err := mapfile.Unmap(b); err != nil {
				t.Fatal(err)
			}
			ro, err := mapfile.Map(f, tc.n, false)
			if err != nil {
				t.Fatal(err)
			}
			defer mapfile.Unmap(ro)
			if ro[0] != 7 || ro[len(ro)-1] != 9 {
				t.Errorf("read-only mapping has %d…%d, want 7…9", ro[0], ro[len(ro)-1])
			}
		})
	}
}

func ExampleMap() {
	if !mapfile.Supported {
		fmt.Println("hello, mapped file")
		return
	}
	dir, err := os.MkdirTemp("", "mapfile")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)
	f, err := os.Create(filepath.Join(dir, "greeting"))
	if err != nil {
		panic(err)
	}
	defer f.Close()
	msg := "hello, mapped file"
	if err := mapfile.Reserve(f, int64(len(msg))); err != nil {
		panic(err)
	}
	b, err := mapfile.Map(f, int64(len(msg)), true)
	if err != nil {
		panic(err)
	}
	copy(b, msg)
	if err := mapfile.Unmap(b); err != nil {
		panic(err)
	}
	got, err := os.ReadFile(f.Name())
	fmt.Println(string(got), err == nil)
	// Output: hello, mapped file true
}
