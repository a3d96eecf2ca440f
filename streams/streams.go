package streams

// Groups keeps one map: group name → group (its stream, and how many hold
// it). Holding a group and releasing it are one map operation under one
// mutex; the map grows with the groups in use, not with every name ever
// used. Streams are made and closed outside the mutex (they are device
// calls): Hold makes the stream of a new group first and then re-checks
// the map, closing the spare stream if another goroutine made the group
// meanwhile.
//
// A group lives while it is held (Hold): the release that leaves it with
// no hold forgets it and closes its stream in the background, once the
// work queued on it is done (closeLeft): the release itself never waits
// for that work, which may be long (a kernel of another client). Close
// waits for every such close and returns their errors.
//
// Who is in a group is not kept here: the one table of members is the
// vram Manager's registry, whose clients each hold their group.

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
	// ErrUnknownGroup: a group that does not exist (GroupStream,
	// HoldExisting).
	ErrUnknownGroup = errors.New("no such stream group")
	// ErrClosed: the Groups has been closed.
	ErrClosed = errors.New("stream groups closed")
)

// StreamMaker makes streams; every device.Device is one. Groups calls it
// from the goroutine of the Hold, Ensure or Reinit that needs a stream, so
// it must be safe for concurrent use.
type StreamMaker interface {
	NewStream() (device.Stream, error)
}

type group struct {
	name   string
	stream device.Stream
	holds  int // Hold calls not yet released
}

// Groups is a set of named stream groups. The zero value is not usable;
// make one with New. Groups is safe for concurrent use.
type Groups struct {
	mk StreamMaker

	mu      sync.Mutex                      // protects the fields below
	groups  map[string]*group               // by name
	closing map[device.Stream]chan struct{} // streams of forgotten groups being closed → closed when done
	late    []error                         // errors of those closes, for Close
	closed  bool
}

// New returns an empty set of groups whose streams mk makes. No stream is
// made until a group is first used.
func New(mk StreamMaker) *Groups {
	return &Groups{mk: mk, groups: map[string]*group{}, closing: map[device.Stream]chan struct{}{}}
}

func name(g string) string {
	if g == "" {
		return Default
	}
	return g
}

// Ensure makes the named group ("" is Default) and its stream if the
// group does not exist, and returns the group's stream. It fails with the
// device's error if a new stream cannot be made, changing nothing. A
// group Ensure makes stays, with no hold, until a hold of it ends leaving
// none (or Close): use Hold to keep a group for a while.
func (g *Groups) Ensure(groupName string) (device.Stream, error) {
	_, s, err := g.get(name(groupName), false, true)
	return s, err
}

// Hold makes the named group ("" is Default) and its stream if the group
// does not exist, and keeps it until release is called: then a group left
// with no other hold is forgotten and its stream closed in the background
// once its work is done. It returns the group's stream. Each member of a
// group holds it while it is a member; a call that uses the group's
// stream holds it so that the stream stays open meanwhile. release is safe
// to call more than once (only the first call counts) and after Close.
func (g *Groups) Hold(groupName string) (s device.Stream, release func() error, err error) {
	return g.hold(name(groupName), true)
}

// HoldExisting is Hold of a group that exists: it makes none, and fails
// with ErrUnknownGroup when the group is not there.
func (g *Groups) HoldExisting(groupName string) (s device.Stream, release func() error, err error) {
	return g.hold(name(groupName), false)
}

// hold is Hold, making the group when make says so.
func (g *Groups) hold(gname string, make bool) (s device.Stream, release func() error, err error) {
	// The group comes from get itself, not from a second look-up: a
	// Close between the two would have emptied the table.
	grp, s, err := g.get(gname, true, make)
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
// stream if it does not exist and make says so; with hold it also counts
// a hold of the group.
func (g *Groups) get(gname string, hold, make bool) (*group, device.Stream, error) {
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
		if !make {
			return nil, nil, fmt.Errorf("group %q: %w", gname, ErrUnknownGroup)
		}
		s, err := g.mk.NewStream()
		if err != nil {
			return nil, nil, fmt.Errorf("make the stream of group %q: %w", gname, err)
		}
		fresh = s
	}
}

// dropIfIdleLocked forgets grp if it has no hold, and returns its stream
// for the caller to close once g.mu is released (nil if grp stays). g.mu
// must be held.
func (g *Groups) dropIfIdleLocked(grp *group) device.Stream {
	if grp.holds > 0 || g.groups[grp.name] != grp {
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
			g.late = append(g.late, fmt.Errorf("close the stream of group %q, left with no hold: %w", gname, err))
		}
	}()
	return nil
}

// WaitClosed waits until s, if it is the stream of a group being
// forgotten (its last hold ended), is closed, and so its work done. It
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

// GroupStream returns the stream of the named group ("" is Default), or
// ErrUnknownGroup if it does not exist (never used, or forgotten when its
// last hold ended).
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

// Names returns the names of the groups that exist (held, or made by
// Ensure), sorted.
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
		// with, after the reset; one forgotten meanwhile (its last hold
		// ended) needs no stream.
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
// for the streams of groups left with no hold to close (their work done)
// and returns the errors of those closes too. Later calls of the other
// methods return ErrClosed (GroupStream: ErrUnknownGroup); a second Close
// returns nil.
func (g *Groups) Close() error {
	g.mu.Lock()
	if g.closed {
		g.mu.Unlock()
		return nil
	}
	g.closed = true
	all := g.groups
	g.groups = map[string]*group{}
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
// (of a group left with no hold) is closed, its work done.
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
