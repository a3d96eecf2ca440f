package device

import (
	"errors"
	"fmt"
	"os"
	"sort"
	"strings"
	"sync"
)

// EnvDevice names the environment variable that sets the default spec.
const EnvDevice = "VRAM_DEVICE"

// Opener opens a device of one backend. opts is the text after the
// backend's name and colon in a spec ("vram=8GiB" in "sim:vram=8GiB"; "1"
// in "cuda:1"), or "".
type Opener func(opts string) (Device, error)

var (
	backendsMu sync.RWMutex
	backends   = map[string]Opener{}
)

// Register makes a backend available to Open under name. Backends call it
// from init; it panics if name is registered twice.
func Register(name string, open Opener) { registerOnce(backends, "backend", name, open) }

// registerOnce adds v to the registry m (a backend's opener, counter or
// spec reader: what names it) under name, or panics if name has one.
func registerOnce[T any](m map[string]T, what, name string, v T) {
	backendsMu.Lock()
	defer backendsMu.Unlock()
	if _, dup := m[name]; dup {
		panic("device: " + what + " registered twice: " + name)
	}
	m[name] = v
}

// Backends lists the registered backend names, sorted.
func Backends() []string {
	backendsMu.RLock()
	defer backendsMu.RUnlock()
	names := make([]string, 0, len(backends))
	for n := range backends {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

func lookup(name string) (Opener, error) {
	backendsMu.RLock()
	open, ok := backends[name]
	backendsMu.RUnlock()
	if !ok {
		known := strings.Join(Backends(), ", ")
		if name == "sim" || name == "cuda" {
			return nil, fmt.Errorf("backend %q is not linked into this program (linked: %s); "+
				"import _ \"github.com/vramkit/vram/device/%s\" to link it: %w", name, known, name, ErrBadSpec)
		}
		return nil, fmt.Errorf("unknown backend %s (want sim, cuda or auto; linked: %s): %w", QuoteSpec(name), known, ErrBadSpec)
	}
	return open, nil
}

// DefaultSpec is the spec Open uses for "": $VRAM_DEVICE, or "auto".
func DefaultSpec() string {
	if s := strings.TrimSpace(os.Getenv(EnvDevice)); s != "" {
		return s
	}
	return "auto"
}

// Open opens a device from a spec:
//
//	""              $VRAM_DEVICE, or "auto" when it is unset
//	"auto"          CUDA device 0 if the driver loads and a GPU exists, else the simulator
//	"sim"           the simulator with its defaults
//	"sim:OPTS"      the simulator with options, e.g. "sim:vram=8GiB,backed=false"
//	"cuda"          CUDA device 0
//	"cuda:N"        CUDA device N
//
// An unknown backend or malformed spec returns an error wrapping ErrBadSpec.
// Open is one of the package's two doors to a device: OpenSpec, the other,
// opens a spec read once with ParseSpec (or each of a list's, ReadSpecs)
// and says why "auto" fell back to the simulator.
func Open(spec string) (Device, error) {
	text, name, opts, err := splitSpec(spec)
	if err != nil {
		return nil, err
	}
	dev, _, err := openNamed(text, name, opts, 0)
	return dev, err
}

// splitSpec reads a spec's text ("" is DefaultSpec) as its backend's name,
// in lower case, and its options, as Open and ParseSpec read it.
func splitSpec(spec string) (text, name, opts string, err error) {
	text = strings.TrimSpace(spec)
	if text == "" {
		text = DefaultSpec()
	}
	name, opts, _ = strings.Cut(text, ":")
	name = strings.ToLower(strings.TrimSpace(name))
	if name == "" {
		return "", "", "", fmt.Errorf("spec %s has no backend name (want sim, cuda or auto): %w", QuoteSpec(text), ErrBadSpec)
	}
	return text, name, opts, nil
}

// openNamed opens spec, read as backend name and opts, of total bytes
// when total is not 0 (on auto, the simulator's size should it fall
// back to it).
func openNamed(spec, name, opts string, total uint64) (dev Device, fallback error, err error) {
	if name != "auto" {
		if _, err := lookup(name); err != nil {
			return nil, nil, err
		}
		dev, err := openBackend(name, opts, total)
		if err != nil {
			return nil, nil, fmt.Errorf("open %s: %w", QuoteSpec(spec), err)
		}
		return dev, nil, nil
	}
	// auto: CUDA first, then the simulator with any options given.
	if opencuda, err := lookup("cuda"); err == nil {
		dev, cerr := opencuda("")
		if cerr == nil {
			return dev, nil, nil
		}
		fallback = cerr
	} else {
		fallback = fmt.Errorf("cuda backend not linked: %w", ErrNoDevice)
	}
	if _, err := lookup("sim"); err != nil {
		return nil, fallback, errors.Join(fallback, err)
	}
	dev, err = openBackend("sim", opts, total)
	if err != nil {
		return nil, fallback, fmt.Errorf("open %s: %w", QuoteSpec(spec), err)
	}
	return dev, fallback, nil
}
