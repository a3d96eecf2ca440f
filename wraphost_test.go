package vram

import (
	"context"
	"errors"
	"slices"
	"testing"
	"unsafe"
)

// TestWrapHost: a host array over the caller's bytes checks its size and
// request, aliases the bytes (nothing copied), and copies to and from the
// device, whole and by chunk, like an array the manager made.
func TestWrapHost(t *testing.T) {
	for name, tc := range map[string]struct {
		n     int
		shape []int
		dtype DType
		err   error
	}{
		"float32 2x3":    {n: 24, shape: []int{2, 3}, dtype: Float32},
		"scalar":         {n: 8, shape: []int{}, dtype: Float64},
		"short by one":   {n: 23, shape: []int{2, 3}, dtype: Float32, err: ErrMismatch},
		"one too many":   {n: 25, shape: []int{2, 3}, dtype: Float32, err: ErrMismatch},
		"zero dimension": {n: 0, shape: []int{2, 0}, dtype: Float32, err: ErrInvalidRequest},
		"no dtype":       {n: 24, shape: []int{2, 3}, err: ErrInvalidRequest},
		"no shape":       {n: 4, dtype: Float32, err: ErrInvalidRequest},
	} {
		t.Run(name, func(t *testing.T) {
			data := make([]byte, tc.n)
			h, err := WrapHost(data, tc.shape, tc.dtype)
			if !errors.Is(err, tc.err) || (err == nil) != (tc.err == nil) {
				t.Fatalf("WrapHost(%d bytes, %v, %v) = %v; want %v", tc.n, tc.shape, tc.dtype, err, tc.err)
			}
			if err != nil {
				return
			}
			if h.Memory() != Pageable || !slices.Equal(h.Shape(), tc.shape) || len(h.Data()) != tc.n {
				t.Errorf("wrapped %v: memory %v, shape %v, %d bytes", h, h.Memory(), h.Shape(), len(h.Data()))
			}
			if tc.n > 0 && unsafe.SliceData(h.Data()) != unsafe.SliceData(data) {
				t.Error("the wrapped array copied the bytes; want them aliased")
			}
		})
	}

	// Runs 2..5 of a wrapped (2, 6) array into a chunk-length (2, 3)
	// device array and back into another wrapped array.
	m, _, _ := newManager(t, 64<<20)
	c := register(t, m, ClientOptions{Name: "wrap"})
	must(t, c.Queue(map[string]ArrayRequest{"a": {Shape: []int{2, 3}, DType: Float32, Unchunkable: true}}))
	r, err := c.Allocate(context.Background())
	must(t, err)
	src := make([]float32, 12)
	for i := range src {
		src[i] = float32(i)
	}
	in, err := WrapHost(unsafe.Slice((*byte)(unsafe.Pointer(&src[0])), 48), []int{2, 6}, Float32)
	must(t, err)
	dst := make([]float32, 12)
	out, err := WrapHost(unsafe.Slice((*byte)(unsafe.Pointer(&dst[0])), 48), []int{2, 6}, Float32)
	must(t, err)
	ctx := context.Background()
	sp := Span{Axis: 1, Start: 2, Len: 3}
	must(t, c.ToDeviceChunk(ctx, r.Arrays()["a"], in, sp))
	must(t, c.FromDeviceChunk(ctx, out, r.Arrays()["a"], sp))
	must(t, c.Sync(ctx))
	want := []float32{0, 0, 2, 3, 4, 0, 0, 0, 8, 9, 10, 0}
	if !slices.Equal(dst, want) {
		t.Errorf("runs 2..5 through the device = %v; want %v", dst, want)
	}
	must(t, out.Free())
	if out.Data() != nil || dst[2] != 2 {
		t.Errorf("Free of a wrapped array: Data %v, the caller's bytes %v; want nil and the caller's bytes kept", out.Data(), dst)
	}
}
