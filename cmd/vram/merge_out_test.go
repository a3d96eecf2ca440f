package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestMergeRefusesOut refuses an OUT.npy that merge cannot write without
// destroying a file — one of the parts or manifests (named, found, or
// through a link), or not a regular file — with or without
// --remove-parts, before anything is written or removed.
func TestMergeRefusesOut(t *testing.T) {
	tests := map[string]struct {
		args func(dir, out string) []string
		want string
	}{
		"OUT is a named part": {
			args: func(dir, out string) []string {
				p0 := filepath.Join(dir, "r.shard-0-of-2.npy")
				return []string{p0, p0, filepath.Join(dir, "r.shard-1-of-2.npy")}
			},
			want: "is the input",
		},
		"OUT is a named part, --remove-parts": {
			args: func(dir, out string) []string {
				p1 := filepath.Join(dir, "r.shard-1-of-2.npy")
				return []string{"--remove-parts", p1, filepath.Join(dir, "r.shard-0-of-2.npy"), p1}
			},
			want: "is the input",
		},
		"OUT is a manifest": {
			args: func(dir, out string) []string {
				return []string{filepath.Join(dir, "r.shard-0-of-2.json"), filepath.Join(dir, "r.shard-0-of-2.npy"), filepath.Join(dir, "r.shard-1-of-2.npy")}
			},
			want: "want a file name ending in .npy",
		},
		"OUT links to a found part, --remove-parts": {
			args: func(dir, out string) []string {
				if err := os.Symlink("r.shard-0-of-2.npy", out); err != nil {
					t.Skip("no symbolic links here:", err)
				}
				return []string{"--remove-parts", out}
			},
			want: "is the input",
		},
		"OUT is a directory": {
			args: func(dir, out string) []string {
				must(t, os.Mkdir(out, 0o755))
				return []string{"--remove-parts", out}
			},
			want: "not a regular file",
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			out := writeParts(t, dir, 200, 2)
			args := tc.args(dir, out)
			before := snapshotDir(t, dir)
			_, stderr, code := cli(t, "", append([]string{"merge"}, args...)...)
			if code == exitOK || !strings.Contains(stderr, tc.want) {
				t.Errorf("vram merge %v: exit %d, stderr:\n%s\nwant a failure saying %q", args, code, stderr, tc.want)
			}
			if after := snapshotDir(t, dir); !sameSnapshot(before, after) {
				t.Errorf("the refused merge changed the directory: %v, was %v", names(after), names(before))
			}
		})
	}
}

// snapshotDir reads every regular file of dir (and the target of each
// link).
func snapshotDir(t *testing.T, dir string) map[string][]byte {
	t.Helper()
	es, err := os.ReadDir(dir)
	must(t, err)
	m := map[string][]byte{}
	for _, e := range es {
		p := filepath.Join(dir, e.Name())
		if e.Type()&os.ModeSymlink != 0 {
			dest, _ := os.Readlink(p)
			m[e.Name()] = []byte("-> " + dest)
			continue
		}
		if e.Type().IsRegular() {
			b, err := os.ReadFile(p)
			must(t, err)
			m[e.Name()] = b
		} else {
			m[e.Name()] = []byte(e.Type().String())
		}
	}
	return m
}

func sameSnapshot(a, b map[string][]byte) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || !bytes.Equal(v, w) {
			return false
		}
	}
	return true
}

func names(m map[string][]byte) []string {
	var n []string
	for k := range m {
		n = append(n, k)
	}
	return n
}
