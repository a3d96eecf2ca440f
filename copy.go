package vram

// Copies between host and device arrays, on the client's stream.
//
// A chunk copy moves the runs [Start, Start+Len) of a full-length host
// array into the first Len positions along the same axis of a
// chunk-length device array (or back). In row-major order that range is
// one contiguous slab per index of the axes before the chunk axis, so a
// chunk copy is outer = ∏ shape[:axis] copies of Len × inner bytes each,
// inner = ∏ shape[axis+1:] × element size: one copy when the chunk axis is
// the first, one per leading row when it is the last.

import (
	"fmt"
	"slices"

	"github.com/vramkit/vram/device"
)

// Span is a range of runs along an axis: the runs [Start, Start+Len) of
// axis Axis. ChunkPlan.Span(i, axis) gives chunk i's. A plain value.
type Span struct {
	Axis  int `json:"axis"`
	Start int `json:"start"`
	Len   int `json:"len"`
}

// ToDevice copies src into dst, which must have the same dtype and shape,
// ordered on c's stream. It returns once the copy is enqueued: keep src
// unchanged until Sync(c).
func (m *Manager) ToDevice(c *Client, dst *DeviceArray, src *HostArray) error {
	s, done, err := m.copyCheck(c, dst, src)
	if err != nil {
		return fmt.Errorf("vram: to device: %w", err)
	}
	defer done()
	if !slices.Equal(dst.shape, src.shape) {
		return fmt.Errorf("vram: to device: %v into %v: %w", src, dst, ErrMismatch)
	}
	if err := m.dev.CopyHtoD(dst.ptr, src.data, s); err != nil {
		return fmt.Errorf("vram: to device: %v into %v: %w", src, dst, err)
	}
	return nil
}

// FromDevice copies src into dst, which must have the same dtype and
// shape, ordered on c's stream. It returns once the copy is enqueued: read
// dst after Sync(c).
func (m *Manager) FromDevice(c *Client, dst *HostArray, src *DeviceArray) error {
	s, done, err := m.copyCheck(c, src, dst)
	if err != nil {
		return fmt.Errorf("vram: from device: %w", err)
	}
	defer done()
	if !slices.Equal(dst.shape, src.shape) {
		return fmt.Errorf("vram: from device: %v into %v: %w", src, dst, ErrMismatch)
	}
	if err := m.dev.CopyDtoH(dst.data, src.ptr, s); err != nil {
		return fmt.Errorf("vram: from device: %v into %v: %w", src, dst, err)
	}
	return nil
}

// ToDeviceChunk copies the runs sp of the full-length host array src into
// the chunk-length device array dst: for every index of the axes other
// than sp.Axis, src's elements at sp.Start … sp.Start+sp.Len−1 along
// sp.Axis go to dst's elements 0 … sp.Len−1. The arrays must have the same
// dtype, rank and dimensions except along sp.Axis, where dst needs at
// least sp.Len and src at least sp.Start+sp.Len. dst's elements past
// sp.Len along the axis (the idle tail of a short last chunk) are left
// as they were. Ordered on c's stream; keep src unchanged until Sync(c).
func (m *Manager) ToDeviceChunk(c *Client, dst *DeviceArray, src *HostArray, sp Span) error {
	s, done, err := m.copyCheck(c, dst, src)
	if err != nil {
		return fmt.Errorf("vram: to device chunk: %w", err)
	}
	defer done()
	slabs, err := chunkSlabs(src.shape, dst.shape, dst.dtype.Size(), sp)
	if err != nil {
		return fmt.Errorf("vram: to device chunk: %v into %v: %w", src, dst, err)
	}
	for _, sl := range slabs {
		if err := m.dev.CopyHtoD(dst.ptr.Add(uint64(sl.dev)), src.data[sl.host:sl.host+sl.n], s); err != nil {
			return fmt.Errorf("vram: to device chunk: runs %d..%d of %v into %v: %w",
				sp.Start, sp.Start+sp.Len, src, dst, err)
		}
	}
	return nil
}

