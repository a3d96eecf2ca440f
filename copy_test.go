package vram

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/vramkit/vram/account"
	"github.com/vramkit/vram/device"
	"github.com/vramkit/vram/device/sim"
)

// fillSeq sets element i of a Float32 host array to i.
func fillSeq(h *HostArray) {
	for i := range h.Float32s() {
		h.Float32s()[i] = float32(i)
	}
}

// refChunk is what a chunk-length array holds after copying runs
// [start, start+n) along axis of a full array of shape full whose element
// i is i; positions past n along the axis hold -1.
func refChunk(full []int, axis, length, start, n int) []float32 {
	inner := 1
	for _, d := range full[axis+1:] {
		inner *= d
	}
	outer := 1
	for _, d := range full[:axis] {
		outer *= d
	}
	out := make([]float32, outer*length*inner)
	for o := range outer {
		for r := range length {
			for i := range inner {
				v := float32(-1)
				if r < n {
					v = float32((o*full[axis]+start+r)*inner + i)
				}
				out[(o*length+r)*inner+i] = v
			}
		}
	}
	return out
}

// countingDev counts the copies a manager enqueues on a simulator.
type countingDev struct {
	*sim.Device
	plain, strided atomic.Int64
}

func (d *countingDev) CopyHtoD(dst device.Ptr, src []byte, s device.Stream) error {
	d.plain.Add(1)
	return d.Device.CopyHtoD(dst, src, s)
}

func (d *countingDev) CopyDtoH(dst []byte, src device.Ptr, s device.Stream) error {
	d.plain.Add(1)
	return d.Device.CopyDtoH(dst, src, s)
}

func (d *countingDev) CopyHtoD2D(dst device.Ptr, dp uint64, src []byte, sp, w, h uint64, s device.Stream) error {
	d.strided.Add(1)
	return d.Device.CopyHtoD2D(dst, dp, src, sp, w, h, s)
}

func (d *countingDev) CopyDtoH2D(dst []byte, dp uint64, src device.Ptr, sp, w, h uint64, s device.Stream) error {
	d.strided.Add(1)
	return d.Device.CopyDtoH2D(dst, dp, src, sp, w, h, s)
}

// rowsOnly is a device without 2-D copies: only device.Device and host
// allocation show through.
type rowsOnly struct {
	device.Device
	device.HostAllocator
}

