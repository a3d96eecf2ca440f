package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vramkit/vram/npy"
)

// writeParts runs the shards of a small batch split n ways into dir, each
// with extra arguments, and returns the --out path.
func writeParts(t *testing.T, dir string, runs, n int, extra ...string) string {
	t.Helper()
	out := filepath.Join(dir, "r.npy")
	for i := range n {
		args := append([]string{"--out", out, "--shard", fmt.Sprintf("%d/%d", i, n)}, extra...)
		runShard(t, runs, nil, args...)
	}
	return out
}

func TestMergeRefuses(t *testing.T) {
	const runs = 300
	for name, tc := range map[string]struct {
		setup func(t *testing.T, dir string) (out string, parts []string)
		want  []string
	}{
		"no parts": {
			setup: func(t *testing.T, dir string) (string, []string) { return filepath.Join(dir, "r.npy"), nil },
			want:  []string{"no parts of", "r.shard-*-of-*.npy", "runs missing from the parts"},
		},
		"a shard never ran": {
			setup: func(t *testing.T, dir string) (string, []string) {
				out := writeParts(t, dir, runs, 3)
				must(t, os.Remove(filepath.Join(dir, "r.shard-1-of-3.npy")))
				must(t, os.Remove(filepath.Join(dir, "r.shard-1-of-3.json")))
				return out, nil
			},
			want: []string{"runs 100-199 of 300 are in no part: shard 1/3", "r.shard-1-of-3.npy: not found"},
		},
		"a shard did not finish": {
			setup: func(t *testing.T, dir string) (string, []string) {
				out := writeParts(t, dir, runs, 3)
				must(t, os.Remove(filepath.Join(dir, "r.shard-2-of-3.json")))
				return out, nil
			},
			want: []string{"runs 200-299 of 300 are in no part: shard 2/3", "no manifest r.shard-2-of-3.json: the shard did not finish"},
		},
		"a named part unfinished": {
			setup: func(t *testing.T, dir string) (string, []string) {
				out := writeParts(t, dir, runs, 2)
				must(t, os.Remove(filepath.Join(dir, "r.shard-1-of-2.json")))
				return out, []string{filepath.Join(dir, "r.shard-0-of-2.npy"), filepath.Join(dir, "r.shard-1-of-2.npy")}
			},
			want: []string{"r.shard-1-of-2.npy has no manifest", "did not finish"},
		},
		"a finished part not named": {
			setup: func(t *testing.T, dir string) (string, []string) {
				out := writeParts(t, dir, runs, 3)
				return out, []string{filepath.Join(dir, "r.shard-0-of-3.npy"), filepath.Join(dir, "r.shard-2-of-3.npy")}
			},
			want: []string{"runs 100-199 of 300 are in no part: shard 1/3", "finished, with its manifest r.shard-1-of-3.json, but not among the parts named"},
		},
		"two splits overlap": {
			setup: func(t *testing.T, dir string) (string, []string) {
				writeParts(t, dir, runs, 2)
				return writeParts(t, dir, runs, 3), nil
			},
			// 0/2 is runs 0-149, 0/3 0-99, 1/3 100-199: the first overlap
			// met in order of first run.
			want: []string{"runs 0-99 are in both", "r.shard-0-of-2.npy", "r.shard-0-of-3.npy", "runs in more than one part"},
		},
		"a part named twice": {
			setup: func(t *testing.T, dir string) (string, []string) {
				out := writeParts(t, dir, runs, 2)
				p0, p1 := filepath.Join(dir, "r.shard-0-of-2.npy"), filepath.Join(dir, "r.shard-1-of-2.npy")
				return out, []string{p0, p1, p1}
			},
			want: []string{"runs 150-299 are in both", "r.shard-1-of-2.npy and", "runs in more than one part"},
		},
		"parts of two batches": {
			setup: func(t *testing.T, dir string) (string, []string) {
				out := writeParts(t, dir, runs, 2)
				runShard(t, runs, nil, "--out", out, "--shard", "1/2", "--seed", "8")
				return out, nil
			},
			want: []string{`"seed":7`, `"seed":8`, "parts of different batches"},
		},
		// Manifests are read from shared storage: one edited or corrupt
		// must not wrap a sum or send merge through 2^62 shards.
		"a run range past 2^63": {
			setup: func(t *testing.T, dir string) (string, []string) {
				out := writeParts(t, dir, runs, 2)
				editManifest(t, filepath.Join(dir, "r.shard-1-of-2.json"), `"first_run": 9223372036854775807`)
				return out, nil
			},
			want: []string{"r.shard-1-of-2.json: part \"r.shard-1-of-2.npy\" of runs 9223372036854775807+150 of 300", "does not describe a part"},
		},
		"a count of shards past the runs": {
			setup: func(t *testing.T, dir string) (string, []string) {
				out := writeParts(t, dir, runs, 2)
				editManifest(t, filepath.Join(dir, "r.shard-1-of-2.json"), `"shards": 4611686018427387904`)
				return out, nil
			},
			want: []string{"shard 1 of 4611686018427387904 shards of 300 runs: not a shard of the rule"},
		},
		"runs that are not the shard's": {
			setup: func(t *testing.T, dir string) (string, []string) {
				out := writeParts(t, dir, runs, 2)
				editManifest(t, filepath.Join(dir, "r.shard-1-of-2.json"), `"shard": 0`)
				return out, nil
			},
			want: []string{"shard 0/2 of 300 runs holds runs 0-149, but the manifest says 150+150"},
		},
		"another job's part behind the manifest": {
			setup: func(t *testing.T, dir string) (string, []string) {
				out := writeParts(t, dir, runs, 2)
				other := filepath.Join(t.TempDir(), "r.npy")
				runShard(t, runs, nil, "--out", other, "--shard", "1/2", "--seed", "8")
				b, err := os.ReadFile(filepath.Join(filepath.Dir(other), "r.shard-1-of-2.npy"))
				must(t, err)
				must(t, os.WriteFile(filepath.Join(dir, "r.shard-1-of-2.npy"), b, 0o644))
				return out, nil
			},
			want: []string{"r.shard-1-of-2.npy's data has CRC-32C", "but its manifest", "run the shard again", "does not match its manifest"},
		},
		"a zeroed part": {
			setup: func(t *testing.T, dir string) (string, []string) {
				out := writeParts(t, dir, runs, 2)
				p := filepath.Join(dir, "r.shard-0-of-2.npy")
				f, err := npy.OpenWrite(p)
				must(t, err)
				_, err = f.WriteAt(make([]byte, f.DataBytes()), 0)
				must(t, errors.Join(err, f.Close()))
				return out, nil
			},
			want: []string{"r.shard-0-of-2.npy's data has CRC-32C", "does not match its manifest"},
		},
		"a manifest naming another shard's part": {
			setup: func(t *testing.T, dir string) (string, []string) {
				out := writeParts(t, dir, runs, 2)
				editManifest(t, filepath.Join(dir, "r.shard-1-of-2.json"), `"part": "r.shard-0-of-2.npy"`)
				return out, nil
			},
			want: []string{`names the part "r.shard-0-of-2.npy", not its own r.shard-1-of-2.npy`},
		},
		"a manifest with no checksum": {
			setup: func(t *testing.T, dir string) (string, []string) {
				out := writeParts(t, dir, runs, 2)
				editManifest(t, filepath.Join(dir, "r.shard-1-of-2.json"), `"data_crc32c": ""`)
				return out, nil
			},
			want: []string{"has no checksum of its part's data", "run the shard again"},
		},
		"a part cut short": {
			setup: func(t *testing.T, dir string) (string, []string) {
				out := writeParts(t, dir, runs, 2)
				p := filepath.Join(dir, "r.shard-0-of-2.npy")
				st, err := os.Stat(p)
				must(t, err)
				must(t, os.Truncate(p, st.Size()-4))
				return out, nil
			},
			want: []string{"r.shard-0-of-2.npy"},
		},
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			out, parts := tc.setup(t, dir)
			_, stderr, code := cli(t, "", append([]string{"merge", out}, parts...)...)
			if code != exitFailure {
				t.Fatalf("exit %d, want %d; stderr:\n%s", code, exitFailure, stderr)
			}
			for _, w := range tc.want {
				if !strings.Contains(stderr, w) {
					t.Errorf("stderr does not say %q:\n%s", w, stderr)
				}
			}
			for _, p := range []string{out, out + ".partial"} {
				if _, err := os.Stat(p); !os.IsNotExist(err) {
					t.Errorf("a refused merge left %s (%v)", p, err)
				}
			}
		})
	}
}

