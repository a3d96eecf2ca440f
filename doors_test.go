package vram_test

// Tests of the doors package batch goes through: host chunk copies,
// staging-buffer views and a group's responses reached from any member.

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/vramkit/vram"
	"github.com/vramkit/vram/device/sim"
)

// TestHostChunkCopy copies runs between a full-length host array and a
// chunk-length one along each axis, and refuses what does not match.
func TestHostChunkCopy(t *testing.T) {
	m := doorManager(t)
	full, err := m.NewHostArray([]int{3, 10}, vram.Int32, vram.Pageable, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := range full.Int32s() {
		full.Int32s()[i] = int32(i)
	}
	tests := map[string]struct {
		chunk []int
		dtype vram.DType
		sp    vram.Span
		want  []int32 // the chunk after CopyChunkFrom; nil: an error wrapping ErrMismatch
	}{
		"axis 1, rows apart": {[]int{3, 4}, vram.Int32, vram.Span{Axis: 1, Start: 6, Len: 3},
			[]int32{6, 7, 8, 0, 16, 17, 18, 0, 26, 27, 28, 0}},
		"axis 0, one block": {[]int{2, 10}, vram.Int32, vram.Span{Axis: 0, Start: 1, Len: 2},
			[]int32{10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29}},
		"empty span":        {[]int{3, 4}, vram.Int32, vram.Span{Axis: 1, Start: 10, Len: 0}, make([]int32, 12)},
		"past the end":      {[]int{3, 4}, vram.Int32, vram.Span{Axis: 1, Start: 8, Len: 3}, nil},
		"longer than chunk": {[]int{3, 2}, vram.Int32, vram.Span{Axis: 1, Start: 0, Len: 3}, nil},
		"other dtype":       {[]int{3, 4}, vram.Float32, vram.Span{Axis: 1, Start: 0, Len: 1}, nil},
		"other shape":       {[]int{2, 4}, vram.Int32, vram.Span{Axis: 1, Start: 0, Len: 1}, nil},
		"bad axis":          {[]int{3, 4}, vram.Int32, vram.Span{Axis: 2, Start: 0, Len: 1}, nil},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			chunk, err := m.NewHostArray(tc.chunk, tc.dtype, vram.Pageable, nil)
			if err != nil {
				t.Fatal(err)
			}
			err = chunk.CopyChunkFrom(full, tc.sp)
			if tc.want == nil {
				if !errors.Is(err, vram.ErrMismatch) {
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
			back, err := m.NewHostArray([]int{3, 10}, vram.Int32, vram.Pageable, nil)
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
	freed, err := m.NewHostArray([]int{3, 4}, vram.Int32, vram.Pageable, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := freed.Free(); err != nil {
		t.Fatal(err)
	}
	if err := freed.CopyChunkFrom(full, vram.Span{Axis: 1, Len: 1}); !errors.Is(err, vram.ErrFreed) {
		t.Errorf("copy into a freed array: %v, want ErrFreed", err)
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
		dtype vram.DType
		want  error
	}{
		"fits":         {[]int{2, 512}, vram.Float32, nil},
		"exactly":      {[]int{512}, vram.Float64, nil},
		"too large":    {[]int{513}, vram.Float64, vram.ErrMismatch},
		"no dtype":     {[]int{4}, 0, vram.ErrInvalidRequest},
		"negative dim": {[]int{-1, 4}, vram.Float32, vram.ErrInvalidRequest},
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
			if !slices.Equal(h.Shape(), tc.shape) || h.DType() != tc.dtype || h.Placement().Rung == vram.RungAuto {
				t.Errorf("array %v on %v; want %v%v on a rung", h, h.Placement(), tc.dtype, tc.shape)
			}
		})
	}
	h, err := b.Array([]int{1024}, vram.Float32)
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
	if _, err := b.Array([]int{4}, vram.Float32); !errors.Is(err, vram.ErrFreed) {
		t.Errorf("view of a released buffer: %v, want ErrFreed", err)
	}
}

func doorManager(t *testing.T) *vram.Manager {
	t.Helper()
	dev, err := sim.New(sim.Config{TotalBytes: 16 << 20, NoContext: true})
	if err != nil {
		t.Fatal(err)
	}
	m, err := vram.New(dev)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := m.Close(); err != nil {
			t.Error(err)
		}
		if r := dev.Leaks(); !r.Empty() {
			t.Errorf("device left with %v", r)
		}
		dev.Close()
	})
	return m
}

// TestResponseMember: the response Allocate returns reaches every
// member's response of the same allocation (the one its hook gets), a
// notary's with no arrays, and none for a client outside the group.
func TestResponseMember(t *testing.T) {
	m := doorManager(t)
	var hooked *vram.ArrayResponse
	a, err := m.Register(vram.ClientOptions{Name: "a", Group: "g"})
	if err != nil {
		t.Fatal(err)
	}
	b, err := m.Register(vram.ClientOptions{Name: "b", Group: "g", OnAllocated: func(r *vram.ArrayResponse) { hooked = r }})
	if err != nil {
		t.Fatal(err)
	}
	notary, err := m.Register(vram.ClientOptions{Name: "notary", Group: "g"})
	if err != nil {
		t.Fatal(err)
	}
	other, err := m.Register(vram.ClientOptions{Name: "other", Group: "elsewhere"})
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range []struct {
		c     *vram.Client
		label string
	}{{a, "x"}, {b, "y"}} {
		if err := q.c.Queue(map[string]vram.ArrayRequest{q.label: {Shape: []int{4 << 20}, DType: vram.Float32}}); err != nil {
			t.Fatal(err)
		}
	}
	ra, err := a.Allocate(context.Background(), vram.WithBuffers(2))
	if err != nil {
		t.Fatal(err)
	}
	rb := ra.Member(b)
	if rb == nil || rb != hooked || rb.Buffers[1].Device["y"] == nil || rb.Plan.Chunks != ra.Plan.Chunks || ra.Plan.Chunks < 2 {
		t.Fatalf("Member(b) = %+v, hook got %p: want b's response of the same chunked plan, with both buffers", rb, hooked)
	}
	if ra.Member(a) != ra || rb.Member(a) != ra {
		t.Error("the members' responses do not reach a's own")
	}
	if rn := ra.Member(notary); rn == nil || len(rn.Arrays()) != 0 || rn.Plan.ChunkLength != ra.Plan.ChunkLength {
		t.Errorf("Member(notary) = %+v: want the chunk parameters and no arrays", rn)
	}
	if ra.Member(other) != nil {
		t.Error("Member of a client of another group is not nil")
	}
}