// TestChunkCopies copies every chunk of a full host array into a
// chunk-length device array and checks the device holds exactly the
// chunk's runs (read back whole), then copies it out into a second full
// host array and checks the round trip. On a device with 2-D copies each
// chunk copy must be one copy; on one without, one per leading row
// unless the rows are adjacent.
func TestChunkCopies(t *testing.T) {
	for name, tc := range map[string]struct {
		shape  []int
		axis   int
		length int // chunk length
	}{
		"runs on the last axis":             {[]int{3, 2, 10}, 2, 4},
		"runs on the first axis":            {[]int{10, 3}, 0, 3},
		"runs in the middle":                {[]int{2, 10, 3}, 1, 4},
		"one dimension":                     {[]int{10}, 0, 6},
		"chunk length equals the run count": {[]int{4, 10}, 1, 10},
		"single run per chunk":              {[]int{2, 5}, 1, 1},
	} {
		for _, strided := range []bool{true, false} {
			kind := map[bool]string{true: "2-D copies", false: "row copies"}[strided]
			t.Run(name+", "+kind, func(t *testing.T) {
				cd := &countingDev{Device: newSim(t, 64*MiB)}
				var dev device.Device = cd
				if !strided {
					dev = rowsOnly{cd, cd}
				}
				m, err := New(dev, WithAllocatorChoice(account.Choice{Kind: Direct}))
				if err != nil {
					t.Fatal(err)
				}
				defer m.Close()
				if (m.strided != nil) != strided {
					t.Fatalf("manager sees 2-D copies: %v, want %v", m.strided != nil, strided)
				}
				c := register(t, m, ClientOptions{})
				runs := tc.shape[tc.axis]
				rows := 1
				for _, d := range tc.shape[:tc.axis] {
					rows *= d
				}
				chunkShape := slices.Clone(tc.shape)
				chunkShape[tc.axis] = tc.length
				_ = c.Queue(map[string]ArrayRequest{"d": {Shape: chunkShape, DType: Float32, ChunkAxis: tc.axis, Unchunkable: true}})
				resp, err := c.Allocate(context.Background())
				if err != nil {
					t.Fatal(err)
				}
				d := resp.Arrays()["d"]
				src, _ := m.NewHostArray(tc.shape, Float32, Pinned, nil)
				defer src.Free()
				fillSeq(src)
				dst, _ := m.NewHostArray(tc.shape, Float32, Pageable, nil)
				whole, _ := m.NewHostArray(chunkShape, Float32, Pageable, nil)
				for start := 0; start < runs; start += tc.length {
					n := min(tc.length, runs-start)
					sp := Span{Axis: tc.axis, Start: start, Len: n}
					// Mark the device array so idle positions show.
					neg, _ := m.NewHostArray(chunkShape, Float32, Pageable, nil)
					for i := range neg.Float32s() {
						neg.Float32s()[i] = -1
					}
					if err := c.ToDevice(context.Background(), d, neg); err != nil {
						t.Fatal(err)
					}
					p0, s0 := cd.plain.Load(), cd.strided.Load()
					if err := c.ToDeviceChunk(context.Background(), d, src, sp); err != nil {
						t.Fatal(err)
					}
					p1, s1 := cd.plain.Load(), cd.strided.Load()
					if err := c.FromDevice(context.Background(), whole, d); err != nil {
						t.Fatal(err)
					}
					p2, s2 := cd.plain.Load(), cd.strided.Load()
					if err := c.FromDeviceChunk(context.Background(), dst, d, sp); err != nil {
						t.Fatal(err)
					}
					p3, s3 := cd.plain.Load(), cd.strided.Load()
					// Adjacent rows (one row, or the whole array) are one
					// plain copy; apart, one 2-D copy or a copy per row.
					wantPlain, want2D := int64(1), int64(0)
					if rows > 1 && !(n == runs && tc.length == runs) {
						if strided {
							wantPlain, want2D = 0, 1
						} else {
							wantPlain = int64(rows)
						}
					}
					for dir, got := range map[string][2]int64{"to device": {p1 - p0, s1 - s0}, "from device": {p3 - p2, s3 - s2}} {
						if got != [2]int64{wantPlain, want2D} {
							t.Errorf("chunk at %d, %s: %d plain and %d 2-D copies, want %d and %d", start, dir, got[0], got[1], wantPlain, want2D)
						}
					}
					if err := c.Sync(context.Background()); err != nil {
						t.Fatal(err)
					}
					if want := refChunk(tc.shape, tc.axis, tc.length, start, n); !slices.Equal(whole.Float32s(), want) {
						t.Fatalf("chunk at %d: device holds %v, want %v", start, whole.Float32s(), want)
					}
				}
				if !slices.Equal(dst.Float32s(), src.Float32s()) {
					t.Errorf("round trip: %v, want %v", dst.Float32s(), src.Float32s())
				}
			})
		}
	}
}

// TestStridedChunkIsOneDeviceCopy counts with the simulator's own fault
// counter: a 3-row chunk is one copy, so a fault armed for the second
// copy does not fire and one armed for the first fails the chunk.
func TestStridedChunkIsOneDeviceCopy(t *testing.T) {
	m, dev, _ := newManager(t, 64*MiB)
	c := register(t, m, ClientOptions{})
	_ = c.Queue(map[string]ArrayRequest{"d": {Shape: []int{3, 4}, DType: Float32, Unchunkable: true}})
	resp, _ := c.Allocate(context.Background())
	h, _ := m.NewHostArray([]int{3, 10}, Float32, Pageable, nil)
	sp := Span{Axis: 1, Start: 2, Len: 4}
	dev.Faults().FailCopyAt(2)
	if err := c.ToDeviceChunk(context.Background(), resp.Arrays()["d"], h, sp); err != nil {
		t.Fatal(err)
	}
	if err := c.Sync(context.Background()); err != nil || dev.Faults().Fired() != 0 {
		t.Fatalf("the second copy failed (%v, %d fired): the chunk took more than one", err, dev.Faults().Fired())
	}
	dev.Faults().FailCopyAt(1)
	if err := c.FromDeviceChunk(context.Background(), h, resp.Arrays()["d"], sp); err != nil {
		t.Fatal(err)
	}
	if err := c.Sync(context.Background()); !errors.Is(err, device.ErrCopyFailed) {
		t.Fatalf("a failed 2-D copy: Sync returned %v, want ErrCopyFailed", err)
	}
	dev.Faults().Clear()
}

