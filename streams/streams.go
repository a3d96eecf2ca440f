package streams

// Groups keeps two maps: group name → group (its stream and a list of
// members) and member id → member (its group and its place in the list).
// Adding, moving, removing and looking a client up are one map operation
// and a list splice under one mutex; the maps grow with the clients and
// the groups in use, not with every name ever used. Streams are made and
// closed outside the mutex (they are device calls): Add and Move make the
// stream of a new group first and then re-check the maps, closing the
// spare stream if another goroutine made the group meanwhile.
//
// A group lives while it has members or holds (Hold): the Remove, Move
// or release that leaves it with neither forgets it and closes its stream
// in the background, once the work queued on it is done (closeLeft): the
// call itself never waits for that work, which may be long (a kernel of
// another client). Close waits for every such close and returns their
// errors.

import (
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/vramkit/vram/device"
)

// Default is the name of the group clients join when they name none.
const Default = "default"

// Sentinel errors; test with errors.Is.
var (
	// ErrAlreadyGrouped: Add of a client that is already in a group.
	ErrAlreadyGrouped = errors.New("client already in a stream group")
	// ErrNotGrouped: a lookup, Move or Remove of a client in no group.
	ErrNotGrouped = errors.New("client not in any stream group")
	// ErrUnknownGroup: GroupStream of a group that does not exist.
	ErrUnknownGroup = errors.New("no such stream group")
	// ErrClosed: the Groups has been closed.
	ErrClosed = errors.New("stream groups closed")
)

// StreamMaker makes streams; every device.Device is one. Groups calls it
// from the goroutine of the Add, Move or Reinit that needs a stream, so it
// must be safe for concurrent use.
type StreamMaker interface {
	NewStream() (device.Stream, error)
}

type group struct {
	name   string
	stream device.Stream
	head   *member // members, most recently added first
	n      int     // number of members
	holds  int     // Hold calls not yet released
}

// member is a client's place in its group's list.
type member struct {
	id         uint64
	g          *group
	prev, next *member
}

func (grp *group) link(mb *member) {
	mb.g, mb.prev, mb.next = grp, nil, grp.head
	if grp.head != nil {
		grp.head.prev = mb
	}
	grp.head = mb
	grp.n++
}

func (grp *group) unlink(mb *member) {
	if mb.prev != nil {
		mb.prev.next = mb.next
	} else {
		grp.head = mb.next
	}
	if mb.next != nil {
		mb.next.prev = mb.prev
	}
	mb.prev, mb.next, mb.g = nil, nil, nil
	grp.n--
}

// Groups is a set of named stream groups. The zero value is not usable;
// make one with New. Groups is safe for concurrent use.
type Groups struct {
	mk StreamMaker

	mu      sync.Mutex                      // protects the fields below
	groups  map[string]*group               // by name
	member  map[uint64]*member              // by client id
	closing map[device.Stream]chan struct{} // streams of forgotten groups being closed → closed when done
	late    []error                         // errors of those closes, for Close
	closed  bool
}

// New returns an empty set of groups whose streams mk makes. No stream is
// made until a group is first used.
func New(mk StreamMaker) *Groups {
	return &Groups{mk: mk, groups: map[string]*group{}, member: map[uint64]*member{}, closing: map[device.Stream]chan struct{}{}}
}

func name(g string) string {
	if g == "" {
		return Default
	}
	return g
}

// Add puts client id in the named group ("" is Default), making the group
// and its stream if it does not exist. It fails with ErrAlreadyGrouped if
// the client is in a group already (use Move), and with the device's error
// if a new stream cannot be made; either way nothing changes.
func (g *Groups) Add(id uint64, groupName string) error {
	return g.place(id, name(groupName), false)
}

// Move puts client id in the named group ("" is Default), making the
// group and its stream if needed. A group it leaves with no member and no
// Hold is forgotten and its stream closed in the background once its
// work is done (Close reports an error of that close). It fails with
// ErrNotGrouped if the client is in no group.
func (g *Groups) Move(id uint64, groupName string) error {
	return g.place(id, name(groupName), true)
}

