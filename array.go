package vram

// Arrays: DeviceArray (device memory, or the device address of mapped
// host memory) and HostArray (pinned, mapped or pageable host memory with
// typed views). Both are row-major. The manager owns the arrays it hands
// out in an ArrayResponse and frees them; an array knows when that has
// happened (Freed) and copies through a freed array fail with ErrFreed.

import (
	"fmt"
	"reflect"
	"slices"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/vramkit/vram/device"
	"github.com/vramkit/vram/internal/meminfo"
	"github.com/vramkit/vram/internal/safecopy"
	"github.com/vramkit/vram/internal/units"
)

// DeviceArray is an array in device memory: an address with a shape, a
// dtype and row-major strides. Its address is never dereferenced on the
// host; copy through Client.ToDevice and Client.FromDevice.
//
// Its accessors are safe for concurrent use. The memory behind it is
// not: order kernels and copies that use it on one stream, or
// synchronize between streams (see package device).
type DeviceArray struct {
	ptr     device.Ptr
	shape   []int
	dtype   DType
	memory  MemoryType // Device or Mapped
	label   string
	owner   *Client // the client it was allocated for; its copies go on its group's stream
	freed   atomic.Bool
	evicted atomic.Bool               // freed by an eviction (evict.go)
	last    atomic.Pointer[streamRef] // the stream of the allocation or the latest copy
	// use is held for reading while a copy checks and enqueues work on
	// the array, and for writing while the manager frees it, so that no
	// copy is enqueued on memory already given back.
	use sync.RWMutex
}

// setLast records s as the stream the array was last used on.
func (a *DeviceArray) setLast(s device.Stream) {
	if p := a.last.Load(); p == nil || p.s != s {
		a.last.Store(&streamRef{s})
	}
}

// lastStream is the stream the array was last used on (nil if none).
func (a *DeviceArray) lastStream() device.Stream {
	if p := a.last.Load(); p != nil {
		return p.s
	}
	return nil
}

// Ptr is the array's device address (0 once freed).
func (a *DeviceArray) Ptr() device.Ptr {
	if a.freed.Load() {
		return 0
	}
	return a.ptr
}

// Shape is a copy of the array's shape.
func (a *DeviceArray) Shape() []int { return slices.Clone(a.shape) }

// Dim is the length of axis i.
func (a *DeviceArray) Dim(i int) int { return a.shape[i] }

// DType is the element type.
func (a *DeviceArray) DType() DType { return a.dtype }

// ElemType is the element type's NumPy name ("float32"): a kernel's
// typed views check it (kernel.Typed).
func (a *DeviceArray) ElemType() string { return a.dtype.String() }

// Strides are the row-major strides in bytes.
func (a *DeviceArray) Strides() []int { return stridesOf(a.shape, a.dtype.Size()) }

// Len is the number of elements.
func (a *DeviceArray) Len() int { n, _ := elements(a.shape); return int(n) }

// Bytes is the array's size in bytes (unrounded).
func (a *DeviceArray) Bytes() uint64 { n, _ := elements(a.shape); return n * a.dtype.Size() }

// Memory is Device, or Mapped for the device address of mapped host
// memory.
func (a *DeviceArray) Memory() MemoryType { return a.memory }

// Label is the name the array was requested under.
func (a *DeviceArray) Label() string { return a.label }

// Freed reports whether the manager has freed the array.
func (a *DeviceArray) Freed() bool { return a.freed.Load() }

// String describes the array ("state float32[2 1000] device at 0x…").
func (a *DeviceArray) String() string {
	return fmt.Sprintf("%s %v%v %v at %v", a.label, a.dtype, a.shape, a.memory, a.ptr)
}

