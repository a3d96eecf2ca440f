package kernel

// A Kernel, its launch in each form, and the Go form's typed views.

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"reflect"
	"regexp"
	"strings"
	"sync"
	"unsafe"

	"github.com/vramkit/vram/device"
)

// ErrArgs is wrapped by launch arguments of a type a kernel cannot take,
// and by a Go kernel's access to an argument of another index or type.
var ErrArgs = errors.New("bad kernel arguments")

// DefaultBlock is the threads per block of a PTX launch when New is given
// none.
const DefaultBlock = 128

// Array is a device array a kernel can take: its address and size in
// bytes. *vram.DeviceArray is one.
type Array interface {
	Ptr() device.Ptr
	Bytes() uint64
}

// Shaped is an Array that states its shape, row-major (*vram.DeviceArray
// does): a Go kernel's view of it knows its dimensions (Args.Shape), so
// that it reads a stride from the array rather than from an argument.
type Shaped interface {
	Array
	Shape() []int
}

// Typed is an Array that states its element type by its NumPy name
// ("float32", "float64", "int32", "uint32", "int64", …): a Go kernel's
// typed views of it check that name, so that a float32 array is never
// read as float64s. *vram.DeviceArray is one. An Array that is not Typed
// is viewed as whatever type is asked for.
type Typed interface {
	Array
	ElemType() string
}

// Func is a kernel's Go form: it computes the indices [lo, hi) of a launch
// over the arguments a. It may be called for several ranges at once, from
// several goroutines.
type Func func(a Args, lo, hi int) error

// Kernel is a portable kernel. It is safe for concurrent use; Close it
// when done, to unload the modules it loaded.
type Kernel struct {
	name  string // the PTX entry's name, and the kernel's in messages
	ptx   string
	fn    Func
	block uint32

	mu     sync.Mutex // protects loaded
	loaded map[device.ModuleLoader]*ptxModule
}

type ptxModule struct {
	mod device.Module
	fn  device.Function
}

// New returns the kernel named name: ptx is its PTX text, whose entry is
// called name (empty: the kernel runs only where Go kernels do), fn its Go
// form (nil: only where PTX loads), block the PTX launch's threads per
// block (0: DefaultBlock). PTX that declares no ".entry name" is refused
// here, on any device, rather than on the first GPU it meets; what the
// PTX says otherwise is the driver's to check, when it loads it.
func New(name, ptx string, fn Func, block int) (*Kernel, error) {
	switch {
	case name == "":
		return nil, fmt.Errorf("kernel: a kernel needs a name (its PTX entry): %w", ErrArgs)
	case ptx == "" && fn == nil:
		return nil, fmt.Errorf("kernel %s: neither PTX nor a Go function; give at least one: %w", name, ErrArgs)
	case block < 0 || block > 1024:
		return nil, fmt.Errorf("kernel %s: %d threads per block: want 1 to 1024, or 0 for %d: %w", name, block, DefaultBlock, ErrArgs)
	case binary.NativeEndian.Uint16([]byte{1, 0}) != 1:
		return nil, fmt.Errorf("kernel %s: a big-endian host cannot view little-endian device memory: %w", name, device.ErrNotSupported)
	}
	if ptx != "" {
		if err := declares(ptx, name); err != nil {
			return nil, err
		}
	}
	if block == 0 {
		block = DefaultBlock
	}
	return &Kernel{name: name, ptx: ptx, fn: fn, block: uint32(block), loaded: map[device.ModuleLoader]*ptxModule{}}, nil
}

// Must returns k, or panics with err: for a kernel made once, from text
// the program carries, in a package-level variable (as
// regexp.MustCompile), where an error is the program's own mistake.
//
//	var affine = kernel.Must(kernel.New("affine", affinePTX, affineGo, 0))
func Must(k *Kernel, err error) *Kernel {
	if err != nil {
		panic(err)
	}
	return k
}

var (
	// entryRE finds the names of a PTX text's .entry declarations.
	entryRE   = regexp.MustCompile(`\.entry\s+([A-Za-z_$%][\w$]*)`)
	commentRE = regexp.MustCompile(`(?s)//[^\n]*|/\*.*?\*/`)
)

