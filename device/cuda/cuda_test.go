package cuda

import (
	"errors"
	"fmt"
	"math"
	"os"
	"reflect"
	"runtime"
	"slices"
	"strings"
	"testing"
	"unsafe"

	"go.uber.org/goleak"

	"github.com/vramkit/vram/device"
)

// loadedAtStart records whether the driver library had been loaded before
// any test ran: importing the package must not load it.
var loadedAtStart bool

func TestMain(m *testing.M) {
	loadedAtStart = loaded != nil
	// With the fake driver library named in the environment (see
	// fakedriver_test.go), every test and benchmark runs against it.
	if lib := os.Getenv(fakeEnv); lib != "" {
		libraryNames = []string{lib}
	}
	goleak.VerifyTestMain(m)
}

// openOrSkip opens CUDA device 0 for one test and closes it afterwards, or
// skips the test with the reason the backend gave.
func openOrSkip(t testing.TB) *Device {
	t.Helper()
	d, err := Open(0)
	if errors.Is(err, device.ErrNoDevice) {
		t.Skipf("no CUDA device: %v", err)
	}
	if err != nil {
		t.Fatalf("cuda.Open(0): %v", err)
	}
	t.Cleanup(func() {
		if err := d.Close(); err != nil && !errors.Is(err, device.ErrClosed) {
			t.Errorf("Close: %v", err)
		}
	})
	return d
}

// probe says why there is no CUDA device here, or "" when there is one.
func probe() string {
	d, err := Open(0)
	if err != nil {
		return err.Error()
	}
	d.Close()
	return ""
}

// TestNothingAtImport: importing the package (and every package the test
// binary links, vram's manager among them) registers the backend and does
// nothing else — the driver library is loaded by the first Open.
func TestNothingAtImport(t *testing.T) {
	if loadedAtStart {
		t.Error("the driver library was loaded before any test ran: something opened it at import time")
	}
	if !slices.Contains(device.Backends(), "cuda") {
		t.Errorf("device.Backends() = %v; want the cuda backend registered", device.Backends())
	}
}

func TestOpenWithoutDriver(t *testing.T) {
	d, err := device.Open("cuda")
	if err == nil {
		d.Close()
		t.Skip("a CUDA driver and device are present: the no-driver path cannot be shown here")
	}
	if !errors.Is(err, device.ErrNoDevice) {
		t.Fatalf(`Open("cuda") = %v; want an error wrapping device.ErrNoDevice`, err)
	}
	if _, lerr := load(); lerr != nil && !strings.Contains(err.Error(), "libcuda.so.1") {
		t.Fatalf(`Open("cuda") = %q; want the message to name libcuda.so.1`, err)
	}
	spec, err := device.ParseSpec("cuda:0")
	if err != nil {
		t.Fatal(err)
	}
	_, fallback, err := device.OpenSpec(spec)
	if err == nil || fallback != nil || !errors.Is(err, device.ErrNoDevice) {
		t.Fatalf(`OpenSpec("cuda:0") = %v, %v; want an ErrNoDevice error and no fallback`, fallback, err)
	}
}

func TestOpenLib(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the driver is only loaded on Linux")
	}
	tests := map[string]struct {
		names []string
		want  []string
	}{
		"missing library": {
			names: []string{"libvram-test-no-such-library.so.1"},
			want:  []string{"libvram-test-no-such-library.so.1", "is the NVIDIA driver installed"},
		},
		"both names missing": {
			names: []string{"libvram-test-a.so.1", "libvram-test-b.so"},
			want:  []string{"libvram-test-a.so.1", "libvram-test-b.so"},
		},
		"library without the driver's symbols": {
			names: []string{"libc.so.6"},
			want:  []string{"libc.so.6 has no symbol cuInit"},
		},
		"falls back to the second name": {
			names: []string{"libvram-test-no-such-library.so.1", "libc.so.6"},
			want:  []string{"libc.so.6 has no symbol cuInit"},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			l, err := openLib(tc.names)
			if err == nil {
				t.Fatalf("openLib(%v) loaded %s; want an error", tc.names, l.path)
			}
			if !errors.Is(err, errLoad) {
				t.Errorf("openLib error %v does not wrap errLoad", err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("openLib(%v) = %q; want it to mention %q", tc.names, err, w)
				}
			}
		})
	}
}

