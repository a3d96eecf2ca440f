package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestREADMEPython runs the README's Python example as a user would after
// pip install ./python: the block as written, under python3, with the
// library and the package where the install puts them, and no Numba
// simulator asked for; it prints what the README says it prints.
func TestREADMEPython(t *testing.T) {
	lib := library(t)
	py := python(t)
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile("(?s)\n```python\n(.*?)```\n\nIt prints `([^`]*)`").FindSubmatch(readme)
	if m == nil {
		t.Fatal("the README has no ```python block followed by \"It prints `…`\"")
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "example.py"), m[1], 0o644); err != nil {
		t.Fatal(err)
	}
	root, err := filepath.Abs("../python")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(py, "example.py")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "VRAM_LIBRARY="+lib, "PYTHONPATH="+root, "PYTHONDONTWRITEBYTECODE=1", "VRAM_DEVICE=",
		"NUMBA_ENABLE_CUDASIM=")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("python3 example.py: %v\n%s", err, out)
	}
	if got := strings.TrimSpace(string(out)); got != string(m[2]) {
		t.Errorf("the README's Python example printed %q; the README says %q", got, m[2])
	}
}
