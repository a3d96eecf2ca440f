// Command gate measures the project's gated figures and holds them to
// the committed file (.ci/gates.json): it runs the TestGate… tests of
// every package that has one, compares what they measured with the file,
// and checks the file's history (package gate says the rules). .ci/run
// runs it; run it by hand from the module's root:
//
//	go run ./internal/gate/cmd/gate                      # check
//	go run ./internal/gate/cmd/gate -update -why "…"     # take the figures measured into the file
//	go run ./internal/gate/cmd/gate -pkg ./alloc         # part of the gate (figures of the others stay)
//
// It exits 1 when a figure is worse than the file, a figure is measured
// that the file lacks or one in the file is not measured, a gate test
// fails, or a change of the file made a figure worse without saying why;
// 2 on bad usage.
package main

import (
	"bufio"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/vramkit/vram/internal/gate"
)

func main() {
	err := run(os.Args[1:], os.Stdout)
	var u usageError
	switch {
	case errors.As(err, &u):
		fmt.Fprintln(os.Stderr, "gate:", err)
		os.Exit(2)
	case err != nil:
		fmt.Fprintln(os.Stderr, "gate: FAIL:", err)
		os.Exit(1)
	}
}

type usageError struct{ error }

// options are the command's flags.
type options struct {
	file    string // the gates file, from the module's root
	update  bool
	why     string
	pkgs    string // comma-separated packages; "": every package with a gate test
	verbose bool
}

func run(args []string, out io.Writer) error {
	var o options
	fl := flag.NewFlagSet("gate", flag.ContinueOnError)
	fl.SetOutput(out)
	fl.StringVar(&o.file, "file", ".ci/gates.json", "the gates file, relative to the module's root")
	fl.BoolVar(&o.update, "update", false, "write the figures measured into the file (worse ones need -why)")
	fl.StringVar(&o.why, "why", "", "with -update: why the figures that get worse do (kept with each)")
	fl.StringVar(&o.pkgs, "pkg", "", "comma-separated packages to measure (default: every package with a TestGate test); figures of the others are not checked")
	fl.BoolVar(&o.verbose, "v", false, "print every figure, not only those that changed")
	if err := fl.Parse(args); err != nil {
		return usageError{err}
	}
	if fl.NArg() > 0 {
		return usageError{fmt.Errorf("unexpected arguments %q", fl.Args())}
	}
	if o.why != "" && !o.update {
		return usageError{errors.New("-why goes with -update")}
	}
	root, err := moduleRoot()
	if err != nil {
		return err
	}
	path := filepath.Join(root, o.file)
	pkgs, err := gatePackages(root, o.pkgs)
	if err != nil {
		return err
	}
	got, terr := measure(root, pkgs, out)
	if got == nil && terr != nil {
		return terr
	}
	kept, err := gate.Read(path)
	if errors.Is(err, fs.ErrNotExist) && o.update {
		kept, err = gate.File{About: about}, nil
	}
	if err != nil {
		return err
	}
	partial := o.pkgs != ""
	if o.update {
		if terr != nil {
			return fmt.Errorf("not updating %s: %w", o.file, terr)
		}
		return update(path, kept, got, o, partial, out)
	}
	ferr := report(gate.Compare(kept, got), partial || terr != nil, o.verbose, out)
	return errors.Join(terr, ferr, history(path, out))
}

// about is the file's own description, written when -update makes it.
const about = "The project's gated figures (package internal/gate): measured by the TestGate tests, checked by go run ./internal/gate/cmd/gate in .ci/run. A figure may get worse only in a commit that updates it here with a new why (-update -why)."

// moduleRoot is the folder of the go.work the go command uses here, or
// of its go.mod where there is no workspace.
func moduleRoot() (string, error) {
	out, err := exec.Command("go", "env", "GOWORK", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOWORK GOMOD: %w", err)
	}
	for _, f := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if f = strings.TrimSpace(f); f != "" && f != "off" && f != os.DevNull {
			return filepath.Dir(f), nil
		}
	}
	return "", usageError{errors.New("not in a Go module: run it from the vram repository")}
}

// workspaceModules lists the folders of the modules the go command builds
// here (the workspace's, or the one module).
func workspaceModules(root string) (map[string]bool, error) {
	cmd := exec.Command("go", "list", "-m", "-f", "{{.Dir}}")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("go list -m: %w", err)
	}
	mods := map[string]bool{}
	for _, d := range strings.Fields(string(out)) {
		mods[filepath.Clean(d)] = true
	}
	return mods, nil
}

var gateTest = regexp.MustCompile(`(?m)^func TestGate\w*\(`)

// gatePackages lists the packages (as ./dir) whose tests have a TestGate
// function, or checks those asked for.
func gatePackages(root, asked string) ([]string, error) {
	if asked != "" {
		return strings.Split(asked, ","), nil
	}
	mods, err := workspaceModules(root)
	if err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	var pkgs []string
	err = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if d.IsDir() {
			if p != root && (strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_") || name == "testdata" || name == "vendor") {
				return filepath.SkipDir
			}
			if _, err := os.Stat(filepath.Join(p, "go.mod")); p != root && err == nil && !mods[filepath.Clean(p)] {
				return filepath.SkipDir // a module outside the workspace
			}
			return nil
		}
		dir := filepath.Dir(p)
		if !strings.HasSuffix(name, "_test.go") || seen[dir] {
			return nil
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		if gateTest.Match(data) {
			seen[dir] = true
			rel, _ := filepath.Rel(root, dir)
			pkgs = append(pkgs, "./"+filepath.ToSlash(rel))
		}
		return nil
	})
	if err == nil && len(pkgs) == 0 {
		err = errors.New("no package has a TestGate test")
	}
	return pkgs, err
}

