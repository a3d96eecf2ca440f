package main

// The client API (vram.h, ABI 2) as its users meet it: from C, a harness
// linked against the library (testdata/client_harness.c); from Python,
// under Numba's CUDA simulator, the package's own tests of it
// (python/tests/test_cudasim.py) and the example of docs/python.md, which
// docs/frameworks.md shows. Like libvram_test.go, this file uses
// no cgo, and each test skips, saying why, without what it needs.

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestClientHarness: the client API from C, on the simulator.
func TestClientHarness(t *testing.T) {
	lib := library(t)
	dir := filepath.Dir(lib)
	bin := compile(t, "gcc", "testdata/client_harness.c", "client_harness", "-L", dir, "-l:libvram.so", "-Wl,-rpath,"+dir, "-lpthread")
	runHarness(t, nil, bin)
}

// python is the system's python3 with numba, or a skip.
func python(t *testing.T) string {
	t.Helper()
	py := "/usr/bin/python3"
	if _, err := os.Stat(py); err != nil {
		if py, err = exec.LookPath("python3"); err != nil {
			t.Skip("no python3")
		}
	}
	if err := exec.Command(py, "-c", "import numba, numpy").Run(); err != nil {
		t.Skip("python3 has no numba or numpy (Debian: python3-numba): the Numba simulator's tests need them")
	}
	return py
}

// runPython runs python3 with args under Numba's CUDA simulator against
// the library, in dir, and returns its output.
func runPython(t *testing.T, lib, dir string, args ...string) string {
	t.Helper()
	root, err := filepath.Abs("../python")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(python(t), args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "VRAM_LIBRARY="+lib, "PYTHONPATH="+root, "PYTHONDONTWRITEBYTECODE=1", "VRAM_DEVICE=",
		"NUMBA_ENABLE_CUDASIM=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("python3 %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// TestPythonCUDASim runs python/tests/test_cudasim.py under Numba's CUDA
// simulator: vram's arrays as Numba's, kernels on them, vram.Batch.
func TestPythonCUDASim(t *testing.T) {
	lib := library(t)
	root, err := filepath.Abs("../python/tests")
	if err != nil {
		t.Fatal(err)
	}
	out := runPython(t, lib, root, "-m", "unittest", "-v", "test_cudasim")
	for _, line := range strings.Split(out, "\n") {
		if strings.Contains(line, "skipped") {
			t.Log(strings.TrimSpace(line))
		}
	}
	if testing.Verbose() {
		t.Logf("%s", out)
	}
}

// TestPythonExample runs the example of docs/python.md, the batch bigger
// than the simulated GPU, as a user would: the code block as it is.
func TestPythonExample(t *testing.T) {
	lib := library(t)
	doc, err := os.ReadFile("../docs/python.md")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile("(?s)<!-- example: batch -->\n```python\n(.*?)```").FindSubmatch(doc)
	if m == nil {
		t.Fatal("docs/python.md has no ```python block after <!-- example: batch -->")
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "example.py"), m[1], 0o644); err != nil {
		t.Fatal(err)
	}
	out := runPython(t, lib, dir, "example.py")
	if !strings.Contains(out, "chunks") {
		t.Errorf("the example printed %q; want its chunks", out)
	}
	t.Logf("the example (%d lines) printed: %s", strings.Count(string(m[1]), "\n"), out)
}
