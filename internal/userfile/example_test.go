package userfile_test

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/vramkit/vram/internal/userfile"
)

// A failed write leaves the user's file as it was; a good one replaces
// it whole.
func Example() {
	dir, _ := os.MkdirTemp("", "userfile")
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "report.txt")
	_ = os.WriteFile(path, []byte("yesterday's report\n"), 0o644)

	err := userfile.Write(path, userfile.Options{}, func(w io.Writer) error {
		io.WriteString(w, "half a rep")
		return errors.New("disk full")
	})
	b, _ := os.ReadFile(path)
	fmt.Printf("%v; the file holds %q\n", err, b)

	_ = userfile.Write(path, userfile.Options{}, func(w io.Writer) error {
		_, err := io.WriteString(w, "today's report\n")
		return err
	})
	b, _ = os.ReadFile(path)
	fmt.Printf("the file holds %q\n", b)

	_, err = userfile.Create(path, userfile.Options{Inputs: []string{path}})
	fmt.Println(errors.Is(err, userfile.ErrIsInput))
	// Output:
	// disk full; the file holds "yesterday's report\n"
	// the file holds "today's report\n"
	// true
}
