package account

// Which of the allocator registry's allocators (package alloc,
// registry.go) an account serves from: one value, Choice.

import (
	"github.com/vramkit/vram/alloc"
	"github.com/vramkit/vram/device"
)

// Choice is the allocator an account serves from and its configuration.
// The zero value is the Pool kind as the registry chooses it for the
// device (alloc.Expandable where the device manages virtual memory, else
// alloc.Pool), every allocator with its default configuration. A plain
// value.
type Choice struct {
	// Kind is the kind the account serves (alloc.KindPool, the zero
	// value, by default).
	Kind alloc.Kind
	// Entry, when not the zero Entry, is the registry's allocator
	// (alloc.Lookup) that serves its kind, Entry.Kind, whenever the
	// account makes an allocator of that kind (at New, at each Prepare);
	// any other kind is served as the registry chooses. An entry not
	// from the registry makes New fail with an error wrapping
	// device.ErrInvalidValue.
	Entry alloc.Entry
	// Configs configures the allocators: each reads its own.
	Configs alloc.Configs
}

// ChoiceOf is the choice of the registry's entry e: its kind, served by
// e.
func ChoiceOf(e alloc.Entry) Choice { return Choice{Kind: e.Kind, Entry: e} }

// make makes the allocator that serves kind on dev and returns it with
// its registry entry: the chosen Entry when it is of kind, else the
// kind's choice for dev.
func (c Choice) make(dev device.Device, kind alloc.Kind) (alloc.Allocator, alloc.Entry, error) {
	e := c.Entry
	if e.Name == "" || e.Kind != kind {
		return kind.New(dev, c.Configs)
	}
	a, err := e.New(dev, c.Configs)
	if err != nil {
		return nil, alloc.Entry{}, err
	}
	return a, e, nil
}
