package broker

// The lease table: each device's leases, their shares by the manager's
// own rules (internal/share), what each is granted and holds, the claims
// waiting for memory and the reclaims in flight.
//
// Figures of a lease l on device d, all in bytes:
//
//	guaranteed(l) = min(d.pools.Bytes(l.units, d.total), l.cap)
//	usage(l)      = l.held + l.ctx   (the context counted once a process and device)
//	occupied(l)   = max(l.limit, usage(l))
//	free(d)       = d.total − Σ occupied
//	borrowed(l)   = occupied(l) − guaranteed(l), when positive
//
// Invariants (checked by checkLocked in tests, after every change):
//   - Σ guaranteed ≤ d.total (the share rules, exact arithmetic).
//   - Σ limits ≤ d.total, and a grant never takes Σ occupied over
//     d.total: a limit rises only by what is free (room). Σ occupied
//     passes d.total only through what holders say they hold (a rejoin
//     after a restart, a context): facts, counted, never granted.
//   - A claim waits only for memory within its guaranteed part, and the
//     borrowers' parts beyond theirs always cover it: reclaiming every
//     borrowed byte leaves each lease its guaranteed part.
//   - A lease is in exactly one device's map, one session's set and, at
//     most, one claim.
//
// Everything here is protected by Server.mu; nothing holding it sends on
// a stream or blocks.

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/vramkit/vram/internal/share"
	"github.com/vramkit/vram/internal/units"
)

// device is one device's table. Protected by Server.mu.
type device struct {
	index   int
	name    string
	id      string // device.Info.ID
	total   uint64 // bytes divided between the leases
	context uint64 // bytes a process's context takes, charged once per process
	pools   share.Pools
	leases  map[uint64]*lease // by id
	claims  []*claim          // waiting, first come first served
	procs   map[uint32]int    // pid → leases it holds here
}

// lease is one lease. Protected by Server.mu.
type lease struct {
	id    uint64
	dev   *device
	sess  *session
	name  string
	asked float64 // the proportion asked for (0: auto)
	units uint64  // in share.Unit; 0: the auto pool
	cap   uint64  // 0: none
	limit uint64  // granted, context included
	held  uint64  // reported by the holder, context excluded
	ctx   uint64  // the process's context, when charged to this lease

	inPools bool // units are counted in dev.pools; false: no share (a rejoin that no longer fit)

	reclaim *reclaim // a request to shrink in flight, or nil
	claim   *claim   // a claim waiting, or nil
	missed  uint64   // reclaim deadlines missed
	sent    leaseView
}

// reclaim is a request to a borrower to shrink to target by deadline.
type reclaim struct {
	id       uint64
	target   uint64
	deadline time.Time
	overdue  bool
	timer    *time.Timer
}

// claim is a Claim waiting for memory.
type claim struct {
	l        *lease
	want     uint64 // the limit asked for
	since    time.Time
	deadline time.Time
	done     chan struct{} // closed when granted or failed
	err      error         // set before done is closed; nil: granted
	timer    *time.Timer
}

// leaseView is what a holder is told of its lease; a change of it is
// sent on the holder's Watch stream.
type leaseView struct {
	guaranteed, limit, held, ctx uint64
	share                        float64
	reclaimID, target            uint64
	deadline                     int64
	overdue                      bool
}

func (d *device) guaranteed(l *lease) uint64 {
	if !l.inPools {
		return 0 // taken back after a restart without a share
	}
	g := d.pools.Bytes(l.units, d.total)
	if l.cap > 0 {
		g = min(g, l.cap)
	}
	return g
}

func (l *lease) usage() uint64    { return units.SatAdd(l.held, l.ctx) }
func (l *lease) occupied() uint64 { return max(l.limit, l.usage()) }

// borrowed is what l occupies beyond its guaranteed part.
func (d *device) borrowed(l *lease) uint64 {
	return l.occupied() - min(l.occupied(), d.guaranteed(l))
}

// occupiedLocked is Σ occupied over the device's leases.
func (d *device) occupiedLocked() uint64 {
	var sum uint64
	for _, l := range d.leases {
		sum = units.SatAdd(sum, l.occupied())
	}
	return sum
}