func TestParseOrdinal(t *testing.T) {
	tests := map[string]struct {
		opts string
		want int
		bad  bool
	}{
		"empty":    {opts: "", want: 0},
		"zero":     {opts: "0", want: 0},
		"three":    {opts: "3", want: 3},
		"spaces":   {opts: " 1 ", want: 1},
		"letters":  {opts: "abc", bad: true},
		"negative": {opts: "-1", bad: true},
		"fraction": {opts: "1.5", bad: true},
		"options":  {opts: "vram=1GiB", bad: true},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			n, err := parseOrdinal(tc.opts)
			if tc.bad {
				if !errors.Is(err, device.ErrBadSpec) {
					t.Fatalf("parseOrdinal(%q) = %d, %v; want ErrBadSpec", tc.opts, n, err)
				}
				// Open reports the spec error before trying the driver.
				if _, err := device.Open("cuda:" + tc.opts); !errors.Is(err, device.ErrBadSpec) {
					t.Fatalf(`device.Open("cuda:%s") = %v; want ErrBadSpec`, tc.opts, err)
				}
				return
			}
			if err != nil || n != tc.want {
				t.Fatalf("parseOrdinal(%q) = %d, %v; want %d", tc.opts, n, err, tc.want)
			}
		})
	}
	if _, err := Open(-2); !errors.Is(err, device.ErrBadSpec) {
		t.Fatalf("Open(-2) = %v; want ErrBadSpec", err)
	}
}

func TestResult(t *testing.T) {
	tests := map[string]struct {
		r       Result
		name    string
		matches []error
	}{
		"out of memory":  {r: ErrorOutOfMemory, name: "CUDA_ERROR_OUT_OF_MEMORY", matches: []error{device.ErrOutOfMemory}},
		"invalid value":  {r: ErrorInvalidValue, name: "CUDA_ERROR_INVALID_VALUE", matches: []error{device.ErrInvalidValue}},
		"not supported":  {r: ErrorNotSupported, name: "CUDA_ERROR_NOT_SUPPORTED", matches: []error{device.ErrNotSupported}},
		"no device":      {r: ErrorNoDevice, name: "CUDA_ERROR_NO_DEVICE", matches: []error{device.ErrNoDevice}},
		"stub library":   {r: ErrorStubLibrary, name: "CUDA_ERROR_STUB_LIBRARY", matches: []error{device.ErrNoDevice}},
		"destroyed":      {r: ErrorContextIsDestroyed, name: "CUDA_ERROR_CONTEXT_IS_DESTROYED", matches: []error{device.ErrInvalidated}},
		"illegal addr":   {r: ErrorIllegalAddress, name: "CUDA_ERROR_ILLEGAL_ADDRESS", matches: []error{device.ErrInvalidPointer}},
		"not ready":      {r: ErrorNotReady, name: "CUDA_ERROR_NOT_READY"},
		"invalid PTX":    {r: ErrorInvalidPTX, name: "CUDA_ERROR_INVALID_PTX"},
		"launch failure": {r: ErrorLaunchFailed, name: "CUDA_ERROR_LAUNCH_FAILED"},
		"unnamed code":   {r: Result(12345), name: "12345"},
	}
	all := []error{device.ErrOutOfMemory, device.ErrInvalidValue, device.ErrNotSupported, device.ErrNoDevice,
		device.ErrInvalidated, device.ErrInvalidPointer, device.ErrClosed, device.ErrCopyFailed}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if !strings.Contains(tc.r.Error(), tc.name) {
				t.Errorf("Result(%d).Error() = %q; want it to contain %q", int32(tc.r), tc.r.Error(), tc.name)
			}
			if !strings.Contains(tc.r.Error(), fmt.Sprintf("(%d)", int32(tc.r))) {
				t.Errorf("Result(%d).Error() = %q; want it to show the code", int32(tc.r), tc.r.Error())
			}
			wrapped := fmt.Errorf("cuda: some call: %w", tc.r)
			for _, target := range all {
				want := false
				for _, m := range tc.matches {
					want = want || m == target
				}
				if got := errors.Is(wrapped, target); got != want {
					t.Errorf("errors.Is(%v, %q) = %v, want %v", tc.r, target, got, want)
				}
			}
			var r Result
			if !errors.As(wrapped, &r) || r != tc.r {
				t.Errorf("errors.As did not recover the Result from %v", wrapped)
			}
		})
	}
}

