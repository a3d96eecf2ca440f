package vram

// Array requests: what a client asks the manager for, and the small value
// types it is made of (DType, MemoryType). Validation lives here so that
// Client.Queue, Plan and the command-line tool refuse the same requests
// with the same messages.

import (
	"fmt"
	"math"
	"math/bits"
	"strings"
)

// DType is an array's element type. The zero value is not a type: a
// request must name one. A DType is a plain value, safe to share.
type DType uint8

// The element types the manager knows.
const (
	Float64 DType = iota + 1
	Float32
	Int32
	Int64
	Uint8
	Uint32
	Complex64
	Complex128
)

var dtypeInfo = [...]struct {
	name string
	size uint64
}{
	Float64:    {"float64", 8},
	Float32:    {"float32", 4},
	Int32:      {"int32", 4},
	Int64:      {"int64", 8},
	Uint8:      {"uint8", 1},
	Uint32:     {"uint32", 4},
	Complex64:  {"complex64", 8},
	Complex128: {"complex128", 16},
}

// DTypes lists every known element type.
func DTypes() []DType {
	return []DType{Float64, Float32, Int32, Int64, Uint8, Uint32, Complex64, Complex128}
}

// Valid reports whether d is a known element type.
func (d DType) Valid() bool { return d >= Float64 && int(d) < len(dtypeInfo) }

// Size is the element size in bytes, 0 for an unknown type.
func (d DType) Size() uint64 {
	if !d.Valid() {
		return 0
	}
	return dtypeInfo[d].size
}

// String is the NumPy name of the type ("float64"), or "dtype(N)".
func (d DType) String() string {
	if !d.Valid() {
		return fmt.Sprintf("dtype(%d)", uint8(d))
	}
	return dtypeInfo[d].name
}

// ParseDType reads a NumPy-style type name: "float64", "f8", "float32",
// "f4", "int32", "i4", "int64", "i8", "uint8", "u1", "uint32", "u4",
// "complex64", "c8", "complex128", "c16". Case and spaces are ignored.
func ParseDType(s string) (DType, error) {
	t := strings.ToLower(strings.TrimSpace(s))
	aliases := map[string]DType{
		"f8": Float64, "double": Float64, "f4": Float32, "float": Float32,
		"i4": Int32, "i8": Int64, "u1": Uint8, "byte": Uint8, "u4": Uint32,
		"c8": Complex64, "c16": Complex128,
	}
	if d, ok := aliases[t]; ok {
		return d, nil
	}
	for _, d := range DTypes() {
		if d.String() == t {
			return d, nil
		}
	}
	names := make([]string, 0, len(dtypeInfo))
	for _, d := range DTypes() {
		names = append(names, d.String())
	}
	return 0, fmt.Errorf("dtype %q: want one of %s: %w", s, strings.Join(names, ", "), ErrInvalidRequest)
}

// MarshalText writes the type's name, so DTypes read well in JSON.
func (d DType) MarshalText() ([]byte, error) {
	if !d.Valid() {
		return nil, fmt.Errorf("marshal %v: %w", d, ErrInvalidRequest)
	}
	return []byte(d.String()), nil
}

// UnmarshalText reads a name as ParseDType does.
func (d *DType) UnmarshalText(b []byte) error {
	v, err := ParseDType(string(b))
	if err != nil {
		return err
	}
	*d = v
	return nil
}

// MemoryType says where an array lives. A plain value, safe to share.
type MemoryType uint8

// Memory types. Device is the zero value.
const (
	// Device memory, from the manager's allocator. Counts against the
	// group's budget.
	Device MemoryType = iota
	// Pinned (page-locked) host memory, for fast asynchronous copies.
	// Does not count against the device budget.
	Pinned
	// Mapped pinned host memory that kernels can also reach through a
	// device address. Does not count against the device budget.
	Mapped
	// Managed (unified) memory. Not supported: requests for it are
	// refused with ErrNotSupported.
	Managed
	// Pageable host memory: ordinary Go memory. Copies from it may be
	// synchronous. Does not count against the device budget.
	Pageable
)

var memoryNames = [...]string{Device: "device", Pinned: "pinned", Mapped: "mapped", Managed: "managed", Pageable: "pageable"}

// String is "device", "pinned", "mapped", "managed" or "pageable".
func (m MemoryType) String() string {
	if int(m) < len(memoryNames) {
		return memoryNames[m]
	}
	return fmt.Sprintf("memory(%d)", uint8(m))
}

