package vram

// Which of the allocator registry's allocators (package alloc,
// registry.go) serves a kind: the one an option names, else the kind's
// choice for the device.

import (
	"strings"

	"github.com/vramkit/vram/alloc"
	"github.com/vramkit/vram/device"
)

// allocChoice is the allocator an option chose: the zero value leaves the
// choice to the registry (alloc.Kind.New).
type allocChoice struct {
	entry alloc.Entry            // the chosen allocator; zero: none chosen
	ecfg  alloc.ExpandableConfig // WithExpandable's configuration
}

// WithAllocatorEntry serves the manager from the allocator registry's
// entry e (alloc.Lookup): the kind is e's (as WithAllocator(e.Kind)), and
// whenever the manager makes an allocator of that kind (New, SetAllocator)
// it is e's. An entry not from the registry makes New fail with an error
// wrapping device.ErrInvalidValue; the zero Entry chooses nothing (the
// Pool kind, served as the registry chooses).
func WithAllocatorEntry(e alloc.Entry) Option {
	return func(c *config) { c.kind, c.pick.entry = e.Kind, e }
}

// WithExpandable chooses the allocator of the Pool kind: on, alloc.Expandable
// with cfg (New fails with an error wrapping device.ErrNotSupported on a
// device without virtual memory); off, the segment alloc.Pool with the
// WithPoolConfig configuration. Without it the Pool kind is Expandable
// where the device manages virtual memory (device.VirtualMemory) and no
// PoolConfig was given, else Pool.
func WithExpandable(on bool, cfg alloc.ExpandableConfig) Option {
	name := alloc.NamePool
	if on {
		name = alloc.NameExpandable
	}
	e := poolEntry(name)
	return func(c *config) { c.pick = allocChoice{entry: e, ecfg: cfg} }
}

// poolEntry is the Pool kind's allocator named name.
func poolEntry(name string) alloc.Entry {
	for _, e := range Pool.Allocators() {
		if e.Name == name {
			return e
		}
	}
	return alloc.Entry{}
}

// makeAllocator makes the allocator that serves kind on dev, and returns
// it with its registry entry: the chosen one when it is of kind; for the
// Pool kind given a PoolConfig, the segment Pool (WithPoolConfig); else
// the kind's choice for dev, Expandable for the Pool kind where the device
// manages virtual memory because it holds fewer bytes beyond the live ones
// on every trace measured (BENCHMARKS.md, "Expandable segments").
func (c *config) makeAllocator(dev device.Device, kind AllocatorKind) (alloc.Allocator, alloc.Entry, error) {
	cfgs := alloc.Configs{Pool: c.pcfg, Expandable: c.pick.ecfg, Async: c.acfg}
	e := c.pick.entry
	if e.Name == "" || e.Kind != kind {
		e = alloc.Entry{}
	}
	if e.Name == "" && kind == Pool && c.pcfg != (alloc.PoolConfig{}) {
		e = poolEntry(alloc.NamePool)
	}
	if e.Name == "" {
		return kind.New(dev, cfgs)
	}
	a, err := e.New(dev, cfgs)
	return a, e, err
}

// kindNames lists the kinds' names, by value: "pool, direct, async".
func kindNames() string {
	var names []string
	for _, k := range alloc.Kinds() {
		names = append(names, k.String())
	}
	return strings.Join(names, ", ")
}
