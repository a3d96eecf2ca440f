package vram

// Stream groups as the manager keeps them: one record per group (its
// members, its queue of array requests, the lock Allocate takes for it
// and its last plan), in the registry of open clients: the one table of
// who is in which group (cubie's StreamGroups).
//
// The registry is built so that Register and Close touch no map keyed by
// client: a slot array (with a stack of free slots) for iterating over
// every client, and a record per stream group whose intrusive list finds
// the group's members. A record lives while its group has members: the
// last member to leave takes it, queue, lock and plan with it, so group
// names do not pile up. The group's stream is package streams': each
// member holds it (Client.leave releases the hold), so it lives while the
// group has members, and a little after, while a call still uses it.

import (
	"errors"
	"fmt"
	"maps"
	"slices"

	"github.com/vramkit/vram/streams"
)

// registry is protected by Manager.mu.
type registry struct {
	slots  []*Client         // open clients; nil where one closed
	free   []int             // indexes of nil slots
	n      int               // open clients
	groups map[string]*group // group name → its record, while it has members
}

// group is one stream group's record. Protected by Manager.mu (lock is a
// channel, taken without it).
type group struct {
	name string
	head *Client // members, linked through Client.gprev/gnext
	n    int     // members
	// queue holds what members have queued: member → label → request.
	// A member that leaves takes its entry out.
	queue map[*Client]map[string]ArrayRequest
	// lock serializes Allocate for the group: a channel with room for
	// one, taken by sending, so that a wait for it can be abandoned
	// (lockCtx). (Allocate re-checks its trigger's group after locking,
	// and planMu serializes allocations, so a record made again later for
	// the name, with a new lock, is as good.)
	lock chan struct{}
	// plan is the group's last plan, sent again by an Allocate with
	// nothing queued (rebroadcast); planned says there is one.
	plan    ChunkPlan
	planned bool
	// claim is the device memory the group claims back from busy groups
	// (replan.go), kept back from every other group's budget until it
	// allocates or its last member leaves; 0: none.
	claim uint64
}

func newRegistry() registry { return registry{groups: map[string]*group{}} }

// add registers c in slot and in its group's list.
func (r *registry) add(c *Client) {
	if k := len(r.free); k > 0 {
		c.slot = r.free[k-1]
		r.free = r.free[:k-1]
		r.slots[c.slot] = c
	} else {
		c.slot = len(r.slots)
		r.slots = append(r.slots, c)
	}
	r.n++
	r.link(c)
}

// remove takes c out of its slot and its group's list; it returns the
// group's record when c was its last member (see unlink).
func (r *registry) remove(c *Client) (gone *group) {
	gone = r.unlink(c)
	r.slots[c.slot] = nil
	r.free = append(r.free, c.slot)
	c.slot = -1
	r.n--
	return gone
}

// link puts c in its group's record, made if it is the first member.
func (r *registry) link(c *Client) {
	l := r.groups[c.group]
	if l == nil {
		l = &group{name: c.group, queue: map[*Client]map[string]ArrayRequest{}, lock: make(chan struct{}, 1)}
		r.groups[c.group] = l
	}
	c.gprev, c.gnext = nil, l.head
	if l.head != nil {
		l.head.gprev = c
	}
	l.head = c
	l.n++
}

// unlink takes c, and what it has queued, out of its group's record, and
// the record out of the registry once it has no member: then it returns
// the record, else nil.
func (r *registry) unlink(c *Client) *group {
	l := r.groups[c.group]
	delete(l.queue, c)
	if c.gprev != nil {
		c.gprev.gnext = c.gnext
	} else {
		l.head = c.gnext
	}
	if c.gnext != nil {
		c.gnext.gprev = c.gprev
	}
	c.gprev, c.gnext = nil, nil
	l.n--
	if l.n > 0 {
		return nil
	}
	delete(r.groups, c.group) // group names do not pile up
	return l
}

// move puts c in group; it returns the record of the group c left when
// c was its last member (see unlink).
func (r *registry) move(c *Client, group string) (gone *group) {
	gone = r.unlink(c)
	c.group = group
	r.link(c)
	return gone
}

// leftLocked follows a member's leaving: the record its last member took
// with it withdraws its claim (replan.go). m.mu must be held.
func (m *Manager) leftLocked(gone *group) {
	if gone != nil {
		m.dropClaimLocked(gone, "withdrawn: the group has no member left")
	}
}

// members returns the open clients of group, by id.
func (r *registry) members(group string) []*Client {
	l := r.groups[group]
	if l == nil {
		return []*Client{}
	}
	out := make([]*Client, 0, l.n)
	for c := l.head; c != nil; c = c.gnext {
		out = append(out, c)
	}
	slices.SortFunc(out, byID)
	return out
}

// all returns every open client, by id.
func (r *registry) all() []*Client {
	out := make([]*Client, 0, r.n)
	for _, c := range r.slots {
		if c != nil {
			out = append(out, c)
		}
	}
	slices.SortFunc(out, byID)
	return out
}