// OnDevice reports whether the memory is device memory, spent from the
// budget the planner divides.
func (m MemoryType) OnDevice() bool { return m == Device }

// ParseMemoryType reads "device", "pinned", "mapped", "pageable" or
// "managed" (case and spaces ignored; "" is Device).
func ParseMemoryType(s string) (MemoryType, error) {
	t := strings.ToLower(strings.TrimSpace(s))
	if t == "" {
		return Device, nil
	}
	for i, n := range memoryNames {
		if n == t {
			return MemoryType(i), nil
		}
	}
	return 0, fmt.Errorf("memory type %q: want device, pinned, mapped or pageable: %w", s, ErrInvalidRequest)
}

// MarshalText writes the type's name.
func (m MemoryType) MarshalText() ([]byte, error) {
	if int(m) >= len(memoryNames) {
		return nil, fmt.Errorf("marshal %v: %w", m, ErrInvalidRequest)
	}
	return []byte(m.String()), nil
}

// UnmarshalText reads a name as ParseMemoryType does.
func (m *MemoryType) UnmarshalText(b []byte) error {
	v, err := ParseMemoryType(string(b))
	if err != nil {
		return err
	}
	*m = v
	return nil
}

// ArrayRequest asks for one array. Arrays are row-major (C order).
// ChunkAxis, the run axis, is 0 unless set (cubie's chunk_axis_index is
// 2, the last of its (time, variable, run) arrays): a request ported
// from cubie names its run axis, and one whose TotalRuns is another
// axis' length is refused saying which.
//
// A request is chunkable unless Unchunkable is set, or Shape has no axis
// ChunkAxis, or that axis has length 1. An empty (non-nil) Shape is a
// scalar: one element, never chunkable. A chunkable request's chunk axis
// is its run axis: its length is the number of runs, and when the batch
// does not fit, the manager allocates it with that axis cut to the chunk
// length instead. TotalRuns is the number of runs; 0 means "the length of
// the chunk axis" for a chunkable request, and for a chunkable request a
// non-zero TotalRuns must equal that length.
//
// ArrayRequest is a plain value; copies are independent once Shape is
// not shared.
type ArrayRequest struct {
	Shape       []int      `json:"shape"`
	DType       DType      `json:"dtype"`
	Memory      MemoryType `json:"memory,omitempty"`
	ChunkAxis   int        `json:"chunk_axis,omitempty"`
	Unchunkable bool       `json:"unchunkable,omitempty"`
	TotalRuns   int        `json:"total_runs,omitempty"`
}

// NewArrayRequest returns a validated chunkable request of shape and
// dtype in device memory, chunked along axis, with TotalRuns set to
// that axis' length (0 when the shape has no such axis).
func NewArrayRequest(dtype DType, chunkAxis int, shape ...int) (ArrayRequest, error) {
	r := ArrayRequest{Shape: append([]int{}, shape...), DType: dtype, ChunkAxis: chunkAxis}
	if chunkAxis >= 0 && chunkAxis < len(shape) {
		r.TotalRuns = shape[chunkAxis]
	}
	if err := r.Validate(); err != nil {
		return ArrayRequest{}, err
	}
	return r, nil
}

// Chunkable reports whether the planner may cut the request along
// ChunkAxis.
func (r ArrayRequest) Chunkable() bool {
	return !r.Unchunkable && r.ChunkAxis >= 0 && r.ChunkAxis < len(r.Shape) && r.Shape[r.ChunkAxis] > 1
}

// Runs is the request's number of runs: TotalRuns, or when that is 0, the
// length of its chunk axis — unless the request is marked Unchunkable or
// its shape has no such axis, when it is 0. (An axis of length 1 is one
// run, though it cannot be cut.)
func (r ArrayRequest) Runs() int {
	if r.TotalRuns == 0 && !r.Unchunkable && r.ChunkAxis >= 0 && r.ChunkAxis < len(r.Shape) {
		return r.Shape[r.ChunkAxis]
	}
	return r.TotalRuns
}

// Elements is the number of elements, and false if it overflows.
func (r ArrayRequest) Elements() (uint64, bool) { return elements(r.Shape) }

// Bytes is the request's size in bytes, unrounded (math.MaxUint64 if it
// overflows).
func (r ArrayRequest) Bytes() uint64 {
	n, ok := r.Elements()
	hi, lo := bits.Mul64(n, r.DType.Size())
	if !ok || hi != 0 {
		return math.MaxUint64
	}
	return lo
}

