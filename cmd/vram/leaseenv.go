// The environment `vram lease` gives its command: each framework's own
// memory limit set to the lease where the framework reads one from its
// environment, and, for those whose limit is an API call (PyTorch before
// 2.10, TensorFlow) or that have none (Numba), vram's import hook on
// Python's path (leasehook/sitecustomize.py), which applies the limit when
// the framework is imported. docs/sharing.md has the table, each row
// checked against the framework's source.
//
// Rules:
//   - A limit the user set lower stays; one set higher is lowered to the
//     lease. A setting of the user's that is not a limit stays as it is.
//   - Where a framework reads two names for one setting, one is set, never
//     both (current JAX refuses both).
//   - $VRAM_BROKER is left out: a vram manager inside keeps to the lease
//     by VRAM_ALLOC_CONF's limit rather than lease the memory again.

package main

import (
	"embed"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/vramkit/vram"
	"github.com/vramkit/vram/broker"
	"github.com/vramkit/vram/internal/units"
)

// Variables of the frameworks that vram lease sets or reads.
const (
	envCuPyLimit    = "CUPY_GPU_MEMORY_LIMIT"          // CuPy: bytes, or a percentage of the device
	envJAXFraction  = "XLA_PYTHON_CLIENT_MEM_FRACTION" // JAX: the fraction of the device (every JAX reads it)
	envJAXFraction2 = "XLA_CLIENT_MEM_FRACTION"        // JAX's newer name of the same; set only where the user set it
	envJAXAllocator = "XLA_PYTHON_CLIENT_ALLOCATOR"    // JAX: "platform" keeps to no fraction
	envTFGrowth     = "TF_FORCE_GPU_ALLOW_GROWTH"      // TensorFlow: "true" allocates as needed instead of most of the GPU
	envCUDAVisible  = "CUDA_VISIBLE_DEVICES"
	envPythonPath   = "PYTHONPATH"
	// podMemoryAnnotation is the pod annotation by which a pod asks for its
	// lease in deploy/kubernetes/lease-job.yaml (Kubernetes has no GPU
	// memory resource): the Downward API gives it to vram lease --bytes.
	podMemoryAnnotation = "vramkit.github.io/gpu-memory"
	leaseHookModule     = "sitecustomize.py"
	leaseHookDirName    = "leasehook"
)

// leaseHook is the Python import hook vram lease puts on the command's
// PYTHONPATH.
//
//go:embed leasehook/sitecustomize.py
var leaseHook embed.FS

// leaseLimit is what a lease gives its command.
type leaseLimit struct {
	bytes uint64 // what the command's allocators may hold: the lease less its context
	dev   broker.DeviceInfo
	id    string
	hook  string // the directory of the import hook ("": none)
}

// fraction is bytes as a fraction of the device, rounded down to 4
// decimals (a fraction rounded up would pass the lease).
func (l leaseLimit) fraction() float64 {
	return math.Floor(float64(l.bytes)/float64(l.dev.Total)*1e4) / 1e4
}

func formatFraction(f float64) string { return strconv.FormatFloat(f, 'f', 4, 64) }

// writeLeaseHook writes the import hook into a new directory of its own,
// which the caller removes when the command has ended.
func writeLeaseHook() (string, error) {
	dir, err := os.MkdirTemp("", "vram-lease-")
	if err != nil {
		return "", err
	}
	b, err := fs.ReadFile(leaseHook, leaseHookDirName+"/"+leaseHookModule)
	if err == nil {
		err = os.WriteFile(filepath.Join(dir, leaseHookModule), b, 0o600)
	}
	if err != nil {
		_ = os.RemoveAll(dir)
		return "", err
	}
	return dir, nil
}

// environ is an environment as a list of keys in order and their values.
type environ struct {
	keys []string
	vals map[string]string
}

func newEnviron(base []string) *environ {
	e := &environ{vals: make(map[string]string, len(base))}
	for _, kv := range base {
		k, v, _ := strings.Cut(kv, "=")
		e.set(k, v)
	}
	return e
}

func (e *environ) get(k string) (string, bool) { v, ok := e.vals[k]; return v, ok }

func (e *environ) set(k, v string) {
	if _, ok := e.vals[k]; !ok {
		e.keys = append(e.keys, k)
	}
	e.vals[k] = v
}

func (e *environ) del(k string) {
	if _, ok := e.vals[k]; !ok {
		return
	}
	delete(e.vals, k)
	for i, key := range e.keys {
		if key == k {
			e.keys = append(e.keys[:i], e.keys[i+1:]...)
			break
		}
	}
}

func (e *environ) list() []string {
	out := make([]string, len(e.keys))
	for i, k := range e.keys {
		out[i] = k + "=" + e.vals[k]
	}
	return out
}