// TestMergeNamedPartsAndRemove: parts named on the command line from
// another directory, --json, --remove-parts, and a stale manifest of a
// shard run again removed before its part is rewritten.
func TestMergeNamedPartsAndRemove(t *testing.T) {
	const runs = 500
	dir := t.TempDir()
	whole := filepath.Join(dir, "whole.npy")
	runShard(t, runs, nil, "--out", whole)
	pdir := filepath.Join(dir, "parts")
	must(t, os.Mkdir(pdir, 0o755))
	out := writeParts(t, pdir, runs, 2)
	p0, p1 := filepath.Join(pdir, "r.shard-0-of-2.npy"), filepath.Join(pdir, "r.shard-1-of-2.npy")
	merged := filepath.Join(dir, "merged.npy")
	stdout, stderr, code := cli(t, "", "merge", "--json", "--remove-parts", merged, p1, p0)
	if code != exitOK {
		t.Fatalf("merge: exit %d\n%s", code, stderr)
	}
	var rep mergeReport
	must(t, json.Unmarshal([]byte(stdout), &rep))
	if rep.Out != merged || len(rep.Parts) != 2 || rep.Parts[0].Part != p0 || rep.Parts[1].FirstRun != 250 || !rep.Removed ||
		fmt.Sprint(rep.Shape) != "[21 2 500]" {
		t.Fatalf("report %+v", rep)
	}
	if left, _ := filepath.Glob(filepath.Join(pdir, "*")); len(left) != 0 {
		t.Fatalf("--remove-parts left %v", left)
	}
	a, err := os.ReadFile(whole)
	must(t, err)
	b, err := os.ReadFile(merged)
	must(t, err)
	if string(a) != string(b) {
		t.Fatal("merged parts differ from the one-process file")
	}
	_ = out
}

// editManifest sets one field of the manifest at path, given as
// `"name": value`.
func editManifest(t *testing.T, path, field string) {
	t.Helper()
	b, err := os.ReadFile(path)
	must(t, err)
	var m map[string]json.RawMessage
	must(t, json.Unmarshal(b, &m))
	name, value, _ := strings.Cut(field, ": ")
	m[strings.Trim(name, `"`)] = json.RawMessage(value)
	b, err = json.Marshal(m)
	must(t, err)
	must(t, os.WriteFile(path, b, 0o644))
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