// place adds (move=false) or moves (move=true) id into group gname.
func (g *Groups) place(id uint64, gname string, move bool) error {
	var fresh device.Stream // made outside the lock when the group is new
	for {
		g.mu.Lock()
		if g.closed {
			g.mu.Unlock()
			closeQuietly(fresh)
			return ErrClosed
		}
		mb, in := g.member[id]
		switch {
		case in && !move:
			g.mu.Unlock()
			closeQuietly(fresh)
			return fmt.Errorf("client %d is in group %q: %w", id, mb.g.name, ErrAlreadyGrouped)
		case !in && move:
			g.mu.Unlock()
			closeQuietly(fresh)
			return fmt.Errorf("move client %d to group %q: %w", id, gname, ErrNotGrouped)
		}
		dst, ok := g.groups[gname]
		if !ok && fresh != nil {
			dst = &group{name: gname, stream: fresh}
			g.groups[gname] = dst
			fresh, ok = nil, true
		}
		if ok {
			var left device.Stream // of a group the move leaves empty
			var leftName string
			switch {
			case !in:
				mb = &member{id: id}
				g.member[id] = mb
			case mb.g != dst:
				from := mb.g
				from.unlink(mb)
				left, leftName = g.dropIfIdleLocked(from), from.name
			default:
				dst = nil // already there
			}
			if dst != nil {
				dst.link(mb)
			}
			g.mu.Unlock()
			closeQuietly(fresh) // another goroutine made the group first
			return g.closeLeft(left, leftName)
		}
		g.mu.Unlock()
		s, err := g.mk.NewStream()
		if err != nil {
			return fmt.Errorf("make the stream of group %q: %w", gname, err)
		}
		fresh = s
	}
}

// Ensure makes the named group ("" is Default) and its stream if the
// group does not exist, and returns the group's stream. It fails with the
// device's error if a new stream cannot be made, changing nothing. A
// group Ensure makes stays, empty, until a member joins and leaves it
// (or Close): use Hold to make a group for a while.
func (g *Groups) Ensure(groupName string) (device.Stream, error) {
	_, s, err := g.get(name(groupName), false)
	return s, err
}

// Hold makes the named group ("" is Default) and its stream if the group
// does not exist, and keeps it (even with no members) until release is
// called: then a group left with no member and no other Hold is
// forgotten and its stream closed in the background once its work is
// done. It returns the
// group's stream. release is safe to call more than once (only the first
// call counts) and after Close.
func (g *Groups) Hold(groupName string) (s device.Stream, release func() error, err error) {
	gname := name(groupName)
	// The group comes from get itself, not from a second look-up: a
	// Close between the two would have emptied the table.
	grp, s, err := g.get(gname, true)
	if err != nil {
		return nil, nil, err
	}
	if testHookHeld != nil {
		testHookHeld()
	}
	var once sync.Once
	release = func() error {
		var err error
		once.Do(func() {
			g.mu.Lock()
			grp.holds--
			var idle device.Stream
			if !g.closed {
				idle = g.dropIfIdleLocked(grp)
			}
			g.mu.Unlock()
			err = g.closeLeft(idle, gname)
		})
		return err
	}
	return s, release, nil
}

// testHookHeld, when set by a test, runs in Hold once the group is held.
var testHookHeld func()

// get returns the named group and its stream, making the group and its
// stream if it does not exist; with hold it also counts a Hold of the
// group.
func (g *Groups) get(gname string, hold bool) (*group, device.Stream, error) {
	var fresh device.Stream // made outside the lock when the group is new
	for {
		g.mu.Lock()
		if g.closed {
			g.mu.Unlock()
			closeQuietly(fresh)
			return nil, nil, ErrClosed
		}
		grp, ok := g.groups[gname]
		if !ok && fresh != nil {
			grp = &group{name: gname, stream: fresh}
			g.groups[gname] = grp
			fresh, ok = nil, true
		}
		if ok {
			if hold {
				grp.holds++
			}
			s := grp.stream // read under the lock: Reinit replaces it
			g.mu.Unlock()
			closeQuietly(fresh) // another goroutine made the group first
			return grp, s, nil
		}
		g.mu.Unlock()
		s, err := g.mk.NewStream()
		if err != nil {
			return nil, nil, fmt.Errorf("make the stream of group %q: %w", gname, err)
		}
		fresh = s
	}
}

