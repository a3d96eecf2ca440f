package cuda

// Two-dimensional (pitched) copies: device.StridedCopier through
// cuMemcpy2DAsync_v2.
//
// A 2-D copy moves height rows of width bytes; row r is read at
// src + r·srcPitch and written at dst + r·dstPitch, in one driver call.
// The checks are those of the 1-D copies, applied to the whole region:
//
//   - A pitch below the width, on either side, is device.ErrInvalidValue,
//     and so is a host slice shorter than the rows need
//     ((height−1)·pitch + width bytes) or a region whose size overflows.
//   - The device side's first row is checked like a 1-D range (a freed
//     pointer, one from before a Reset, another device's, an overrun);
//     then the last row must end inside the same allocation. Rows are
//     evenly spaced, so every row lies in that one live allocation; a
//     region that reaches into a neighbouring allocation is refused with
//     device.ErrOutOfBounds naming the first row that leaves it, before
//     the driver sees it.
//   - The pageable-memory rule of CopyHtoD and CopyDtoH holds: unless the
//     rows' host range lies inside one pinned buffer of this Device, the
//     stream is synchronized before the call returns.
//   - A zero width or height copies nothing (the stream and the device
//     pointer are still checked, as for a 1-D copy of zero bytes).
//
// cuMemcpy2D refuses pitches above CU_DEVICE_ATTRIBUTE_MAX_PITCH (2 GiB − 1
// on current GPUs); a copy with a larger pitch — a host array whose rows
// are longer than that — is done as one 1-D copy per row on the same
// stream, which orders and completes exactly like the single call.

import (
	"fmt"
	"math/bits"
	"runtime"
	"unsafe"

	"github.com/vramkit/vram/device"
	"github.com/vramkit/vram/internal/units"
)

// extent2D is the bytes from the first row's start to the last row's end,
// (height−1)·pitch + width; 0 when width or height is 0. ok is false when
// it overflows.
func extent2D(pitch, width, height uint64) (ext uint64, ok bool) {
	if width == 0 || height == 0 {
		return 0, true
	}
	hi, lo := bits.Mul64(height-1, pitch)
	ext = lo + width
	return ext, hi == 0 && ext >= lo
}

// shape2D checks a 2-D copy's arguments that need no device state and
// returns the host and device extents.
func shape2D(op string, hostLen int, hostPitch, devPitch, width, height uint64) (hostExt, devExt uint64, err error) {
	shape := fmt.Sprintf("%d rows of %s", height, units.Format(width))
	for _, c := range []struct {
		side  string
		pitch uint64
	}{{"device", devPitch}, {"host", hostPitch}} {
		if c.pitch < width {
			return 0, 0, fmt.Errorf("cuda: %s of %s: the %s pitch %s is less than the row width, so rows would overlap; "+
				"want pitch >= width: %w", op, shape, c.side, units.Format(c.pitch), device.ErrInvalidValue)
		}
	}
	hostExt, ok := extent2D(hostPitch, width, height)
	if !ok {
		return 0, 0, fmt.Errorf("cuda: %s of %s at host pitch %s: the rows span more than 2^64 bytes: %w",
			op, shape, units.Format(hostPitch), device.ErrInvalidValue)
	}
	if hostExt > uint64(hostLen) {
		return 0, 0, fmt.Errorf("cuda: %s of %s at host pitch %s: the host slice holds %s but the rows need %s "+
			"((height-1)*pitch + width): %w",
			op, shape, units.Format(hostPitch), units.Format(uint64(hostLen)), units.Format(hostExt), device.ErrInvalidValue)
	}
	devExt, ok = extent2D(devPitch, width, height)
	if !ok {
		return 0, 0, fmt.Errorf("cuda: %s of %s at device pitch %s: the rows span more than 2^64 bytes: %w",
			op, shape, units.Format(devPitch), device.ErrOutOfBounds)
	}
	return hostExt, devExt, nil
}

// checkRowsLocked checks that height rows of width bytes, pitch apart from
// p, lie in one live allocation (ext is their extent). Requires d.mu and
// p.mu (read).
func (d *Device) checkRowsLocked(op string, p device.Ptr, pitch, width, height, ext uint64) error {
	if width == 0 || height == 0 {
		return d.checkRangeLocked(op, p, 0)
	}
	if err := d.checkRangeLocked(op+" row 0", p, width); err != nil {
		return err
	}
	sp, _ := d.live.containing(uint64(p)) // row 0 is inside it
	room := sp.end() - uint64(p)          // >= width
	if ext <= room {
		return nil
	}
	r := (room-width)/pitch + 1 // the first row that does not fit
	at := p.Add(r * pitch)
	return fmt.Errorf("cuda: %s of %d rows of %s at pitch %s from %v: row %d (at %v) ends %s past the end of the %s allocation of %s at %v: %w",
		op, height, units.Format(width), units.Format(pitch), p, r, at, units.Format(r*pitch+width-room),
		sp.kind, units.Format(sp.size), device.Ptr(sp.base), device.ErrOutOfBounds)
}

