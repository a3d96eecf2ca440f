package vram

// Host arrays that outlive their manager. Pinned, mapped and file-backed
// host arrays (NewHostArray, Host().Alloc, Host().Open) hold memory or a
// mapping the manager's Close takes away; they are tracked while they
// live, and Close frees those still live and names them in its error.
// Pageable arrays are Go memory and are not tracked.

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/vramkit/vram/device"
)

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
	err := fmt.Errorf("vram: close: %d host array(s) were still live and are freed now; free host arrays (HostArray.Free) before closing the manager: %s: %w",
		len(live), strings.Join(names, "; "), ErrLiveHostArrays)
	return errors.Join(append([]error{err}, errs...)...)
}