// dropIfIdleLocked forgets grp if it has no member and no Hold, and
// returns its stream for the caller to close once g.mu is released (nil
// if grp stays). g.mu must be held.
func (g *Groups) dropIfIdleLocked(grp *group) device.Stream {
	if grp.n > 0 || grp.holds > 0 || g.groups[grp.name] != grp {
		return nil
	}
	delete(g.groups, grp.name)
	g.closing[grp.stream] = make(chan struct{})
	return grp.stream
}

// closeLeft closes the stream of a group that was forgotten (nil: none)
// in the background, once its work is done, and returns at once (nil: the
// error is Close's). After a device reset there is nothing to wait for,
// and no error.
func (g *Groups) closeLeft(s device.Stream, gname string) error {
	if s == nil {
		return nil
	}
	go func() {
		err := s.Close()
		g.mu.Lock()
		defer g.mu.Unlock()
		close(g.closing[s])
		delete(g.closing, s)
		if err != nil && !errors.Is(err, device.ErrInvalidated) {
			g.late = append(g.late, fmt.Errorf("close the stream of group %q, left with no member: %w", gname, err))
		}
	}()
	return nil
}

// WaitClosed waits until s, if it is the stream of a group being
// forgotten (its last member left), is closed, and so its work done. It
// returns at once for any other stream. A stream reports itself closed
// as soon as its Close starts; WaitClosed is how to wait for the work it
// still had.
func (g *Groups) WaitClosed(s device.Stream) {
	g.mu.Lock()
	ch := g.closing[s]
	g.mu.Unlock()
	if ch != nil {
		<-ch
	}
}

func closeQuietly(s device.Stream) {
	if s != nil {
		_ = s.Close()
	}
}

// Remove takes client id out of its group. A group left with no member
// and no Hold is forgotten and its stream closed in the background once
// its work is done (Close reports an error of that close). It fails with
// ErrNotGrouped if the client is in no group.
func (g *Groups) Remove(id uint64) error {
	g.mu.Lock()
	mb, ok := g.member[id]
	if !ok {
		g.mu.Unlock()
		return fmt.Errorf("remove client %d: %w", id, ErrNotGrouped)
	}
	grp := mb.g
	grp.unlink(mb)
	delete(g.member, id)
	idle := g.dropIfIdleLocked(grp)
	g.mu.Unlock()
	return g.closeLeft(idle, grp.name)
}

// Group returns the name of the group client id is in, or ErrNotGrouped.
func (g *Groups) Group(id uint64) (string, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	mb, ok := g.member[id]
	if !ok {
		return "", fmt.Errorf("client %d: %w", id, ErrNotGrouped)
	}
	return mb.g.name, nil
}

// Stream returns the stream of the group client id is in, or
// ErrNotGrouped.
func (g *Groups) Stream(id uint64) (device.Stream, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	mb, ok := g.member[id]
	if !ok {
		return nil, fmt.Errorf("client %d: %w", id, ErrNotGrouped)
	}
	return mb.g.stream, nil
}

// GroupStream returns the stream of the named group ("" is Default), or
// ErrUnknownGroup if it does not exist (never used, or forgotten when its
// last member left).
func (g *Groups) GroupStream(groupName string) (device.Stream, error) {
	gname := name(groupName)
	g.mu.Lock()
	defer g.mu.Unlock()
	grp, ok := g.groups[gname]
	if !ok {
		return nil, fmt.Errorf("group %q: %w", gname, ErrUnknownGroup)
	}
	return grp.stream, nil
}

