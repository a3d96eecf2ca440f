package main

// The library as its users meet it: built with go build -buildmode=c-shared
// into a temporary directory, loaded by a C harness (testdata/harness.c)
// and a C++ one (testdata/torch_harness.cc) compiled here, and by the
// Python package's tests (python/tests) under the system's python3. Each
// test skips, saying why, when what it needs is missing: a C compiler (the
// library), a C++ compiler (PyTorch's hook, libvram_torch.so), python3,
// numba.
//
// This file uses nothing of the package's cgo code, so it also runs, and
// skips, in a build without cgo.

import (
	"bytes"
	"debug/elf"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vramkit/vram/internal/brokertest"
)

var (
	buildOnce sync.Once
	buildDir  string
	buildLib  string
	buildErr  error
	buildSkip string
)

func TestMain(m *testing.M) {
	code := m.Run()
	if buildDir != "" {
		os.RemoveAll(buildDir)
	}
	os.Exit(code)
}

// library builds libvram once for the package's tests, or skips.
func library(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		if runtime.GOOS != "linux" {
			buildSkip = "the harnesses are for Linux (fork, dlopen, LD_LIBRARY_PATH)"
			return
		}
		if _, err := exec.LookPath("gcc"); err != nil {
			buildSkip = "gcc not found: libvram needs a C compiler (cgo)"
			return
		}
		goTool := filepath.Join(runtime.GOROOT(), "bin", "go")
		if _, err := os.Stat(goTool); err != nil {
			if goTool, err = exec.LookPath("go"); err != nil {
				buildSkip = "no go command to build the library with"
				return
			}
		}
		buildDir, buildErr = os.MkdirTemp("", "libvram-test-")
		if buildErr != nil {
			return
		}
		buildLib = filepath.Join(buildDir, "libvram.so")
		var soname string
		if soname, buildErr = sonameOf("vram.h"); buildErr != nil {
			return
		}
		cmd := exec.Command(goTool, "build", "-buildmode=c-shared", "-ldflags=-extldflags=-Wl,-soname,"+soname, "-o", buildLib, ".")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=1")
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = errors.New("go build -buildmode=c-shared: " + err.Error() + "\n" + string(out))
			return
		}
		buildErr = os.Symlink("libvram.so", filepath.Join(buildDir, soname))
	})
	if buildSkip != "" {
		t.Skip(buildSkip)
	}
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return buildLib
}

// hookLib is one of the C++ hook libraries beside libvram.so, built once.
type hookLib struct {
	name, src, what string
	once            sync.Once
	path            string
	err             error
}

var (
	torchHook = &hookLib{name: "libvram_torch.so", src: "torch/vram_torch.cc", what: "PyTorch's hook"}
	cupyHook  = &hookLib{name: "libvram_cupy.so", src: "cupy/vram_cupy.cc", what: "CuPy's C hook"}
)

// build builds h beside the library, or returns "" and why not.
func (h *hookLib) build(t *testing.T) (path, why string) {
	t.Helper()
	lib := library(t)
	if _, err := exec.LookPath("g++"); err != nil {
		return "", "g++ not found: " + h.what + " (" + h.name + ") is C++"
	}
	h.once.Do(func() {
		out := filepath.Join(buildDir, h.name)
		b, err := exec.Command("g++", "-shared", "-fPIC", "-O2", "-Wall", "-Wextra", "-Werror", "-I", ".", "-o", out,
			h.src, "-L", filepath.Dir(lib), "-l:libvram.so", "-Wl,-rpath,$ORIGIN").CombinedOutput()
		if err != nil {
			h.err = errors.New("building " + h.name + ": " + err.Error() + "\n" + string(b))
			return
		}
		h.path = out
	})
	if h.err != nil {
		t.Fatal(h.err)
	}
	return h.path, ""
}

// torchLibrary builds libvram_torch.so beside the library, or returns ""
// and why not.
func torchLibrary(t *testing.T) (path, why string) { return torchHook.build(t) }

// compile builds a harness with tool (gcc or g++) into the build directory.
func compile(t *testing.T, tool, src, name string, libs ...string) string {
	t.Helper()
	out := filepath.Join(buildDir, name)
	args := append([]string{"-Wall", "-Wextra", "-Werror", "-O1", "-o", out, src}, libs...)
	if b, err := exec.Command(tool, args...).CombinedOutput(); err != nil {
		t.Fatalf("%s %s: %v\n%s", tool, src, err, b)
	}
	return out
}

// runHarness runs a harness and reports each "not ok" line as a failure.
func runHarness(t *testing.T, env []string, bin string, args ...string) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	for _, line := range strings.Split(string(out), "\n") {
		if strings.HasPrefix(line, "not ok") {
			t.Error(line)
		}
	}
	if err != nil || !bytes.Contains(out, []byte("# 0 failures")) {
		t.Fatalf("%s %v: %v\n%s", filepath.Base(bin), args, err, out)
	}
	if testing.Verbose() {
		t.Logf("%s", out)
	}
}

