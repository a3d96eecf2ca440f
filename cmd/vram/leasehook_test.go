package main

// vram lease's import hook (leasehook/sitecustomize.py) run by Python
// against stand-ins of the frameworks (testdata/frameworks), each with
// the interface the hook uses and the framework's own behaviour where it
// matters: what it reads, what it refuses. The lease is testLease: 3 GiB
// of 12 GiB, a fraction of 0.25.

import (
	"bytes"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// python3 is the interpreter the hook's tests run; the test skips without
// one.
func python3(t *testing.T) string {
	t.Helper()
	for _, p := range []string{"/usr/bin/python3", "python3"} {
		if path, err := exec.LookPath(p); err == nil {
			return path
		}
	}
	t.Skip("no python3: vram lease's import hook is Python (apt-get install -y python3)")
	return ""
}

// standins copies the stand-in frameworks into a new directory, torch's
// version.py saying torchVersion.
func standins(t *testing.T, torchVersion string) string {
	t.Helper()
	dir := t.TempDir()
	src := os.DirFS("testdata/frameworks")
	err := fs.WalkDir(src, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := fs.ReadFile(src, p)
		if err != nil {
			return err
		}
		if p == "torch/version.py" {
			b = []byte("__version__ = '" + torchVersion + "'\ncuda = '12.4'\n")
		}
		if err := os.MkdirAll(filepath.Join(dir, filepath.Dir(p)), 0o755); err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(dir, p), b, 0o644)
	})
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

// hooked runs script with python under testLease's environment, made
// from base (plus PATH) with the hook written for the test and the
// stand-ins and path after it on PYTHONPATH.
func hooked(t *testing.T, torchVersion string, base []string, path []string, script string) (stdout, stderr string) {
	t.Helper()
	py := python3(t)
	hook, err := writeLeaseHook()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(hook) })
	l := testLease
	l.hook = hook
	pp := strings.Join(append([]string{standins(t, torchVersion)}, path...), string(os.PathListSeparator))
	env, _ := leaseEnv(append([]string{"PATH=" + os.Getenv("PATH"), "PYTHONDONTWRITEBYTECODE=1", "PYTHONPATH=" + pp}, base...), l)
	cmd := exec.Command(py, "-c", script)
	cmd.Env = env
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		t.Fatalf("python: %v\nstdout:\n%s\nstderr:\n%s", err, out.String(), errb.String())
	}
	return out.String(), errb.String()
}

// Each framework keeps to the lease by its own mechanism, as the stand-in
// of its interface reports.
func TestLeaseHook(t *testing.T) {
	const torchScript = `import os, torch
torch.cuda.init()
print(torch.cuda.get_per_process_memory_fraction(0), torch.cuda.get_per_process_memory_fraction(1),
      os.environ.get("PYTORCH_CUDA_ALLOC_CONF"), os.environ.get("PYTORCH_ALLOC_CONF"))`
	const tfScript = `import os, tensorflow as tf
gpus = tf.config.list_physical_devices("GPU")
for g in gpus:
    tf.config.experimental.set_memory_growth(g, True)  # a program's own, common line
tf.initialize()
print([tf.config.get_logical_device_configuration(g)[0].memory_limit for g in gpus], os.environ["TF_FORCE_GPU_ALLOW_GROWTH"])`
	const numbaScript = `import numba.cuda
print(numba.cuda.memory_manager)`
	repoPython, err := filepath.Abs("../../python")
	if err != nil {
		t.Fatal(err)
	}
	theirs := t.TempDir() // an installation's own sitecustomize
	if err := os.WriteFile(filepath.Join(theirs, "sitecustomize.py"), []byte("print('their sitecustomize ran')\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := map[string]struct {
		torch  string   // the stand-in's version ("" 2.10.0)
		base   []string // the user's environment
		path   []string // more of PYTHONPATH
		script string
		want   string // stdout
		stderr string // in stderr ("": stderr empty)
	}{
		"torch 2.10: the allocator setting": {script: torchScript,
			want: "0.25 0.25 per_process_memory_fraction:0.25 None\n"},
		// A release before 2.10 stops on the key: the API, when CUDA starts.
		"torch 2.9: the API":  {torch: "2.9.1+cu128", script: torchScript, want: "0.25 0.25 None None\n"},
		"torch 1.13: the API": {torch: "1.13.1", script: torchScript, want: "0.25 0.25 None None\n"},
		"torch: the user's options kept": {base: []string{"PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"}, script: torchScript,
			want: "0.25 0.25 expandable_segments:True,per_process_memory_fraction:0.25 None\n"},
		"torch: a lower fraction stays": {base: []string{"PYTORCH_CUDA_ALLOC_CONF=per_process_memory_fraction:0.125"}, script: torchScript,
			want: "0.125 0.125 per_process_memory_fraction:0.125 None\n"},
		"torch: a higher fraction lowered": {base: []string{"PYTORCH_CUDA_ALLOC_CONF=per_process_memory_fraction:0.9"}, script: torchScript,
			want: "0.25 0.25 per_process_memory_fraction:0.25 None\n"},
		"torch: PYTORCH_ALLOC_CONF": {base: []string{"PYTORCH_ALLOC_CONF=expandable_segments:True"}, script: torchScript,
			want: "0.25 0.25 None expandable_segments:True,per_process_memory_fraction:0.25\n"},
		"torch: cudaMallocAsync, the API": {base: []string{"PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync"}, script: torchScript,
			want: "0.25 0.25 backend:cudaMallocAsync None\n"},
		"torch: the program's own call wins": {torch: "2.9.0", script: `import torch
torch.cuda.set_per_process_memory_fraction(0.5, 0)
print(torch.cuda.get_per_process_memory_fraction(0), torch.cuda.get_per_process_memory_fraction(1))`, want: "0.5 0.25\n"},
		"tensorflow": {script: tfScript, want: "[3072, 3072] true\n"},
		"tensorflow: growth forced off": {base: []string{"TF_FORCE_GPU_ALLOW_GROWTH=false"}, script: `import tensorflow as tf
g = tf.config.list_physical_devices("GPU")[0]
try:
    tf.config.experimental.set_memory_growth(g, True)
except ValueError as e:
    print("refused:", e)`, want: "refused: Cannot set memory growth on device when virtual devices configured\n"},
		"numba with vram's plugin":    {path: []string{repoPython}, script: numbaScript, want: "vram.numba\n"},
		"numba without vram's plugin": {script: numbaScript, want: "default\n", stderr: "vram lease: Numba is not capped"},
		"numba: the user's manager": {base: []string{"NUMBA_CUDA_MEMORY_MANAGER=rmm.allocators.numba"}, path: []string{repoPython},
			script: numbaScript, want: "rmm.allocators.numba\n", stderr: "Numba's memory manager is rmm.allocators.numba"},
		"numba for the CPU only": {script: "import numba; print(numba.CUDA_MEMORY_MANAGER)", want: "default\n"},
		"cupy":                   {script: "import cupy; print(cupy.pool_limit(12 << 30))", want: "3221225472\n"},
		"jax":                    {script: "import jax; print(jax.memory_fraction())", want: "0.25\n"},
		"jax: the newer name":    {base: []string{"XLA_CLIENT_MEM_FRACTION=0.75"}, script: "import jax; print(jax.memory_fraction())", want: "0.25\n"},
		"their sitecustomize runs too": {path: []string{theirs}, script: torchScript,
			want: "their sitecustomize ran\n0.25 0.25 per_process_memory_fraction:0.25 None\n"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			v := tc.torch
			if v == "" {
				v = "2.10.0"
			}
			stdout, stderr := hooked(t, v, tc.base, tc.path, tc.script)
			if stdout != tc.want {
				t.Errorf("stdout %q, want %q (stderr %q)", stdout, tc.want, stderr)
			}
			if (tc.stderr == "") != (stderr == "") || !strings.Contains(stderr, tc.stderr) {
				t.Errorf("stderr %q, want %q", stderr, tc.stderr)
			}
		})
	}
}

