//go:build unix

package userfile

import (
	"bufio"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
)

// helperEnv, set in a child's environment to a path, makes the test
// binary a writer of that path that never finishes: it creates the new
// content, prints its temporary file's name and waits to be killed.
const helperEnv = "USERFILE_TEST_WRITER"

func TestMain(m *testing.M) {
	if path := os.Getenv(helperEnv); path != "" {
		f, err := Create(path, Options{})
		if err != nil {
			os.Stderr.WriteString(err.Error() + "\n")
			os.Exit(1)
		}
		_, _ = f.OS().WriteString(strings.Repeat("x", 1<<16))
		os.Stdout.WriteString(f.TempName() + "\n")
		select {}
	}
	os.Exit(m.Run())
}

// partials lists dir's temporary files.
func partials(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	for _, n := range entries(t, dir) {
		if strings.HasSuffix(n, partialSuffix) {
			out = append(out, n)
		}
	}
	return out
}

// TestKilledWriterPartialRemoved: a writer killed with SIGKILL leaves its
// full temporary file behind; the next Create of the same file removes
// it, and the next writer's own is all that is left.
func TestKilledWriterPartialRemoved(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "r.npy")
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"="+path)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	name, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		_ = cmd.Process.Kill()
		t.Fatalf("the writer said nothing: %v", err)
	}
	// Alive, its partial is its own: another Create leaves it.
	f, err := Create(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(partials(t, dir), filepath.Base(strings.TrimSpace(name))) {
		t.Errorf("a live writer's partial %s was removed: %v", name, partials(t, dir))
	}
	must(t, f.Abort())
	must(t, cmd.Process.Signal(syscall.SIGKILL))
	_ = cmd.Wait()
	if got := partials(t, dir); len(got) != 1 {
		t.Fatalf("after the kill: %v; want the killed writer's partial", got)
	}
	f, err = Create(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Abort()
	if got, want := partials(t, dir), []string{filepath.Base(f.TempName())}; !slices.Equal(got, want) {
		t.Errorf("partials after the next Create: %v; want only its own %v", got, want)
	}
}

// TestRemoveStale: what the next Create removes and what it leaves.
func TestRemoveStale(t *testing.T) {
	tests := map[string]struct {
		make    func(t *testing.T, dir string) string // makes a file, returns its name
		removed bool
	}{
		"unlocked partial of the same file": {
			make: func(t *testing.T, dir string) string {
				write(t, filepath.Join(dir, ".r.npy.0123.partial"), "half")
				return ".r.npy.0123.partial"
			},
			removed: true,
		},
		"partial of another file": {
			make: func(t *testing.T, dir string) string {
				write(t, filepath.Join(dir, ".q.npy.0123.partial"), "half")
				return ".q.npy.0123.partial"
			},
		},
		"partial of a longer name": {
			make: func(t *testing.T, dir string) string {
				write(t, filepath.Join(dir, ".r.npy.old.0123.partial"), "half")
				return ".r.npy.old.0123.partial"
			},
			removed: true, // ".r.npy." is its prefix: the pattern's RANDOM part is free text
		},
		"a writer's partial in this process": {
			make: func(t *testing.T, dir string) string {
				f, err := Create(filepath.Join(dir, "r.npy"), Options{})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = f.Abort() })
				return filepath.Base(f.TempName())
			},
		},
		"directory named like a partial": {
			make: func(t *testing.T, dir string) string {
				must(t, os.Mkdir(filepath.Join(dir, ".r.npy.d.partial"), 0o700))
				return ".r.npy.d.partial"
			},
		},
		"symbolic link named like a partial": {
			make: func(t *testing.T, dir string) string {
				write(t, filepath.Join(dir, "precious"), "keep")
				must(t, os.Symlink("precious", filepath.Join(dir, ".r.npy.s.partial")))
				return ".r.npy.s.partial"
			},
		},
		"bare pattern": {
			make: func(t *testing.T, dir string) string {
				write(t, filepath.Join(dir, ".r.npy.partial"), "half")
				return ".r.npy.partial"
			},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			made := tc.make(t, dir)
			f, err := Create(filepath.Join(dir, "r.npy"), Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer f.Abort()
			_, err = os.Lstat(filepath.Join(dir, made))
			if gone := os.IsNotExist(err); gone != tc.removed {
				t.Errorf("%s removed: %v, want %v (stat: %v)", made, gone, tc.removed, err)
			}
			if b, err := os.ReadFile(filepath.Join(dir, "precious")); err == nil && string(b) != "keep" {
				t.Errorf("the link's target holds %q", b)
			}
		})
	}
}

// TestNewFileTakesUmask: a new file's mode is Perm less the umask, as any
// file the process makes; a replaced file keeps its own whatever the
// umask.
func TestNewFileTakesUmask(t *testing.T) {
	tests := map[string]struct {
		umask    int
		perm     os.FileMode
		existing os.FileMode // 0: no file before
		want     os.FileMode
	}{
		"default, umask 022":         {umask: 0o022, want: 0o644},
		"default, umask 077":         {umask: 0o077, want: 0o600},
		"default, umask 027":         {umask: 0o027, want: 0o640},
		"Perm 0666, umask 002":       {umask: 0o002, perm: 0o666, want: 0o664},
		"existing 0644, umask 077":   {umask: 0o077, existing: 0o644, want: 0o644},
		"existing 0600, umask 000":   {umask: 0, existing: 0o600, want: 0o600},
		"existing 0664 through Perm": {umask: 0o022, perm: 0o600, existing: 0o664, want: 0o664},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "r.npy")
			if tc.existing != 0 {
				write(t, path, "old")
				must(t, os.Chmod(path, tc.existing))
			}
			old := syscall.Umask(tc.umask) // the tests of this package run one at a time
			err := Write(path, Options{Perm: tc.perm}, func(w io.Writer) error { _, err := io.WriteString(w, "new"); return err })
			syscall.Umask(old)
			if err != nil {
				t.Fatal(err)
			}
			st, err := os.Stat(path)
			if err != nil {
				t.Fatal(err)
			}
			if st.Mode().Perm() != tc.want {
				t.Errorf("mode %v, want %v", st.Mode().Perm(), tc.want)
			}
		})
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