// TestHarness: every entry point with good and bad arguments, threads,
// a fork, the signal handlers and dlclose, on the simulator.
func TestHarness(t *testing.T) {
	lib := library(t)
	bin := compile(t, "gcc", "testdata/harness.c", "harness", "-ldl", "-lpthread")
	args := []string{lib, "sim"}
	if torch, why := torchLibrary(t); torch != "" {
		args = append(args, torch)
	} else {
		t.Log(why + ": the harness checks the other hooks")
	}
	runHarness(t, nil, bin, args...)
}

// TestHarnessCUDA: the same library on the stand-in CUDA driver, as a
// framework's thread would call it: its context put back after every
// call, its stream borrowed and never destroyed, a second context of the
// GPU refused.
func TestHarnessCUDA(t *testing.T) {
	lib := library(t)
	bin := compile(t, "gcc", "testdata/harness.c", "harness", "-ldl", "-lpthread")
	fake := filepath.Join(buildDir, "fakecuda")
	if err := os.MkdirAll(fake, 0o755); err != nil {
		t.Fatal(err)
	}
	if b, err := exec.Command("gcc", "-shared", "-fPIC", "-O1", "-o", filepath.Join(fake, "libcuda.so.1"),
		"../device/cuda/testdata/fakecuda.c", "-lpthread").CombinedOutput(); err != nil {
		t.Fatalf("building the stand-in driver: %v\n%s", err, b)
	}
	runHarness(t, []string{"LD_LIBRARY_PATH=" + fake}, bin, lib, "cuda")
}

// TestTorchHook: PyTorch's way of calling the hooks, through std::function;
// a refusal is a C++ exception with vram's message.
func TestTorchHook(t *testing.T) {
	lib := library(t)
	torch, why := torchLibrary(t)
	if torch == "" {
		t.Skip(why)
	}
	bin := compile(t, "g++", "testdata/torch_harness.cc", "torch_harness", "-ldl")
	runHarness(t, nil, bin, lib, torch)
}

// TestCupyHook: CuPy's way of calling its C hooks, through function
// pointers, the malloc in a C++ try as Cython compiles `except +`: a
// refusal is a C++ exception (std::bad_alloc when out of memory, for
// Python's MemoryError), never NULL.
func TestCupyHook(t *testing.T) {
	lib := library(t)
	cupy, why := cupyHook.build(t)
	if cupy == "" {
		t.Skip(why)
	}
	bin := compile(t, "g++", "testdata/cupy_harness.cc", "cupy_harness", "-ldl")
	runHarness(t, nil, bin, lib, cupy)
}

// sonameOf is the library's SONAME, libvram.so.N with N the header's
// VRAM_ABI_VERSION: what a library or program linked against it records
// and asks the loader for. scripts/build-libvram.sh reads it so too.
func sonameOf(header string) (string, error) {
	b, err := os.ReadFile(header)
	if err != nil {
		return "", err
	}
	m := regexp.MustCompile(`(?m)^#define VRAM_ABI_VERSION (\d+)`).FindSubmatch(b)
	if m == nil {
		return "", errors.New(header + " defines no VRAM_ABI_VERSION")
	}
	return "libvram.so." + string(m[1]), nil
}

// TestSoname: the library names itself by its ABI version, as the script
// that builds it for users does, and the link of that name beside it
// reaches it.
func TestSoname(t *testing.T) {
	lib := library(t)
	want, err := sonameOf("vram.h")
	if err != nil {
		t.Fatal(err)
	}
	f, err := elf.Open(lib)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	names, err := f.DynString(elf.DT_SONAME)
	if err != nil || len(names) != 1 || names[0] != want {
		t.Errorf("DT_SONAME = %q, %v; want %q", names, err, want)
	}
	out := t.TempDir()
	if b, err := exec.Command("bash", "../scripts/build-libvram.sh", out).CombinedOutput(); err != nil {
		t.Fatalf("scripts/build-libvram.sh: %v\n%s", err, b)
	}
	g, err := elf.Open(filepath.Join(out, want)) // through the link
	if err != nil {
		t.Fatalf("scripts/build-libvram.sh left no %s: %v", want, err)
	}
	defer g.Close()
	if names, err := g.DynString(elf.DT_SONAME); err != nil || len(names) != 1 || names[0] != want {
		t.Errorf("scripts/build-libvram.sh built a library whose DT_SONAME is %q, %v; want %q", names, err, want)
	}
}

