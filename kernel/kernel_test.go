package kernel_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/vramkit/vram/device"
	"github.com/vramkit/vram/device/sim"
	"github.com/vramkit/vram/internal/simtest"
	"github.com/vramkit/vram/kernel"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// buf is a device allocation as a kernel argument.
type buf struct {
	p device.Ptr
	n uint64
}

func (b buf) Ptr() device.Ptr { return b.p }
func (b buf) Bytes() uint64   { return b.n }

// ptrBuf is an array behind a pointer, as *vram.DeviceArray is.
type ptrBuf struct{ buf }

// shaped is an array that states its shape (kernel.Shaped), as
// *vram.DeviceArray does.
type shaped struct {
	buf
	shape []int
}

func (s *shaped) Shape() []int { return s.shape }

// newSim is a simulated device of 64 MiB, checked for leaks when the
// test ends (simtest).
func newSim(t *testing.T) *sim.Device { return simtest.New(t, 64<<20) }

func alloc(t *testing.T, dev *sim.Device, n uint64) buf {
	t.Helper()
	p, err := dev.Malloc(n)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dev.Free(p) })
	return buf{p, n}
}

// TestGoViews launches a Go kernel that reads and writes every view type
// and scalar type, and checks the bytes on the device: little-endian.
func TestGoViews(t *testing.T) {
	dev := newSim(t)
	const n = 1000
	f32, f64, i32, u32, i64 := alloc(t, dev, 4*n), alloc(t, dev, 8*n), alloc(t, dev, 4*n), alloc(t, dev, 4*n), alloc(t, dev, 8*n)
	k, err := kernel.New("views", "", func(a kernel.Args, lo, hi int) error {
		x, y, z, u, w := a.Float32s(0), a.Float64s(1), a.Int32s(2), a.Uint32s(3), a.Int64s(4)
		for i := lo; i < hi; i++ {
			x[i] = a.Float32(5) * float32(i)
			y[i] = a.Float64(6) * float64(i)
			z[i] = a.Int32(7) - int32(i)
			u[i] = a.Uint32(8) + uint32(i)
			w[i] = a.Int64(9) + int64(a.Uint64(10)) + int64(i)
		}
		return nil
	}, 0)
	if err != nil {
		t.Fatal(err)
	}
	s := dev.DefaultStream()
	if err := k.Launch(dev, s, n, f32, f64, i32, u32, i64, float32(0.5), float64(0.25), int32(-3), uint32(7), int64(1)<<40, uint64(2)); err != nil {
		t.Fatal(err)
	}
	if err := s.Synchronize(); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 4*n)
	if err := dev.CopyDtoH(got, i32.p, s); err != nil || s.Synchronize() != nil {
		t.Fatal(err)
	}
	// int32 at index 5: −3 − 5 = −8, little-endian.
	if want := []byte{0xf8, 0xff, 0xff, 0xff}; string(got[20:24]) != string(want) {
		t.Errorf("int32 element 5 is % x on the device, want % x", got[20:24], want)
	}
	if err := dev.CopyDtoH(got, f32.p, s); err != nil || s.Synchronize() != nil {
		t.Fatal(err)
	}
	// float32 at index 2: 1.0 = 0x3f800000.
	if want := []byte{0, 0, 0x80, 0x3f}; string(got[8:12]) != string(want) {
		t.Errorf("float32 element 2 is % x, want % x", got[8:12], want)
	}
	if k.Form(dev) != "go" {
		t.Errorf("Form(sim) = %q, want go", k.Form(dev))
	}
}

