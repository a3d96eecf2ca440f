package vram

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
)

// TestStagingNoRoomCounts: a staging request that cannot fit says how
// many buffers, in the singular for one ("1 pinned buffers" once).
func TestStagingNoRoomCounts(t *testing.T) {
	m := newHostManager(t, HostOptions{Limit: 4096}, 1<<40)
	tests := map[string]struct {
		sizes []uint64
		want  string
	}{
		"one":   {[]uint64{1 << 20}, "a pinned buffer of 1 MiB does not fit"},
		"three": {[]uint64{1 << 20, 1 << 20, 1 << 20}, "3 pinned buffers of 3 MiB in all do not fit"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			_, err := m.Host().Staging().AcquireSet(context.Background(), tc.sizes)
			if !errors.Is(err, ErrOutOfMemory) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("%v; want it to say %q", err, tc.want)
			}
		})
	}
}

// TestStagingBufferArray views a staging buffer as host arrays, and
// refuses one that does not fit, a bad dtype or shape, and a released
// buffer; freeing the view releases the buffer.
func TestStagingBufferArray(t *testing.T) {
	m := doorManager(t)
	pool := m.Host().Staging()
	b, err := pool.Acquire(context.Background(), 4096)
	if err != nil {
		t.Fatal(err)
	}
	tests := map[string]struct {
		shape []int
		dtype DType
		want  error
	}{
		"fits":         {[]int{2, 512}, Float32, nil},
		"exactly":      {[]int{512}, Float64, nil},
		"too large":    {[]int{513}, Float64, ErrMismatch},
		"no dtype":     {[]int{4}, 0, ErrInvalidRequest},
		"negative dim": {[]int{-1, 4}, Float32, ErrInvalidRequest},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			h, err := b.Array(tc.shape, tc.dtype)
			if !errors.Is(err, tc.want) || (tc.want == nil) != (err == nil) {
				t.Fatalf("Array(%v, %v): %v, want %v", tc.shape, tc.dtype, err, tc.want)
			}
			if err != nil {
				return
			}
			if !slices.Equal(h.Shape(), tc.shape) || h.DType() != tc.dtype || h.Placement().Rung == RungAuto {
				t.Errorf("array %v on %v; want %v%v on a rung", h, h.Placement(), tc.dtype, tc.shape)
			}
		})
	}
	h, err := b.Array([]int{1024}, Float32)
	if err != nil {
		t.Fatal(err)
	}
	if st := pool.Stats(); st.InUse != 1 {
		t.Fatalf("staging %+v: want the buffer in use", st)
	}
	if err := h.Free(); err != nil {
		t.Fatal(err)
	}
	if st := pool.Stats(); st.InUse != 0 {
		t.Errorf("staging %+v after the view's Free: want the buffer back", st)
	}
	if _, err := b.Array([]int{4}, Float32); !errors.Is(err, ErrFreed) {
		t.Errorf("view of a released buffer: %v, want ErrFreed", err)
	}
}
