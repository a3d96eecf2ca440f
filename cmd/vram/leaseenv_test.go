package main

import (
	"slices"
	"strings"
	"testing"

	"github.com/vramkit/vram/broker"
)

// testLease is 3 GiB of a 12 GiB GPU: a fraction of exactly 0.25.
var testLease = leaseLimit{bytes: 3 << 30, dev: broker.DeviceInfo{Index: 1, Name: "cuda:1", ID: "GPU-8d3a", Total: 12 << 30}, id: "l1", hook: "/tmp/hook"}

// TestLeaseEnv: each framework's variable as vram lease sets it from the
// lease and what the user's environment had (3 GiB of 12 GiB: 0.25).
func TestLeaseEnv(t *testing.T) {
	tests := map[string]struct {
		base   []string
		lease  leaseLimit
		want   []string // KEY=VALUE in the command's environment
		absent []string // keys it must not have
		note   string   // in a note ("": none)
	}{
		"nothing set": {
			want: []string{"VRAM_ALLOC_CONF=limit:3221225472", "CUPY_GPU_MEMORY_LIMIT=3221225472", "XLA_PYTHON_CLIENT_MEM_FRACTION=0.2500",
				"TF_FORCE_GPU_ALLOW_GROWTH=true", "CUDA_VISIBLE_DEVICES=GPU-8d3a", "PYTHONPATH=/tmp/hook",
				"VRAM_LEASE_BYTES=3221225472", "VRAM_LEASE_FRACTION=0.2500", "VRAM_LEASE_DEVICE=1", "VRAM_LEASE_ID=l1"},
			absent: []string{"XLA_CLIENT_MEM_FRACTION", "VRAM_BROKER"},
		},
		// Current JAX refuses XLA_CLIENT_MEM_FRACTION with
		// XLA_PYTHON_CLIENT_MEM_FRACTION: only the one the user set is set.
		"jax: the user's newer name": {base: []string{"XLA_CLIENT_MEM_FRACTION=.9"},
			want: []string{"XLA_CLIENT_MEM_FRACTION=0.2500"}, absent: []string{"XLA_PYTHON_CLIENT_MEM_FRACTION"}},
		"jax: a lower fraction stays": {base: []string{"XLA_PYTHON_CLIENT_MEM_FRACTION=.1"},
			want: []string{"XLA_PYTHON_CLIENT_MEM_FRACTION=.1"}, absent: []string{"XLA_CLIENT_MEM_FRACTION"}},
		"jax: the platform allocator": {base: []string{"XLA_PYTHON_CLIENT_ALLOCATOR=platform"},
			want: []string{"XLA_PYTHON_CLIENT_ALLOCATOR=platform"}, note: "keeps to no fraction"},
		"cupy: a lower limit stays":  {base: []string{"CUPY_GPU_MEMORY_LIMIT=1000"}, want: []string{"CUPY_GPU_MEMORY_LIMIT=1000"}},
		"cupy: a lower percentage":   {base: []string{"CUPY_GPU_MEMORY_LIMIT=10%"}, want: []string{"CUPY_GPU_MEMORY_LIMIT=10%"}},
		"cupy: a higher percentage":  {base: []string{"CUPY_GPU_MEMORY_LIMIT=90%"}, want: []string{"CUPY_GPU_MEMORY_LIMIT=3221225472"}},
		"cupy: a higher limit":       {base: []string{"CUPY_GPU_MEMORY_LIMIT=99999999999"}, want: []string{"CUPY_GPU_MEMORY_LIMIT=3221225472"}},
		"cupy: not a limit":          {base: []string{"CUPY_GPU_MEMORY_LIMIT=lots"}, want: []string{"CUPY_GPU_MEMORY_LIMIT=3221225472"}},
		"tensorflow: growth kept":    {base: []string{"TF_FORCE_GPU_ALLOW_GROWTH=false"}, want: []string{"TF_FORCE_GPU_ALLOW_GROWTH=false"}},
		"vram: other keys kept":      {base: []string{"VRAM_ALLOC_CONF=kind:async"}, want: []string{"VRAM_ALLOC_CONF=kind:async,limit:3221225472"}},
		"the user's devices kept":    {base: []string{"CUDA_VISIBLE_DEVICES=0"}, want: []string{"CUDA_VISIBLE_DEVICES=0"}},
		"the python path after hook": {base: []string{"PYTHONPATH=/a:/b"}, want: []string{"PYTHONPATH=/tmp/hook:/a:/b"}},
		"the broker left out":        {base: []string{"VRAM_BROKER=/run/vram/broker.sock", "HOME=/root"}, want: []string{"HOME=/root"}, absent: []string{"VRAM_BROKER"}},
		"a device with no GPU id": {lease: leaseLimit{bytes: 1 << 20, dev: broker.DeviceInfo{ID: "sim-1", Total: 4 << 20}, hook: "/h"},
			want: []string{"VRAM_LEASE_FRACTION=0.2500"}, absent: []string{"CUDA_VISIBLE_DEVICES"}},
		"no hook": {lease: leaseLimit{bytes: 1 << 20, dev: broker.DeviceInfo{Total: 4 << 20}},
			absent: []string{"PYTHONPATH"}, note: "PyTorch, TensorFlow and Numba are not capped"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			l := tc.lease
			if l.dev.Total == 0 {
				l = testLease
			}
			env, notes := leaseEnv(tc.base, l)
			for _, kv := range tc.want {
				if !slices.Contains(env, kv) {
					t.Errorf("no %s in %q", kv, env)
				}
			}
			for _, k := range tc.absent {
				if v := lookupEnv(env, k); v != "" || slices.ContainsFunc(env, func(kv string) bool { return strings.HasPrefix(kv, k+"=") }) {
					t.Errorf("%s is set (%q)", k, v)
				}
			}
			switch joined := strings.Join(notes, "\n"); {
			case tc.note == "" && joined != "":
				t.Errorf("notes %q, want none", joined)
			case !strings.Contains(joined, tc.note):
				t.Errorf("notes %q, want one saying %q", joined, tc.note)
			}
			seen := map[string]bool{}
			for _, kv := range env {
				k, _, _ := strings.Cut(kv, "=")
				if seen[k] {
					t.Errorf("%s twice", k)
				}
				seen[k] = true
			}
		})
	}
}

// A fraction rounded to 4 decimals is rounded down: rounded up, it would
// let a framework pass the lease.
func TestLeaseFractionRoundsDown(t *testing.T) {
	for _, tc := range []struct {
		bytes, total uint64
		want         string
	}{
		{896 << 20, 4 << 30, "0.2187"}, // 0.21875
		{1, 3, "0.3333"},
		{2, 3, "0.6666"},
		{3, 3, "1.0000"},
	} {
		l := leaseLimit{bytes: tc.bytes, dev: broker.DeviceInfo{Total: tc.total}}
		if got := formatFraction(l.fraction()); got != tc.want {
			t.Errorf("%d of %d: %s, want %s", tc.bytes, tc.total, got, tc.want)
		}
	}
}
