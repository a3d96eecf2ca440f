package oscillator

import (
	_ "embed"
	"encoding/binary"
	"errors"
	"fmt"
	"math"

	"github.com/vramkit/vram/device"
)

// PTX is the kernel's PTX text (entry "oscillate"), loaded by the CUDA
// form of the kernel.
//
//go:embed oscillate.ptx
var PTX string

// Entry is the PTX entry name.
const Entry = "oscillate"

// ErrArgs is returned (wrapped with the offending figures) for launch
// arguments that break the layout's rules.
var ErrArgs = errors.New("bad oscillator arguments")

// Args are one launch's arrays and scalars, a plain value. Arrays hold little-endian
// float32 (status: int32) in rows of LD columns; only the first N columns
// are computed:
//
//	Init   float32 [2][LD]      x0, v0
//	Params float32 [4][LD]      ω, ζ, A, Ω
//	Out    float32 [S][2][LD]   x, v of each sample, S = Samples(Steps, Every)
//	Status int32   [LD]         0 ok, 1 the state became NaN or ±Inf
//
// Sample 0 is the initial state; after step k (k = 1..Steps) the state is
// saved as sample k/Every when k % Every == 0. Keep |Ω·t| below 100π: the
// PTX form uses the GPU's fast cosine, accurate in that range.
type Args struct {
	Init, Params, Out, Status device.Ptr
	N, LD                     uint32
	Dt                        float32
	Steps, Every              uint32
}

// Samples is the number of saved samples S for steps and every (> 0).
func Samples(steps, every uint32) int { return int(steps/every) + 1 }

// InitBytes is the size of the init array for leading dimension ld.
func InitBytes(ld int) uint64 { return uint64(2*ld) * 4 }

// ParamsBytes is the size of the params array for leading dimension ld.
func ParamsBytes(ld int) uint64 { return uint64(4*ld) * 4 }

// OutBytes is the size of the out array for leading dimension ld and
// samples saved samples.
func OutBytes(ld, samples int) uint64 { return uint64(samples) * uint64(2*ld) * 4 }

// StatusBytes is the size of the status array for leading dimension ld.
func StatusBytes(ld int) uint64 { return uint64(ld) * 4 }

func outIndex(ld, s, comp, i int) int { return (s*2+comp)*ld + i }

func f32at(b []byte, idx int) float32 {
	return math.Float32frombits(binary.LittleEndian.Uint32(b[4*idx:]))
}

func putf32(b []byte, idx int, v float32) {
	binary.LittleEndian.PutUint32(b[4*idx:], math.Float32bits(v))
}

// Check validates a's scalars: 0 < N ≤ LD, Every > 0, Steps % Every == 0,
// a finite positive Dt, and non-zero pointers.
func (a Args) Check() error {
	switch {
	case a.N == 0 || a.N > a.LD:
		return fmt.Errorf("oscillator: n = %d active columns with leading dimension %d: want 0 < n ≤ ld: %w", a.N, a.LD, ErrArgs)
	case a.Every == 0:
		return fmt.Errorf("oscillator: every = 0: want a positive sampling interval: %w", ErrArgs)
	case a.Steps%a.Every != 0:
		return fmt.Errorf("oscillator: %d steps is not a multiple of every = %d: %w", a.Steps, a.Every, ErrArgs)
	case !(a.Dt > 0) || math.IsInf(float64(a.Dt), 0):
		return fmt.Errorf("oscillator: dt = %v: want a finite positive step: %w", a.Dt, ErrArgs)
	case a.Init == 0 || a.Params == 0 || a.Out == 0 || a.Status == 0:
		return fmt.Errorf("oscillator: a nil array pointer (init %v, params %v, out %v, status %v): %w",
			a.Init, a.Params, a.Out, a.Status, ErrArgs)
	}
	return nil
}

// Kernel launches the oscillator kernel on a device. Implementations are
// safe for concurrent use; each Launch is ordered on its stream like any
// other device work.
type Kernel interface {
	// Launch enqueues one launch over a.N runs on s.
	Launch(s device.Stream, a Args) error
	// Kind is "go" or "ptx".
	Kind() string
	// Close releases what the kernel holds on the device (a loaded module).
	Close() error
}

// New returns the kernel form dev supports: PTX when it loads modules
// (CUDA), the Go function when it runs Go kernels (the simulator). A
// device with neither gets an error wrapping device.ErrNotSupported.
func New(dev device.Device) (Kernel, error) {
	if ml, ok := dev.(device.ModuleLoader); ok {
		return NewPTX(ml)
	}
	if fl, ok := dev.(device.FuncLauncher); ok {
		return NewGo(fl), nil
	}
	return nil, fmt.Errorf("oscillator: device %q runs neither PTX nor Go kernels: %w", dev.Info().Name, device.ErrNotSupported)
}

// Run is one oscillator's initial state and parameters, a plain value.
type Run struct {
	X0, V0 float64
	Omega  float64 // ω, natural angular frequency
	Zeta   float64 // ζ, damping ratio
	A      float64 // drive amplitude
	Drive  float64 // Ω, drive angular frequency
}

// Encode writes runs into host init and params arrays of leading dimension
// ld (len(runs) ≤ ld; len(init) ≥ InitBytes(ld), len(params) ≥
// ParamsBytes(ld)), as float32.
func Encode(runs []Run, ld int, init, params []byte) error {
	if len(runs) > ld {
		return fmt.Errorf("oscillator: %d runs do not fit leading dimension %d: %w", len(runs), ld, ErrArgs)
	}
	if uint64(len(init)) < InitBytes(ld) || uint64(len(params)) < ParamsBytes(ld) {
		return fmt.Errorf("oscillator: init (%d bytes) and params (%d bytes) must hold %d and %d bytes for ld = %d: %w",
			len(init), len(params), InitBytes(ld), ParamsBytes(ld), ld, ErrArgs)
	}
	for i, r := range runs {
		putf32(init, i, float32(r.X0))
		putf32(init, ld+i, float32(r.V0))
		for k, v := range [4]float64{r.Omega, r.Zeta, r.A, r.Drive} {
			putf32(params, k*ld+i, float32(v))
		}
	}
	return nil
}

// Sample is one saved state, a plain value.
type Sample struct{ X, V float64 }

// Decode reads run i's samples from a host copy of the out array.
func Decode(out []byte, ld, samples, i int) ([]Sample, error) {
	if i < 0 || i >= ld || uint64(len(out)) < OutBytes(ld, samples) {
		return nil, fmt.Errorf("oscillator: run %d of an out array of %d bytes (ld %d, %d samples needs %d): %w",
			i, len(out), ld, samples, OutBytes(ld, samples), ErrArgs)
	}
	s := make([]Sample, samples)
	for k := range s {
		s[k] = Sample{
			X: float64(f32at(out, outIndex(ld, k, 0, i))),
			V: float64(f32at(out, outIndex(ld, k, 1, i))),
		}
	}
	return s, nil
}

// Status reads run i's status from a host copy of the status array.
func Status(status []byte, i int) int32 {
	return int32(binary.LittleEndian.Uint32(status[4*i:]))
}