// measure runs the packages' gate tests and collects their figures: those
// recorded even when a test failed (its assertion is then beside the
// comparison), and an error saying the tests failed.
func measure(root string, pkgs []string, out io.Writer) ([]gate.Figure, error) {
	dir, err := os.MkdirTemp("", "vram-gate-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	args := append([]string{"test", "-count=1", "-v", "-run", "^TestGate", "-timeout", "30m"}, pkgs...)
	fmt.Fprintf(out, "== go %s\n", strings.Join(args, " "))
	cmd := exec.Command("go", args...)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), gate.OutEnv+"="+dir)
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = pw, pw
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	done := make(chan struct{})
	go func() { filterTestOutput(pr, out); close(done) }()
	werr := cmd.Wait()
	pw.Close()
	<-done
	fmt.Fprintf(out, "== the gate's tests took %s\n", time.Since(start).Round(time.Second))
	got, err := gate.Collect(dir)
	if err != nil {
		return nil, err
	}
	if werr != nil {
		return got, fmt.Errorf("the gate's tests failed (above): %w", werr)
	}
	return got, nil
}

// filterTestOutput copies go test -v's output without its === lines.
func filterTestOutput(r io.Reader, w io.Writer) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if line := sc.Text(); !strings.HasPrefix(strings.TrimSpace(line), "=== ") {
			fmt.Fprintln(w, line)
		}
	}
	_, _ = io.Copy(io.Discard, r)
}

// report prints the figures that changed (all with verbose) and fails on
// any worse, new, or not measured (unless partial).
func report(changes []gate.Change, partial, verbose bool, out io.Writer) error {
	count := map[gate.Status]int{}
	var bad []string
	for _, c := range changes {
		if c.Status == gate.Gone && partial {
			continue
		}
		count[c.Status]++
		if c.Status != gate.Same || verbose {
			fmt.Fprintln(out, line(c))
		}
		if c.Status == gate.Worse || c.Status == gate.New || c.Status == gate.Gone {
			bad = append(bad, c.Name)
		}
	}
	fmt.Fprintf(out, "== %d figures: %d same, %d better, %d worse, %d new, %d not measured\n",
		count[gate.Same]+count[gate.Improved]+count[gate.Worse]+count[gate.New]+count[gate.Gone], count[gate.Same], count[gate.Improved], count[gate.Worse], count[gate.New], count[gate.Gone])
	if count[gate.Improved] > 0 {
		fmt.Fprintln(out, "   better figures: keep the gain with -update (no -why needed)")
	}
	if len(bad) > 0 {
		return fmt.Errorf("%d figures worse, new or not measured: %s; if that is meant, run go run ./internal/gate/cmd/gate -update -why \"what changed and why it is worth it\" and commit the file with the change",
			len(bad), strings.Join(bad, ", "))
	}
	return nil
}

// line is one figure's row.
func line(c gate.Change) string {
	switch c.Status {
	case gate.New:
		return fmt.Sprintf("  %-12s %s: %v %s", c.Status, c.Name, c.Got.Value, c.Got.Unit)
	case gate.Gone:
		return fmt.Sprintf("  %-12s %s: %v %s in the file (its test skipped, or no longer records it)", c.Status, c.Name, c.Kept.Value, c.Kept.Unit)
	}
	s := fmt.Sprintf("  %-12s %s: %v → %v %s (%s is better)", c.Status, c.Name, c.Kept.Value, c.Got.Value, c.Got.Unit, c.Kept.Better)
	if c.Kept.Slack > 0 {
		s += fmt.Sprintf(", slack %v", c.Kept.Slack)
	}
	return s
}

// update writes the measured figures into the file.
func update(path string, kept gate.File, got []gate.Figure, o options, partial bool, out io.Writer) error {
	changes := gate.Compare(kept, got)
	_ = report(changes, partial, o.verbose, out)
	next, err := gate.Update(kept, got, o.why, partial)
	if err != nil {
		return usageError{err}
	}
	if err := gate.Write(path, next); err != nil {
		return err
	}
	fmt.Fprintf(out, "== wrote %s: commit it with the change it measures\n", path)
	return nil
}

// history checks the file's changes; a repository git cannot read is
// reported and passes (a source tarball has no history to check).
func history(path string, out io.Writer) error {
	h, err := gate.CheckHistory(path)
	if err != nil {
		fmt.Fprintf(out, "== history not checked: %v\n", err)
		return nil
	}
	fmt.Fprintf(out, "== history: %d changes of the file checked, %d beyond the clone\n", h.Checked, h.Unchecked)
	for _, p := range h.Problems {
		fmt.Fprintln(out, "  ", p)
	}
	if len(h.Problems) > 0 {
		return fmt.Errorf("%d changes of %s made figures worse without saying why", len(h.Problems), filepath.Base(path))
	}
	return nil
}
