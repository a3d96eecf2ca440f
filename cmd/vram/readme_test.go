package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"
	"time"
)

// The README's commands, each run somewhere that checks it: the shell
// blocks marked <!-- run --> by TestREADMECommands below (their output
// compared with the text block after them), the Go program by batch's
// TestREADMEProgram, the Python example by libvram's TestREADMEPython,
// and the rest by CI, as readmeElsewhere says where.

// readmeElsewhere is each README command that no test here runs, with the
// file that runs it and what that file says to run it.
var readmeElsewhere = map[string]struct{ file, has string }{
	"go run ./cmd/vram run": {".ci/run", "go run ./cmd/vram run"},
	"go test -race ./...":   {".ci/run", "go test -race ./..."},
	"go install ./cmd/vram": {".ci/run", "go install ./cmd/vram"},
	"pip install ./python":  {"scripts/pip-install.sh", "pip install --no-build-isolation --no-cache-dir --target \"$dir/site\" ./python"},
}

// readmeBlock is a fenced shell block of the README, and the text block
// right after it (what it prints), if any.
type readmeBlock struct {
	line   int // of its opening fence, from 1
	run    bool
	script string
	output *string
}

// readmeBlocks finds the README's shell blocks: those after a line
// <!-- run --> are to be run.
func readmeBlocks(readme string) []readmeBlock {
	lines := strings.Split(readme, "\n")
	var blocks []readmeBlock
	marked := false
	for i := 0; i < len(lines); i++ {
		l := lines[i]
		switch {
		case l == "<!-- run -->":
			marked = true
		case l == "```sh":
			b := readmeBlock{line: i + 1, run: marked}
			b.script, i = fenced(lines, i+1)
			j := i + 1
			for j < len(lines) && lines[j] == "" {
				j++
			}
			if j < len(lines) && lines[j] == "```text" {
				out, end := fenced(lines, j+1)
				b.output, i = &out, end
			}
			blocks = append(blocks, b)
			marked = false
		case strings.HasPrefix(l, "```"):
			_, i = fenced(lines, i+1)
		}
	}
	return blocks
}

// fenced returns the text of a fenced block from line i to its closing
// fence, and the index of that fence.
func fenced(lines []string, i int) (string, int) {
	start := i
	for i < len(lines) && lines[i] != "```" {
		i++
	}
	if i == len(lines) {
		return strings.Join(lines[start:], "\n"), i
	}
	return strings.Join(lines[start:i], "\n") + "\n", i
}

// TestREADMECommands runs the README's marked shell blocks with bash, in a
// directory of their own, with the vram command this checkout builds on
// the PATH and the simulator as the default device, and compares what each prints with the text block after it:
// a line "…" there stands for any lines, and "…" within a line for any
// text. Every other command of the README must be one that CI runs
// (readmeElsewhere).
func TestREADMECommands(t *testing.T) {
	if testing.Short() {
		t.Skip("builds vram and runs the README's commands: not with -short")
	}
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	blocks := readmeBlocks(string(readme))
	var ran int
	for _, b := range blocks {
		if !b.run {
			checkElsewhere(t, b)
		}
	}
	bin := buildVram(t)
	for _, b := range blocks {
		if !b.run {
			continue
		}
		ran++
		got := runReadmeBlock(t, b, bin)
		if b.output != nil && !linesMatch(strings.Split(strings.TrimSuffix(*b.output, "\n"), "\n"), strings.Split(strings.TrimSuffix(got, "\n"), "\n")) {
			t.Errorf("README line %d: the block printed\n%s\nwhere the README shows\n%s", b.line, got, *b.output)
		}
	}
	if ran == 0 {
		t.Error("the README has no block marked <!-- run -->")
	}
}