// declares checks that ptx declares the entry name, outside comments.
func declares(ptx, name string) error {
	var found []string
	for _, m := range entryRE.FindAllStringSubmatch(commentRE.ReplaceAllString(ptx, ""), -1) {
		if m[1] == name {
			return nil
		}
		found = append(found, m[1])
	}
	has := "declares no .entry at all (is it PTX, or a placeholder?)"
	if len(found) > 0 {
		const most = 8
		names := make([]string, 0, most)
		for _, f := range found[:min(len(found), most)] {
			names = append(names, clip(f, 64))
		}
		if len(found) > most {
			names = append(names, fmt.Sprintf("… %d more", len(found)-most))
		}
		has = "declares .entry " + strings.Join(names, ", ")
	}
	return fmt.Errorf("kernel %s: its PTX has no \".entry %s\": it %s; give New the name of the PTX's entry: %w", name, clip(name, 64), has, ErrArgs)
}

// clip shortens s to at most n runes, marking the cut.
func clip(s string, n int) string {
	if r := []rune(s); len(r) > n {
		return string(r[:n]) + "…"
	}
	return s
}

// Name is the kernel's name, its PTX entry.
func (k *Kernel) Name() string { return k.name }

// Form is the form the kernel takes on dev: "ptx" where dev loads PTX
// and the kernel has it, else "go" where dev runs Go kernels and the
// kernel has a Go function, else "" (Launch fails).
func (k *Kernel) Form(dev device.Device) string {
	if _, ok := dev.(device.ModuleLoader); ok && k.ptx != "" {
		return "ptx"
	}
	if _, ok := dev.(device.FuncLauncher); ok && k.fn != nil {
		return "go"
	}
	return ""
}

// Load loads the PTX module on dev now, where it takes PTX, so that a
// compile error shows before a batch starts; elsewhere it does nothing.
func (k *Kernel) Load(dev device.Device) error {
	if k.Form(dev) != "ptx" {
		return nil
	}
	return k.LoadOn(dev.(device.ModuleLoader))
}

// LoadOn loads the PTX module on dev now (once; Close unloads it).
func (k *Kernel) LoadOn(dev device.ModuleLoader) error {
	if k.ptx == "" {
		return fmt.Errorf("kernel %s: no PTX form: %w", k.name, device.ErrNotSupported)
	}
	_, err := k.module(dev)
	return err
}

func (k *Kernel) module(ml device.ModuleLoader) (*ptxModule, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if m := k.loaded[ml]; m != nil {
		return m, nil
	}
	mod, err := ml.LoadPTX(k.ptx)
	if err != nil {
		return nil, fmt.Errorf("kernel %s: load PTX: %w", k.name, err)
	}
	fn, err := mod.Function(k.name)
	if err != nil {
		return nil, errors.Join(fmt.Errorf("kernel %s: %w", k.name, err), mod.Close())
	}
	m := &ptxModule{mod: mod, fn: fn}
	k.loaded[ml] = m
	return m, nil
}

// Close unloads every module the kernel loaded. The kernel can be
// launched again afterwards (it loads them again).
func (k *Kernel) Close() error {
	k.mu.Lock()
	defer k.mu.Unlock()
	var errs []error
	for ml, m := range k.loaded {
		errs = append(errs, m.mod.Close())
		delete(k.loaded, ml)
	}
	return errors.Join(errs...)
}

// Launch enqueues the kernel over the indices [0, n), n > 0, on s of dev,
// in the form dev runs (see the package doc). It returns once the launch
// is enqueued; errors the Go form returns while it runs come back from
// the stream's Synchronize, like any device work's.
func (k *Kernel) Launch(dev device.Device, s device.Stream, n int, args ...any) error {
	switch k.Form(dev) {
	case "ptx":
		return k.LaunchPTX(dev.(device.ModuleLoader), s, n, args...)
	case "go":
		return k.LaunchGo(dev.(device.FuncLauncher), s, n, args...)
	}
	return fmt.Errorf("kernel %s: device %q runs neither its PTX (%v) nor its Go form (%v): %w",
		k.name, dev.Info().Name, k.ptx != "", k.fn != nil, device.ErrNotSupported)
}

