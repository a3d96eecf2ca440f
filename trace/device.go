package trace

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/bits"

	"github.com/vramkit/vram/alloc"
	"github.com/vramkit/vram/device"
	"github.com/vramkit/vram/device/sim"
	"github.com/vramkit/vram/internal/units"
)

// SimConfig is an address-only simulated device big enough to replay
// events with any reasonable allocator: room for twice the log's peak live
// bytes, plus one device granule (2 MiB) for each block live at the peak
// (what an allocator that rounds every block up to the granule, like
// Direct, needs), plus 1 GiB, rounded up to a GiB. Address-only, so its
// size costs the host nothing; its context takes no memory, so the device
// free memory is all the allocator's. The sum saturates: for a log whose
// peak needs more than 2^64 bytes TotalBytes is math.MaxUint64, which
// sim.New refuses as larger than sim.MaxTotalBytes, as it refuses any
// device too large to simulate.
func SimConfig(events []Event) sim.Config {
	s := Summarize(events)
	total := u128{}.add(s.PeakLive).add(s.PeakLive).add(units.GiB)
	hi, lo := bits.Mul64(uint64(s.PeakBlocks), sim.DefaultGranularity)
	total = total.add(lo)
	total.hi += hi
	t, ok := units.RoundUp(total.sat(), units.GiB)
	if !ok {
		t = math.MaxUint64
	}
	return sim.Config{TotalBytes: t, AddressOnly: true, NoContext: true}
}

// Factory makes the allocator for a replay on dev.
type Factory func(dev device.Device) (alloc.Allocator, error)

// ErrLeak is wrapped by ReplayOn's error when closing the allocator left
// device memory allocated.
var ErrLeak = errors.New("allocator leaked device memory")

// ReplayOn replays events on a fresh simulated device made from
// SimConfig(events), with the allocator newAlloc makes on it. It closes
// the allocator and the device after the replay, and reports an error
// wrapping ErrLeak if the allocator's Close did not give every byte back.
func ReplayOn(events []Event, newAlloc Factory, opts Options) (Result, error) {
	return ReplayOnConfig(events, SimConfig(events), newAlloc, opts)
}

// ReplayOnConfig is ReplayOn on a simulated device made from cfg (for
// another size or granularity).
func ReplayOnConfig(events []Event, cfg sim.Config, newAlloc Factory, opts Options) (res Result, err error) {
	return ReplayOnConfigContext(context.Background(), events, cfg, newAlloc, opts)
}

// ReplayOnConfigContext is ReplayOnConfig that stops soon after ctx is
// done (see ReplayContext).
func ReplayOnConfigContext(ctx context.Context, events []Event, cfg sim.Config, newAlloc Factory, opts Options) (res Result, err error) {
	dev, err := sim.New(cfg)
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