// FromDeviceChunk copies the first sp.Len runs along sp.Axis of the
// chunk-length device array src into runs sp.Start … sp.Start+sp.Len−1 of
// the full-length host array dst: the reverse of ToDeviceChunk, with the
// same rules. Ordered on c's stream; read dst after Sync(c).
func (m *Manager) FromDeviceChunk(c *Client, dst *HostArray, src *DeviceArray, sp Span) error {
	s, done, err := m.copyCheck(c, src, dst)
	if err != nil {
		return fmt.Errorf("vram: from device chunk: %w", err)
	}
	defer done()
	slabs, err := chunkSlabs(dst.shape, src.shape, src.dtype.Size(), sp)
	if err != nil {
		return fmt.Errorf("vram: from device chunk: %v into %v: %w", src, dst, err)
	}
	for _, sl := range slabs {
		if err := m.dev.CopyDtoH(dst.data[sl.host:sl.host+sl.n], src.ptr.Add(uint64(sl.dev)), s); err != nil {
			return fmt.Errorf("vram: from device chunk: runs %d..%d of %v into %v: %w",
				sp.Start, sp.Start+sp.Len, src, dst, err)
		}
	}
	return nil
}

// copyCheck checks the client and the arrays and returns c's stream.
// On success it holds what keeps the stream and the arrays alive until
// the copy is enqueued; call done when it is.
func (m *Manager) copyCheck(c *Client, d *DeviceArray, h *HostArray) (s device.Stream, done func(), err error) {
	if d == nil || h == nil {
		return nil, nil, fmt.Errorf("nil array: %w", device.ErrInvalidValue)
	}
	m.allocMu.RLock()
	d.use.RLock()
	h.use.RLock()
	done = func() {
		h.use.RUnlock()
		d.use.RUnlock()
		m.allocMu.RUnlock()
	}
	switch {
	case d.Freed():
		err = fmt.Errorf("device array %v: %w", d, ErrFreed)
	case h.Freed():
		err = fmt.Errorf("host array %v: %w", h, ErrFreed)
	case d.dtype != h.dtype:
		err = fmt.Errorf("dtype %v and %v: %w", d.dtype, h.dtype, ErrMismatch)
	default:
		s, err = m.Stream(c)
	}
	if err != nil {
		done()
		return nil, nil, err
	}
	h.setLast(s)
	return s, done, nil
}

// slab is one contiguous piece of a chunk copy: n bytes at offset host in
// the host array and dev in the device array.
type slab struct{ host, dev, n int }

// chunkSlabs lists the contiguous pieces of a chunk copy between a host
// array of shape hs and a device array of shape ds.
func chunkSlabs(hs, ds []int, size uint64, sp Span) ([]slab, error) {
	if len(hs) != len(ds) {
		return nil, fmt.Errorf("rank %d and %d: %w", len(hs), len(ds), ErrMismatch)
	}
	ax := sp.Axis
	if ax < 0 || ax >= len(hs) {
		return nil, fmt.Errorf("axis %d of a rank-%d array: %w", ax, len(hs), ErrMismatch)
	}
	for i := range hs {
		if i != ax && hs[i] != ds[i] {
			return nil, fmt.Errorf("shapes %v and %v differ on axis %d (only the chunk axis %d may): %w", hs, ds, i, ax, ErrMismatch)
		}
	}
	if sp.Start < 0 || sp.Len < 0 || sp.Start+sp.Len > hs[ax] || sp.Len > ds[ax] {
		return nil, fmt.Errorf("runs [%d, %d) along axis %d: the host array has %d and the device array %d: %w",
			sp.Start, sp.Start+sp.Len, ax, hs[ax], ds[ax], ErrMismatch)
	}
	if sp.Len == 0 {
		return nil, nil
	}
	outer := 1
	for _, d := range hs[:ax] {
		outer *= d
	}
	inner := int(size)
	for _, d := range hs[ax+1:] {
		inner *= d
	}
	// Whole rows on both sides: the pieces are adjacent, one copy.
	if sp.Start == 0 && sp.Len == hs[ax] && sp.Len == ds[ax] {
		return []slab{{0, 0, outer * sp.Len * inner}}, nil
	}
	slabs := make([]slab, outer)
	for o := range outer {
		slabs[o] = slab{
			host: (o*hs[ax] + sp.Start) * inner,
			dev:  o * ds[ax] * inner,
			n:    sp.Len * inner,
		}
	}
	return slabs, nil
}