// HostArray is an array in host memory: pinned (page-locked, for fast
// asynchronous copies), mapped (pinned and also reachable by kernels at
// DevicePtr) or pageable (ordinary Go memory). Typed views (Float64s,
// Float32s, …) alias its bytes.
//
// Its accessors are safe for concurrent use; its contents are not, and a
// host array must not be written (or, as a copy's destination, read)
// while an asynchronous copy that uses it is in flight: synchronize the
// stream first (Client.Sync).
type HostArray struct {
	data    []byte
	shape   []int
	dtype   DType
	memory  MemoryType // Pinned, Mapped or Pageable
	devPtr  device.Ptr // mapped: the device address of data
	label   string
	release func(last device.Stream) error // returns the memory and uncounts it
	place   *HostPlacement                 // the ladder's choice; nil: forced (Placement)
	last    atomic.Pointer[streamRef]      // the stream of the latest copy
	freed   atomic.Bool
	evicted atomic.Bool  // freed by an eviction (evict.go)
	use     sync.RWMutex // as DeviceArray.use
}

// streamRef boxes a stream for atomic.Pointer.
type streamRef struct{ s device.Stream }

// setLast records s as the stream the array was last used on.
func (h *HostArray) setLast(s device.Stream) {
	if p := h.last.Load(); p == nil || p.s != s {
		h.last.Store(&streamRef{s})
	}
}

// Shape is a copy of the array's shape.
func (h *HostArray) Shape() []int { return slices.Clone(h.shape) }

// Dim is the length of axis i.
func (h *HostArray) Dim(i int) int { return h.shape[i] }

// DType is the element type.
func (h *HostArray) DType() DType { return h.dtype }

// Strides are the row-major strides in bytes.
func (h *HostArray) Strides() []int { return stridesOf(h.shape, h.dtype.Size()) }

// Len is the number of elements.
func (h *HostArray) Len() int { n, _ := elements(h.shape); return int(n) }

// Bytes is the array's size in bytes.
func (h *HostArray) Bytes() uint64 { return uint64(len(h.data)) }

// Memory is Pinned, Mapped or Pageable.
func (h *HostArray) Memory() MemoryType { return h.memory }

// DevicePtr is the device address of a mapped array, else 0.
func (h *HostArray) DevicePtr() device.Ptr { return h.devPtr }

// Label is the name the array was requested under ("" for NewHostArray).
func (h *HostArray) Label() string { return h.label }

// Freed reports whether the array has been freed.
func (h *HostArray) Freed() bool { return h.freed.Load() }

// Data is the array's raw bytes (nil once freed).
func (h *HostArray) Data() []byte {
	if h.freed.Load() {
		return nil
	}
	return h.data
}

// Free returns a pinned or mapped array's memory to where it came from;
// for a pageable array it only marks it freed; a file-backed one (the
// host ladder's file rung) is unmapped and its file removed unless kept.
// Views taken before must not be used afterwards. A pinned buffer is reused only once the stream
// of the array's latest copy has finished that copy; an array copied on
// several streams at once must be synchronized before Free. A second Free
// returns nil. Arrays from an
// ArrayResponse are freed by the manager; freeing one here first is
// allowed.
func (h *HostArray) Free() error {
	h.use.Lock()
	defer h.use.Unlock()
	if !h.freed.CompareAndSwap(false, true) {
		return nil
	}
	if h.release != nil {
		var last device.Stream
		if p := h.last.Load(); p != nil {
			last = p.s
		}
		return h.release(last)
	}
	return nil
}

// String describes the array.
func (h *HostArray) String() string {
	if h.label == "" {
		return fmt.Sprintf("%v%v %v host array", h.dtype, h.shape, h.memory)
	}
	return fmt.Sprintf("%s %v%v %v host array", h.label, h.dtype, h.shape, h.memory)
}

