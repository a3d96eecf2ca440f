package vram

// An Allocate with nothing queued (cubie's allocate_queue with an empty
// queue): every member of the group is sent the group's last plan again,
// with no arrays, which is how members that keep their arrays across
// runs learn the chunking again. A group that has never been planned
// (or was emptied of members since) has no plan to send: that is
// ErrNothingQueued.

import "fmt"

// rebroadcast answers an Allocate of group with nothing queued: ok
// false when the group has requests queued (allocate them), else every
// member's response with the group's last plan and no arrays, their
// OnAllocated calls queued, or ErrNothingQueued when there is no plan.
// The group lock must be held (so no allocation of the group runs
// meanwhile).
func (m *Manager) rebroadcast(trigger *Client, group string) (res groupOutcome, ok bool, err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.checkLocked(trigger); err != nil {
		return groupOutcome{}, true, err
	}
	if len(m.queues[group]) > 0 {
		return groupOutcome{}, false, nil
	}
	plan, planned := m.plans[group]
	if !planned {
		return groupOutcome{}, true, fmt.Errorf("vram: allocate for %v: group %q has no requests queued and no plan yet to send again (queue requests with Client.Queue first; cubie's allocate_queue does nothing here): %w",
			trigger, group, ErrNothingQueued)
	}
	members := m.reg.members(group)
	res.out = make([]delivery, 0, len(members))
	res.calls = make([]*hookCall, len(members))
	for i, c := range members {
		resp := newResponse(c, plan, 1)
		resp.ChunkedShapes = map[string][]int{}
		res.out = append(res.out, delivery{c: c, resp: resp})
		if c == trigger {
			res.mine = resp
		}
		if c.onAllocated != nil {
			on := c.onAllocated
			res.calls[i] = c.postLocked(func() { on(resp) }, false)
		}
	}
	return res, true, nil
}