func TestPackArgs(t *testing.T) {
	tests := map[string]struct {
		arg  any
		bits uint64
		size int
		ptr  bool
	}{
		"Ptr":     {arg: device.Ptr(0x7f0000001000), bits: 0x7f0000001000, size: 8, ptr: true},
		"int32":   {arg: int32(-2), bits: 0xfffffffe, size: 4},
		"uint32":  {arg: uint32(7), bits: 7, size: 4},
		"int64":   {arg: int64(-1), bits: math.MaxUint64, size: 8},
		"uint64":  {arg: uint64(1) << 40, bits: 1 << 40, size: 8},
		"float32": {arg: float32(1.5), bits: 0x3fc00000, size: 4},
		"float64": {arg: 2.0, bits: 0x4000000000000000, size: 8},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			s, err := packArg(tc.arg)
			if err != nil || s.bits != tc.bits || s.size != tc.size || s.ptr != tc.ptr {
				t.Fatalf("packArg(%v) = %+v, %v; want bits %#x, size %d, ptr %v", tc.arg, s, err, tc.bits, tc.size, tc.ptr)
			}
		})
	}
	for _, bad := range []any{int(1), "x", uintptr(3), nil, []float32{1}} {
		if _, err := packArg(bad); !errors.Is(err, device.ErrInvalidValue) {
			t.Errorf("packArg(%#v) = %v; want ErrInvalidValue", bad, err)
		}
	}

	params := []ptxParam{{"u64", 8}, {"u32", 4}, {"f32", 4}, {"f64", 8}}
	args := []any{device.Ptr(0x1000), uint32(9), float32(0.25), 3.0}
	var pin runtime.Pinner
	defer pin.Unpin()
	slots, vals, ptrs, err := packArgs("k", params, args, &pin)
	if err != nil {
		t.Fatal(err)
	}
	if len(slots) != 4 || len(vals) != 4 || len(ptrs) != 4 {
		t.Fatalf("packArgs lengths %d, %d, %d; want 4", len(slots), len(vals), len(ptrs))
	}
	// Each kernelParams entry is the address of its value, laid out as the
	// driver reads it: little-endian from the slot's first byte.
	for i := range vals {
		if ptrs[i] != uintptr(unsafe.Pointer(&vals[i])) {
			t.Errorf("kernelParams[%d] = %#x, not the address of value slot %d", i, ptrs[i], i)
		}
	}
	if vals[0] != 0x1000 || uint32(vals[1]) != 9 || math.Float32frombits(uint32(vals[2])) != 0.25 || math.Float64frombits(vals[3]) != 3 {
		t.Errorf("value slots %#x", vals)
	}

	mismatch := map[string]struct {
		params []ptxParam
		args   []any
		want   string
	}{
		"too few":         {params: params, args: args[:3], want: "takes 4 parameters, got 3"},
		"too many":        {params: params[:1], args: args[:2], want: "takes 1 parameters, got 2"},
		"narrow for wide": {params: params[:1], args: []any{uint32(1)}, want: "uint32 (4 bytes) but the parameter is .u64 (8 bytes)"},
		"wide for narrow": {params: params[1:2], args: []any{device.Ptr(1)}, want: "device.Ptr (8 bytes) but the parameter is .u32"},
		"bad type":        {params: nil, args: []any{1}, want: "argument 0"},
	}
	for name, tc := range mismatch {
		t.Run(name, func(t *testing.T) {
			var pin runtime.Pinner
			defer pin.Unpin()
			_, _, _, err := packArgs("k", tc.params, tc.args, &pin)
			if !errors.Is(err, device.ErrInvalidValue) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("packArgs = %v; want ErrInvalidValue mentioning %q", err, tc.want)
			}
		})
	}
	// Unknown parameter lists (nil) check only the Go types.
	if _, _, _, err := packArgs("k", nil, args, &pin); err != nil {
		t.Fatalf("packArgs without a parameter list: %v", err)
	}
}

func TestPTXEntries(t *testing.T) {
	const ptx = `
.version 7.0
.target sm_52
.address_size 64
// .entry commented(.param .u64 x)
.visible .entry scale(
	.param .u64 scale_p,   // the data
	.param .u32 scale_n,
	.param .f32 scale_a
)
{ ret; }
.entry noargs()
{ ret; }
.visible .entry aligned(.param .align 8 .u64 .ptr.global.align 16 a_p, .param .s64 a_n)
{ ret; }
.visible .entry bystruct(.param .align 4 .b8 bs_s[12])
{ ret; }
/* .entry blockcomment(.param .u32 z) */
`
	got := ptxEntries(ptx)
	want := map[string][]ptxParam{
		"scale":   {{"u64", 8}, {"u32", 4}, {"f32", 4}},
		"noargs":  {},
		"aligned": {{"u64", 8}, {"s64", 8}},
	}
	if len(got) != len(want) {
		t.Errorf("ptxEntries found %v; want the entries %v (struct parameters and comments left out)", got, want)
	}
	for name, w := range want {
		g, ok := got[name]
		if !ok || fmt.Sprint(g) != fmt.Sprint(w) {
			t.Errorf("entry %s: %v, want %v", name, g, w)
		}
	}
}