// WrapHost makes a pageable host array of shape and dtype over data,
// bytes the caller owns (a Go slice, C memory, a NumPy array's buffer that
// libvram is given): nothing is copied or allocated, and nothing counts on
// the host ladder. len(data) must be the array's size in bytes. It copies
// like any host array (Client.ToDevice, the chunk copies); keep data alive
// and unchanged (or, copied into, unread) while a copy that uses it is in
// flight, until Client.Sync. Free only marks it freed.
func WrapHost(data []byte, shape []int, dtype DType) (*HostArray, error) {
	r := ArrayRequest{Shape: shape, DType: dtype, Memory: Pageable}
	if err := r.Validate(); err != nil {
		return nil, fmt.Errorf("wrap host bytes: %w", err)
	}
	if n := r.Bytes(); uint64(len(data)) != n {
		return nil, fmt.Errorf("wrap host bytes: %d bytes for %v%v, which takes %d: %w", len(data), dtype, shape, n, ErrMismatch)
	}
	return &HostArray{data: data, shape: slices.Clone(shape), dtype: dtype, memory: Pageable}, nil
}

// view returns the array's bytes as a []T after checking the dtype and
// alignment. It panics on a mismatch, as a wrong-typed view is a
// programming error.
func view[T any](h *HostArray, want DType) []T {
	if h.dtype != want {
		panic(fmt.Sprintf("vram: %v view of a %v host array", want, h.dtype))
	}
	data := h.Data()
	if len(data) == 0 {
		return nil
	}
	var zero T
	size := unsafe.Sizeof(zero)
	if uintptr(unsafe.Pointer(&data[0]))%unsafe.Alignof(zero) != 0 {
		panic(fmt.Sprintf("vram: host array at %p is not aligned for %v", &data[0], want))
	}
	return unsafe.Slice((*T)(unsafe.Pointer(&data[0])), uintptr(len(data))/size)
}

// Float64s views a Float64 array. It panics for another dtype; it is nil
// once the array is freed.
func (h *HostArray) Float64s() []float64 { return view[float64](h, Float64) }

// Float32s views a Float32 array; see Float64s.
func (h *HostArray) Float32s() []float32 { return view[float32](h, Float32) }

// Int32s views an Int32 array; see Float64s.
func (h *HostArray) Int32s() []int32 { return view[int32](h, Int32) }

// Int64s views an Int64 array; see Float64s.
func (h *HostArray) Int64s() []int64 { return view[int64](h, Int64) }

// Uint8s views a Uint8 array; see Float64s.
func (h *HostArray) Uint8s() []uint8 { return view[uint8](h, Uint8) }

// Uint32s views a Uint32 array; see Float64s.
func (h *HostArray) Uint32s() []uint32 { return view[uint32](h, Uint32) }

// Complex64s views a Complex64 array; see Float64s.
func (h *HostArray) Complex64s() []complex64 { return view[complex64](h, Complex64) }

// Complex128s views a Complex128 array; see Float64s.
func (h *HostArray) Complex128s() []complex128 { return view[complex128](h, Complex128) }

// maxGoAlloc bounds one allocation of Go memory: the Go runtime cannot
// make a larger object (it has 48-bit heap addresses on 64-bit
// platforms, 32-bit ones elsewhere; this keeps a margin below both).
const maxGoAlloc = 1<<(31+16*(^uint(0)>>63)) - 1<<20

// pageableLimit is the most bytes one pageable host array may have:
// what the Go runtime can allocate in one piece, and no more than the
// host's memory and swap where they are known (meminfo.RAMAndSwap), since a
// larger one would end the process, not fail.
func pageableLimit() uint64 {
	limit := uint64(maxGoAlloc)
	if h := meminfo.RAMAndSwap(); h > 0 {
		limit = min(limit, h)
	}
	return limit
}

// pageable returns n zeroed bytes of Go memory aligned to 8 bytes, or an
// error wrapping ErrOutOfMemory when n is more than pageableLimit.
func pageable(n uint64) ([]byte, error) {
	if limit := pageableLimit(); n > limit {
		return nil, fmt.Errorf("pageable host memory of %s (%d bytes) is more than one Go allocation on this host may take, %s (its memory and swap, and the Go runtime's limit); shrink the array or chunk it: %w",
			units.Format(n), n, units.Format(limit), errHostOutOfMemory)
	}
	if n == 0 {
		return []byte{}, nil
	}
	words := make([]uint64, (n+7)/8)
	return unsafe.Slice((*byte)(unsafe.Pointer(&words[0])), n), nil
}

