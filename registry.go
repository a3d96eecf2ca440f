package vram

// The registry of open clients, built so that Register and Close touch no
// map keyed by client: a slot array (with a stack of free slots) for
// iterating over every client, and an intrusive list per stream group for
// finding a group's members. The stream groups (package streams) keep
// their own id map for stream lookups; the registry mirrors their
// membership under the manager's lock.

import "slices"

// registry is protected by Manager.mu.
type registry struct {
	slots  []*Client              // open clients; nil where one closed
	free   []int                  // indexes of nil slots
	n      int                    // open clients
	groups map[string]*clientList // group name → members
}

// clientList is a group's members, linked through Client.gprev/gnext.
type clientList struct {
	head *Client
	n    int
}

func newRegistry() registry { return registry{groups: map[string]*clientList{}} }

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

// remove takes c out of its slot and its group's list.
func (r *registry) remove(c *Client) {
	r.unlink(c)
	r.slots[c.slot] = nil
	r.free = append(r.free, c.slot)
	c.slot = -1
	r.n--
}

func (r *registry) link(c *Client) {
	l := r.groups[c.group]
	if l == nil {
		l = &clientList{}
		r.groups[c.group] = l
	}
	c.gprev, c.gnext = nil, l.head
	if l.head != nil {
		l.head.gprev = c
	}
	l.head = c
	l.n++
}

func (r *registry) unlink(c *Client) {
	l := r.groups[c.group]
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
	if l.n == 0 {
		delete(r.groups, c.group) // group names do not pile up
	}
}

// move puts c in group.
func (r *registry) move(c *Client, group string) {
	r.unlink(c)
	c.group = group
	r.link(c)
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