func TestSpanSet(t *testing.T) {
	var ss spanSet
	ss.insert(span{base: 1000, size: 100, kind: kindMalloc})
	ss.insert(span{base: 100, size: 50, kind: kindAsync})
	ss.insert(span{base: 5000, size: 1, kind: kindMapped})
	lookups := map[string]struct {
		addr uint64
		base uint64
		ok   bool
	}{
		"below all":      {addr: 99},
		"first byte":     {addr: 100, base: 100, ok: true},
		"last byte":      {addr: 149, base: 100, ok: true},
		"one past":       {addr: 150},
		"between":        {addr: 999},
		"interior":       {addr: 1050, base: 1000, ok: true},
		"single byte":    {addr: 5000, base: 5000, ok: true},
		"after the last": {addr: 5001},
	}
	for name, tc := range lookups {
		t.Run(name, func(t *testing.T) {
			sp, ok := ss.containing(tc.addr)
			if ok != tc.ok || (ok && sp.base != tc.base) {
				t.Fatalf("containing(%d) = %+v, %v; want base %d, %v", tc.addr, sp, ok, tc.base, tc.ok)
			}
		})
	}
	if _, ok := ss.get(1050); ok {
		t.Error("get of an interior address found a span")
	}
	// A new span over old ones replaces them.
	ss.insert(span{base: 90, size: 1000, kind: kindMalloc})
	if ss.len() != 2 {
		t.Fatalf("after an overlapping insert: %v; want [90,1090) and [5000,5001)", ss.all())
	}
	if sp, ok := ss.remove(90); !ok || sp.size != 1000 {
		t.Fatalf("remove(90) = %+v, %v", sp, ok)
	}
	if _, ok := ss.remove(90); ok {
		t.Fatal("second remove(90) found a span")
	}
	var other spanSet
	other.insert(span{base: 1, size: 1})
	ss.moveAll(&other)
	if ss.len() != 2 || other.len() != 0 {
		t.Fatalf("moveAll: %d and %d spans, want 2 and 0", ss.len(), other.len())
	}

	f := freedSet{max: 3}
	for i := uint64(1); i <= 5; i++ {
		f.add(span{base: i * 100, size: 10})
	}
	if _, ok := f.containing(105); ok {
		t.Error("freedSet kept more than its bound")
	}
	if _, ok := f.containing(505); !ok {
		t.Error("freedSet lost its newest record")
	}
	f.forget(500, 10)
	if _, ok := f.containing(505); ok {
		t.Error("forget did not drop a reused range")
	}
}

// TestNoGoPointersToDriver: memory handed to the driver holds no Go
// pointers (the rule for memory passed to C): the 2-D copy descriptor has
// integer fields only, and the kernelParams array packArgs builds and
// launchKernel passes is an array of integer addresses (of pinned slots).
func TestNoGoPointersToDriver(t *testing.T) {
	ct := reflect.TypeOf(memcpy2D{})
	for i := range ct.NumField() {
		switch f := ct.Field(i); f.Type.Kind() {
		case reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		default:
			t.Errorf("memcpy2D.%s is a %v: the driver reads this struct, so it may hold integers only", f.Name, f.Type)
		}
	}
	want := reflect.TypeOf([]uintptr(nil))
	if got := reflect.TypeOf(packArgs).Out(2); got != want {
		t.Errorf("packArgs builds kernelParams as %v; want %v", got, want)
	}
	if got := reflect.TypeOf((*lib).launchKernel).In(6); got != want {
		t.Errorf("launchKernel passes kernelParams as %v; want %v", got, want)
	}
}

func TestStickyResults(t *testing.T) {
	cases := map[string]struct {
		r      Result
		sticky bool
	}{
		"illegal address":  {ErrorIllegalAddress, true},
		"launch failed":    {ErrorLaunchFailed, true},
		"misaligned":       {ErrorMisalignedAddress, true},
		"out of memory":    {ErrorOutOfMemory, false},
		"invalid value":    {ErrorInvalidValue, false},
		"context gone":     {ErrorContextIsDestroyed, false},
		"already pinned":   {ErrorHostMemoryAlreadyReg, false},
		"operating system": {ErrorOperatingSystem, false},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			if tc.r.Sticky() != tc.sticky || errors.Is(tc.r, ErrNeedsReset) != tc.sticky ||
				strings.Contains(tc.r.Error(), "sticky") != tc.sticky {
				t.Errorf("%v: Sticky %v, Is(ErrNeedsReset) %v; want %v", tc.r, tc.r.Sticky(), errors.Is(tc.r, ErrNeedsReset), tc.sticky)
			}
		})
	}
	if !errors.Is(ErrorIllegalAddress, device.ErrInvalidPointer) {
		t.Error("CUDA_ERROR_ILLEGAL_ADDRESS no longer matches device.ErrInvalidPointer")
	}
}