// fill copies like into h: nil (nothing), a *HostArray of h's dtype, or
// a slice of h's element type. A slice with h.Len() elements is h's
// elements in row-major order; any other like is broadcast as NumPy
// broadcasts an assignment (cubie's create_host_array does arr[:] =
// like): a slice is a 1-D array of its length, and each of like's
// dimensions, matched from the last, must equal h's or be 1 (leading
// dimensions of 1 beyond h's are dropped). Types are never converted.
func fill(h *HostArray, like any) error {
	var src []byte
	var shape []int
	switch v := like.(type) {
	case nil:
		return nil
	case *HostArray:
		if v.dtype != h.dtype {
			return fmt.Errorf("like is %v%v, want %v elements for %v%v (vram converts no types): %w", v.dtype, v.shape, h.dtype, h.dtype, h.shape, ErrMismatch)
		}
		if src = v.Data(); src == nil {
			return fmt.Errorf("like: %w", ErrFreed)
		}
		shape = v.shape
	case []float64:
		src, shape = sliceBytes(v, Float64, h)
	case []float32:
		src, shape = sliceBytes(v, Float32, h)
	case []int32:
		src, shape = sliceBytes(v, Int32, h)
	case []int64:
		src, shape = sliceBytes(v, Int64, h)
	case []uint8:
		src, shape = sliceBytes(v, Uint8, h)
	case []uint32:
		src, shape = sliceBytes(v, Uint32, h)
	case []complex64:
		src, shape = sliceBytes(v, Complex64, h)
	case []complex128:
		src, shape = sliceBytes(v, Complex128, h)
	default:
		return fmt.Errorf("like is a %T; want nil, a *HostArray or a slice of %v: %w", like, h.dtype, ErrMismatch)
	}
	if src == nil {
		return fmt.Errorf("like is a %T of %d elements; want a %s for %v%v: %w",
			like, reflect.ValueOf(like).Len(), goSliceType(h.dtype), h.dtype, h.shape, ErrMismatch)
	}
	if !broadcastCopy(h.data, h.shape, src, shape, int(h.dtype.Size())) {
		return fmt.Errorf("like of shape %v does not broadcast to %v%v: each of its dimensions, matched from the last, must equal the array's or be 1 (NumPy's rule; a slice of %d elements fills the array in row-major order): %w",
			shape, h.dtype, h.shape, h.Len(), ErrMismatch)
	}
	return nil
}

// broadcastCopy copies src, an array of shape from, into dst, of shape
// to, broadcasting as NumPy does (see fill), in elements of size bytes;
// false when from does not broadcast to to.
func broadcastCopy(dst []byte, to []int, src []byte, from []int, size int) bool {
	for len(from) > len(to) && from[0] == 1 {
		from = from[1:]
	}
	if len(from) > len(to) {
		return false
	}
	n := len(to)
	sh := make([]int, n) // from, padded with leading 1s
	for i := range sh {
		sh[i] = 1
	}
	copy(sh[n-len(from):], from)
	for i := range n {
		if sh[i] != to[i] && sh[i] != 1 {
			return false
		}
	}
	// The trailing dimensions that match are copied as one block; the
	// others are walked, a broadcast one (length 1) with no step in src.
	k := n
	block := size
	for k > 0 && sh[k-1] == to[k-1] {
		k--
		block *= to[k]
	}
	if k == 0 {
		copy(dst, src[:block])
		return true
	}
	step := make([]int, k) // bytes src moves per index of dimension i
	acc := block
	for i := k - 1; i >= 0; i-- {
		if sh[i] != 1 {
			step[i] = acc
		}
		acc *= sh[i]
	}
	idx := make([]int, k)
	for d, s := 0, 0; d < len(dst); d += block {
		copy(dst[d:d+block], src[s:s+block])
		for i := k - 1; i >= 0; i-- { // the next index, odometer style
			idx[i]++
			s += step[i]
			if idx[i] < to[i] {
				break
			}
			s -= step[i] * idx[i]
			idx[i] = 0
		}
	}
	return true
}

