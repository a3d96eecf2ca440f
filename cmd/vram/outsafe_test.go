package main

import (
	"bytes"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vramkit/vram/npy"
)

// precious is what a user's file held before a run wrote to its path.
const precious = "the user's own data, not to be lost\n"

// outPath makes the --out path in a fresh directory: a file holding
// precious, or with link a symbolic link to one (the link's target is
// returned as held).
func outPath(t *testing.T, link bool) (dir, out, held string) {
	t.Helper()
	dir = t.TempDir()
	held = filepath.Join(dir, "r.npy")
	if err := os.WriteFile(held, []byte(precious), 0o644); err != nil {
		t.Fatal(err)
	}
	out = held
	if link {
		out = filepath.Join(dir, "link.npy")
		if err := os.Symlink("r.npy", out); err != nil {
			t.Skip("no symbolic links here:", err)
		}
	}
	return dir, out, held
}

// checkUntouched checks that held still holds precious, that out is
// still a link to it when it was one, and that dir holds nothing else.
func checkUntouched(t *testing.T, dir, out, held string) {
	t.Helper()
	b, err := os.ReadFile(held)
	if err != nil || string(b) != precious {
		t.Errorf("%s after the run: %d bytes, %.40q… (%v); want it as it was", held, len(b), b, err)
	}
	want := 1
	if out != held {
		want = 2
		if dest, err := os.Readlink(out); err != nil || dest != "r.npy" {
			t.Errorf("%s after the run: link to %q (%v); want the link kept", out, dest, err)
		}
	}
	if es, _ := os.ReadDir(dir); len(es) != want {
		var names []string
		for _, e := range es {
			names = append(names, e.Name())
		}
		t.Errorf("the directory holds %v after the run; want only the user's files", names)
	}
}

// busyAddr is an address a listener of the test holds, so that a
// --metrics-addr of it fails once the job has started.
func busyAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l.Addr().String()
}

// TestRunOutFailureKeepsFile runs jobs that fail at different points
// with --out naming an existing file, directly or through a symbolic
// link: the file, the link and the directory are left as they were.
func TestRunOutFailureKeepsFile(t *testing.T) {
	tests := map[string][]string{
		"bad --metrics-addr":   {"--metrics-addr", "127.0.0.1:99999"},
		"--host-mem too small": {"--host-mem", "100B"}, // below one run's staging
		// One run's 80 KiB of trajectories cannot fit a 64 KiB device.
		"no room on the device": {"--steps", "10000", "--samples", "10001", "--dt", "0.001", "--vram", "64KiB"},
	}
	for name, extra := range tests {
		for _, link := range []bool{false, true} {
			t.Run(name+map[bool]string{false: "", true: ", through a link"}[link], func(t *testing.T) {
				dir, out, held := outPath(t, link)
				args := append(append([]string{"run"}, smallRun...), "--out", out)
				_, stderr, code := cli(t, "", append(args, extra...)...)
				if code == exitOK {
					t.Fatalf("exit 0; want a failure; stderr:\n%s", stderr)
				}
				checkUntouched(t, dir, out, held)
			})
		}
	}
}

// TestRunOutReplacesThroughLink runs a job whose --out is a symbolic
// link to an existing file: the link stays, and the file it names holds
// the results.
func TestRunOutReplacesThroughLink(t *testing.T) {
	dir, out, held := outPath(t, true)
	args := append(append([]string{"run"}, smallRun...), "--out", out)
	if _, stderr, code := cli(t, "", args...); code != exitOK {
		t.Fatalf("exit %d; stderr:\n%s", code, stderr)
	}
	if dest, err := os.Readlink(out); err != nil || dest != "r.npy" {
		t.Errorf("%s: link to %q (%v); want the link kept", out, dest, err)
	}
	f, err := npy.Open(held)
	if err != nil {
		t.Fatalf("the link's file after the run: %v", err)
	}
	f.Close()
	if es, _ := os.ReadDir(dir); len(es) != 2 {
		t.Errorf("the directory holds %d files, want the link and its file", len(es))
	}
}

// TestRunOutRefusesSpecialFile refuses an --out that is a directory
// before the job starts.
func TestRunOutRefusesSpecialFile(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "d.npy")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	args := append(append([]string{"run"}, smallRun...), "--out", dir)
	_, stderr, code := cli(t, "", args...)
	if code == exitOK || !strings.Contains(stderr, "not a regular file") {
		t.Errorf("--out a directory: exit %d, stderr:\n%s\nwant it refused as not a regular file", code, stderr)
	}
	if es, _ := os.ReadDir(dir); len(es) != 0 {
		t.Errorf("the directory holds %d files", len(es))
	}
}

// TestShardRetryFailureKeepsPart runs shard 1/2, then the same shard
// again in a job that fails: the first try's part and manifest are left
// as they were, and still merge with shard 0/2.
func TestShardRetryFailureKeepsPart(t *testing.T) {
	const runs = 3000
	dir := t.TempDir()
	out := filepath.Join(dir, "r.npy")
	runShard(t, runs, nil, "--out", out, "--shard", "1/2")
	part, manifest := filepath.Join(dir, "r.shard-1-of-2.npy"), filepath.Join(dir, "r.shard-1-of-2.json")
	wantPart, err1 := os.ReadFile(part)
	wantManifest, err2 := os.ReadFile(manifest)
	if err1 != nil || err2 != nil {
		t.Fatal(err1, err2)
	}
	args := append(append([]string{"run", "--runs", "3000"}, shardRun...), "--out", out, "--shard", "1/2", "--metrics-addr", busyAddr(t))
	if _, stderr, code := cli(t, "", args...); code == exitOK {
		t.Fatalf("the failing retry succeeded; stderr:\n%s", stderr)
	}
	for path, want := range map[string][]byte{part: wantPart, manifest: wantManifest} {
		if got, err := os.ReadFile(path); err != nil || !bytes.Equal(got, want) {
			t.Errorf("%s after a failed retry: %d bytes (%v), want the first try's %d", path, len(got), err, len(want))
		}
	}
	runShard(t, runs, nil, "--out", out, "--shard", "0/2")
	if _, stderr, code := cli(t, "", "merge", out); code != exitOK {
		t.Errorf("merge after the failed retry: exit %d\n%s", code, stderr)
	}
}