// TestArgErrors checks arguments a kernel cannot take (refused by
// Launch) and accesses of the wrong type or index (the launch's error,
// from the stream).
func TestArgErrors(t *testing.T) {
	dev := newSim(t)
	b := alloc(t, dev, 64)
	tests := map[string]struct {
		fn        kernel.Func
		args      []any
		atLaunch  bool
		wantInMsg string
	}{
		"string arg":     {fn: func(kernel.Args, int, int) error { return nil }, args: []any{"x"}, atLaunch: true, wantInMsg: "argument 0 is a string"},
		"int arg":        {fn: func(kernel.Args, int, int) error { return nil }, args: []any{b, 3}, atLaunch: true, wantInMsg: "argument 1 is a int"},
		"nil array":      {fn: func(kernel.Args, int, int) error { return nil }, args: []any{buf{}}, atLaunch: true, wantInMsg: "nil array"},
		"view a scalar":  {fn: func(a kernel.Args, _, _ int) error { a.Float32s(0); return nil }, args: []any{float32(1)}, wantInMsg: "argument 0 as []float32, but it is a float32"},
		"scalar a view":  {fn: func(a kernel.Args, _, _ int) error { a.Uint32(0); return nil }, args: []any{b}, wantInMsg: "argument 0 as uint32, but it is a kernel_test.buf"},
		"past the end":   {fn: func(a kernel.Args, _, _ int) error { a.Int32s(2); return nil }, args: []any{b}, wantInMsg: "argument 2 as []int32, but it is nothing"},
		"wrong scalar":   {fn: func(a kernel.Args, _, _ int) error { a.Float64(0); return nil }, args: []any{float32(1)}, wantInMsg: "as float64, but it is a float32"},
		"out of bounds":  {fn: func(a kernel.Args, _, _ int) error { a.Bytes(0); return nil }, args: []any{buf{b.p, 1 << 20}}, wantInMsg: "argument 0 as []byte"},
		"unshaped":       {fn: func(a kernel.Args, _, _ int) error { a.Shape(0); return nil }, args: []any{b}, wantInMsg: "argument 0 as a shaped array, but it is a kernel_test.buf"},
		"shape a scalar": {fn: func(a kernel.Args, _, _ int) error { a.Shape(0); return nil }, args: []any{float32(1)}, wantInMsg: "argument 0 as a shaped array, but it is a float32"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			k, err := kernel.New("k", "", tc.fn, 0)
			if err != nil {
				t.Fatal(err)
			}
			s, err := dev.NewStream()
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			err = k.Launch(dev, s, 4, tc.args...)
			if !tc.atLaunch {
				if err != nil {
					t.Fatalf("Launch: %v", err)
				}
				err = s.Synchronize()
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantInMsg) {
				t.Fatalf("error %v, want one saying %q", err, tc.wantInMsg)
			}
			if name != "out of bounds" && !errors.Is(err, kernel.ErrArgs) {
				t.Errorf("error %v does not wrap ErrArgs", err)
			}
		})
	}
}

// TestShapedView: a Go kernel reads the row stride of a 2-D array from
// its view's shape, not from an argument.
func TestShapedView(t *testing.T) {
	dev := newSim(t)
	const rows, cols = 3, 50
	x := &shaped{alloc(t, dev, 4*rows*cols), []int{rows, cols}}
	k, err := kernel.New("rows", "", func(a kernel.Args, lo, hi int) error {
		v, ld := a.Float32s(0), a.Shape(0)[1]
		for i := lo; i < hi; i++ {
			for r := range a.Shape(0)[0] {
				v[r*ld+i] = float32(r)
			}
		}
		return nil
	}, 0)
	if err != nil {
		t.Fatal(err)
	}
	s := dev.DefaultStream()
	if err := k.Launch(dev, s, cols, x); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 4*rows*cols)
	if err := dev.CopyDtoH(got, x.p, s); err != nil || s.Synchronize() != nil {
		t.Fatal(err)
	}
	// Element [2][49]: 2.0 = 0x40000000, at byte 4·(2·50+49).
	if o := 4 * (2*cols + cols - 1); string(got[o:o+4]) != string([]byte{0, 0, 0, 0x40}) {
		t.Errorf("element [2][49] is % x, want 2.0", got[o:o+4])
	}
}

func TestNewErrors(t *testing.T) {
	fn := func(kernel.Args, int, int) error { return nil }
	tests := map[string]struct {
		name, ptx string
		fn        kernel.Func
		block     int
	}{
		"no name":     {"", "ptx", fn, 0},
		"no form":     {"k", "", nil, 0},
		"block 2048":  {"k", "ptx", fn, 2048},
		"block below": {"k", "ptx", fn, -1},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if _, err := kernel.New(tc.name, tc.ptx, tc.fn, tc.block); !errors.Is(err, kernel.ErrArgs) {
				t.Errorf("New = %v, want ErrArgs", err)
			}
		})
	}
}

