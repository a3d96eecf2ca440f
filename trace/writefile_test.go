package trace

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/vramkit/vram/internal/userfile"
)

// TestWriteFilesWholeOrRefused checks the two file writers: a path that
// is not a regular file (a device, a directory) is refused, and a good
// write replaces the file whole, leaving nothing beside it.
func TestWriteFilesWholeOrRefused(t *testing.T) {
	dir := t.TempDir()
	events := []Event{{Action: Allocate, Pointer: 1 << 20, Size: 4096}, {Time: 1, Action: Free, Pointer: 1 << 20, Size: 4096}}
	writers := map[string]func(string) error{
		"WriteFile":         func(p string) error { return WriteFile(p, events) },
		"WriteSnapshotFile": func(p string) error { return WriteSnapshotFile(p, History{}) },
	}
	for name, write := range writers {
		t.Run(name, func(t *testing.T) {
			for _, p := range []string{os.DevNull, dir} {
				if err := write(p); !errors.Is(err, userfile.ErrNotRegular) {
					t.Errorf("%s(%s): %v, want ErrNotRegular", name, p, err)
				}
			}
			p := filepath.Join(t.TempDir(), "out")
			if err := os.WriteFile(p, []byte("old"), 0o644); err != nil {
				t.Fatal(err)
			}
			if err := write(p); err != nil {
				t.Fatal(err)
			}
			if b, _ := os.ReadFile(p); string(b) == "old" || len(b) == 0 {
				t.Errorf("%s holds %q after the write", p, b)
			}
			if es, _ := os.ReadDir(filepath.Dir(p)); len(es) != 1 {
				t.Errorf("%d files beside the output, want none", len(es)-1)
			}
		})
	}
}
