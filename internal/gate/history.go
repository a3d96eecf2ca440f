package gate

// The history check: every commit that changed the gates file, and the
// file in the working tree against HEAD's, must say why for each figure
// it made worse (a new Why) and each it dropped (a Retired entry with a
// Why). A commit that did not may be amended: the file as it stands now
// (the working tree's, or HEAD's) gives the why in an Amend. Commits whose
// parent a shallow clone lacks are counted, not checked.

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// History is what CheckHistory found.
type History struct {
	Checked   int      // changes of the file checked (commits, and the working tree's)
	Unchecked int      // commits whose parent is not in the clone
	Problems  []string // one line each: the commit, the figure, what it did
}

// CheckHistory checks the changes of the gates file at path, in the git
// repository that holds it (the rules above). It fails only when git
// cannot read the repository.
func CheckHistory(path string) (History, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return History{}, fmt.Errorf("gate: %w", err)
	}
	dir := filepath.Dir(abs)
	top, err := git(dir, "rev-parse", "--show-toplevel")
	if err != nil {
		return History{}, err
	}
	dir = strings.TrimSpace(string(top)) // git reads pathspecs from the folder it runs in
	rel, err := filepath.Rel(dir, abs)
	if err != nil {
		return History{}, fmt.Errorf("gate: %w", err)
	}
	rel = filepath.ToSlash(rel)
	log, err := git(dir, "log", "--format=%H", "--", rel)
	if err != nil {
		return History{}, err
	}
	now, err := current(dir, abs, rel)
	if err != nil {
		return History{}, err
	}
	var h History
	for _, c := range strings.Fields(string(log)) {
		if _, err := git(dir, "rev-parse", "-q", "--verify", c+"^1^{commit}"); err != nil {
			h.Unchecked++ // a shallow clone's boundary, or the root commit
			continue
		}
		newer, err := fileAt(dir, c, rel)
		if err != nil {
			return h, err
		}
		older, err := fileAt(dir, c+"^1", rel)
		if err != nil {
			return h, err
		}
		h.check(c[:min(len(c), minAmendPrefix)], older, newer, func(name string) bool { return now != nil && now.amended(c, name) })
	}
	// The working tree's file, against HEAD's.
	if work, err := os.ReadFile(abs); err == nil {
		head, err := fileAt(dir, "HEAD", rel)
		if err != nil {
			return h, err
		}
		if head != nil && !bytes.Equal(work, head.Marshal()) {
			wf, perr := Parse(work)
			if perr != nil {
				return h, fmt.Errorf("%s: %w", path, perr)
			}
			h.check("the working tree", head, &wf, func(string) bool { return false })
		}
	}
	return h, nil
}

// current is the file as it stands: the working tree's, or HEAD's where
// the working tree has none; nil where neither has it.
func current(dir, abs, rel string) (*File, error) {
	data, err := os.ReadFile(abs)
	if err != nil {
		return fileAt(dir, "HEAD", rel)
	}
	f, err := Parse(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", abs, err)
	}
	return &f, nil
}

// check adds the problems of one change of the file, older → newer
// (older nil: the change made the file), made where (a commit, or the
// working tree); amended says whether the file as it stands explains the
// change's worsening of a figure after the fact.
func (h *History) check(where string, older, newer *File, amended func(name string) bool) {
	h.Checked++
	if older == nil || newer == nil {
		return
	}
	kept := make(map[string]Figure, len(newer.Figures))
	for _, f := range newer.Figures {
		kept[f.Name] = f
	}
	retired := map[string]string{}
	for _, r := range older.Retired {
		retired[r.Name] = r.Why
	}
	for _, o := range older.Figures {
		n, ok := kept[o.Name]
		if !ok {
			if !retiredAnew(newer, o.Name, retired) {
				h.Problems = append(h.Problems, fmt.Sprintf("%s: dropped %q without retiring it with a why", where, o.Name))
			}
			continue
		}
		exact := o
		exact.Slack = 0
		if n.WorseThan(exact) && n.Why == o.Why && !amended(o.Name) {
			h.Problems = append(h.Problems, fmt.Sprintf("%s: made %q worse (%v → %v %s) and left its why as it was", where, o.Name, o.Value, n.Value, n.Unit))
		}
	}
}

// retiredAnew reports whether f retires name with a why that was not
// already its retired why before (old).
func retiredAnew(f *File, name string, old map[string]string) bool {
	for _, r := range f.Retired {
		if r.Name == name {
			prev, was := old[name]
			return strings.TrimSpace(r.Why) != "" && (!was || prev != r.Why)
		}
	}
	return false
}

// fileAt reads the gates file at rev; nil when rev has none.
func fileAt(dir, rev, rel string) (*File, error) {
	if _, err := git(dir, "cat-file", "-e", rev+":"+rel); err != nil {
		return nil, nil
	}
	data, err := git(dir, "show", rev+":"+rel)
	if err != nil {
		return nil, err
	}
	f, err := Parse(data)
	if err != nil {
		return nil, fmt.Errorf("%s at %s: %w", rel, rev, err)
	}
	return &f, nil
}

// git runs git in dir and returns its output.
func git(dir string, args ...string) ([]byte, error) {
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("gate: git %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return out, nil
}
