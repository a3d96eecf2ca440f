package sim

// Two-dimensional (pitched) copies: device.StridedCopier, as
// cuMemcpy2DAsync does them.
//
// A 2-D copy moves height rows of width bytes; row r is read at
// src + r·srcPitch and written at dst + r·dstPitch. It is one stream
// operation, checked and counted like any other copy:
//
//   - A pitch below the width, on either side, is device.ErrInvalidValue,
//     and so is a host slice shorter than the rows need
//     ((height−1)·pitch + width bytes).
//   - The memory checker resolves the first row like a 1-D access (use
//     after free, a pointer from before a Reset or from another device
//     give their usual errors), then requires the last row to end inside
//     the same allocation: rows are evenly spaced, so then every row lies
//     in that one live allocation. Otherwise the error (ErrOutOfBounds)
//     names the first row that runs past the end.
//   - Fault injection counts the whole copy as one copy (FailCopyAt,
//     ResetAt(OpCopy, n)), and Config.CopyBandwidth charges width·height
//     bytes, the bytes actually moved.
//   - A zero width or height copies nothing and enqueues nothing, like a
//     1-D copy of zero bytes: the device pointer is still checked unless
//     it is nil.

import (
	"fmt"
	"math/bits"

	"github.com/vramkit/vram/device"
	"github.com/vramkit/vram/internal/safecopy"
	"github.com/vramkit/vram/internal/units"
)

// extent2D is the bytes from the first row's start to the last row's end:
// (height−1)·pitch + width. ok is false on overflow. height must be > 0.
func extent2D(pitch, width, height uint64) (ext uint64, ok bool) {
	hi, lo := bits.Mul64(height-1, pitch)
	ext = lo + width
	return ext, hi == 0 && ext >= lo
}

// shape2D describes a 2-D copy's rows for messages.
func shape2D(width, height uint64) string {
	return fmt.Sprintf("%d rows of %s", height, units.Format(width))
}

// CopyHtoD2D copies height rows of width bytes from src (row r at
// src[r*srcPitch:]) to dst + r*dstPitch, ordered on s. src is read when the
// stream reaches the copy: keep it unchanged until the stream is
// synchronized past it.
func (d *Device) CopyHtoD2D(dst device.Ptr, dstPitch uint64, src []byte, srcPitch, width, height uint64, s device.Stream) error {
	return d.copy2D("2-D copy host to device", true, dst, dstPitch, src, srcPitch, width, height, s)
}

// CopyDtoH2D copies height rows of width bytes from src + r*srcPitch to
// dst[r*dstPitch:], ordered on s. dst is written when the stream reaches the
// copy: read it after synchronizing. Bytes of dst between rows are left as
// they were.
func (d *Device) CopyDtoH2D(dst []byte, dstPitch uint64, src device.Ptr, srcPitch, width, height uint64, s device.Stream) error {
	return d.copy2D("2-D copy device to host", false, src, srcPitch, dst, dstPitch, width, height, s)
}

// copy2D checks and enqueues a 2-D copy between the device region at dev
// and the host slice host; toDevice gives the direction.
func (d *Device) copy2D(op string, toDevice bool, dev device.Ptr, devPitch uint64, host []byte, hostPitch, width, height uint64, s device.Stream) error {
	st, err := d.streamOf(s, op)
	if err != nil {
		return err
	}
	if err := d.needBacked(op); err != nil {
		return err
	}
	devSide, hostSide := "destination", "source"
	if !toDevice {
		devSide, hostSide = hostSide, devSide
	}
	if devPitch < width || hostPitch < width {
		side, pitch := "device "+devSide, devPitch
		if devPitch >= width {
			side, pitch = "host "+hostSide, hostPitch
		}
		return fmt.Errorf("%v: %s of %s: the %s pitch %s is less than the row width; "+
			"rows would overlap (want pitch >= width): %w",
			d, op, shape2D(width, height), side, units.Format(pitch), device.ErrInvalidValue)
	}
	if width == 0 || height == 0 {
		return d.checkEmpty(op, dev)
	}
	hostExt, ok := extent2D(hostPitch, width, height)
	if !ok || hostExt > uint64(len(host)) {
		need := "more than 2^64 bytes"
		if ok {
			need = units.Format(hostExt)
		}
		return fmt.Errorf("%v: %s of %s at host pitch %s: the host %s slice holds %s but the rows need %s "+
			"((height-1)*pitch + width): %w",
			d, op, shape2D(width, height), units.Format(hostPitch), hostSide, units.Format(uint64(len(host))), need, device.ErrInvalidValue)
	}
	devExt, ok := extent2D(devPitch, width, height)
	if !ok {
		return fmt.Errorf("%v: %s of %s at device pitch %s from %v: the region overflows the address space: %w",
			d, op, shape2D(width, height), units.Format(devPitch), dev, device.ErrOutOfBounds)
	}
	if err := d.faults.check(OpCopy, op, 0); err != nil {
		return err
	}
	mem, err := d.checkAccess2D(op, dev, devPitch, width, height, devExt)
	if err != nil {
		return err
	}
	host = host[:hostExt:hostExt]
	n := width * height // cannot overflow: it is at most devExt
	fail := d.faults.copyFault()
	return st.enqueue(op, func() error {
		if fail {
			return d.copyFailed(op, n, st)
		}
		dstBuf, dstPitch, srcBuf, srcPitch := mem, devPitch, host, hostPitch
		if !toDevice {
			dstBuf, dstPitch, srcBuf, srcPitch = host, hostPitch, mem, devPitch
		}
		var err error
		d.transfer(n, func() {
			err = safecopy.Do(func() {
				for r := range height {
					copy(dstBuf[r*dstPitch:r*dstPitch+width], srcBuf[r*srcPitch:r*srcPitch+width])
				}
			})
		})
		return d.hostFaulted(op, n, st, err)
	})
}

// checkAccess2D resolves height rows of width bytes, pitch apart, from p
// (ext bytes from the first row's start to the last row's end) and returns
// those ext bytes of the allocation.
func (d *Device) checkAccess2D(op string, p device.Ptr, pitch, width, height, ext uint64) ([]byte, error) {
	d.mu.RLock()
	defer d.mu.RUnlock()
	if d.closed.Load() {
		return nil, d.errClosed(op)
	}
	data, base, err := d.resolveLocked(op+" (row 0)", p, width, 0)
	if err != nil || data == nil {
		return nil, err
	}
	off, size := uint64(p)-base, uint64(len(data))
	if ext > size-off { // size-off >= width: row 0 fits
		r := (size-off-width)/pitch + 1 // the first row that does not
		outside := fmt.Sprintf("rows %d to %d lie", r, height-1)
		if r == height-1 {
			outside = fmt.Sprintf("row %d lies", r)
		}
		return nil, fmt.Errorf("%v: %s of %s at pitch %s from %v: row %d (at %v) ends %s past the end of "+
			"the %s allocation at 0x%x, so %s outside it: %w",
			d, op, shape2D(width, height), units.Format(pitch), p, r, p.Add(r*pitch), units.Format(off+r*pitch+width-size),
			units.Format(size), base, outside, device.ErrOutOfBounds)
	}
	return data[off : off+ext : off+ext], nil
}