// TestMust: Must returns New's kernel, and panics with New's error.
func TestMust(t *testing.T) {
	fn := func(kernel.Args, int, int) error { return nil }
	for name, tc := range map[string]struct {
		name    string
		wantErr error
	}{
		"a kernel": {name: "k"},
		"no name":  {name: "", wantErr: kernel.ErrArgs},
	} {
		t.Run(name, func(t *testing.T) {
			defer func() {
				p := recover()
				if err, _ := p.(error); !errors.Is(err, tc.wantErr) || (tc.wantErr == nil) != (p == nil) {
					t.Errorf("Must panicked with %v; want %v", p, tc.wantErr)
				}
			}()
			if k := kernel.Must(kernel.New(tc.name, "", fn, 0)); k.Name() != tc.name {
				t.Errorf("Must returned the kernel %q, want %q", k.Name(), tc.name)
			}
		})
	}
}

// ptxDev is a simulator that also loads PTX: it records what a launch
// would pass to the driver.
type ptxDev struct {
	*sim.Device
	loads, unloads int
	launches       []string
}

type fakeModule struct{ d *ptxDev }
type fakeFunction struct {
	d    *ptxDev
	name string
}

func (d *ptxDev) LoadPTX(ptx string) (device.Module, error) {
	if !strings.Contains(ptx, ".entry") {
		return nil, fmt.Errorf("no entry: %w", device.ErrInvalidValue)
	}
	d.loads++
	return fakeModule{d}, nil
}

func (m fakeModule) Function(name string) (device.Function, error) {
	return fakeFunction{m.d, name}, nil
}
func (m fakeModule) Close() error { m.d.unloads++; return nil }

func (f fakeFunction) Launch(s device.Stream, grid, block device.Dim3, shared uint32, args ...any) error {
	f.d.launches = append(f.d.launches, fmt.Sprintf("%s grid %d block %d args %v", f.name, grid.X, block.X, args))
	return nil
}

// TestPTXForm checks that a device that loads PTX gets the PTX form:
// loaded once, a 1-D grid covering n, arrays passed as addresses.
func TestPTXForm(t *testing.T) {
	dev := &ptxDev{Device: newSim(t)}
	k, err := kernel.New("scale", ".entry scale", func(kernel.Args, int, int) error {
		t.Error("the Go form ran on a device that loads PTX")
		return nil
	}, 256)
	if err != nil {
		t.Fatal(err)
	}
	if k.Form(dev) != "ptx" {
		t.Fatalf("Form = %q, want ptx", k.Form(dev))
	}
	b := buf{0x1000, 64}
	for _, n := range []int{1, 256, 257} {
		if err := k.Launch(dev, dev.DefaultStream(), n, b, uint32(n), float32(2)); err != nil {
			t.Fatal(err)
		}
	}
	want := []string{
		"scale grid 1 block 256 args [0x1000 1 2]",
		"scale grid 1 block 256 args [0x1000 256 2]",
		"scale grid 2 block 256 args [0x1000 257 2]",
	}
	if fmt.Sprint(dev.launches) != fmt.Sprint(want) || dev.loads != 1 {
		t.Errorf("launches %q after %d loads; want %q after 1", dev.launches, dev.loads, want)
	}
	if err := k.Close(); err != nil || dev.unloads != 1 {
		t.Errorf("Close = %v after %d unloads, want 1", err, dev.unloads)
	}
	goOnly, _ := kernel.New("g", "", func(kernel.Args, int, int) error { return nil }, 0)
	if goOnly.Form(dev) != "go" {
		t.Errorf("a Go-only kernel on a device with both: form %q, want go", goOnly.Form(dev))
	}
	ptxOnly, _ := kernel.New("p", ".entry p", nil, 0)
	if err := ptxOnly.Launch(dev.Device, dev.DefaultStream(), 1); !errors.Is(err, device.ErrNotSupported) {
		t.Errorf("a PTX-only kernel on the simulator: %v, want ErrNotSupported", err)
	}
}

