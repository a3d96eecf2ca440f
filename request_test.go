package vram

import (
	"encoding/json"
	"errors"
	"math"
	"strings"
	"testing"
)

func TestDTypes(t *testing.T) {
	for name, tc := range map[string]struct {
		in   string
		want DType
		size uint64
	}{
		"float64": {"float64", Float64, 8}, "f8": {"F8", Float64, 8}, "float32": {" float32 ", Float32, 4},
		"f4": {"f4", Float32, 4}, "int32": {"int32", Int32, 4}, "i8": {"i8", Int64, 8},
		"uint8": {"uint8", Uint8, 1}, "u4": {"u4", Uint32, 4}, "c8": {"c8", Complex64, 8},
		"complex128": {"complex128", Complex128, 16},
	} {
		t.Run(name, func(t *testing.T) {
			got, err := ParseDType(tc.in)
			if err != nil || got != tc.want || got.Size() != tc.size || !got.Valid() {
				t.Errorf("ParseDType(%q) = %v (size %d), %v", tc.in, got, got.Size(), err)
			}
			b, err := got.MarshalText()
			var back DType
			if err != nil || back.UnmarshalText(b) != nil || back != got {
				t.Errorf("text round trip of %v: %q, %v", got, b, err)
			}
		})
	}
	if _, err := ParseDType("float16"); !errors.Is(err, ErrInvalidRequest) || !strings.Contains(err.Error(), "float64, float32") {
		t.Errorf("unknown dtype: %v", err)
	}
	var zero DType
	if zero.Valid() || zero.Size() != 0 || zero.String() != "dtype(0)" {
		t.Errorf("zero DType: valid %v size %d %q", zero.Valid(), zero.Size(), zero)
	}
	if _, err := zero.MarshalText(); err == nil {
		t.Error("marshalled the zero DType")
	}
	if n := len(DTypes()); n != 8 {
		t.Errorf("%d dtypes", n)
	}
}

func TestMemoryTypes(t *testing.T) {
	for _, mt := range []MemoryType{Device, Pinned, Mapped, Managed, Pageable} {
		got, err := ParseMemoryType(strings.ToUpper(mt.String()))
		if err != nil || got != mt {
			t.Errorf("ParseMemoryType(%v) = %v, %v", mt, got, err)
		}
	}
	if got, _ := ParseMemoryType(""); got != Device {
		t.Errorf("empty memory type = %v", got)
	}
	if _, err := ParseMemoryType("unified"); !errors.Is(err, ErrInvalidRequest) {
		t.Errorf("unknown memory type: %v", err)
	}
	if !Device.OnDevice() || Pinned.OnDevice() || Mapped.OnDevice() {
		t.Error("OnDevice")
	}
}

func TestArrayRequestJSON(t *testing.T) {
	const in = `{"shape":[3,2,1000],"dtype":"float32","memory":"pinned","chunk_axis":2,"total_runs":1000}`
	var r ArrayRequest
	if err := json.Unmarshal([]byte(in), &r); err != nil {
		t.Fatal(err)
	}
	if r.DType != Float32 || r.Memory != Pinned || r.ChunkAxis != 2 || r.Runs() != 1000 || !r.Chunkable() {
		t.Errorf("decoded %+v", r)
	}
	out, _ := json.Marshal(r)
	if string(out) != in {
		t.Errorf("encoded %s, want %s", out, in)
	}
	if err := json.Unmarshal([]byte(`{"shape":[3],"dtype":"float7"}`), &r); !errors.Is(err, ErrInvalidRequest) {
		t.Errorf("bad dtype in JSON: %v", err)
	}
}

func TestValidateAndSizes(t *testing.T) {
	r, err := NewArrayRequest(Float64, 1, 4, 250)
	if err != nil || r.TotalRuns != 250 || r.Bytes() != 8000 {
		t.Errorf("NewArrayRequest: %+v, %v", r, err)
	}
	if _, err := NewArrayRequest(Float64, 0, 0); !errors.Is(err, ErrInvalidRequest) {
		t.Errorf("NewArrayRequest of a zero shape: %v", err)
	}
	if r, _ := NewArrayRequest(Int32, 3, 4, 5); r.TotalRuns != 0 || r.Chunkable() {
		t.Errorf("request with no axis 3: %+v", r)
	}
	for name, tc := range map[string]struct {
		r     ArrayRequest
		bytes uint64
		runs  int
	}{
		"unchunkable keeps its TotalRuns":   {ArrayRequest{Shape: []int{2, 3}, DType: Int32, Unchunkable: true, TotalRuns: 9}, 24, 9},
		"chunkable takes its axis":          {ArrayRequest{Shape: []int{2, 3}, DType: Int32, ChunkAxis: 1}, 24, 3},
		"axis of length 1 keeps TotalRuns":  {ArrayRequest{Shape: []int{1, 3}, DType: Int32, TotalRuns: 5}, 12, 5},
		"axis of length 1 is one run":       {ArrayRequest{Shape: []int{4, 1}, DType: Int32, ChunkAxis: 1}, 16, 1},
		"unchunkable without TotalRuns":     {ArrayRequest{Shape: []int{4, 3}, DType: Int32, ChunkAxis: 1, Unchunkable: true}, 48, 0},
		"no such axis without TotalRuns":    {ArrayRequest{Shape: []int{4, 3}, DType: Int32, ChunkAxis: 2}, 48, 0},
		"largest exact size":                {ArrayRequest{Shape: []int{1 << 30, 1 << 30, 1 << 2}, DType: Uint8}, 1 << 62, 1 << 30},
		"overflowing size saturates Bytes":  {ArrayRequest{Shape: []int{1 << 32, 1 << 32}, DType: Uint8}, math.MaxUint64, 1 << 32},
		"overflowing bytes saturates Bytes": {ArrayRequest{Shape: []int{1 << 31, 1 << 31}, DType: Complex128}, math.MaxUint64, 1 << 31},
	} {
		t.Run(name, func(t *testing.T) {
			if got := tc.r.Bytes(); got != tc.bytes {
				t.Errorf("Bytes = %d, want %d", got, tc.bytes)
			}
			if got := tc.r.Runs(); got != tc.runs {
				t.Errorf("Runs = %d, want %d", got, tc.runs)
			}
			if err := tc.r.Validate(); (err != nil) != (tc.bytes == math.MaxUint64) {
				t.Errorf("Validate = %v", err)
			}
		})
	}
}

