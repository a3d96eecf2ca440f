package trace

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/bits"

	"github.com/vramkit/vram/alloc"
	"github.com/vramkit/vram/device"
	"github.com/vramkit/vram/internal/units"
)

// DeviceBytes is the device memory that replaying events with any
// reasonable allocator needs, on a device whose allocations are rounded
// to granularity: room for twice the log's peak live bytes, plus one
// granule for each block live at the peak (what an allocator that rounds
// every block up to the granule, like Direct, needs), plus 1 GiB, rounded
// up to a GiB. The sum saturates: for a log whose peak needs more than
// 2^64 bytes it is math.MaxUint64, which a device refuses as too large
// (the simulator above sim.MaxTotalBytes) as it refuses any device too
// large to make. An address-only simulator of this size (device/sim:
// Config.AddressOnly and NoContext) costs the host nothing and leaves all
// its memory to the allocator, so a log that peaked at 55 GB replays on a
// laptop.
func DeviceBytes(events []Event, granularity uint64) uint64 {
	s := Summarize(events)
	total := u128{}.add(s.PeakLive).add(s.PeakLive).add(units.GiB)
	hi, lo := bits.Mul64(uint64(s.PeakBlocks), granularity)
	total = total.add(lo)
	total.hi += hi
	t, ok := units.RoundUp(total.sat(), units.GiB)
	if !ok {
		t = math.MaxUint64
	}
	return t
}

// DeviceFactory makes the device for one replay: a fresh one, which the
// replay closes (see DeviceBytes for its size).
type DeviceFactory func() (device.Device, error)

// Factory makes the allocator for a replay on dev.
type Factory func(dev device.Device) (alloc.Allocator, error)

// ErrLeak is wrapped by ReplayOn's error when closing the allocator left
// device memory allocated.
var ErrLeak = errors.New("allocator leaked device memory")

// ReplayOn replays events on a fresh device newDev makes, with the
// allocator newAlloc makes on it. It closes the allocator and the device
// after the replay, and reports an error wrapping ErrLeak if the
// allocator's Close did not give every byte back.
func ReplayOn(events []Event, newDev DeviceFactory, newAlloc Factory, opts Options) (Result, error) {
	return ReplayOnContext(context.Background(), events, newDev, newAlloc, opts)
}

// ReplayOnContext is ReplayOn that stops soon after ctx is done (see
// ReplayContext).
func ReplayOnContext(ctx context.Context, events []Event, newDev DeviceFactory, newAlloc Factory, opts Options) (res Result, err error) {
	dev, err := newDev()
	if err != nil {
		return Result{}, fmt.Errorf("trace: replay device: %w", err)
	}
	defer func() {
		if cerr := dev.Close(); cerr != nil && err == nil {
			err = fmt.Errorf("trace: close replay device: %w", cerr)
		}
	}()
	startFree, _, err := dev.MemInfo()
	if err != nil {
		return Result{}, fmt.Errorf("trace: replay device: %w", err)
	}
	a, err := newAlloc(dev)
	if err != nil {
		return Result{}, fmt.Errorf("trace: make the allocator: %w", err)
	}
	opts.Device = dev
	res, err = ReplayContext(ctx, events, a, opts)
	if cerr := a.Close(); cerr != nil {
		return res, errors.Join(err, fmt.Errorf("trace: close the allocator: %w", cerr))
	}
	if err != nil {
		return res, err
	}
	free, _, err := dev.MemInfo()
	if err != nil {
		return res, fmt.Errorf("trace: replay device: %w", err)
	}
	if free != startFree {
		return res, fmt.Errorf("trace: after Close the allocator still holds %s of the replay device: %w",
			units.Format(startFree-free), ErrLeak)
	}
	return res, nil
}
