package vram

// Host memory: pinned buffers come from a pinned pool (alloc.PinnedPool,
// CuPy's PinnedMemoryPool), which caches them because pinning is slow;
// mapped ones straight from the device (cuMemHostAlloc with a device
// address); pageable ones are Go memory.
//
// A pinned buffer goes back to the pool on the stream it was last used
// on, so the pool hands it out again only once that stream's copies from
// or into it have finished. Each copy records its stream in the array.

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"

	"github.com/vramkit/vram/alloc"
	"github.com/vramkit/vram/device"
	"github.com/vramkit/vram/internal/meminfo"
)

// hostPool hands out host memory for host arrays. Safe for concurrent
// use (the pinned pool and the device's host allocator are).
type hostPool struct {
	dev     device.Device
	ha      device.HostAllocator // nil when the device has none
	pinned  *alloc.PinnedPool    // nil when the device has no host allocator
	staging *StagingPool
	lim     hostLimits
	log     *slog.Logger
	// avail is the RAM available and whether it is known (meminfo.HostAvailable;
	// tests replace it).
	avail func() (uint64, bool)
	// waitClosed waits for the close of a stream group's stream in
	// progress (streams.Groups.WaitClosed).
	waitClosed func(device.Stream)

	placeMu sync.Mutex            // serializes the ladder's choices (HostMemory.Alloc)
	mu      sync.Mutex            // protects the fields below
	n       hostCounts            // bytes held on each rung
	live    map[*HostArray]uint64 // pinned, mapped and file-backed arrays not yet freed, in order made (track)
	seq     uint64                // the order of the latest array tracked
}

func newHostPool(dev device.Device, waitClosed func(device.Stream), o HostOptions, log *slog.Logger) *hostPool {
	h := &hostPool{dev: dev, waitClosed: waitClosed, lim: resolveHostOptions(o), log: log, avail: meminfo.HostAvailable}
	h.ha, _ = dev.(device.HostAllocator)
	if h.ha != nil {
		h.pinned, _ = alloc.NewPinnedPool(dev)
	}
	h.staging = newStagingPool(h)
	return h
}

// alloc returns n bytes of host memory of kind mem (Pinned, Mapped or
// Pageable) for use on stream s, the mapped device address, and the
// function that frees it given the stream it was last used on (nil if
// none or unknown).
func (h *hostPool) alloc(n uint64, mem MemoryType, s device.Stream) ([]byte, device.Ptr, func(device.Stream) error, error) {
	b, dp, release, err := h.allocRaw(n, mem, s)
	if err != nil {
		return nil, 0, nil, err
	}
	uncount := h.count(n, mem, false)
	if release == nil {
		return b, dp, func(device.Stream) error { uncount(); return nil }, nil
	}
	return b, dp, func(last device.Stream) error { uncount(); return release(last) }, nil
}

// allocRaw is alloc without the counting.
func (h *hostPool) allocRaw(n uint64, mem MemoryType, s device.Stream) ([]byte, device.Ptr, func(device.Stream) error, error) {
	switch mem {
	case Pageable:
		b, err := pageable(n)
		return b, 0, nil, err
	case Pinned, Mapped:
		if h.ha == nil {
			return nil, 0, nil, fmt.Errorf("%s host memory: the %s device cannot allocate pinned memory; ask for pageable memory: %w",
				mem, h.dev.Info().Backend, ErrNotSupported)
		}
		if mem == Pinned && h.pinned != nil {
			b, err := h.pinned.Alloc(n, s)
			if err != nil {
				return nil, 0, nil, err
			}
			return b.Data, 0, func(last device.Stream) error { return h.pinned.Free(b, h.usable(last)) }, nil
		}
		b, err := h.ha.HostAlloc(n, mem == Mapped)
		if err != nil {
			return nil, 0, nil, err
		}
		// HostFree waits for work that may use the buffer.
		return b.Data[:n:n], b.DevicePtr, func(device.Stream) error { return h.ha.HostFree(b) }, nil
	}
	return nil, 0, nil, fmt.Errorf("memory %v is not host memory: %w", mem, ErrInvalidRequest)
}

// usable returns s, or the device's default stream when s is nil or has
// been closed (its work is then finished: Close waits for it, and so
// does this for a group's stream whose close is in progress).
func (h *hostPool) usable(s device.Stream) device.Stream {
	if s != nil {
		_, err := s.Query()
		if err == nil {
			return s
		}
		if errors.Is(err, device.ErrClosed) {
			h.waitClosed(s)
		}
	}
	return h.dev.DefaultStream()
}

func (h *hostPool) close() error {
	err := h.staging.close()
	if h.pinned == nil {
		return err
	}
	return errors.Join(err, h.pinned.Close())
}