// TestScalarShape: an empty shape is a scalar (one element, never
// chunked, as cubie's shape ()); a nil shape is no shape and is refused,
// so that a forgotten Shape is not taken for a scalar.
func TestScalarShape(t *testing.T) {
	scalar := ArrayRequest{Shape: []int{}, DType: Float64}
	if err := scalar.Validate(); err != nil || scalar.Bytes() != 8 || scalar.Chunkable() || scalar.Runs() != 0 {
		t.Errorf("scalar: Validate %v, Bytes %d, Chunkable %v, Runs %d; want nil, 8, false, 0",
			err, scalar.Bytes(), scalar.Chunkable(), scalar.Runs())
	}
	if err := (ArrayRequest{DType: Float64}).Validate(); !errors.Is(err, ErrInvalidRequest) || !strings.Contains(err.Error(), "[]int{}") {
		t.Errorf("nil shape: %v; want ErrInvalidRequest naming the empty shape for a scalar", err)
	}
	if r, err := NewArrayRequest(Float32, 0); err != nil || r.Shape == nil || len(r.Shape) != 0 {
		t.Errorf("NewArrayRequest with no dimensions: %+v, %v; want a scalar", r, err)
	}
	// Planned and allocated beside a chunked array: whole in every chunk.
	p, err := Plan(map[string]map[string]ArrayRequest{"c": {"s": scalar, "x": req(Float32, 0, 1000)}}, 2048, PlanOptions{})
	if err != nil || p.Chunks < 2 || len(p.ChunkedShapes["c"]["s"]) != 0 || p.UnchunkableBytes != DefaultGranularity {
		t.Fatalf("plan: %+v, %v; want chunks, the scalar whole and counted unchunkable", p, err)
	}
	m, _, _ := newManager(t, 64*MiB)
	c := register(t, m, ClientOptions{Name: "c"})
	if err := c.Queue(map[string]ArrayRequest{"s": scalar}); err != nil {
		t.Fatal(err)
	}
	resp, err := c.Allocate(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	d := resp.Arrays()["s"]
	if d.Len() != 1 || d.Bytes() != 8 || len(d.Shape()) != 0 || len(d.Strides()) != 0 {
		t.Errorf("device scalar: len %d, bytes %d, shape %v, strides %v", d.Len(), d.Bytes(), d.Shape(), d.Strides())
	}
	in, err := m.NewHostArray([]int{}, Float64, Pinned, []float64{2.5})
	if err != nil {
		t.Fatal(err)
	}
	defer in.Free()
	out, err := m.NewHostArray([]int{}, Float64, Pageable, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := errors.Join(c.ToDevice(t.Context(), d, in), c.FromDevice(t.Context(), out, d), c.Sync(t.Context())); err != nil {
		t.Fatal(err)
	}
	if got := out.Float64s(); len(got) != 1 || got[0] != 2.5 {
		t.Errorf("scalar round trip: %v, want [2.5]", got)
	}
}

// TestChunkAxisHint: a request whose TotalRuns is not its chunk axis'
// length (a cubie request ported as written: cubie's run axis defaults
// to 2, vram's to 0) is refused naming the axis that has that length.
func TestChunkAxisHint(t *testing.T) {
	for name, tc := range map[string]struct {
		r    ArrayRequest
		says string
	}{
		"cubie's (variable, run)": {ArrayRequest{Shape: []int{10, 150}, DType: Float32, TotalRuns: 150}, "axis 1 has that length: set ChunkAxis: 1"},
		"(time, variable, run)":   {ArrayRequest{Shape: []int{100, 4, 50}, DType: Float64, TotalRuns: 50}, "set ChunkAxis: 2"},
		"no axis of that length":  {ArrayRequest{Shape: []int{10, 20}, DType: Float32, TotalRuns: 7}, "set them equal or mark the request unchunkable"},
	} {
		t.Run(name, func(t *testing.T) {
			err := tc.r.Validate()
			if !errors.Is(err, ErrInvalidRequest) || !strings.Contains(err.Error(), tc.says) || !strings.Contains(err.Error(), "cubie") {
				t.Errorf("got %v, want ErrInvalidRequest saying %q and what cubie's default is", err, tc.says)
			}
		})
	}
}
