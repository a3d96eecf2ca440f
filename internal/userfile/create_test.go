package userfile

import (
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// write puts s in path.
func write(t *testing.T, path, s string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(s), 0o600); err != nil {
		t.Fatal(err)
	}
}

func read(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// entries lists dir's names.
func entries(t *testing.T, dir string) []string {
	t.Helper()
	es, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range es {
		names = append(names, e.Name())
	}
	return names
}

func TestWriteCommitAbort(t *testing.T) {
	tests := map[string]struct {
		setup  func(t *testing.T, dir string) (path string, opt Options)
		fail   bool   // the write fails: Abort
		want   string // the content of path afterwards
		follow string // a symbolic link at path to this name must stay
	}{
		"new file": {
			setup: func(t *testing.T, dir string) (string, Options) { return filepath.Join(dir, "r.npy"), Options{} },
			want:  "new",
		},
		"new file, failed write leaves none": {
			setup: func(t *testing.T, dir string) (string, Options) { return filepath.Join(dir, "r.npy"), Options{} },
			fail:  true,
		},
		"existing file replaced": {
			setup: func(t *testing.T, dir string) (string, Options) {
				p := filepath.Join(dir, "r.npy")
				write(t, p, "old content")
				return p, Options{}
			},
			want: "new",
		},
		"existing file kept on failure": {
			setup: func(t *testing.T, dir string) (string, Options) {
				p := filepath.Join(dir, "r.npy")
				write(t, p, "old content")
				return p, Options{}
			},
			fail: true,
			want: "old content",
		},
		"symbolic link followed, kept": {
			setup: func(t *testing.T, dir string) (string, Options) {
				write(t, filepath.Join(dir, "target.npy"), "old content")
				p := filepath.Join(dir, "link.npy")
				if err := os.Symlink("target.npy", p); err != nil {
					t.Skip("no symbolic links here:", err)
				}
				return p, Options{}
			},
			want:   "new",
			follow: "target.npy",
		},
		"symbolic link's file kept on failure": {
			setup: func(t *testing.T, dir string) (string, Options) {
				write(t, filepath.Join(dir, "target.npy"), "old content")
				p := filepath.Join(dir, "link.npy")
				if err := os.Symlink("target.npy", p); err != nil {
					t.Skip("no symbolic links here:", err)
				}
				return p, Options{}
			},
			fail:   true,
			want:   "old content",
			follow: "target.npy",
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			path, opt := tc.setup(t, dir)
			before := entries(t, dir)
			werr := errors.New("the write failed")
			err := Write(path, opt, func(w io.Writer) error {
				if _, err := io.WriteString(w, "new"); err != nil {
					return err
				}
				if tc.fail {
					return werr
				}
				return nil
			})
			if tc.fail != errors.Is(err, werr) || (!tc.fail && err != nil) {
				t.Fatalf("Write: %v", err)
			}
			if tc.want == "" {
				if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
					t.Errorf("%s exists after a failed write of a new file (%v)", path, err)
				}
			} else if got := read(t, path); got != tc.want {
				t.Errorf("%s holds %q, want %q", path, got, tc.want)
			}
			if tc.follow != "" {
				if dest, err := os.Readlink(path); err != nil || dest != tc.follow {
					t.Errorf("the link is now %q (%v), want it kept, to %q", dest, err, tc.follow)
				}
			}
			after := entries(t, dir)
			if !tc.fail && len(before) == 0 {
				before = []string{filepath.Base(path)}
			}
			if strings.Join(after, ",") != strings.Join(before, ",") {
				t.Errorf("the directory holds %v, want %v (no temporary file left)", after, before)
			}
		})
	}
}

