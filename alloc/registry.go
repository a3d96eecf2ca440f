package alloc

// The allocator registry: every device allocator of the package in one
// table (registry, below), each by its one name, with the other names it
// is asked by, the kind it serves, what it needs of a device beyond
// device.Device, the configuration it takes and how it is made. Whatever
// names a device allocator reads this table: the manager's kinds
// (vram.AllocatorKind is Kind, and ParseAllocatorKind is ParseKind), the
// manager's choice of allocator, VRAM_ALLOC_CONF's kind, the command
// line's --allocator and its help text, vram info, the memory reports
// (MemoryReport.Allocator), the run report and the metrics label.
//
// The one-name rule is stated on Entry.

import (
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"

	"github.com/vramkit/vram/device"
)

// The names of the registry's allocators (Entry.Name). Each allocator's
// memory report is made under its name (MemoryReport.Allocator).
const (
	NameDirect     = "direct"
	NamePool       = "pool"
	NameAsync      = "async"
	NameExpandable = "expandable"
)

// Kind is a family of device allocators that serve one role, what a
// manager is asked for (vram.AllocatorKind is Kind). KindPool, the zero
// value, is the default. A plain value, safe to share.
type Kind uint8

// The kinds.
const (
	// KindPool: a caching best-fit allocator (CuPy's MemoryPool, PyTorch's
	// caching allocator), Expandable where the device manages virtual
	// memory, else the segment Pool.
	KindPool Kind = iota
	// KindDirect: every call goes to the device (Direct).
	KindDirect
	// KindAsync: the device's stream-ordered pool (AsyncPool:
	// cuMemAllocAsync, CuPy's MemoryAsyncPool).
	KindAsync
)

// Configs holds a configuration for each allocator that takes one; New
// reads the one of the allocator it makes (Entry.Config says which). The
// zero value configures every allocator with its defaults.
type Configs struct {
	Pool       PoolConfig
	Expandable ExpandableConfig
	Async      AsyncConfig
}

// Entry is one device allocator in the registry. A plain value.
//
// The one-name rule. Every allocator has one name, its Entry.Name, and an
// allocator is named by what serves, never by what was asked for: every
// report, listing, metrics label and message that names the allocator
// making the allocations gives that name (MemoryReport.Allocator is it). A
// Kind is what a manager is asked for, a family of allocators in one role,
// named by its first allocator in the table (the one it falls back to):
// kind pool, asked for, is served by expandable where the device manages
// virtual memory, and is then reported as expandable. A name read where
// one allocator is chosen (Lookup: --allocator) gives that allocator, an
// alias the allocator it stands for; read where a kind is chosen
// (ParseKind: VRAM_ALLOC_CONF's kind), it must be a kind's name or an
// alias of the allocator that names the kind.
type Entry struct {
	// Name is the allocator's one name (the rule above).
	Name string
	// Aliases are other names it is asked by, lower case, with '_' where
	// either '_' or '-' may be written: cubie's, and other spellings.
	Aliases []string
	// Kind is the kind it serves.
	Kind Kind
	// Preferred says that its kind is served by it where the device has
	// what it Needs (Kind.New).
	Preferred bool
	// Summary says what it is, in a few words.
	Summary string
	// Needs is the interface (of package device) a device must implement
	// for it beyond device.Device; nil for none. A device that has it may
	// still refuse (a CUDA device without the driver's support), and New
	// then fails with an error wrapping device.ErrNotSupported.
	Needs reflect.Type
	// Config is the type of the configuration it takes (the field of
	// Configs that New reads); nil for none.
	Config reflect.Type

	build func(device.Device, Configs) (Allocator, error)
}

// registry is every device allocator, in the order listings and replays
// give them. A kind's first entry names it (Kind.String).
var registry = [...]Entry{
	{
		Name: NameDirect, Aliases: []string{"default"}, Kind: KindDirect,
		Summary: "every call goes to the device",
		build:   func(dev device.Device, _ Configs) (Allocator, error) { return NewDirect(dev), nil },
	},
	{
		Name: NamePool, Aliases: []string{"cupy"}, Kind: KindPool,
		Summary: "caching best-fit pool",
		Config:  reflect.TypeFor[PoolConfig](),
		build:   func(dev device.Device, c Configs) (Allocator, error) { return NewPool(dev, c.Pool) },
	},
	{
		Name: NameAsync, Aliases: []string{"asyncpool", "async_pool", "cupy_async"}, Kind: KindAsync,
		Summary: "the device's stream-ordered pool",
		Needs:   reflect.TypeFor[device.AsyncAllocator](),
		Config:  reflect.TypeFor[AsyncConfig](),
		build:   func(dev device.Device, c Configs) (Allocator, error) { return NewAsyncPool(dev, c.Async) },
	},
	{
		Name: NameExpandable, Kind: KindPool, Preferred: true,
		Summary: "best fit in one growing range per stream and size class, 2 MiB pages mapped as it grows and unmapped before passing its high-water mark, on trim and on out of memory",
		Needs:   reflect.TypeFor[device.VirtualMemory](),
		Config:  reflect.TypeFor[ExpandableConfig](),
		build:   func(dev device.Device, c Configs) (Allocator, error) { return NewExpandable(dev, c.Expandable) },
	},
}

// Allocators returns the registry's entries, in its order.
func Allocators() []Entry { return registry[:] }

// Names returns the registry's names, in its order.
func Names() []string {
	names := make([]string, len(registry))
	for i, e := range registry {
		names[i] = e.Name
	}
	return names
}