// TestNoDelete: Go's linker marks the library -z nodelete, so that no
// dlclose unloads the Go runtime (the harness checks the behaviour).
func TestNoDelete(t *testing.T) {
	f, err := elf.Open(library(t))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	flags, err := f.DynValue(elf.DT_FLAGS_1)
	if err != nil {
		t.Fatal(err)
	}
	if len(flags) == 0 || flags[0]&uint64(elf.DF_1_NODELETE) == 0 {
		t.Errorf("DT_FLAGS_1 = %#x; want DF_1_NODELETE", flags)
	}
}

// exports lists the functions a shared library defines.
func exports(t *testing.T, path string) map[string]bool {
	t.Helper()
	f, err := elf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	syms, err := f.DynamicSymbols()
	if err != nil {
		t.Fatal(err)
	}
	exported := map[string]bool{}
	for _, s := range syms {
		if s.Section != elf.SHN_UNDEF && elf.ST_TYPE(s.Info) == elf.STT_FUNC {
			exported[s.Name] = true
		}
	}
	return exported
}

// TestHeaderExported: every function vram.h declares is exported by
// libvram.so, or, for those the header marks as a C++ hook library's
// (libvram_torch.so, libvram_cupy.so), by that library (a name in the
// header a library lacks would be found only by a framework's dlsym, at
// run time).
func TestHeaderExported(t *testing.T) {
	exported := exports(t, library(t))
	hooks := map[string]map[string]bool{} // library → its exports, nil when it cannot be built here
	for _, h := range []*hookLib{torchHook, cupyHook} {
		if path, why := h.build(t); path != "" {
			hooks[h.name] = exports(t, path)
		} else {
			t.Logf("%s not checked: %s", h.name, why)
			hooks[h.name] = nil
		}
	}
	header, err := os.ReadFile("vram.h")
	if err != nil {
		t.Fatal(err)
	}
	decls := regexp.MustCompile(`(?m)^[a-z][\w \*]*?\b(vram_\w+)\(.*;( /\* (libvram_\w+\.so) \*/)?$`).FindAllSubmatch(header, -1)
	if len(decls) < 20 {
		t.Fatalf("found %d declarations in vram.h; the pattern is stale", len(decls))
	}
	for _, d := range decls {
		name, in := string(d[1]), string(d[3])
		hook, known := hooks[in]
		switch {
		case in == "" && !exported[name]:
			t.Errorf("vram.h declares %s; libvram.so does not export it", name)
		case in == "":
		case !known:
			t.Errorf("vram.h puts %s in %s, which is no library of libvram's", name, in)
		case exported[name]:
			t.Errorf("vram.h puts %s in %s; libvram.so exports one too", name, in)
		case hook != nil && !hook[name]:
			t.Errorf("vram.h declares %s in %s; it does not export it", name, in)
		}
	}
	if exported["vram_hook_alloc_"] {
		t.Error("the internal vram_hook_alloc_ is exported")
	}
}

// TestPython runs the Python package's tests (python/tests) under the
// system's python3 against the library: the package over ctypes, the
// stats, peaks, trim and cap, and the Numba EMM plugin class against the
// installed numba (those tests skip, saying so, without it).
func TestPython(t *testing.T) {
	lib := library(t)
	py := "/usr/bin/python3"
	if _, err := os.Stat(py); err != nil {
		if py, err = exec.LookPath("python3"); err != nil {
			t.Skip("no python3")
		}
	}
	root, err := filepath.Abs("../python")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(py, "-m", "unittest", "discover", "-v", "-s", filepath.Join(root, "tests"))
	cmd.Env = append(os.Environ(), "VRAM_LIBRARY="+lib, "PYTHONPATH="+root, "PYTHONDONTWRITEBYTECODE=1", "VRAM_DEVICE=")
	// A broker of a shared simulated device of 64 MiB, for the lease tests.
	spec := "sim:shared=libvram" + strconv.Itoa(os.Getpid()) + ",vram=64MiB,context=0,dir=" + t.TempDir()
	socket := brokertest.Serve(t, spec, 64<<20, 300*time.Millisecond)
	cmd.Env = append(cmd.Env, "VRAM_TEST_BROKER="+socket, "VRAM_TEST_BROKER_SPEC="+spec)
	if torch, why := torchLibrary(t); torch != "" {
		cmd.Env = append(cmd.Env, "VRAM_TORCH_LIBRARY="+torch)
	} else {
		t.Log(why)
	}
	if cupy, why := cupyHook.build(t); cupy != "" {
		cmd.Env = append(cmd.Env, "VRAM_CUPY_LIBRARY="+cupy)
	} else {
		t.Log(why)
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("python3 -m unittest: %v\n%s", err, out)
	}
	for _, line := range strings.Split(string(out), "\n") {
		if strings.Contains(line, "skipped") {
			t.Log(strings.TrimSpace(line))
		}
	}
	if testing.Verbose() {
		t.Logf("%s", out)
	}
}
