package vram

import (
	"context"
	"errors"
	"strings"
	"testing"
)

// TestStagingNoRoomCounts: a staging request that cannot fit says how
// many buffers, in the singular for one ("1 pinned buffers" once).
func TestStagingNoRoomCounts(t *testing.T) {
	m := newHostManager(t, HostOptions{Limit: 4096}, 1<<40)
	tests := map[string]struct {
		sizes []uint64
		want  string
	}{
		"one":   {[]uint64{1 << 20}, "a pinned buffer of 1 MiB does not fit"},
		"three": {[]uint64{1 << 20, 1 << 20, 1 << 20}, "3 pinned buffers of 3 MiB in all do not fit"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			_, err := m.Host().Staging().AcquireSet(context.Background(), tc.sizes)
			if !errors.Is(err, ErrOutOfMemory) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("%v; want it to say %q", err, tc.want)
			}
		})
	}
}
