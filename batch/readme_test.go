package batch_test

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// readmeProgramLines is the most lines the README's program may take: a
// two-client batch bigger than the GPU, every error handled.
const readmeProgramLines = 60

// TestREADMEProgram builds and runs the README's Go program (its ```go
// block that starts with "package main" and makes a batch) as written,
// and compares what it prints with what the README says it prints. The
// program keeps to readmeProgramLines lines.
func TestREADMEProgram(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs a program: not with -short")
	}
	goTool := filepath.Join(runtime.GOROOT(), "bin", "go")
	if _, err := os.Stat(goTool); err != nil {
		t.Skipf("no go command to build the README's program with: %v", err)
	}
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	prog, want := readmeProgram(t, string(readme))
	if n := strings.Count(prog, "\n"); n > readmeProgramLines {
		t.Errorf("the README's program takes %d lines; keep it to %d", n, readmeProgramLines)
	}
	// In a directory of this module, so that it builds against this
	// checkout's packages; its leading dot keeps it out of ./... patterns.
	dir, err := os.MkdirTemp(".", ".readme-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.WriteFile(filepath.Join(dir, "main.go"), []byte(prog), 0o644); err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	cmd := exec.Command(goTool, "run", "./"+filepath.ToSlash(dir))
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("go run the README's program: %v\n%s", err, stderr.String())
	}
	if got := stdout.String(); got != want {
		t.Errorf("the README's program printed\n%s\nthe README says it prints\n%s", got, want)
	}
}

// readmeProgram finds the README's batch program and the output block
// after it.
func readmeProgram(t *testing.T, readme string) (prog, output string) {
	t.Helper()
	const open, end = "```go\npackage main\n", "```\n"
	for rest := readme; ; {
		i := strings.Index(rest, open)
		if i < 0 {
			t.Fatal("the README has no ```go block that starts with package main and makes a batch")
		}
		rest = rest[i+len("```go\n"):]
		prog, after, ok := strings.Cut(rest, end)
		if !ok || !strings.Contains(prog, "batch.New()") {
			continue
		}
		_, printed, ok := strings.Cut(after, "It prints `")
		if !ok {
			t.Fatal("the README's batch program has no \"It prints `…`\" after it")
		}
		output, _, _ = strings.Cut(printed, "`")
		return prog, output + "\n"
	}
}