// prologue2D validates a 2-D copy's stream and device rows and says
// whether host (the rows' host range) is pinned. Requires enter.
func (d *Device) prologue2D(op string, s device.Stream, p device.Ptr, pitch, width, height, ext uint64, host []byte) (*stream, bool, error) {
	st, err := d.streamOf(op, s)
	if err != nil {
		return nil, false, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.checkRowsLocked(op, p, pitch, width, height, ext); err != nil {
		return nil, false, err
	}
	return st, len(host) > 0 && d.pinnedLocked(host), nil
}

// CopyHtoD2D copies height rows of width bytes from src (row r at
// src[r*srcPitch:]) to dst + r*dstPitch, ordered on s
// (cuMemcpy2DAsync_v2). When the rows lie in a pinned buffer of this
// Device it returns once the copy is enqueued (keep src unchanged until
// the stream is synchronized past it); otherwise the copy has finished
// when it returns.
func (d *Device) CopyHtoD2D(dst device.Ptr, dstPitch uint64, src []byte, srcPitch, width, height uint64, s device.Stream) error {
	const op = "CopyHtoD2D"
	if err := d.enter(); err != nil {
		return err
	}
	defer d.exit()
	hostExt, devExt, err := shape2D(op, len(src), srcPitch, dstPitch, width, height)
	if err != nil {
		return err
	}
	src = src[:hostExt:hostExt]
	st, pinned, err := d.prologue2D(op, s, dst, dstPitch, width, height, devExt, src)
	if err != nil || hostExt == 0 {
		return err
	}
	var r Result
	if srcPitch <= d.maxPitch && dstPitch <= d.maxPitch {
		var pin runtime.Pinner
		pin.Pin(unsafe.SliceData(src))
		defer pin.Unpin()
		c := &memcpy2D{
			srcMemoryType: cuMemoryTypeHost, srcHost: uintptr(unsafe.Pointer(unsafe.SliceData(src))), srcPitch: srcPitch,
			dstMemoryType: cuMemoryTypeDevice, dstDevice: uint64(dst), dstPitch: dstPitch,
			widthInBytes: width, height: height,
		}
		r = d.lib.memcpy2DAsync(c, st.h)
		runtime.KeepAlive(c)
	} else {
		for row := uint64(0); row < height && r == Success; row++ {
			r = d.lib.memcpyHtoDAsync(uint64(dst)+row*dstPitch, src[row*srcPitch:row*srcPitch+width], st.h)
		}
	}
	if r == Success && !pinned {
		r = d.lib.streamSynchronize(st.h)
	}
	runtime.KeepAlive(src)
	if r != Success {
		return fmt.Errorf("cuda: %s of %d rows of %s to %v (pitch %s, host pitch %s): %w: %w",
			op, height, units.Format(width), dst, units.Format(dstPitch), units.Format(srcPitch), device.ErrCopyFailed, r)
	}
	return nil
}

// CopyDtoH2D copies height rows of width bytes from src + r*srcPitch to
// dst[r*dstPitch:], ordered on s (cuMemcpy2DAsync_v2). Bytes of dst between
// rows are left as they were. When the rows lie in a pinned buffer of this
// Device it returns once the copy is enqueued (read dst after synchronizing
// the stream); otherwise the copy has finished when it returns.
func (d *Device) CopyDtoH2D(dst []byte, dstPitch uint64, src device.Ptr, srcPitch, width, height uint64, s device.Stream) error {
	const op = "CopyDtoH2D"
	if err := d.enter(); err != nil {
		return err
	}
	defer d.exit()
	hostExt, devExt, err := shape2D(op, len(dst), dstPitch, srcPitch, width, height)
	if err != nil {
		return err
	}
	dst = dst[:hostExt:hostExt]
	st, pinned, err := d.prologue2D(op, s, src, srcPitch, width, height, devExt, dst)
	if err != nil || hostExt == 0 {
		return err
	}
	var r Result
	if srcPitch <= d.maxPitch && dstPitch <= d.maxPitch {
		var pin runtime.Pinner
		pin.Pin(unsafe.SliceData(dst))
		defer pin.Unpin()
		c := &memcpy2D{
			srcMemoryType: cuMemoryTypeDevice, srcDevice: uint64(src), srcPitch: srcPitch,
			dstMemoryType: cuMemoryTypeHost, dstHost: uintptr(unsafe.Pointer(unsafe.SliceData(dst))), dstPitch: dstPitch,
			widthInBytes: width, height: height,
		}
		r = d.lib.memcpy2DAsync(c, st.h)
		runtime.KeepAlive(c)
	} else {
		for row := uint64(0); row < height && r == Success; row++ {
			r = d.lib.memcpyDtoHAsync(dst[row*dstPitch:row*dstPitch+width], uint64(src)+row*srcPitch, st.h)
		}
	}
	if r == Success && !pinned {
		r = d.lib.streamSynchronize(st.h)
	}
	runtime.KeepAlive(dst)
	if r != Success {
		return fmt.Errorf("cuda: %s of %d rows of %s from %v (pitch %s, host pitch %s): %w: %w",
			op, height, units.Format(width), src, units.Format(srcPitch), units.Format(dstPitch), device.ErrCopyFailed, r)
	}
	return nil
}
