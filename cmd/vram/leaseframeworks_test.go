//go:build linux

package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// `vram lease` end to end: a Python command importing each framework's
// stand-in gets the lease's limit in each (896 MiB of a 4 GiB simulator
// less its context: 0.2187), and the hook's directory is gone when the
// command has ended.
func TestLeaseFrameworksEndToEnd(t *testing.T) {
	py := python3(t)
	socket := startBroker(t, "sim:vram=4GiB")
	for name, torch := range map[string]string{"torch 2.10": "2.10.1", "torch 2.9": "2.9.0"} {
		t.Run(name, func(t *testing.T) {
			t.Setenv("PYTHONPATH", standins(t, torch))
			t.Setenv("PYTHONDONTWRITEBYTECODE", "1")
			for _, k := range []string{"PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF", "XLA_CLIENT_MEM_FRACTION", "XLA_PYTHON_CLIENT_MEM_FRACTION",
				"CUPY_GPU_MEMORY_LIMIT", "TF_FORCE_GPU_ALLOW_GROWTH", "NUMBA_CUDA_MEMORY_MANAGER"} {
				t.Setenv(k, "") // set, then unset: the test's own environment must not leak in
				os.Unsetenv(k)
			}
			script := `import os, sys, torch, tensorflow as tf, cupy, jax
torch.cuda.init()
g = tf.config.list_physical_devices("GPU")[0]
print(torch.cuda.get_per_process_memory_fraction(0), tf.config.get_logical_device_configuration(g)[0].memory_limit,
      cupy.pool_limit(4 << 30), jax.memory_fraction(), os.environ["PYTHONPATH"].split(os.pathsep)[0])`
			stdout, stderr, code := cli(t, "", "lease", "--socket", socket, "--bytes", "1GiB", "--", py, "-c", script)
			if code != exitOK {
				t.Fatalf("exit %d:\n%s", code, stderr)
			}
			f := strings.Fields(stdout)
			if len(f) != 5 || f[0] != "0.2187" || f[1] != "896" || f[2] != "939524096" || f[3] != "0.2187" {
				t.Errorf("the frameworks' limits %q, want 0.2187 896 939524096 0.2187 HOOK-DIR (stderr %q)", stdout, stderr)
			}
			if len(f) == 5 {
				if _, err := os.Stat(filepath.Join(f[4], leaseHookModule)); !os.IsNotExist(err) {
					t.Errorf("the hook %s is still there after the command: %v", f[4], err)
				}
			}
		})
	}
}