func TestWholeCopies(t *testing.T) {
	m, _, _ := newManager(t, 64*MiB)
	c := register(t, m, ClientOptions{})
	for _, dt := range DTypes() {
		t.Run(dt.String(), func(t *testing.T) {
			_ = c.Queue(map[string]ArrayRequest{dt.String(): {Shape: []int{3, 5}, DType: dt, Unchunkable: true}})
			resp, err := c.Allocate(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			d := resp.Arrays()[dt.String()]
			src, _ := m.NewHostArray([]int{3, 5}, dt, Pinned, nil)
			defer src.Free()
			for i := range src.Data() {
				src.Data()[i] = byte(i*7 + 1)
			}
			back, _ := m.NewHostArray([]int{3, 5}, dt, Pageable, nil)
			if err := c.ToDevice(context.Background(), d, src); err != nil {
				t.Fatal(err)
			}
			if err := c.FromDevice(context.Background(), back, d); err != nil {
				t.Fatal(err)
			}
			if err := c.Sync(context.Background()); err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(back.Data(), src.Data()) || uint64(len(back.Data())) != 15*dt.Size() {
				t.Errorf("round trip of %v differs", dt)
			}
		})
	}
}

func TestCopyErrors(t *testing.T) {
	m, _, _ := newManager(t, 64*MiB)
	c := register(t, m, ClientOptions{})
	other := register(t, m, ClientOptions{})
	_ = c.Queue(map[string]ArrayRequest{
		"d":   {Shape: []int{2, 4}, DType: Float32, Unchunkable: true},
		"old": {Shape: []int{2, 4}, DType: Float32, Unchunkable: true},
	})
	resp, _ := c.Allocate(context.Background())
	d, old := resp.Arrays()["d"], resp.Arrays()["old"]
	_ = c.Free("old")
	host := func(dt DType, shape ...int) *HostArray {
		h, err := m.NewHostArray(shape, dt, Pageable, nil)
		if err != nil {
			t.Fatal(err)
		}
		return h
	}
	full := host(Float32, 2, 10)
	freed := host(Float32, 2, 4)
	_ = freed.Free()
	_ = other.Close()
	for name, tc := range map[string]struct {
		do func() error
		is error
	}{
		"dtype differs":            {func() error { return c.ToDevice(context.Background(), d, host(Float64, 2, 4)) }, ErrMismatch},
		"shape differs":            {func() error { return c.ToDevice(context.Background(), d, host(Float32, 4, 2)) }, ErrMismatch},
		"shape differs, from":      {func() error { return c.FromDevice(context.Background(), host(Float32, 8), d) }, ErrMismatch},
		"freed device array":       {func() error { return c.ToDevice(context.Background(), old, host(Float32, 2, 4)) }, ErrFreed},
		"freed host array":         {func() error { return c.FromDevice(context.Background(), freed, d) }, ErrFreed},
		"closed client":            {func() error { return other.ToDevice(context.Background(), d, host(Float32, 2, 4)) }, ErrClosed},
		"chunk past the host end":  {func() error { return c.ToDeviceChunk(context.Background(), d, full, Span{Axis: 1, Start: 8, Len: 4}) }, ErrMismatch},
		"chunk longer than device": {func() error { return c.ToDeviceChunk(context.Background(), d, full, Span{Axis: 1, Start: 0, Len: 5}) }, ErrMismatch},
		"chunk on the wrong axis":  {func() error { return c.ToDeviceChunk(context.Background(), d, full, Span{Axis: 0, Start: 0, Len: 2}) }, ErrMismatch},
		"chunk axis out of range":  {func() error { return c.FromDeviceChunk(context.Background(), full, d, Span{Axis: 2, Start: 0, Len: 1}) }, ErrMismatch},
		"chunk ranks differ": {func() error {
			return c.ToDeviceChunk(context.Background(), d, host(Float32, 20), Span{Axis: 0, Len: 1})
		}, ErrMismatch},
		"negative start": {func() error { return c.ToDeviceChunk(context.Background(), d, full, Span{Axis: 1, Start: -1, Len: 2}) }, ErrMismatch},
		"start + len overflows": {func() error {
			return c.ToDeviceChunk(context.Background(), d, full, Span{Axis: 1, Start: math.MaxInt, Len: 1})
		}, ErrMismatch},
		"chunk of a freed array": {func() error { return c.FromDeviceChunk(context.Background(), full, old, Span{Axis: 1, Len: 1}) }, ErrFreed},
		"chunk dtype differs": {func() error {
			return c.FromDeviceChunk(context.Background(), host(Int32, 2, 10), d, Span{Axis: 1, Len: 1})
		}, ErrMismatch},
		"nil array":                  {func() error { return c.ToDevice(context.Background(), nil, full) }, device.ErrInvalidValue},
		"empty chunk copies nothing": {func() error { return c.ToDeviceChunk(context.Background(), d, full, Span{Axis: 1, Start: 10, Len: 0}) }, nil},
	} {
		t.Run(name, func(t *testing.T) {
			err := tc.do()
			if (tc.is == nil && err != nil) || !errors.Is(err, tc.is) {
				t.Errorf("got %v, want %v", err, tc.is)
			}
		})
	}
}

func TestHostArrays(t *testing.T) {
	m, _, _ := newManager(t, 64*MiB)
	for name, tc := range map[string]struct {
		dt   DType
		like any
		view func(*HostArray) int
	}{
		"float64 from slice":   {Float64, []float64{1, 2, 3, 4, 5, 6}, func(h *HostArray) int { return int(h.Float64s()[5]) }},
		"float32 from slice":   {Float32, []float32{1, 2, 3, 4, 5, 6}, func(h *HostArray) int { return int(h.Float32s()[5]) }},
		"int32 from slice":     {Int32, []int32{1, 2, 3, 4, 5, 6}, func(h *HostArray) int { return int(h.Int32s()[5]) }},
		"int64 from slice":     {Int64, []int64{1, 2, 3, 4, 5, 6}, func(h *HostArray) int { return int(h.Int64s()[5]) }},
		"uint8 from slice":     {Uint8, []uint8{1, 2, 3, 4, 5, 6}, func(h *HostArray) int { return int(h.Uint8s()[5]) }},
		"uint32 from slice":    {Uint32, []uint32{1, 2, 3, 4, 5, 6}, func(h *HostArray) int { return int(h.Uint32s()[5]) }},
		"complex64 from slice": {Complex64, []complex64{1, 2, 3, 4, 5, 6}, func(h *HostArray) int { return int(real(h.Complex64s()[5])) }},
		"complex128 slice":     {Complex128, []complex128{1, 2, 3, 4, 5, 6}, func(h *HostArray) int { return int(real(h.Complex128s()[5])) }},
		"zeroed":               {Float64, nil, func(h *HostArray) int { return int(h.Float64s()[5]) }},
	} {
		for _, mem := range []MemoryType{Pinned, Pageable, Mapped} {
			t.Run(name+"/"+mem.String(), func(t *testing.T) {
				h, err := m.NewHostArray([]int{2, 3}, tc.dt, mem, tc.like)
				if err != nil {
					t.Fatal(err)
				}
				want := 6
				if tc.like == nil {
					want = 0
				}
				if got := tc.view(h); got != want {
					t.Errorf("element 5 = %d, want %d", got, want)
				}
				if h.Memory() != mem || h.Len() != 6 || h.Dim(1) != 3 || h.Bytes() != 6*tc.dt.Size() ||
					!slices.Equal(h.Strides(), []int{3 * int(tc.dt.Size()), int(tc.dt.Size())}) {
					t.Errorf("accessors: %v len %d bytes %d strides %v", h, h.Len(), h.Bytes(), h.Strides())
				}
				if (mem == Mapped) != (h.DevicePtr() != 0) {
					t.Errorf("device pointer %v for %v memory", h.DevicePtr(), mem)
				}
				if err := h.Free(); err != nil {
					t.Fatal(err)
				}
				if err := h.Free(); err != nil {
					t.Errorf("second Free: %v", err)
				}
				if h.Data() != nil || !h.Freed() {
					t.Error("freed array still has data")
				}
			})
		}
	}
	// Freed pinned buffers stay cached in the pinned pool; none is in use
	// and no mapped buffer (made directly) is left.
	if st := m.host.pinned.Stats(); st.InUse != 0 || st.Frees != st.Allocs || st.Allocs == 0 {
		t.Errorf("pinned pool: %+v", st)
	}
	src, _ := m.NewHostArray([]int{2, 2}, Int32, Pageable, []int32{1, 2, 3, 4})
	cp, err := m.NewHostArray([]int{2, 2}, Int32, Pinned, src)
	if err != nil || !slices.Equal(cp.Int32s(), []int32{1, 2, 3, 4}) {
		t.Errorf("like a host array: %v, %v", cp, err)
	}
	_ = cp.Free()
	for name, tc := range map[string]struct {
		shape []int
		dt    DType
		mem   MemoryType
		like  any
		is    error
		says  string
	}{
		"wrong slice type":      {[]int{2}, Float64, Pageable, []float32{1, 2}, ErrMismatch, "like is a []float32 of 2 elements; want a []float64 for float64[2]"},
		"wrong slice length":    {[]int{2}, Float64, Pageable, []float64{1, 2, 3}, ErrMismatch, "like of shape [3] does not broadcast to float64[2]"},
		"like of another dtype": {[]int{2, 2}, Float64, Pageable, src, ErrMismatch, "converts no types"},
		"unknown like":          {[]int{2}, Float64, Pageable, "1,2", ErrMismatch, "like is a string"},
		"like of another shape": {[]int{4}, Int32, Pageable, src, ErrMismatch, ""},
		"device memory":         {[]int{2}, Float64, Device, nil, ErrInvalidRequest, "want pinned, mapped or pageable"},
		"managed memory":        {[]int{2}, Float64, Managed, nil, ErrNotSupported, "want pinned, mapped or pageable"},
		"bad shape":             {[]int{0}, Float64, Pinned, nil, ErrInvalidRequest, ""},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := m.NewHostArray(tc.shape, tc.dt, tc.mem, tc.like)
			if !errors.Is(err, tc.is) || !strings.Contains(err.Error(), tc.says) {
				t.Errorf("got %v, want %v saying %q", err, tc.is, tc.says)
			}
		})
	}
	if st := m.host.pinned.Stats(); st.InUse != 0 {
		t.Errorf("a refused NewHostArray left a pinned buffer in use: %+v", st)
	}
	defer func() {
		if recover() == nil {
			t.Error("a Float64 view of an Int32 array did not panic")
		}
	}()
	_ = src.Float64s()
}