// LaunchPTX is Launch in the PTX form, whatever else dev runs (to compare
// the forms on a device that runs both).
func (k *Kernel) LaunchPTX(dev device.ModuleLoader, s device.Stream, n int, args ...any) error {
	vals, err := k.check(n, args)
	if err != nil {
		return err
	}
	if k.ptx == "" {
		return fmt.Errorf("kernel %s: no PTX form: %w", k.name, device.ErrNotSupported)
	}
	m, err := k.module(dev)
	if err != nil {
		return err
	}
	grid := (uint32(n)-1)/k.block + 1
	if err := m.fn.Launch(s, device.Dim3{X: grid, Y: 1, Z: 1}, device.Dim3{X: k.block, Y: 1, Z: 1}, 0, vals...); err != nil {
		return fmt.Errorf("kernel %s: %w", k.name, err)
	}
	return nil
}

// LaunchGo is Launch in the Go form, whatever else dev runs.
func (k *Kernel) LaunchGo(dev device.FuncLauncher, s device.Stream, n int, args ...any) error {
	if _, err := k.check(n, args); err != nil {
		return err
	}
	if k.fn == nil {
		return fmt.Errorf("kernel %s: no Go form: %w", k.name, device.ErrNotSupported)
	}
	fn, name := k.fn, k.name
	err := dev.LaunchFunc(s, n, func(mem device.View, lo, hi int) (err error) {
		defer func() {
			if r := recover(); r != nil {
				ae, ok := r.(*ArgError)
				if !ok {
					panic(r)
				}
				err = ae
			}
		}()
		return fn(Args{name: name, mem: mem, args: args, n: n}, lo, hi)
	})
	if err != nil {
		return fmt.Errorf("kernel %s: %w", k.name, err)
	}
	return nil
}

// check turns args into what a PTX launch takes (arrays become their
// addresses) and refuses other types.
func (k *Kernel) check(n int, args []any) ([]any, error) {
	if n <= 0 || n > math.MaxInt32 {
		return nil, fmt.Errorf("kernel %s: launch over %d indices: want 1 to %d: %w", k.name, n, math.MaxInt32, device.ErrInvalidValue)
	}
	vals := make([]any, len(args))
	for i, a := range args {
		switch v := a.(type) {
		case Array:
			if rv := reflect.ValueOf(v); rv.Kind() == reflect.Pointer && rv.IsNil() || v.Ptr() == 0 {
				return nil, fmt.Errorf("kernel %s: argument %d is a nil array: %w", k.name, i, ErrArgs)
			}
			vals[i] = v.Ptr()
		case int32, uint32, int64, uint64, float32, float64:
			vals[i] = v
		default:
			return nil, fmt.Errorf("kernel %s: argument %d is a %T; want an array or an int32, uint32, int64, uint64, float32 or float64: %w",
				k.name, i, a, ErrArgs)
		}
	}
	return vals, nil
}

// ArgError is a Go kernel's access to an argument it does not have, or as
// a type it is not. It wraps ErrArgs.
type ArgError struct {
	Kernel string
	Index  int
	Want   string // what the access asked for: "[]float32", "float32", …
	Got    string // what the argument is, or "nothing" past the end
	Reason string // set when the argument is of the right kind but cannot be viewed
}

func (e *ArgError) Error() string {
	if e.Reason != "" {
		return fmt.Sprintf("kernel %s: argument %d as %s: %s: %v", e.Kernel, e.Index, e.Want, e.Reason, ErrArgs)
	}
	return fmt.Sprintf("kernel %s: argument %d as %s, but it is %s: %v", e.Kernel, e.Index, e.Want, e.Got, ErrArgs)
}

func (e *ArgError) Unwrap() error { return ErrArgs }

// Args are a Go kernel's arguments while it runs: views of its arrays and
// its scalars, by the index they were passed at. A plain value; its views
// are valid only until the kernel function returns.
type Args struct {
	name string
	mem  device.View
	args []any
	n    int
}

// N is the launch's number of indices.
func (a Args) N() int { return a.n }

// Len is the number of arguments.
func (a Args) Len() int { return len(a.args) }

func (a Args) arg(i int, want string) any {
	if i < 0 || i >= len(a.args) {
		panic(&ArgError{Kernel: a.name, Index: i, Want: want, Got: "nothing"})
	}
	return a.args[i]
}

