package vram

// Copies between host and device arrays, on the client's stream.
//
// A chunk copy moves the runs [Start, Start+Len) of a full-length host
// array into the first Len positions along the same axis of a
// chunk-length device array (or back). In row-major order that range is
// one contiguous row per index of the axes before the chunk axis: outer =
// ∏ shape[:axis] rows of Len × inner bytes each, inner = ∏ shape[axis+1:]
// × element size, spaced shape[axis] × inner bytes apart on the host and
// chunk length × inner on the device. When the device implements
// device.StridedCopier (cuMemcpy2DAsync) that is one pitched 2-D copy;
// otherwise one copy per row. Either way it is one copy when the rows are
// adjacent (the chunk axis is the first, or the chunk is the whole array).

import (
	"context"
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
// unchanged until c.Sync.
//
// The copies (ToDevice, FromDevice, ToDeviceChunk, FromDeviceChunk) check
// ctx before they enqueue and return an error wrapping ctx.Err(), with
// nothing enqueued, when it is done. A copy between the device and
// pageable host memory may wait in the driver until the stream reaches
// it (CUDA returns from a copy into pageable memory only once it is
// done); that wait cannot be abandoned.
func (c *Client) ToDevice(ctx context.Context, dst *DeviceArray, src *HostArray) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("to device for %v: %w", c, err)
	}
	return c.m.toDevice(c, dst, src)
}

// FromDevice copies src into dst, which must have the same dtype and
// shape, ordered on c's stream. It returns once the copy is enqueued
// (into pageable memory, on CUDA, once it is done): read dst after
// c.Sync. ctx as for ToDevice.
func (c *Client) FromDevice(ctx context.Context, dst *HostArray, src *DeviceArray) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("from device for %v: %w", c, err)
	}
	return c.m.fromDevice(c, dst, src)
}

// ToDeviceChunk copies the runs sp of the full-length host array src into
// the chunk-length device array dst: for every index of the axes other
// than sp.Axis, src's elements at sp.Start … sp.Start+sp.Len−1 along
// sp.Axis go to dst's elements 0 … sp.Len−1. The arrays must have the same
// dtype, rank and dimensions except along sp.Axis, where dst needs at
// least sp.Len and src at least sp.Start+sp.Len. dst's elements past
// sp.Len along the axis (the idle tail of a short last chunk) are left
// as they were. It is one copy when the device implements
// device.StridedCopier or the runs are contiguous, else one per index of
// the axes before sp.Axis. Ordered on c's stream; keep src unchanged
// until c.Sync. ctx as for ToDevice.
func (c *Client) ToDeviceChunk(ctx context.Context, dst *DeviceArray, src *HostArray, sp Span) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("to device chunk for %v: %w", c, err)
	}
	return c.m.toDeviceChunk(c, dst, src, sp)
}

// FromDeviceChunk copies the first sp.Len runs along sp.Axis of the
// chunk-length device array src into runs sp.Start … sp.Start+sp.Len−1 of
// the full-length host array dst: the reverse of ToDeviceChunk, with the
// same rules. Ordered on c's stream; read dst after c.Sync. ctx as for
// ToDevice.
func (c *Client) FromDeviceChunk(ctx context.Context, dst *HostArray, src *DeviceArray, sp Span) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("from device chunk for %v: %w", c, err)
	}
	return c.m.fromDeviceChunk(c, dst, src, sp)
}

// toDevice is Client.ToDevice.
func (m *Manager) toDevice(c *Client, dst *DeviceArray, src *HostArray) error {
	s, done, err := m.copyCheck(c, dst, src)
	if err != nil {
		return fmt.Errorf("to device: %w", err)
	}
	defer done()
	if !slices.Equal(dst.shape, src.shape) {
		return fmt.Errorf("to device: %v into %v: the shapes differ; give both the same shape, or copy one chunk with ToDeviceChunk: %w", src, dst, ErrMismatch)
	}
	if err := m.dev.CopyHtoD(dst.ptr, src.data, s); err != nil {
		return fmt.Errorf("to device: %v into %v: %w", src, dst, err)
	}
	return nil
}

