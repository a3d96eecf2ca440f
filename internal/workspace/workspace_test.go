package workspace

// TestMain runs `go test ./...` in each other module of the workspace
// before this package's tests, outside the test binary's -timeout: each
// of those modules' test binaries gets the -timeout, -race, -short,
// -count, -failfast and -v this one got, as the root's packages do.
// TestModules reports how each went. Its result is cached by go test like
// any other: it opens every file of the repository and reads every
// environment variable, so that a change to any of them runs it again
// (and the other modules' own go test caches say what is still good).

import (
	"bytes"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// moduleRun is how `go test ./...` went in one module.
type moduleRun struct {
	dir string // relative to the workspace's root
	out []byte
	err error
}

var (
	root    string      // the workspace's root: go.work's directory
	runs    []moduleRun // what TestMain ran
	skipped string      // why it ran nothing, for TestModules
)

func TestMain(m *testing.M) {
	flag.Parse()
	set := map[string]string{}
	flag.Visit(func(f *flag.Flag) { set[strings.TrimPrefix(f.Name, "test.")] = f.Value.String() })
	root, runs, skipped = runModules(set)
	os.Exit(m.Run())
}

// runModules runs the other modules' tests with the flags set, unless
// the flags leave TestModules out or there is no workspace.
func runModules(set map[string]string) (string, []moduleRun, string) {
	if set["list"] != "" || !runsTest(set["run"], "TestModules") {
		return "", nil, "not asked for"
	}
	goTool, err := exec.LookPath("go")
	if err != nil {
		return "", nil, "no go command on $PATH to run the other modules' tests"
	}
	work, err := exec.Command(goTool, "env", "GOWORK").Output()
	gowork := strings.TrimSpace(string(work))
	if err != nil || gowork == "" || gowork == "off" {
		return "", nil, "the workspace is off (GOWORK=off, or no go.work): run go test ./... in cmd/vram and deploy/kubernetes"
	}
	root := filepath.Dir(gowork)
	list, err := exec.Command(goTool, "list", "-m", "-f", "{{.Dir}}").Output()
	if err != nil {
		return root, []moduleRun{{dir: ".", err: fmt.Errorf("go list -m: %w", err)}}, ""
	}
	var out []moduleRun
	for _, dir := range strings.Fields(string(list)) {
		rel, err := filepath.Rel(root, dir)
		if err != nil || rel == "." {
			continue // the root module: the outer go test runs it
		}
		cmd := exec.Command(goTool, append([]string{"test"}, append(goTestFlags(set, raced), "./...")...)...)
		cmd.Dir = dir
		b, err := cmd.CombinedOutput()
		out = append(out, moduleRun{dir: rel, out: b, err: err})
	}
	return root, out, ""
}

// runsTest reports whether a -run pattern selects the top-level test
// name ("" selects every test).
func runsTest(pattern, name string) bool {
	if pattern == "" {
		return true
	}
	top, _, _ := strings.Cut(pattern, "/")
	ok, err := regexp.MatchString(top, name)
	return err != nil || ok // a pattern go test would refuse: run, and let it say so
}

// goTestFlags are the go test flags that give another module's test
// binaries what this one got: set holds the test flags given to it
// (without "test."), race whether it was built with the race detector.
func goTestFlags(set map[string]string, race bool) []string {
	var args []string
	if race {
		args = append(args, "-race")
	}
	for _, name := range []string{"count", "short", "failfast", "timeout", "v"} {
		v, ok := set[name]
		switch {
		case !ok:
		case name == "v" && v != "true": // test2json under go test -json: not for this output
		case v == "true":
			args = append(args, "-"+name)
		case v != "false":
			args = append(args, "-"+name+"="+v)
		}
	}
	return args
}

// TestModules: every other module of the workspace passes its tests.
func TestModules(t *testing.T) {
	if skipped != "" {
		t.Skip(skipped)
	}
	recordInputs(t, root)
	if len(runs) == 0 {
		t.Fatal("the workspace lists no module but the root: go.work names cmd/vram and deploy/kubernetes")
	}
	for _, r := range runs {
		t.Run(r.dir, func(t *testing.T) {
			if r.err != nil {
				t.Fatalf("go test ./... in %s: %v\n%s", r.dir, r.err, r.out)
			}
			for _, line := range bytes.Split(bytes.TrimSpace(r.out), []byte("\n")) {
				if testing.Verbose() || bytes.HasPrefix(line, []byte("ok")) {
					t.Log(string(line))
				}
			}
		})
	}
}

// recordInputs opens every file under root but .git's, and reads every
// environment variable: go test caches this package's result on what its
// tests read, and the other modules' tests read any of them.
func recordInputs(t *testing.T, root string) {
	t.Helper()
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		_ = os.Getenv(k)
	}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		switch {
		case err != nil:
			return err
		case d.IsDir() && d.Name() == ".git":
			return filepath.SkipDir
		case !d.Type().IsRegular():
			return nil
		}
		f, err := os.Open(path)
		if err != nil {
			return err
		}
		return f.Close()
	})
	if err != nil {
		t.Fatalf("record the repository's files: %v", err)
	}
}

// TestGoTestFlags: the flags another module's tests get are the ones this
// binary was given, in go test's spelling.
func TestGoTestFlags(t *testing.T) {
	tests := map[string]struct {
		set  map[string]string
		race bool
		want string
	}{
		"none":        {set: map[string]string{}, want: ""},
		"race":        {set: map[string]string{"timeout": "10m0s"}, race: true, want: "-race -timeout=10m0s"},
		"as CI gives": {set: map[string]string{"count": "1", "timeout": "30m0s", "paniconexit0": "true"}, race: true, want: "-race -count=1 -timeout=30m0s"},
		"short, v":    {set: map[string]string{"short": "true", "v": "true", "failfast": "false"}, want: "-short -v"},
		"under -json": {set: map[string]string{"v": "test2json"}, want: ""},
		"run ignored": {set: map[string]string{"run": "TestModules", "count": "3"}, want: "-count=3"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if got := strings.Join(goTestFlags(tc.set, tc.race), " "); got != tc.want {
				t.Errorf("goTestFlags(%v, %v) = %q; want %q", tc.set, tc.race, got, tc.want)
			}
		})
	}
}

func TestRunsTest(t *testing.T) {
	tests := map[string]struct {
		pattern string
		want    bool
	}{
		"every test":     {"", true},
		"this one":       {"TestModules", true},
		"a subtest":      {"TestModules/cmd", true},
		"another":        {"TestGoTestFlags", false},
		"none":           {"^$", false},
		"an alternation": {"TestX|Modules", true},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if got := runsTest(tc.pattern, "TestModules"); got != tc.want {
				t.Errorf("runsTest(%q) = %v; want %v", tc.pattern, got, tc.want)
			}
		})
	}
}
