package vram

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/vramkit/vram/kernel"
)

var _ kernel.Typed = (*DeviceArray)(nil) // a kernel's views check its dtype

// TestKernelViewsCheckTheDType: a Go kernel's Float64s view of a float32
// device array fails the launch (it once read the bytes as float64s).
func TestKernelViewsCheckTheDType(t *testing.T) {
	m, _, _ := newManager(t, 64*MiB)
	c := register(t, m, ClientOptions{Name: "c"})
	resp, err := queueAndAllocate(t, c, map[string]ArrayRequest{"x": fixed(Float32, 16)})
	if err != nil {
		t.Fatal(err)
	}
	for view, want := range map[string]string{"float32": "", "float64": "as []float64, but it is an array of float32"} {
		k, err := kernel.New("k", "", func(a kernel.Args, _, _ int) error {
			if view == "float32" {
				a.Float32s(0)[0] = 1
			} else {
				a.Float64s(0)[0] = 1
			}
			return nil
		}, 0)
		if err != nil {
			t.Fatal(err)
		}
		s, _ := c.Stream()
		err = errors.Join(k.Launch(m.Device(), s, 1, resp.Arrays()["x"]), c.Sync(t.Context()))
		if (err == nil) != (want == "") || (want != "" && (!errors.Is(err, kernel.ErrArgs) || !strings.Contains(err.Error(), want))) {
			t.Errorf("%s view of a float32 array: %v; want %q", view, err, want)
		}
	}
}

// TestHostChunkCopy copies runs between a full-length host array and a
// chunk-length one along each axis, and refuses what does not match.
func TestHostChunkCopy(t *testing.T) {
	m := doorManager(t)
	full, err := m.NewHostArray([]int{3, 10}, Int32, Pageable, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := range full.Int32s() {
		full.Int32s()[i] = int32(i)
	}
	tests := map[string]struct {
		chunk []int
		dtype DType
		sp    Span
		want  []int32 // the chunk after CopyChunkFrom; nil: an error wrapping ErrMismatch
	}{
		"axis 1, rows apart": {[]int{3, 4}, Int32, Span{Axis: 1, Start: 6, Len: 3},
			[]int32{6, 7, 8, 0, 16, 17, 18, 0, 26, 27, 28, 0}},
		"axis 0, one block": {[]int{2, 10}, Int32, Span{Axis: 0, Start: 1, Len: 2},
			[]int32{10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29}},
		"empty span":        {[]int{3, 4}, Int32, Span{Axis: 1, Start: 10, Len: 0}, make([]int32, 12)},
		"past the end":      {[]int{3, 4}, Int32, Span{Axis: 1, Start: 8, Len: 3}, nil},
		"longer than chunk": {[]int{3, 2}, Int32, Span{Axis: 1, Start: 0, Len: 3}, nil},
		"other dtype":       {[]int{3, 4}, Float32, Span{Axis: 1, Start: 0, Len: 1}, nil},
		"other shape":       {[]int{2, 4}, Int32, Span{Axis: 1, Start: 0, Len: 1}, nil},
		"bad axis":          {[]int{3, 4}, Int32, Span{Axis: 2, Start: 0, Len: 1}, nil},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			chunk, err := m.NewHostArray(tc.chunk, tc.dtype, Pageable, nil)
			if err != nil {
				t.Fatal(err)
			}
			err = chunk.CopyChunkFrom(full, tc.sp)
			if tc.want == nil {
				if !errors.Is(err, ErrMismatch) {
					t.Fatalf("CopyChunkFrom: %v, want ErrMismatch", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := chunk.Int32s(); !slices.Equal(got, tc.want) {
				t.Fatalf("chunk %v, want %v", got, tc.want)
			}
			// Back, into a zeroed full array: the span's runs return, the
			// rest stays zero.
			back, err := m.NewHostArray([]int{3, 10}, Int32, Pageable, nil)
			if err != nil {
				t.Fatal(err)
			}
			if err := chunk.CopyChunkTo(back, tc.sp); err != nil {
				t.Fatal(err)
			}
			for i, v := range back.Int32s() {
				row, col := i/10, i%10
				in := tc.sp.Axis == 1 && col >= tc.sp.Start && col < tc.sp.Start+tc.sp.Len ||
					tc.sp.Axis == 0 && row >= tc.sp.Start && row < tc.sp.Start+tc.sp.Len
				if want := map[bool]int32{true: int32(i), false: 0}[in]; v != want {
					t.Fatalf("back[%d] = %d, want %d", i, v, want)
				}
			}
		})
	}
	freed, err := m.NewHostArray([]int{3, 4}, Int32, Pageable, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := freed.Free(); err != nil {
		t.Fatal(err)
	}
	if err := freed.CopyChunkFrom(full, Span{Axis: 1, Len: 1}); !errors.Is(err, ErrFreed) {
		t.Errorf("copy into a freed array: %v, want ErrFreed", err)
	}
}