// fromDevice is Client.FromDevice.
func (m *Manager) fromDevice(c *Client, dst *HostArray, src *DeviceArray) error {
	s, done, err := m.copyCheck(c, src, dst)
	if err != nil {
		return fmt.Errorf("from device: %w", err)
	}
	defer done()
	if !slices.Equal(dst.shape, src.shape) {
		return fmt.Errorf("from device: %v into %v: the shapes differ; give both the same shape, or copy one chunk with FromDeviceChunk: %w", src, dst, ErrMismatch)
	}
	if err := m.dev.CopyDtoH(dst.data, src.ptr, s); err != nil {
		return fmt.Errorf("from device: %v into %v: %w", src, dst, err)
	}
	return nil
}

// toDeviceChunk is Client.ToDeviceChunk.
func (m *Manager) toDeviceChunk(c *Client, dst *DeviceArray, src *HostArray, sp Span) error {
	s, done, err := m.copyCheck(c, dst, src)
	if err != nil {
		return fmt.Errorf("to device chunk: %w", err)
	}
	defer done()
	cc, err := planChunkCopy(src.shape, dst.shape, dst.dtype.Size(), sp)
	if err != nil {
		return fmt.Errorf("to device chunk: %v into %v: %w", src, dst, err)
	}
	if err := m.copyChunk(true, dst.ptr, src.data, cc, s); err != nil {
		return fmt.Errorf("to device chunk: runs %d..%d of %v into %v: %w",
			sp.Start, sp.Start+sp.Len, src, dst, err)
	}
	return nil
}

// fromDeviceChunk is Client.FromDeviceChunk.
func (m *Manager) fromDeviceChunk(c *Client, dst *HostArray, src *DeviceArray, sp Span) error {
	s, done, err := m.copyCheck(c, src, dst)
	if err != nil {
		return fmt.Errorf("from device chunk: %w", err)
	}
	defer done()
	cc, err := planChunkCopy(dst.shape, src.shape, src.dtype.Size(), sp)
	if err != nil {
		return fmt.Errorf("from device chunk: %v into %v: %w", src, dst, err)
	}
	if err := m.copyChunk(false, src.ptr, dst.data, cc, s); err != nil {
		return fmt.Errorf("from device chunk: runs %d..%d of %v into %v: %w",
			sp.Start, sp.Start+sp.Len, src, dst, err)
	}
	return nil
}

// copyChunk enqueues the copy cc between the device array at dev and the
// host bytes host, toward the device when toDev: one 2-D copy when the
// device can do them and the rows are apart, else one copy per row (one
// in all when they are adjacent).
func (m *Manager) copyChunk(toDev bool, dev device.Ptr, host []byte, cc chunkCopy, s device.Stream) error {
	if cc.rows == 0 || cc.width == 0 {
		return nil
	}
	if cc.contiguous() {
		n := cc.rows * cc.width
		if toDev {
			return m.dev.CopyHtoD(dev, host[cc.hostOff:cc.hostOff+n], s)
		}
		return m.dev.CopyDtoH(host[cc.hostOff:cc.hostOff+n], dev, s)
	}
	if m.strided != nil {
		hs := host[cc.hostOff : cc.hostOff+(cc.rows-1)*cc.hostPitch+cc.width]
		w, h, hp, dp := uint64(cc.width), uint64(cc.rows), uint64(cc.hostPitch), uint64(cc.devPitch)
		if toDev {
			return m.strided.CopyHtoD2D(dev, dp, hs, hp, w, h, s)
		}
		return m.strided.CopyDtoH2D(hs, hp, dev, dp, w, h, s)
	}
	for r := range cc.rows {
		ho := cc.hostOff + r*cc.hostPitch
		d := dev.Add(uint64(r * cc.devPitch))
		var err error
		if toDev {
			err = m.dev.CopyHtoD(d, host[ho:ho+cc.width], s)
		} else {
			err = m.dev.CopyDtoH(host[ho:ho+cc.width], d, s)
		}
		if err != nil {
			return fmt.Errorf("row %d of %d: %w", r, cc.rows, err)
		}
	}
	return nil
}