// TestNewChecksPTXEntry: PTX given to New must declare ".entry NAME"
// (outside comments); otherwise New refuses it on any device, saying
// what the PTX declares, instead of the first GPU failing to load it.
func TestNewChecksPTXEntry(t *testing.T) {
	fn := func(kernel.Args, int, int) error { return nil }
	for name, tc := range map[string]struct {
		ptx  string
		says string // "" accepted
	}{
		"entry with parameters": {ptx: ".version 7.0\n.target sm_50\n.visible .entry k(\n\t.param .u64 k_param_0\n)\n{\n\tret;\n}\n"},
		"entry with no list":    {ptx: ".entry k\n{\n\tret;\n}"},
		"one of several":        {ptx: ".entry a() { ret; }\n.entry k() { ret; }"},
		"a placeholder":         {ptx: "ptx", says: "declares no .entry at all"},
		"another entry":         {ptx: ".visible .entry other(\n.param .u32 n\n) { ret; }", says: "declares .entry other"},
		"a longer name":         {ptx: ".entry kk() { ret; }", says: "declares .entry kk"},
		"only in a comment":     {ptx: "// .entry k()\n/* .entry k() */\n.entry j() { ret; }", says: "declares .entry j"},
		"many entries, clipped": {ptx: strings.Repeat(".entry e() {}\n", 10) + ".entry " + strings.Repeat("x", 100) + "() {}", says: "… 3 more"},
	} {
		t.Run(name, func(t *testing.T) {
			k, err := kernel.New("k", tc.ptx, fn, 0)
			if tc.says == "" {
				if err != nil || k.Name() != "k" {
					t.Fatalf("New = %v, %v; want the kernel", k, err)
				}
				return
			}
			if !errors.Is(err, kernel.ErrArgs) || !strings.Contains(err.Error(), `no ".entry k"`) || !strings.Contains(err.Error(), tc.says) {
				t.Errorf("New = %v; want ErrArgs saying the PTX has no .entry k and %q", err, tc.says)
			}
		})
	}
}

// typedBuf is an array that states its element type, as
// *vram.DeviceArray does.
type typedBuf struct {
	buf
	elem string
}

func (b typedBuf) ElemType() string { return b.elem }

// TestTypedViewsCheckTheDType: a view of a Typed array as another
// element type is the launch's error (an *ArgError wrapping ErrArgs);
// its own type and Bytes view it; an array that states no type is viewed
// as asked.
func TestTypedViewsCheckTheDType(t *testing.T) {
	dev := newSim(t)
	b := alloc(t, dev, 64)
	f32 := typedBuf{b, "float32"}
	for name, tc := range map[string]struct {
		arg  any
		view func(kernel.Args)
		says string // "" no error
	}{
		"float32 as float32":  {f32, func(a kernel.Args) { _ = a.Float32s(0) }, ""},
		"float32 as bytes":    {f32, func(a kernel.Args) { _ = a.Bytes(0) }, ""},
		"float32 as float64":  {f32, func(a kernel.Args) { _ = a.Float64s(0) }, "argument 0 as []float64, but it is an array of float32"},
		"float32 as int32":    {f32, func(a kernel.Args) { _ = a.Int32s(0) }, "as []int32, but it is an array of float32"},
		"int64 as uint32":     {typedBuf{b, "int64"}, func(a kernel.Args) { _ = a.Uint32s(0) }, "as []uint32, but it is an array of int64"},
		"untyped as anything": {b, func(a kernel.Args) { _ = a.Int64s(0) }, ""},
	} {
		t.Run(name, func(t *testing.T) {
			k, err := kernel.New("k", "", func(a kernel.Args, _, _ int) error { tc.view(a); return nil }, 0)
			if err != nil {
				t.Fatal(err)
			}
			s := dev.DefaultStream()
			if err := k.Launch(dev, s, 1, tc.arg); err != nil {
				t.Fatal(err)
			}
			err = s.Synchronize()
			var ae *kernel.ArgError
			if tc.says == "" {
				if err != nil {
					t.Errorf("launch: %v", err)
				}
			} else if !errors.As(err, &ae) || !errors.Is(err, kernel.ErrArgs) || !strings.Contains(err.Error(), tc.says) {
				t.Errorf("launch: %v; want an *ArgError saying %q", err, tc.says)
			}
		})
	}
}