// Members returns the ids in the named group ("" is Default), sorted; it
// is empty for a group that does not exist. It costs O(members).
func (g *Groups) Members(groupName string) []uint64 {
	g.mu.Lock()
	grp, ok := g.groups[name(groupName)]
	if !ok {
		g.mu.Unlock()
		return []uint64{}
	}
	ids := make([]uint64, 0, grp.n)
	for mb := grp.head; mb != nil; mb = mb.next {
		ids = append(ids, mb.id)
	}
	g.mu.Unlock()
	slices.Sort(ids)
	return ids
}

// Size returns the number of clients in the named group ("" is Default),
// 0 for a group that does not exist.
func (g *Groups) Size(groupName string) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	if grp, ok := g.groups[name(groupName)]; ok {
		return grp.n
	}
	return 0
}

// Names returns the names of the groups that exist (with members or
// held), sorted.
func (g *Groups) Names() []string {
	g.mu.Lock()
	names := make([]string, 0, len(g.groups))
	for n := range g.groups {
		names = append(names, n)
	}
	g.mu.Unlock()
	slices.Sort(names)
	return names
}

// Reinit gives every group a fresh stream, as needed after a device reset
// has invalidated the old ones, and closes the old streams (ignoring their
// errors: after a reset they are already gone). If a new stream cannot be
// made, the streams made so far are closed, every group keeps its old
// stream and the error is returned.
func (g *Groups) Reinit() error {
	g.mu.Lock()
	if g.closed {
		g.mu.Unlock()
		return ErrClosed
	}
	names := make([]string, 0, len(g.groups))
	for n := range g.groups {
		names = append(names, n)
	}
	g.mu.Unlock()

	fresh := make(map[string]device.Stream, len(names))
	for _, n := range names {
		s, err := g.mk.NewStream()
		if err != nil {
			for _, f := range fresh {
				closeQuietly(f)
			}
			return fmt.Errorf("reinit the stream of group %q: %w", n, err)
		}
		fresh[n] = s
	}

	var old []device.Stream
	g.mu.Lock()
	if g.closed {
		g.mu.Unlock()
		for _, f := range fresh {
			closeQuietly(f)
		}
		return ErrClosed
	}
	for n, s := range fresh {
		// A group made after the snapshot keeps the stream it was made
		// with, after the reset; one forgotten meanwhile (its last member
		// left) needs no stream.
		if grp, ok := g.groups[n]; ok {
			old = append(old, grp.stream)
			grp.stream = s
		} else {
			old = append(old, s)
		}
	}
	g.mu.Unlock()
	for _, s := range old {
		closeQuietly(s)
	}
	return nil
}

// Close closes every group's stream and forgets every group, then waits
// for the streams of groups left empty to close (their work done) and
// returns the errors of those closes too. Later calls of the other methods
// return ErrClosed (lookups: ErrNotGrouped); a second Close returns nil.
func (g *Groups) Close() error {
	g.mu.Lock()
	if g.closed {
		g.mu.Unlock()
		return nil
	}
	g.closed = true
	all := g.groups
	g.groups, g.member = map[string]*group{}, map[uint64]*member{}
	g.mu.Unlock()
	var errs []error
	for _, grp := range all {
		if err := grp.stream.Close(); err != nil && !errors.Is(err, device.ErrInvalidated) {
			errs = append(errs, fmt.Errorf("close the stream of group %q: %w", grp.name, err))
		}
	}
	g.WaitClosing()
	g.mu.Lock()
	errs, g.late = append(errs, g.late...), nil
	g.mu.Unlock()
	return errors.Join(errs...)
}

// WaitClosing waits until every stream being closed in the background
// (of a group left with no member) is closed, its work done.
func (g *Groups) WaitClosing() {
	for {
		g.mu.Lock()
		var ch chan struct{}
		for _, c := range g.closing {
			ch = c
			break
		}
		g.mu.Unlock()
		if ch == nil {
			return
		}
		<-ch
	}
}