// Outside a lease (no VRAM_LEASE_BYTES) the hook does nothing; a hook
// that fails says so in one line and leaves the import as it was.
func TestLeaseHookHarmless(t *testing.T) {
	py := python3(t)
	hook, err := writeLeaseHook()
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(hook)
	lease := []string{"VRAM_LEASE_BYTES=1073741824", "VRAM_LEASE_FRACTION=0.25"}
	for name, tc := range map[string]struct {
		env          []string
		file, from   string // a stand-in broken: from replaced in file
		to           string
		script, want string
		stderr       string
	}{
		"no lease": {env: []string{"PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"},
			script: "import os, torch; torch.cuda.init(); print(torch.cuda.get_per_process_memory_fraction(0), os.environ['PYTORCH_CUDA_ALLOC_CONF'])",
			want:   "1.0 expandable_segments:True\n"},
		"a torch without _lazy_call": {env: lease, file: "torch/cuda/__init__.py", from: "def _lazy_call(", to: "def _lazy_call_gone(",
			script: "import torch; print('imported')", want: "imported\n", stderr: "vram lease: PyTorch is not capped"},
		"tensorflow without a driver": {env: lease, file: "tensorflow/__init__.py", from: "    return [g for g in _gpus", to: "    raise RuntimeError('no driver')\n    return [g for g in _gpus",
			script: "import tensorflow; print('imported')", want: "imported\n", stderr: "vram lease: could not cap tensorflow: RuntimeError: no driver"},
	} {
		t.Run(name, func(t *testing.T) {
			dir := standins(t, "2.9.0")
			if tc.file != "" {
				p := filepath.Join(dir, tc.file)
				b, err := os.ReadFile(p)
				if err != nil || !bytes.Contains(b, []byte(tc.from)) {
					t.Fatalf("%s: %v, or no %q in it", tc.file, err, tc.from)
				}
				if err := os.WriteFile(p, bytes.Replace(b, []byte(tc.from), []byte(tc.to), 1), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			cmd := exec.Command(py, "-c", tc.script)
			cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"), "PYTHONDONTWRITEBYTECODE=1",
				"PYTHONPATH=" + hook + string(os.PathListSeparator) + dir}, tc.env...)
			var out, errb bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, &errb
			if err := cmd.Run(); err != nil {
				t.Fatalf("python: %v\n%s%s", err, out.String(), errb.String())
			}
			if out.String() != tc.want || !strings.Contains(errb.String(), tc.stderr) || (tc.stderr == "") != (errb.Len() == 0) {
				t.Errorf("stdout %q, stderr %q; want %q and stderr %q", out.String(), errb.String(), tc.want, tc.stderr)
			}
		})
	}
}
