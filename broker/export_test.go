package broker

import (
	"fmt"

	"github.com/vramkit/vram/internal/units"
)

// CheckInvariants makes s check its table after every change; Broken
// returns what it found.
func (s *Server) CheckInvariants() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.check = checkLocked
}

// Broken lists the invariants found broken since CheckInvariants.
func (s *Server) Broken() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.broken...)
}

// checkLocked checks the invariants of table.go on every device.
func checkLocked(s *Server) string {
	n := 0
	for _, d := range s.devices {
		var g uint64
		manual, auto := uint64(0), 0
		for _, l := range d.leases {
			g += d.guaranteed(l)
			switch {
			case !l.inPools: // taken back after a restart without a share
			case l.units > 0:
				manual += l.units
			default:
				auto++
			}
			if s.leases[l.id] != l || l.sess.leases[l.id] != l {
				return fmt.Sprintf("lease %s is in device %d but not in the broker's or its session's maps", l.label(), d.index)
			}
			if l.reclaim != nil && l.usage() <= max(l.limit, l.ctx) {
				return fmt.Sprintf("lease %s has a reclaim in flight but occupies %s under its limit %s", l.label(), units.Format(l.usage()), units.Format(l.limit))
			}
		}
		n += len(d.leases)
		if g > d.total {
			return fmt.Sprintf("device %d: guaranteed parts total %s, over the device's %s", d.index, units.Format(g), units.Format(d.total))
		}
		if manual != d.pools.Manual() || auto != d.pools.Auto() {
			return fmt.Sprintf("device %d: pools say manual %d, auto %d; the leases %d, %d", d.index, d.pools.Manual(), d.pools.Auto(), manual, auto)
		}
		var limits uint64
		for _, l := range d.leases {
			limits += l.limit
		}
		if limits > d.total {
			return fmt.Sprintf("device %d: limits total %s, over the device's %s", d.index, units.Format(limits), units.Format(d.total))
		}
	}
	if n != len(s.leases) {
		return fmt.Sprintf("%d leases in the devices, %d in the broker's map", n, len(s.leases))
	}
	return ""
}
