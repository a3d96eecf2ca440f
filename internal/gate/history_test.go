package gate

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// repo is a git repository in a temporary folder, for the history check.
type repo struct {
	t   *testing.T
	dir string
}

func newRepo(t *testing.T) *repo {
	t.Helper()
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("no git to make a repository with")
	}
	r := &repo{t: t, dir: t.TempDir()}
	r.git("init", "-q")
	return r
}

func (r *repo) git(args ...string) {
	r.t.Helper()
	cmd := exec.Command("git", append([]string{"-c", "user.name=t", "-c", "user.email=t@example.com"}, args...)...)
	cmd.Dir = r.dir
	if out, err := cmd.CombinedOutput(); err != nil {
		r.t.Fatalf("git %v: %v\n%s", args, err, out)
	}
}

// path is the gates file's path: in a folder of the repository, as
// .ci/gates.json is.
func (r *repo) path() string { return filepath.Join(r.dir, ".ci", "gates.json") }

// commit writes f as the gates file and commits it.
func (r *repo) commit(f File) {
	r.t.Helper()
	if err := os.MkdirAll(filepath.Dir(r.path()), 0o755); err != nil {
		r.t.Fatal(err)
	}
	if err := Write(r.path(), f); err != nil {
		r.t.Fatal(err)
	}
	r.git("add", r.path())
	r.git("commit", "-q", "-m", "figures")
}

func withWhy(f Figure, why string) Figure { f.Why = why; return f }

// TestCheckHistory: a commit that makes a figure worse must change its
// why, one that drops a figure must retire it with a why; improvements
// and new figures need nothing; the working tree is checked against HEAD.
func TestCheckHistory(t *testing.T) {
	for name, tc := range map[string]struct {
		next     File
		problems []string
	}{
		"better":          {File{Figures: []Figure{fig("a", 1), fig("b", 1)}}, nil},
		"new figure":      {File{Figures: []Figure{fig("a", 2), fig("b", 1), fig("c", 9)}}, nil},
		"worse, same why": {File{Figures: []Figure{fig("a", 3), fig("b", 1)}}, []string{`made "a" worse (2 → 3 allocs/op)`}},
		"worse, new why":  {File{Figures: []Figure{withWhy(fig("a", 3), "the lease needs a context"), fig("b", 1)}}, nil},
		"dropped":         {File{Figures: []Figure{fig("a", 2)}}, []string{`dropped "b" without retiring it`}},
		"retired":         {File{Figures: []Figure{fig("a", 2)}, Retired: []Retired{{Name: "b", Why: "the path is gone"}}}, nil},
	} {
		t.Run(name, func(t *testing.T) {
			r := newRepo(t)
			r.commit(File{Figures: []Figure{fig("a", 2), fig("b", 1)}})
			r.commit(tc.next)
			h, err := CheckHistory(r.path())
			if err != nil {
				t.Fatal(err)
			}
			if h.Checked != 1 || h.Unchecked != 1 {
				t.Errorf("checked %d, unchecked %d; want the second commit checked and the first (the root) not", h.Checked, h.Unchecked)
			}
			if len(h.Problems) != len(tc.problems) {
				t.Fatalf("problems %q; want %q", h.Problems, tc.problems)
			}
			for i, p := range tc.problems {
				if !strings.Contains(h.Problems[i], p) {
					t.Errorf("problem %q; want it to say %q", h.Problems[i], p)
				}
			}
		})
	}
}

// TestCheckHistoryWorkingTree: an uncommitted change of the file is held
// to the same rule.
func TestCheckHistoryWorkingTree(t *testing.T) {
	r := newRepo(t)
	r.commit(File{Figures: []Figure{fig("a", 2)}})
	path := r.path()
	if err := Write(path, File{Figures: []Figure{fig("a", 5)}}); err != nil {
		t.Fatal(err)
	}
	h, err := CheckHistory(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(h.Problems) != 1 || !strings.Contains(h.Problems[0], "the working tree") {
		t.Errorf("problems %q; want one, in the working tree", h.Problems)
	}
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if h, err := CheckHistory(path); err != nil || len(h.Problems) != 0 {
		t.Errorf("with the file removed from the working tree: %+v, %v; want no problem", h, err)
	}
}