// NewHostArray makes a host array of shape and dtype in mem (Pinned,
// Mapped or Pageable), zeroed, or filled from like: nil, a *HostArray of
// the same dtype, or a slice of the dtype's Go type ([]float64 for
// Float64, …). A slice with as many elements fills the array in
// row-major order; otherwise like is broadcast as NumPy broadcasts
// arr[:] = like (as cubie's create_host_array): a slice is a 1-D array
// of its length, and like's dimensions, matched from the last, must each
// equal the array's or be 1 (so one element fills every element, and a
// slice as long as the last dimension fills every row). Types are never
// converted. Pinned and mapped arrays must be freed (HostArray.Free)
// before the manager is closed: Close frees those still live and returns
// an error naming them (ErrLiveHostArrays).
func (m *Manager) NewHostArray(shape []int, dtype DType, mem MemoryType, like any) (*HostArray, error) {
	if mem == Managed {
		return nil, fmt.Errorf("new host array: managed (unified) memory is not supported; want pinned, mapped or pageable host memory: %w", ErrNotSupported)
	}
	r := ArrayRequest{Shape: shape, DType: dtype, Memory: mem, Unchunkable: true}
	if err := r.Validate(); err != nil {
		return nil, fmt.Errorf("new host array: %w", err)
	}
	if mem == Device {
		return nil, fmt.Errorf("new host array: memory %v is not host memory; want pinned, mapped or pageable: %w", mem, ErrInvalidRequest)
	}
	if m.isClosed() {
		return nil, closedErr("new host array")
	}
	h, err := m.newHost(slices.Clone(shape), dtype, mem, "", m.dev.DefaultStream())
	if err != nil {
		return nil, fmt.Errorf("new host array: %w", err)
	}
	if err := fill(h, like); err != nil {
		return nil, errors.Join(fmt.Errorf("new host array: %w", err), h.Free())
	}
	return h, nil
}

// newHost allocates a host array for use on s.
func (m *Manager) newHost(shape []int, dtype DType, mem MemoryType, label string, s device.Stream) (*HostArray, error) {
	n, _ := elements(shape)
	data, dp, release, err := m.host.alloc(n*dtype.Size(), mem, s)
	if err != nil {
		return nil, err
	}
	if mem != Pageable {
		clear(data) // a cached buffer holds its last user's bytes
	}
	h := &HostArray{data: data, shape: shape, dtype: dtype, memory: mem, devPtr: dp, label: label, release: release}
	h.setLast(s)
	if mem != Pageable {
		m.host.track(h) // Close frees what is still live, and says which (freeLive)
	}
	return h, nil
}

// Host arrays that outlive their manager. Pinned, mapped and file-backed
// host arrays (NewHostArray, Host().Alloc, Host().Open) hold memory or a
// mapping the manager's Close takes away; they are tracked while they
// live, and Close frees those still live and names them in its error.
// Pageable arrays are Go memory and are not tracked.

// track records h as live until it is freed.
func (hp *hostPool) track(h *HostArray) {
	hp.mu.Lock()
	if hp.live == nil {
		hp.live = map[*HostArray]uint64{}
	}
	hp.seq++
	hp.live[h] = hp.seq
	hp.mu.Unlock()
	release := h.release
	h.release = func(last device.Stream) error {
		hp.mu.Lock()
		delete(hp.live, h)
		hp.mu.Unlock()
		if release == nil {
			return nil
		}
		return release(last)
	}
}

// freeLive frees the tracked host arrays still live, and returns an error
// wrapping ErrLiveHostArrays that names them (nil when there were none).
func (hp *hostPool) freeLive() error {
	hp.mu.Lock()
	live := slices.SortedFunc(maps.Keys(hp.live), func(a, b *HostArray) int { return cmp.Compare(hp.live[a], hp.live[b]) })
	hp.mu.Unlock()
	if len(live) == 0 {
		return nil
	}
	const most = 8
	names := make([]string, 0, most+1)
	var errs []error
	for i, h := range live {
		if i < most {
			names = append(names, fmt.Sprintf("%v (%s)", h, h.Placement().Rung))
		}
		if err := h.Free(); err != nil {
			errs = append(errs, fmt.Errorf("free %v: %w", h, err))
		}
	}
	if len(live) > most {
		names = append(names, fmt.Sprintf("… %d more", len(live)-most))
	}
	err := fmt.Errorf("close: %d host array(s) were still live and are freed now; free host arrays (HostArray.Free) before closing the manager: %s: %w",
		len(live), strings.Join(names, "; "), ErrLiveHostArrays)
	return errors.Join(append([]error{err}, errs...)...)
}