// TestPinnedBuffersAreReused: a freed pinned array's buffer serves the
// next one once the stream of its last copy is done, and comes back zeroed.
func TestPinnedBuffersAreReused(t *testing.T) {
	m, dev, _ := newManager(t, 64*MiB)
	c := register(t, m, ClientOptions{})
	_ = c.Queue(map[string]ArrayRequest{"d": fixed(Float32, 1000)})
	resp, _ := c.Allocate(context.Background())
	h, _ := m.NewHostArray([]int{1000}, Float32, Pinned, nil)
	fillSeq(h)
	if err := c.ToDevice(context.Background(), resp.Arrays()["d"], h); err != nil {
		t.Fatal(err)
	}
	if err := c.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	_ = h.Free()
	before := dev.Leaks().HostBuffers
	h2, _ := m.NewHostArray([]int{1000}, Float32, Pinned, nil)
	defer h2.Free()
	if st := m.host.pinned.Stats(); st.CacheHits != 1 || dev.Leaks().HostBuffers != before {
		t.Errorf("second pinned array not served from the cache: %+v", st)
	}
	for _, v := range h2.Float32s() {
		if v != 0 {
			t.Fatal("a reused pinned buffer was not zeroed")
		}
	}
}

// TestLikeBroadcasts: like fills a host array as NumPy's arr[:] = like
// does (cubie's create_host_array): broadcast from the last dimension,
// each of like's dimensions equal to the array's or 1; a slice of every
// element fills in row-major order.
func TestLikeBroadcasts(t *testing.T) {
	m, _, _ := newManager(t, 64*MiB)
	row, _ := m.NewHostArray([]int{3}, Int32, Pageable, []int32{1, 2, 3})
	col, _ := m.NewHostArray([]int{2, 1}, Int32, Pageable, []int32{10, 20})
	one, _ := m.NewHostArray([]int{1, 1, 1}, Int32, Pageable, []int32{7})
	for name, tc := range map[string]struct {
		shape []int
		like  any
		want  []int32
	}{
		"every element, row-major": {[]int{2, 3}, []int32{1, 2, 3, 4, 5, 6}, []int32{1, 2, 3, 4, 5, 6}},
		"a slice as each row":      {[]int{2, 3}, []int32{1, 2, 3}, []int32{1, 2, 3, 1, 2, 3}},
		"a one-element slice":      {[]int{2, 2}, []int32{9}, []int32{9, 9, 9, 9}},
		"a row array":              {[]int{2, 3}, row, []int32{1, 2, 3, 1, 2, 3}},
		"a column array":           {[]int{2, 3}, col, []int32{10, 10, 10, 20, 20, 20}},
		"leading 1s dropped":       {[]int{2}, one, []int32{7, 7}},
		"into a scalar":            {[]int{}, []int32{5}, []int32{5}},
		"a middle axis of 1":       {[]int{2, 2, 3}, row, []int32{1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2, 3}},
	} {
		t.Run(name, func(t *testing.T) {
			h, err := m.NewHostArray(tc.shape, Int32, Pageable, tc.like)
			if err != nil {
				t.Fatal(err)
			}
			if got := h.Int32s(); !slices.Equal(got, tc.want) {
				t.Errorf("filled %v, want %v", got, tc.want)
			}
		})
	}
	for name, tc := range map[string]struct {
		shape []int
		like  any
	}{
		"a row of another length": {[]int{2, 4}, []int32{1, 2, 3}},
		"a column into rows":      {[]int{3, 2}, col},
		"more dimensions":         {[]int{3}, col},
		"an empty slice":          {[]int{2}, []int32{}},
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := m.NewHostArray(tc.shape, Int32, Pageable, tc.like); !errors.Is(err, ErrMismatch) || !strings.Contains(err.Error(), "broadcast") {
				t.Errorf("got %v, want ErrMismatch saying it does not broadcast", err)
			}
		})
	}
	// Random shapes against the rule element by element.
	rng := rand.New(rand.NewPCG(1, 2))
	for range 300 {
		to := make([]int, 1+rng.IntN(4))
		for i := range to {
			to[i] = 1 + rng.IntN(4)
		}
		from := slices.Clone(to[rng.IntN(len(to)):])
		for i := range from {
			if rng.IntN(3) == 0 {
				from[i] = 1
			}
		}
		n, _ := elements(from)
		src := make([]int32, n)
		for i := range src {
			src[i] = int32(i + 1)
		}
		like, err := m.NewHostArray(from, Int32, Pageable, src)
		if err != nil {
			t.Fatal(err)
		}
		h, err := m.NewHostArray(to, Int32, Pageable, like)
		if err != nil {
			t.Fatalf("%v into %v: %v", from, to, err)
		}
		got := h.Int32s()
		for e := range got {
			// The element's index in to, then in from (broadcast dims at 0).
			rem, si, stride := e, 0, 1
			for i := len(to) - 1; i >= 0; i-- {
				x := rem % to[i]
				rem /= to[i]
				if j := i - (len(to) - len(from)); j >= 0 {
					if from[j] != 1 {
						si += x * stride
					}
					stride *= from[j]
				}
			}
			if got[e] != src[si] {
				t.Fatalf("%v into %v: element %d is %d, want %d", from, to, e, got[e], src[si])
			}
		}
	}
}