func (d *device) free() uint64 { return d.total - min(d.total, d.occupiedLocked()) }

// limitsLocked is Σ limits over the device's leases.
func (d *device) limitsLocked() uint64 {
	var sum uint64
	for _, l := range d.leases {
		sum = units.SatAdd(sum, l.limit)
	}
	return sum
}

// room is the most l's limit may be: what keeps Σ occupied and Σ limits
// within the device (the second binds only when holders report more than
// their limits, as after a restart).
func (d *device) room(l *lease) uint64 {
	others := d.limitsLocked() - l.limit
	return min(d.free()+l.occupied(), d.total-min(d.total, others))
}

// maxLimit is the most l's limit may be: its cap, else the device.
func (d *device) maxLimit(l *lease) uint64 {
	if l.cap > 0 {
		return min(l.cap, d.total)
	}
	return d.total
}

// view is l as its holder sees it now.
func (d *device) view(l *lease) leaseView {
	v := leaseView{guaranteed: d.guaranteed(l), limit: l.limit, held: l.held, ctx: l.ctx}
	if l.inPools {
		v.share = d.pools.Proportion(l.units)
	}
	if r := l.reclaim; r != nil {
		v.reclaimID, v.target, v.deadline, v.overdue = r.id, r.target, r.deadline.UnixNano(), r.overdue
	}
	return v
}

// add puts l in the device and charges its process's context to it if no
// other lease of the process here carries it.
func (d *device) add(l *lease) {
	l.dev = d
	d.leases[l.id] = l
	pid := l.sess.pid
	if d.procs[pid] == 0 {
		l.ctx = d.context
	}
	d.procs[pid]++
}

// remove takes l out (its share is the caller's to give back); a context it carried moves to another lease of its
// process, if one is left here.
func (d *device) remove(l *lease) {
	delete(d.leases, l.id)
	pid := l.sess.pid
	d.procs[pid]--
	if d.procs[pid] == 0 {
		delete(d.procs, pid)
	}
	if l.ctx > 0 && d.procs[pid] > 0 {
		for _, o := range d.sortedLeases() {
			if o.sess.pid == pid {
				o.ctx = l.ctx
				break
			}
		}
	}
	l.ctx = 0
}

// sortedLeases are the device's leases by id, so that every choice made
// over them is the same however the map iterates.
func (d *device) sortedLeases() []*lease {
	ls := make([]*lease, 0, len(d.leases))
	for _, l := range d.leases {
		ls = append(ls, l)
	}
	slices.SortFunc(ls, func(a, b *lease) int { return cmp.Compare(a.id, b.id) })
	return ls
}

// holders describes who occupies the device, largest first, for errors:
// "a (pid 12) holds 700 MiB under a limit of 400 MiB, asked to shrink by
// 12:00:01.5 (overdue)".
func (d *device) holders(except *lease) string {
	ls := d.sortedLeases()
	slices.SortStableFunc(ls, func(a, b *lease) int { return cmp.Compare(b.occupied(), a.occupied()) })
	var parts []string
	for _, l := range ls {
		if l == except || l.occupied() == 0 {
			continue
		}
		s := fmt.Sprintf("%s holds %s under a limit of %s (guaranteed %s)", l.label(), units.Format(l.usage()), units.Format(l.limit), units.Format(d.guaranteed(l)))
		if r := l.reclaim; r != nil {
			s += fmt.Sprintf(", asked to shrink to %s by %s", units.Format(r.target), r.deadline.Format("15:04:05.000"))
			if r.overdue {
				s += " (overdue)"
			}
		}
		parts = append(parts, s)
		if len(parts) == 8 {
			parts = append(parts, fmt.Sprintf("and %d more", len(ls)-9))
			break
		}
	}
	if len(parts) == 0 {
		return "no other lease holds memory"
	}
	return strings.Join(parts, "; ")
}

// label names a lease in messages: "train" (lease 1f2e…, pid 4242).
func (l *lease) label() string {
	name := l.name
	if name == "" {
		name = "lease"
	}
	return fmt.Sprintf("%q (lease %016x, pid %d)", name, l.id, l.sess.pid)
}