// copyCheck checks the client and the arrays and returns c's stream.
// On success it holds what keeps the stream and the arrays alive until
// the copy is enqueued; call done when it is.
func (m *Manager) copyCheck(c *Client, d *DeviceArray, h *HostArray) (s device.Stream, done func(), err error) {
	if d == nil || h == nil {
		return nil, nil, fmt.Errorf("nil array; pass arrays from an ArrayResponse and NewHostArray: %w", device.ErrInvalidValue)
	}
	m.useMu.RLock()
	d.use.RLock()
	h.use.RLock()
	done = func() {
		h.use.RUnlock()
		d.use.RUnlock()
		m.useMu.RUnlock()
	}
	switch {
	case d.Freed():
		err = d.freedErr()
	case h.Freed():
		err = h.freedErr()
	case d.dtype != h.dtype:
		err = fmt.Errorf("the device array is %v and the host array %v; make the host array with the device array's dtype: %w", d.dtype, h.dtype, ErrMismatch)
	default:
		if err = m.checkOwner(c, d); err == nil {
			s, err = m.stream(c)
		}
	}
	if err != nil {
		done()
		return nil, nil, err
	}
	h.setLast(s)
	d.setLast(s)
	return s, done, nil
}

// checkOwner refuses a copy by c of device array d unless d is c's or a
// member's of c's group: the copy goes on c's stream, and another group's
// array is used on that group's stream, with no order between the two.
func (m *Manager) checkOwner(c *Client, d *DeviceArray) error {
	o := d.owner
	if o == nil || o == c {
		return nil
	}
	if c == nil || c.m != m {
		return foreign(c)
	}
	if o.m != m {
		return fmt.Errorf("the device array %v is %v's, of another manager: %w", d, o, ErrUnknownClient)
	}
	m.mu.Lock()
	og, cg := o.group, c.group
	m.mu.Unlock()
	if og == cg {
		return nil
	}
	return fmt.Errorf("the device array %v is %v's, of stream group %q, and %v is in group %q: an array is copied on its group's stream; copy it with a member of %q: %w",
		d, o, og, c, cg, og, ErrOtherGroup)
}

// chunkCopy is a chunk copy as rows: rows pieces of width bytes, row r
// at byte hostOff + r·hostPitch of the host array and r·devPitch of the
// device array.
type chunkCopy struct {
	rows, width         int
	hostOff             int
	hostPitch, devPitch int
}

// contiguous reports whether the rows are adjacent on both sides, so that
// one plain copy moves them all.
func (cc chunkCopy) contiguous() bool {
	return cc.rows == 1 || (cc.hostPitch == cc.width && cc.devPitch == cc.width)
}

// planChunkCopy checks a chunk copy between a host array of shape hs and
// a device array of shape ds (elements of size bytes) and lays it out as
// rows.
func planChunkCopy(hs, ds []int, size uint64, sp Span) (chunkCopy, error) {
	if len(hs) != len(ds) {
		return chunkCopy{}, fmt.Errorf("rank %d and %d; give both arrays the same axes: %w", len(hs), len(ds), ErrMismatch)
	}
	ax := sp.Axis
	if ax < 0 || ax >= len(hs) {
		return chunkCopy{}, fmt.Errorf("axis %d of a rank-%d array; the span's axis must be the arrays' chunk axis: %w", ax, len(hs), ErrMismatch)
	}
	for i := range hs {
		if i != ax && hs[i] != ds[i] {
			return chunkCopy{}, fmt.Errorf("shapes %v and %v differ on axis %d (only the chunk axis %d may): %w", hs, ds, i, ax, ErrMismatch)
		}
	}
	if sp.Start < 0 || sp.Len < 0 || sp.Start > hs[ax] || sp.Len > hs[ax]-sp.Start || sp.Len > ds[ax] {
		return chunkCopy{}, fmt.Errorf("runs [%d, %d) along axis %d: the host array has %d and the device array %d; use the plan's Span(i, axis): %w",
			sp.Start, sp.Start+sp.Len, ax, hs[ax], ds[ax], ErrMismatch)
	}
	if sp.Len == 0 {
		return chunkCopy{}, nil
	}
	outer := 1
	for _, d := range hs[:ax] {
		outer *= d
	}
	inner := int(size)
	for _, d := range hs[ax+1:] {
		inner *= d
	}
	return chunkCopy{
		rows:      outer,
		width:     sp.Len * inner,
		hostOff:   sp.Start * inner,
		hostPitch: hs[ax] * inner,
		devPitch:  ds[ax] * inner,
	}, nil
}