func TestCreateRefuses(t *testing.T) {
	tests := map[string]struct {
		setup func(t *testing.T, dir string) (path string, opt Options)
		want  error
	}{
		"directory": {
			setup: func(t *testing.T, dir string) (string, Options) { return dir, Options{} },
			want:  ErrNotRegular,
		},
		"dangling symbolic link": {
			setup: func(t *testing.T, dir string) (string, Options) {
				p := filepath.Join(dir, "link.npy")
				if err := os.Symlink("nowhere.npy", p); err != nil {
					t.Skip("no symbolic links here:", err)
				}
				return p, Options{}
			},
			want: ErrNotRegular,
		},
		"a missing directory": {
			setup: func(t *testing.T, dir string) (string, Options) {
				return filepath.Join(dir, "none", "out.npy"), Options{}
			},
			want: fs.ErrNotExist,
		},
		"the input itself": {
			setup: func(t *testing.T, dir string) (string, Options) {
				p := filepath.Join(dir, "in.csv")
				write(t, p, "input")
				return p, Options{Inputs: []string{filepath.Join(dir, "other.csv"), p}}
			},
			want: ErrIsInput,
		},
		"the input through another name": {
			setup: func(t *testing.T, dir string) (string, Options) {
				p := filepath.Join(dir, "in.csv")
				write(t, p, "input")
				return filepath.Join(dir, ".", "sub", "..", "in.csv"), Options{Inputs: []string{p}}
			},
			want: ErrIsInput,
		},
		"a hard link to the input": {
			setup: func(t *testing.T, dir string) (string, Options) {
				p := filepath.Join(dir, "in.csv")
				write(t, p, "input")
				l := filepath.Join(dir, "out.csv")
				if err := os.Link(p, l); err != nil {
					t.Skip("no hard links here:", err)
				}
				return l, Options{Inputs: []string{p}}
			},
			want: ErrIsInput,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			if err := os.Mkdir(filepath.Join(dir, "sub"), 0o755); err != nil {
				t.Fatal(err)
			}
			path, opt := tc.setup(t, dir)
			before := entries(t, dir)
			if _, _, err := Check(path, opt); !errors.Is(err, tc.want) {
				t.Errorf("Check(%s): %v, want %v", path, err, tc.want)
			}
			f, err := Create(path, opt)
			if !errors.Is(err, tc.want) {
				if f != nil {
					f.Abort()
				}
				t.Fatalf("Create(%s): %v, want %v", path, err, tc.want)
			}
			if after := entries(t, dir); strings.Join(after, ",") != strings.Join(before, ",") {
				t.Errorf("a refused Create changed the directory: %v, was %v", after, before)
			}
		})
	}
}

// TestCommitKeepsMode checks that a replaced file keeps its mode, and a
// new one gets Perm.
func TestCommitKeepsMode(t *testing.T) {
	dir := t.TempDir()
	old := filepath.Join(dir, "old.npy")
	write(t, old, "x")
	if err := os.Chmod(old, 0o640); err != nil {
		t.Fatal(err)
	}
	nw := filepath.Join(dir, "new.npy")
	for path, want := range map[string]os.FileMode{old: 0o640, nw: 0o604} {
		if err := Write(path, Options{Perm: 0o604}, func(w io.Writer) error { return nil }); err != nil {
			t.Fatal(err)
		}
		st, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		if st.Mode().Perm() != want {
			t.Errorf("%s: mode %v, want %v", path, st.Mode().Perm(), want)
		}
	}
}

// TestTempNameLooksUnfinished checks what a killed writer leaves: a
// hidden file that does not end in the user's name.
func TestTempNameLooksUnfinished(t *testing.T) {
	dir := t.TempDir()
	f, err := Create(filepath.Join(dir, "r.npy"), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Abort()
	base := filepath.Base(f.TempName())
	if !strings.HasPrefix(base, ".r.npy.") || !strings.HasSuffix(base, ".partial") || filepath.Dir(f.TempName()) != dir {
		t.Errorf("temporary file %s: want .r.npy.*.partial in %s", f.TempName(), dir)
	}
	if err := f.Commit(); err != nil {
		t.Fatal(err)
	}
	if err := f.Commit(); err == nil {
		t.Error("a second Commit returned nil")
	}
	if err := f.Abort(); err != nil {
		t.Errorf("Abort after Commit: %v", err)
	}
}