// Bytes views argument i's array as bytes.
func (a Args) Bytes(i int) []byte {
	arr, ok := a.arg(i, "[]byte").(Array)
	if !ok {
		panic(&ArgError{Kernel: a.name, Index: i, Want: "[]byte", Got: fmt.Sprintf("a %T", a.args[i])})
	}
	b, err := a.mem.Bytes(arr.Ptr(), arr.Bytes())
	if err != nil {
		panic(&ArgError{Kernel: a.name, Index: i, Want: "[]byte", Reason: err.Error()})
	}
	return b
}

// Shape is the shape of argument i's array, as the array states it
// (Shaped): with Float32s(i) and the others, a view that knows its
// dimensions. An argument that is no array, or an array that states no
// shape, is an ArgError.
func (a Args) Shape(i int) []int {
	arr, ok := a.arg(i, "a shaped array").(Shaped)
	if !ok {
		panic(&ArgError{Kernel: a.name, Index: i, Want: "a shaped array", Got: fmt.Sprintf("a %T", a.args[i])})
	}
	return arr.Shape()
}

// viewAs views argument i's array as a slice of T, whose NumPy name is
// elem.
func viewAs[T any](a Args, i int, elem string) []T {
	want := "[]" + elem
	arr, ok := a.arg(i, want).(Array)
	if !ok {
		panic(&ArgError{Kernel: a.name, Index: i, Want: want, Got: fmt.Sprintf("a %T", a.args[i])})
	}
	if ta, typed := arr.(Typed); typed && ta.ElemType() != elem {
		panic(&ArgError{Kernel: a.name, Index: i, Want: want, Got: "an array of " + clip(ta.ElemType(), 32)})
	}
	var zero T
	size := uint64(unsafe.Sizeof(zero))
	n := arr.Bytes() / size
	if n == 0 {
		return nil
	}
	b, err := a.mem.Bytes(arr.Ptr(), n*size)
	if err != nil {
		panic(&ArgError{Kernel: a.name, Index: i, Want: want, Reason: err.Error()})
	}
	p := unsafe.Pointer(unsafe.SliceData(b))
	if uintptr(p)%uintptr(unsafe.Alignof(zero)) != 0 {
		panic(&ArgError{Kernel: a.name, Index: i, Want: want, Reason: fmt.Sprintf("its memory is not aligned to %d bytes", unsafe.Alignof(zero))})
	}
	return unsafe.Slice((*T)(p), n)
}

// Float32s views argument i's array as float32 values.
func (a Args) Float32s(i int) []float32 { return viewAs[float32](a, i, "float32") }

// Float64s views argument i's array as float64 values.
func (a Args) Float64s(i int) []float64 { return viewAs[float64](a, i, "float64") }

// Int32s views argument i's array as int32 values.
func (a Args) Int32s(i int) []int32 { return viewAs[int32](a, i, "int32") }

// Uint32s views argument i's array as uint32 values.
func (a Args) Uint32s(i int) []uint32 { return viewAs[uint32](a, i, "uint32") }

// Int64s views argument i's array as int64 values.
func (a Args) Int64s(i int) []int64 { return viewAs[int64](a, i, "int64") }

// scalar returns argument i as a T.
func scalar[T any](a Args, i int, want string) T {
	v, ok := a.arg(i, want).(T)
	if !ok {
		panic(&ArgError{Kernel: a.name, Index: i, Want: want, Got: fmt.Sprintf("a %T", a.args[i])})
	}
	return v
}

// Float32 is scalar argument i, a float32.
func (a Args) Float32(i int) float32 { return scalar[float32](a, i, "float32") }

// Float64 is scalar argument i, a float64.
func (a Args) Float64(i int) float64 { return scalar[float64](a, i, "float64") }

// Int32 is scalar argument i, an int32.
func (a Args) Int32(i int) int32 { return scalar[int32](a, i, "int32") }

// Uint32 is scalar argument i, a uint32.
func (a Args) Uint32(i int) uint32 { return scalar[uint32](a, i, "uint32") }

// Int64 is scalar argument i, an int64.
func (a Args) Int64(i int) int64 { return scalar[int64](a, i, "int64") }

// Uint64 is scalar argument i, a uint64.
func (a Args) Uint64(i int) uint64 { return scalar[uint64](a, i, "uint64") }