// checkElsewhere checks that each command of an unmarked block is run by
// the file readmeElsewhere names.
func checkElsewhere(t *testing.T, b readmeBlock) {
	t.Helper()
	for _, l := range strings.Split(strings.TrimSpace(b.script), "\n") {
		cmd, _, _ := strings.Cut(l, "#")
		cmd = strings.TrimSpace(cmd)
		where, ok := readmeElsewhere[cmd]
		if !ok {
			t.Errorf("README line %d: %q is run by no test and no CI step: mark its block <!-- run --> or add it to readmeElsewhere", b.line, cmd)
			continue
		}
		text, err := os.ReadFile(filepath.Join("../..", where.file))
		if err != nil || !strings.Contains(string(text), where.has) {
			t.Errorf("README line %d: %q should be run by %s, which does not say %q (%v)", b.line, cmd, where.file, where.has, err)
		}
	}
}

// buildVram builds the vram command into a directory of its own.
func buildVram(t *testing.T) string {
	t.Helper()
	goTool := filepath.Join(runtime.GOROOT(), "bin", "go")
	if _, err := os.Stat(goTool); err != nil {
		t.Skipf("no go command to build vram with: %v", err)
	}
	bin := t.TempDir()
	if out, err := exec.Command(goTool, "build", "-o", filepath.Join(bin, "vram"), ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// runReadmeBlock runs b's script with bash -e, as a user's shell would,
// and returns its stdout.
func runReadmeBlock(t *testing.T, b readmeBlock, bin string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	dir := t.TempDir()
	cmd := exec.CommandContext(ctx, "bash", "-e", "-c", b.script)
	cmd.Dir = dir
	// On the simulator even where a GPU is, as the README's output is.
	cmd.Env = append(os.Environ(), "PATH="+bin+string(os.PathListSeparator)+os.Getenv("PATH"), "TMPDIR="+dir,
		"VRAM_DEVICE=sim", "VRAM_BROKER=", "VRAM_ALLOC_CONF=", "VRAM_SIM_DIR=")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("README line %d: bash: %v\nstdout:\n%s\nstderr:\n%s", b.line, err, stdout.String(), stderr.String())
	}
	return stdout.String()
}

// linesMatch reports whether got matches want line by line, a want line
// "…" matching any lines (none too), and "…" within a line any text.
func linesMatch(want, got []string) bool {
	if len(want) == 0 {
		return len(got) == 0
	}
	if want[0] == "…" {
		for i := 0; i <= len(got); i++ {
			if linesMatch(want[1:], got[i:]) {
				return true
			}
		}
		return false
	}
	return len(got) > 0 && lineMatches(want[0], got[0]) && linesMatch(want[1:], got[1:])
}

// lineMatches reports whether got matches want, "…" in want matching any
// text.
func lineMatches(want, got string) bool {
	parts := strings.Split(want, "…")
	for i, p := range parts {
		parts[i] = regexp.QuoteMeta(p)
	}
	return regexp.MustCompile("^" + strings.Join(parts, ".*") + "$").MatchString(got)
}

// TestLinesMatch: the README's output blocks against what was printed.
func TestLinesMatch(t *testing.T) {
	for name, tc := range map[string]struct {
		want, got string
		ok        bool
	}{
		"same":                 {"a\nb", "a\nb", true},
		"a line differs":       {"a\nb", "a\nc", false},
		"one more line":        {"a", "a\nb", false},
		"any lines":            {"a\n…\nd", "a\nb\nc\nd", true},
		"no lines":             {"a\n…\nd", "a\nd", true},
		"any text":             {"device … 256 MiB", "device sim:0 (auto) 256 MiB", true},
		"any text, not a line": {"device … 256 MiB", "device sim:0 64 MiB", false},
		"regexp characters":    {"a (b) [c]", "a (b) [c]", true},
	} {
		t.Run(name, func(t *testing.T) {
			if got := linesMatch(strings.Split(tc.want, "\n"), strings.Split(tc.got, "\n")); got != tc.ok {
				t.Errorf("linesMatch(%q, %q) = %v", tc.want, tc.got, got)
			}
		})
	}
}