// Lookup returns the entry named name, or of which name is an alias;
// case, surrounding space and '-' for '_' are ignored. Any other name is
// an error wrapping device.ErrInvalidValue that lists the names.
func Lookup(name string) (Entry, error) {
	if e, ok := lookup(name); ok {
		return e, nil
	}
	return Entry{}, fmt.Errorf("allocator %q: want %s: %w", clip(name), nameList(registry[:]), device.ErrInvalidValue)
}

// lookup finds the entry named name or of which it is an alias.
func lookup(name string) (Entry, bool) {
	key := strings.ReplaceAll(strings.ToLower(strings.TrimSpace(name)), "-", "_")
	for _, e := range registry {
		if key == e.Name || slices.Contains(e.Aliases, key) {
			return e, true
		}
	}
	return Entry{}, false
}

// nameList lists the names of entries, then their aliases:
// "a, b or c (or x, y)".
func nameList(entries []Entry) string {
	var names, other []string
	for _, e := range entries {
		names = append(names, e.Name)
		other = append(other, e.Aliases...)
	}
	s := names[len(names)-1]
	if len(names) > 1 {
		s = strings.Join(names[:len(names)-1], ", ") + " or " + s
	}
	if len(other) > 0 {
		s += " (or " + strings.Join(other, ", ") + ")"
	}
	return s
}

// clip is s cut to 40 bytes, for an error that quotes a name it was given.
func clip(s string) string {
	const max = 40
	if len(s) <= max {
		return s
	}
	return s[:max] + "…"
}

// Supported reports whether dev implements what e Needs.
func (e Entry) Supported(dev device.Device) bool {
	return e.Needs == nil || (dev != nil && reflect.TypeOf(dev).Implements(e.Needs))
}

// New makes e's allocator on dev with its configuration from c. An entry
// that is not the registry's (the zero Entry) is an error wrapping
// device.ErrInvalidValue.
func (e Entry) New(dev device.Device, c Configs) (Allocator, error) {
	if e.build == nil {
		return nil, fmt.Errorf("allocator %q: not an entry of the registry: %w", clip(e.Name), device.ErrInvalidValue)
	}
	return e.build(dev, c)
}

// String is the kind's name: the name of its first allocator in the
// registry ("pool", "direct" or "async").
func (k Kind) String() string {
	if e, ok := k.first(); ok {
		return e.Name
	}
	return fmt.Sprintf("allocator(%d)", uint8(k))
}

// Allocators returns the entries of kind k, in the registry's order.
func (k Kind) Allocators() []Entry {
	var out []Entry
	for _, e := range registry {
		if e.Kind == k {
			out = append(out, e)
		}
	}
	return out
}

// first is the entry that names k.
func (k Kind) first() (Entry, bool) {
	for _, e := range registry {
		if e.Kind == k {
			return e, true
		}
	}
	return Entry{}, false
}

// Choose returns the entry that serves k on dev: its Preferred entry where
// dev has what that one Needs, else its first. A kind the registry does
// not have is an error wrapping device.ErrInvalidValue.
func (k Kind) Choose(dev device.Device) (Entry, error) {
	first, ok := k.first()
	if !ok {
		return Entry{}, fmt.Errorf("allocator kind %v: want %s: %w", k, nameList(kindEntries()), device.ErrInvalidValue)
	}
	for _, e := range k.Allocators() {
		if e.Preferred && e.Supported(dev) {
			return e, nil
		}
	}
	return first, nil
}

// New makes the allocator of kind k on dev, configured from c, and returns
// it with its entry: the one Choose returns, or, when that one is the
// Preferred entry and fails with an error wrapping device.ErrNotSupported
// (a device that implements what it needs but whose driver refuses), the
// kind's first.
func (k Kind) New(dev device.Device, c Configs) (Allocator, Entry, error) {
	e, err := k.Choose(dev)
	if err != nil {
		return nil, Entry{}, err
	}
	a, err := e.New(dev, c)
	if err != nil && e.Preferred && errors.Is(err, device.ErrNotSupported) {
		e, _ = k.first()
		a, err = e.New(dev, c)
	}
	if err != nil {
		return nil, Entry{}, err
	}
	return a, e, nil
}

// ParseKind reads a kind's name, or an alias of the allocator that names
// it (case, surrounding space and '-' for '_' ignored). The name of an
// allocator that does not name its kind ("expandable") is refused, as it
// asks for one allocator and not a kind. Errors wrap
// device.ErrInvalidValue and list the kinds' names and aliases.
func ParseKind(s string) (Kind, error) {
	e, ok := lookup(s)
	if ok {
		if first, _ := e.Kind.first(); first.Name == e.Name {
			return e.Kind, nil
		}
		return 0, fmt.Errorf("allocator kind %q: %s is an allocator of kind %v, not a kind; want %s: %w",
			clip(s), e.Name, e.Kind, nameList(kindEntries()), device.ErrInvalidValue)
	}
	return 0, fmt.Errorf("allocator kind %q: want %s: %w", clip(s), nameList(kindEntries()), device.ErrInvalidValue)
}

// Kinds returns the kinds, by value: every value from 0 up to the first
// that no entry of the registry is of.
func Kinds() []Kind {
	var out []Kind
	for k := Kind(0); ; k++ {
		if _, ok := k.first(); !ok {
			return out
		}
		out = append(out, k)
	}
}

// kindEntries lists the entry that names each kind, by the kinds' values.
func kindEntries() []Entry {
	var out []Entry
	for _, k := range Kinds() {
		e, _ := k.first()
		out = append(out, e)
	}
	return out
}