// GroupMembers returns the open clients in the named group ("" is
// "default"), by id.
func (m *Manager) GroupMembers(group string) []*Client {
	if group == "" {
		group = streams.Default
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.reg.members(group)
}

// IsGrouped reports whether c shares a named stream group with another
// client (false once closed). Clients in the "default" group are never
// grouped (as in the reference: the default group is where ungrouped
// clients live).
func (c *Client) IsGrouped() bool {
	m := c.m
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.checkLocked(c) != nil {
		return false
	}
	return c.group != streams.Default && m.reg.groups[c.group].n > 1
}

// ChangeStreamGroup moves c to the named group ("" is "default"), making
// it if needed. Requests c has queued move with it; arrays it holds stay
// valid (they were made on the old group's stream: synchronize it before
// using them on the new one; the manager frees each array ordered after
// the stream it was last copied on). A group c leaves with no member is
// removed and its stream closed once its work is done, so a stream
// obtained from Stream before the move may be closed. The move never
// waits for that work (a long kernel of the old group's): the stream
// closes in the background. A refused move (a closed client or manager)
// makes no group.
func (c *Client) ChangeStreamGroup(group string) error {
	m := c.m
	if group == "" {
		group = streams.Default
	}
	for {
		m.mu.Lock()
		err := m.checkLocked(c)
		from := c.group
		m.mu.Unlock()
		if err != nil || from == group {
			return err
		}
		moved, err := m.moveHeld(c, from, group)
		if moved || err != nil {
			return err
		}
		// c moved meanwhile: try again from where it is now.
	}
}

// moveHeld moves c from group from to group to: it holds to's stream
// first (making it outside mu, so that a refused move makes none), which
// becomes c's hold on success, and releases c's hold of from once mu is
// released: then the group c left, with no hold left, is forgotten and
// its stream closed after its work. moved is false, with no error, if c
// was no longer in from.
func (m *Manager) moveHeld(c *Client, from, to string) (moved bool, err error) {
	// Streams of groups left empty are closed under useMu, so that no
	// SetAllocator or Close overlaps it (see Client.Close).
	m.useMu.RLock()
	defer m.useMu.RUnlock()
	_, holdTo, err := m.groups.Hold(to)
	if err != nil {
		if errors.Is(err, streams.ErrClosed) {
			return false, closedErr("change stream group") // closed meanwhile
		}
		return false, fmt.Errorf("make group %q: %w", to, err)
	}
	release := holdTo // unless the move takes it
	defer func() {
		// After mu is released: closing a stream waits for its work.
		err = errors.Join(err, wrapIf("close the stream of the group left", release()))
	}()
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.checkLocked(c); err != nil {
		return false, err
	}
	if c.group != from {
		return false, nil
	}
	reqs, queued := m.reg.groups[c.group].queue[c]
	m.leftLocked(m.reg.move(c, to)) // its queue entry leaves the old group with it
	if queued {
		m.queueLocked(c, to, reqs)
	}
	release, c.leave = c.leave, holdTo
	return true, nil
}

// Queue queues requests (label → request) for c in its stream group, to
// be allocated by the next Allocate of any member of the group. Every
// request is validated first; an invalid one (an error wrapping
// ErrInvalidRequest, or ErrNotSupported for Managed memory) queues
// nothing and leaves what c had queued. Otherwise the requests replace
// everything c had queued (as cubie's queue_request does): a label queued
// before and not now is no longer queued. An empty (or nil) map drops
// c's queued requests and returns nil once c is known to be open: c is
// then no requester of the next Allocate.
func (c *Client) Queue(requests map[string]ArrayRequest) error {
	m := c.m
	labels := slices.Sorted(maps.Keys(requests))
	for _, l := range labels {
		if err := requests[l].Validate(); err != nil {
			return fmt.Errorf("queue %s for %v: %w", l, c, err)
		}
	}
	own := make(map[string]ArrayRequest, len(requests))
	for l, r := range requests {
		r.Shape = slices.Clone(r.Shape)
		own[l] = r
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.checkLocked(c); err != nil {
		return err
	}
	delete(m.reg.groups[c.group].queue, c) // replaced, not merged
	if len(own) == 0 {
		return nil // nothing to queue: no queue entry, so no hook calls for it
	}
	m.queueLocked(c, c.group, own)
	return nil
}

// queueLocked merges reqs into c's queue in group, a group c is a member
// of. m.mu must be held.
func (m *Manager) queueLocked(c *Client, group string, reqs map[string]ArrayRequest) {
	q := m.reg.groups[group].queue
	if cur := q[c]; cur != nil {
		maps.Copy(cur, reqs)
		return
	}
	q[c] = reqs
}

// Queued returns a copy of the requests c has queued, by label (none
// once closed).
func (c *Client) Queued() map[string]ArrayRequest {
	m := c.m
	m.mu.Lock()
	defer m.mu.Unlock()
	if c.closed {
		return map[string]ArrayRequest{}
	}
	return maps.Clone(m.reg.groups[c.group].queue[c])
}

// streamGroup returns the name of c's stream group, or why c cannot be
// used.
func (m *Manager) streamGroup(c *Client) (string, error) {
	if c == nil || c.m != m {
		return "", foreign(c)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.checkLocked(c); err != nil {
		return "", err
	}
	return c.group, nil
}

// groupLock returns c's group and the lock that serializes Allocate for
// it (group.lock), or why c cannot be used.
func (m *Manager) groupLock(c *Client) (string, chan struct{}, error) {
	if c == nil || c.m != m {
		return "", nil, foreign(c)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.checkLocked(c); err != nil {
		return "", nil, err
	}
	return c.group, m.reg.groups[c.group].lock, nil
}