func TestCopyCancelled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	m, _, _ := newManager(t, 64*MiB)
	c := register(t, m, ClientOptions{})
	must(t, c.Queue(map[string]ArrayRequest{"x": req(Float32, 0, 8)}))
	resp, err := c.Allocate(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	d := resp.Arrays()["x"]
	h, err := m.NewHostArray([]int{8}, Float32, Pinned, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Free()
	sp := Span{Axis: 0, Start: 0, Len: 8}
	for name, run := range map[string]func(context.Context) error{
		"ToDevice":        func(ctx context.Context) error { return c.ToDevice(ctx, d, h) },
		"FromDevice":      func(ctx context.Context) error { return c.FromDevice(ctx, h, d) },
		"ToDeviceChunk":   func(ctx context.Context) error { return c.ToDeviceChunk(ctx, d, h, sp) },
		"FromDeviceChunk": func(ctx context.Context) error { return c.FromDeviceChunk(ctx, h, d, sp) },
	} {
		t.Run(name, func(t *testing.T) {
			// The device holds zeros, the host ones: a copy that ran
			// would change one side.
			for i := range h.Float32s() {
				h.Float32s()[i] = 0
			}
			must(t, c.ToDevice(context.Background(), d, h))
			must(t, c.Sync(context.Background()))
			for i := range h.Float32s() {
				h.Float32s()[i] = 1
			}
			if err := run(ctx); !errors.Is(err, context.Canceled) {
				t.Fatalf("%s with a cancelled context = %v; want an error wrapping context.Canceled", name, err)
			}
			must(t, c.Sync(context.Background()))
			got := make([]float32, 8)
			copy(got, h.Float32s())
			must(t, c.FromDevice(context.Background(), h, d))
			must(t, c.Sync(context.Background()))
			for i, v := range h.Float32s() {
				if got[i] != 1 || v != 0 {
					t.Fatalf("element %d: host %v before the check (want 1), device %v (want 0): the cancelled copy ran", i, got[i], v)
				}
			}
		})
	}
}

// TestCopyOfAnotherGroupsArray: a client copies into and out of its own
// arrays and its group's members', and is refused another group's (the
// copy would go on its own stream, unordered with the other group's
// work) with ErrOtherGroup; nothing is enqueued.
func TestCopyOfAnotherGroupsArray(t *testing.T) {
	m, _, _ := newManager(t, 64*MiB)
	owner := register(t, m, ClientOptions{Name: "owner", Group: "g"})
	member := register(t, m, ClientOptions{Name: "member", Group: "g"})
	stranger := register(t, m, ClientOptions{Name: "stranger", Group: "other"})
	must(t, owner.Queue(map[string]ArrayRequest{"x": {Shape: []int{1024}, DType: Float32, Unchunkable: true}}))
	resp, err := owner.Allocate(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	x := resp.Arrays()["x"]
	h, err := m.NewHostArray([]int{1024}, Float32, Pinned, nil)
	must(t, err)
	defer h.Free()
	ctx := context.Background()
	sp := Span{Axis: 0, Start: 0, Len: 1024}
	for name, tc := range map[string]struct {
		c    *Client
		want error
	}{
		"its owner":                 {owner, nil},
		"a member of its group":     {member, nil},
		"a client of another group": {stranger, ErrOtherGroup},
	} {
		t.Run(name, func(t *testing.T) {
			for what, copyFn := range map[string]func() error{
				"ToDevice":        func() error { return tc.c.ToDevice(ctx, x, h) },
				"FromDevice":      func() error { return tc.c.FromDevice(ctx, h, x) },
				"ToDeviceChunk":   func() error { return tc.c.ToDeviceChunk(ctx, x, h, sp) },
				"FromDeviceChunk": func() error { return tc.c.FromDeviceChunk(ctx, h, x, sp) },
			} {
				if err := copyFn(); !errors.Is(err, tc.want) || (tc.want == nil && err != nil) {
					t.Errorf("%s: %v, want %v", what, err, tc.want)
				}
			}
			must(t, tc.c.Sync(ctx))
		})
	}
}