// Validate checks the request: a shape (nil is none; an empty shape is a
// scalar, one element, never chunkable, as cubie's shape ()), every
// dimension ≥ 1, a size that fits in 64 bits, a known dtype, a chunk axis ≥ 0, a
// TotalRuns ≥ 0 that agrees with the chunk axis of a chunkable request,
// and memory Device, Pinned, Mapped or Pageable. Managed memory is refused with an
// error wrapping ErrNotSupported; everything else with ErrInvalidRequest.
func (r ArrayRequest) Validate() error {
	if r.Shape == nil {
		return fmt.Errorf("no shape; give the dimensions, or an empty shape ([]int{}, JSON []) for a scalar: %w", ErrInvalidRequest)
	}
	for i, d := range r.Shape {
		if d < 1 {
			return fmt.Errorf("shape %v: dimension %d is %d, want ≥ 1: %w", r.Shape, i, d, ErrInvalidRequest)
		}
	}
	if !r.DType.Valid() {
		return fmt.Errorf("shape %v: dtype %v is not a known type (float64, float32, int32, …): %w", r.Shape, r.DType, ErrInvalidRequest)
	}
	n, ok := r.Elements()
	if !ok {
		return fmt.Errorf("shape %v: element count overflows 64 bits; shrink the shape or chunk it: %w", r.Shape, ErrInvalidRequest)
	}
	if hi, _ := bits.Mul64(n, r.DType.Size()); hi != 0 {
		return fmt.Errorf("shape %v of %v: byte size overflows 64 bits; shrink the shape or chunk it: %w", r.Shape, r.DType, ErrInvalidRequest)
	}
	switch r.Memory {
	case Device, Pinned, Mapped, Pageable:
	case Managed:
		return fmt.Errorf("shape %v: managed (unified) memory is not supported; ask for device, pinned or mapped memory: %w", r.Shape, ErrNotSupported)
	default:
		return fmt.Errorf("shape %v: memory type %v: want device, pinned, mapped or pageable: %w", r.Shape, r.Memory, ErrInvalidRequest)
	}
	if r.ChunkAxis < 0 {
		return fmt.Errorf("shape %v: chunk axis %d is negative; axes count from 0: %w", r.Shape, r.ChunkAxis, ErrInvalidRequest)
	}
	if r.TotalRuns < 0 {
		return fmt.Errorf("shape %v: total runs %d is negative; use 0 (the chunk axis' length) or the number of runs: %w", r.Shape, r.TotalRuns, ErrInvalidRequest)
	}
	if r.Chunkable() && r.TotalRuns != 0 && r.TotalRuns != r.Shape[r.ChunkAxis] {
		return fmt.Errorf("shape %v: total runs %d differs from the length %d of chunk axis %d; %s: %w",
			r.Shape, r.TotalRuns, r.Shape[r.ChunkAxis], r.ChunkAxis, r.axisHint(), ErrInvalidRequest)
	}
	return nil
}

// axisHint says what to change for a request whose TotalRuns is not the
// length of its chunk axis: name the axis that has that length (cubie's
// default run axis is 2, the last of its (time, variable, run) arrays,
// vram's 0, so a request ported with no axis given lands here).
func (r ArrayRequest) axisHint() string {
	for i := len(r.Shape) - 1; i >= 0; i-- {
		if r.Shape[i] == r.TotalRuns {
			return fmt.Sprintf("axis %d has that length: set ChunkAxis: %d (ChunkAxis defaults to 0; cubie's chunk_axis_index defaults to 2, the run axis of its (time, variable, run) arrays)", i, i)
		}
	}
	return "set them equal or mark the request unchunkable (ChunkAxis defaults to 0; cubie's chunk_axis_index to 2)"
}

// elements multiplies the dimensions, reporting false on overflow or a
// dimension < 0.
func elements(shape []int) (uint64, bool) {
	n := uint64(1)
	for _, d := range shape {
		if d < 0 {
			return 0, false
		}
		hi, lo := bits.Mul64(n, uint64(d))
		if hi != 0 {
			return 0, false
		}
		n = lo
	}
	return n, true
}

// stridesOf returns row-major strides in bytes.
func stridesOf(shape []int, size uint64) []int {
	st := make([]int, len(shape))
	acc := int(size)
	for i := len(shape) - 1; i >= 0; i-- {
		st[i] = acc
		acc *= shape[i]
	}
	return st
}