// sliceBytes returns the bytes of v and the shape they fill h as: h's
// own for as many elements as h has, else [len(v)] (broadcast by fill);
// nil when v's element type is not h's dtype.
func sliceBytes[T any](v []T, d DType, h *HostArray) ([]byte, []int) {
	if d != h.dtype {
		return nil, nil
	}
	shape := []int{len(v)}
	if len(v) == h.Len() {
		shape = h.shape
	}
	if len(v) == 0 {
		return []byte{}, shape
	}
	var zero T
	return unsafe.Slice((*byte)(unsafe.Pointer(&v[0])), uintptr(len(v))*unsafe.Sizeof(zero)), shape
}

// goSliceType names the Go slice type that holds a dtype's elements.
func goSliceType(d DType) string {
	switch d {
	case Float64:
		return "[]float64"
	case Float32:
		return "[]float32"
	case Int32:
		return "[]int32"
	case Int64:
		return "[]int64"
	case Uint8:
		return "[]uint8"
	case Uint32:
		return "[]uint32"
	case Complex64:
		return "[]complex64"
	case Complex128:
		return "[]complex128"
	}
	return "slice of " + d.String()
}

// CopyChunkFrom copies the runs sp of the full-length host array full
// into the first sp.Len runs along sp.Axis of h, a chunk-length host array
// (a staging buffer's, say): the host-side twin of Client.ToDeviceChunk,
// with its rules for shapes and spans. It copies at once, on the calling
// goroutine; neither array may be in use by a copy in flight.
func (h *HostArray) CopyChunkFrom(full *HostArray, sp Span) error {
	return copyHostChunk(h, full, sp, true)
}

// CopyChunkTo copies the first sp.Len runs along sp.Axis of h, a
// chunk-length host array, into the runs sp of the full-length host
// array full: the reverse of CopyChunkFrom, the host-side twin of
// Client.FromDeviceChunk.
func (h *HostArray) CopyChunkTo(full *HostArray, sp Span) error {
	return copyHostChunk(h, full, sp, false)
}

// copyHostChunk copies runs sp between the chunk-length chunk and the
// full-length full: into chunk when toChunk, else back.
func copyHostChunk(chunk, full *HostArray, sp Span, toChunk bool) error {
	if chunk == nil || full == nil {
		return fmt.Errorf("host chunk copy: a nil host array: %w", device.ErrInvalidValue)
	}
	chunk.use.RLock()
	defer chunk.use.RUnlock()
	if full != chunk {
		full.use.RLock()
		defer full.use.RUnlock()
	}
	switch {
	case chunk.Freed():
		return fmt.Errorf("host chunk copy: %w", chunk.freedErr())
	case full.Freed():
		return fmt.Errorf("host chunk copy: %w", full.freedErr())
	case chunk.dtype != full.dtype:
		return fmt.Errorf("host chunk copy: %v and %v: give both one dtype: %w", chunk, full, ErrMismatch)
	}
	cc, err := planChunkCopy(full.shape, chunk.shape, full.dtype.Size(), sp)
	if err != nil {
		return fmt.Errorf("host chunk copy: %v and %v: %w", full, chunk, err)
	}
	// A file-backed array whose file shrank (or whose disk filled)
	// faults: an error wrapping ErrHostFault, not the end of the process.
	err = safecopy.Do(func() {
		for row := range cc.rows {
			c := chunk.data[row*cc.devPitch:][:cc.width]
			f := full.data[cc.hostOff+row*cc.hostPitch:][:cc.width]
			if toChunk {
				copy(c, f)
			} else {
				copy(f, c)
			}
		}
	})
	if err != nil {
		return fmt.Errorf("host chunk copy: %v and %v: %w", full, chunk, err)
	}
	return nil
}
