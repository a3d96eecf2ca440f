package vram

// Each member's own cap, in the Active limit mode.
//
// A group's budget in Active mode is the sum of its members' caps less
// what they hold (budget.go); on top of it each requester's arrays must
// fit its own cap less what it holds beyond the arrays being replaced,
// in the bytes the allocator charges. Each requester is planned alone
// within its own room, with the group's buffers in flight once the group
// is chunked; the shortest chunk any of them needs bounds the group's
// chunk length (PlanOptions.MaxChunkLength), so the group takes the
// largest chunk count of theirs. (cubie bounds the group's sum only.)

import (
	"fmt"
	"maps"
	"slices"

	"github.com/vramkit/vram/internal/units"
)

// ownRoomLocked reads into b each requester's own room: its cap less what
// it holds beyond the arrays being replaced (Active mode only). m.mu must
// be held.
func (m *Manager) ownRoomLocked(b *groupBudget) {
	b.own = nil
	if b.mode != Active {
		return
	}
	b.own = make(map[string]ownRoom, len(b.requesters))
	for _, c := range b.requesters {
		if c.closed {
			continue
		}
		held := c.held - min(c.held, c.replacedLocked(b.queue[c]))
		cp := m.capLocked(c)
		b.own[c.String()] = ownRoom{cap: cp, held: held, room: cp - min(cp, held)}
	}
}

// ownRoom is one requester's cap, what it holds beyond the arrays being
// replaced, and what that leaves (allocator bytes).
type ownRoom struct{ cap, held, room uint64 }

// replacedLocked is what c's arrays under the labels of reqs take, as
// charged: the arrays an allocation of reqs replaces. m.mu must be held.
func (c *Client) replacedLocked(reqs map[string]ArrayRequest) uint64 {
	var n uint64
	for l := range reqs {
		for _, a := range c.arrays[l] {
			n += a.charged
		}
	}
	return n
}

// withinOwnCaps returns p, the group's plan, or the plan made again with
// a chunk length short enough for every requester's arrays to fit its
// own room (b.own); an error when one's arrays cannot, however chunked.
func withinOwnCaps(reqs map[string]map[string]ArrayRequest, b *groupBudget, opts PlanOptions, p ChunkPlan) (ChunkPlan, error) {
	if b.own == nil {
		return p, nil
	}
	names := slices.Sorted(maps.Keys(reqs))
	for range 3 { // the bound only falls; twice settles it (once the group is chunked, with its buffers)
		bound := 0
		for _, name := range names {
			o := PlanOptions{Granularity: opts.Granularity, Buffers: opts.Buffers}
			if p.Chunks > 1 {
				o.MaxChunkLength = p.ChunkLength // chunked as the group is, with its buffers
			}
			r, ok := b.own[name]
			if !ok {
				continue // closed meanwhile: its arrays are freed at install
			}
			q, err := Plan(map[string]map[string]ArrayRequest{name: reqs[name]}, r.room, o)
			if err != nil {
				return p, fmt.Errorf("%s's arrays do not fit its own cap in the Active limit mode (%s, %s of it held besides the arrays being replaced; raise its proportion, free what it holds, or use the Passive mode): %w",
					name, units.Format(r.cap), units.Format(r.held), err)
			}
			if q.Chunks > 1 && q.ChunkLength < p.ChunkLength && (bound == 0 || q.ChunkLength < bound) {
				bound = q.ChunkLength
			}
		}
		if bound == 0 {
			return p, nil
		}
		opts.MaxChunkLength = bound
		next, err := Plan(reqs, b.budget, opts)
		if err != nil {
			return p, err
		}
		p = next
	}
	return p, nil
}