func lookupEnv(env []string, key string) string {
	v, _ := newEnviron(env).get(key)
	return v
}

// leaseEnv is base with each framework's memory limit set to the lease,
// the import hook on PYTHONPATH and the lease's own variables, without
// $VRAM_BROKER; notes says what the lease cannot bind, one line each.
func leaseEnv(base []string, l leaseLimit) (env, notes []string) {
	e := newEnviron(base)
	e.del(vram.BrokerEnv)
	conf, _ := e.get(vram.AllocConfEnv)
	e.set(vram.AllocConfEnv, allocConfLimit(conf, l.bytes))
	e.set(envCuPyLimit, cupyLimit(e, l))
	setJAXFraction(e, l)
	if a, _ := e.get(envJAXAllocator); strings.EqualFold(strings.TrimSpace(a), "platform") {
		notes = append(notes, envJAXAllocator+"=platform: JAX's platform allocator keeps to no fraction, so the lease does not bind JAX; unset it to use JAX's default allocator")
	}
	if _, ok := e.get(envTFGrowth); !ok {
		e.set(envTFGrowth, "true")
	}
	if _, ok := e.get(envCUDAVisible); !ok && strings.HasPrefix(l.dev.ID, "GPU-") {
		e.set(envCUDAVisible, l.dev.ID) // the leased GPU, and no other, for every framework
	}
	if l.hook != "" {
		path, _ := e.get(envPythonPath)
		e.set(envPythonPath, strings.TrimSuffix(l.hook+string(os.PathListSeparator)+path, string(os.PathListSeparator)))
	} else {
		notes = append(notes, "no import hook (its directory could not be written): PyTorch, TensorFlow and Numba are not capped")
	}
	e.set(envLeaseBytes, strconv.FormatUint(l.bytes, 10))
	e.set(envLeaseFraction, formatFraction(l.fraction()))
	e.set(envLeaseDevice, strconv.Itoa(l.dev.Index))
	e.set(envLeaseID, l.id)
	return e.list(), notes
}

// cupyLimit is CUPY_GPU_MEMORY_LIMIT for the lease: its bytes, or the
// user's own limit where that is lower (CuPy reads bytes or "N%" of the
// device: cupy/cuda/memory.pyx, _parse_limit_string).
func cupyLimit(e *environ, l leaseLimit) string {
	old, ok := e.get(envCuPyLimit)
	if !ok {
		return strconv.FormatUint(l.bytes, 10)
	}
	s := strings.TrimSpace(old)
	if p, isPct := strings.CutSuffix(s, "%"); isPct {
		if f, err := strconv.ParseFloat(p, 64); err == nil && f >= 0 && f/100*float64(l.dev.Total) < float64(l.bytes) {
			return old
		}
	} else if n, err := strconv.ParseUint(s, 10, 64); err == nil && n < l.bytes {
		return old
	}
	return strconv.FormatUint(l.bytes, 10)
}

// setJAXFraction sets JAX's memory fraction to the lease's, or keeps the
// user's lower one, in the variable the user set: XLA_CLIENT_MEM_FRACTION
// if that is the one given, else XLA_PYTHON_CLIENT_MEM_FRACTION, which
// every JAX reads (current JAX refuses the two together: jaxlib's
// xla_client.py, generate_pjrt_gpu_plugin_options).
func setJAXFraction(e *environ, l leaseLimit) {
	key := envJAXFraction
	if _, ok := e.get(envJAXFraction2); ok {
		key = envJAXFraction2
	}
	f := l.fraction()
	if old, ok := e.get(key); ok {
		if v, err := strconv.ParseFloat(strings.TrimSpace(old), 64); err == nil && v > 0 && v < f {
			return
		}
	}
	e.set(key, formatFraction(f))
}

// allocConfLimit is a VRAM_ALLOC_CONF with its limit set to bytes, or
// kept if it was lower; its other keys as they were.
func allocConfLimit(conf string, bytes uint64) string {
	var keep []string
	limit := bytes
	for _, entry := range strings.Split(conf, ",") {
		k, v, _ := strings.Cut(entry, ":")
		switch {
		case strings.TrimSpace(entry) == "":
		case strings.EqualFold(strings.TrimSpace(k), "limit"):
			if n, err := units.ParseSize(strings.TrimSpace(v)); err == nil && n < limit {
				limit = n
			}
		default:
			keep = append(keep, entry)
		}
	}
	return strings.Join(append(keep, "limit:"+strconv.FormatUint(limit, 10)), ",")
}

// leaseNotes writes each note on a line of its own.
func (a *app) leaseNotes(notes []string) {
	for _, n := range notes {
		fmt.Fprintf(a.stderr, "vram lease: %s\n", n)
	}
}
