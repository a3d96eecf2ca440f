//go:build unix

package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestRunOutKilledOrInterrupted ends a job writing --out mid-run, by
// SIGINT (it stops before its next chunk and fails) and by SIGKILL (it
// ends at once): an existing file at the path is left as it was, and
// nothing the run leaves looks like a finished .npy; the partial a killed
// run leaves is removed by the next run into the same file.
func TestRunOutKilledOrInterrupted(t *testing.T) {
	tests := map[string]struct {
		sig      os.Signal
		existing bool
	}{
		"SIGINT, existing file":  {os.Interrupt, true},
		"SIGKILL, existing file": {os.Kill, true},
		"SIGKILL, new file":      {os.Kill, false},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			dir, out, held := outPath(t, false)
			if !tc.existing {
				os.Remove(held)
			}
			c := startChild(t, append(slowRun, "--out", out))
			c.waitFor(t, "msg=plan")
			if err := c.cmd.Process.Signal(tc.sig); err != nil {
				t.Fatal(err)
			}
			st, stderr := c.wait(t)
			if st.Success() {
				t.Fatalf("the job succeeded; stderr:\n%s", stderr)
			}
			if tc.existing && tc.sig == os.Interrupt {
				checkUntouched(t, dir, out, held)
				return
			}
			if tc.existing {
				if b, err := os.ReadFile(held); err != nil || string(b) != precious {
					t.Errorf("%s after SIGKILL: %d bytes, %.40q… (%v); want it as it was", held, len(b), b, err)
				}
			} else if _, err := os.Stat(out); !os.IsNotExist(err) {
				t.Errorf("%s after SIGKILL: %v; want no file", out, err)
			}
			es, _ := os.ReadDir(dir)
			for _, e := range es {
				if e.Name() != filepath.Base(held) && strings.HasSuffix(e.Name(), ".npy") {
					t.Errorf("SIGKILL left %s, which looks like a finished .npy", e.Name())
				}
			}
			// What the killed run left, a partial of the file's full size,
			// is removed by the next run into the same file.
			if got := partials(t, dir); len(got) != 1 {
				t.Fatalf("after SIGKILL: partials %v; want the killed run's", got)
			}
			if _, stderr, code := cli(t, "", append(append([]string{"run"}, smallRun...), "--out", out)...); code != exitOK {
				t.Fatalf("the next run: exit %d:\n%s", code, stderr)
			}
			if got := partials(t, dir); len(got) != 0 {
				t.Errorf("after the next run into %s: partials %v; want none", out, got)
			}
		})
	}
}

// partials lists dir's temporary files of unfinished writes.
func partials(t *testing.T, dir string) []string {
	t.Helper()
	es, err := os.ReadDir(dir)
	must(t, err)
	var out []string
	for _, e := range es {
		if strings.HasSuffix(e.Name(), ".partial") {
			out = append(out, e.Name())
		}
	}
	return out
}
