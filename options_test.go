package vram

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/vramkit/vram/account"
	"github.com/vramkit/vram/alloc"
	"github.com/vramkit/vram/device"
)

// plainAlloc wraps an allocator and hides every ability but Allocator's
// own methods (its Report among them).
type plainAlloc struct{ a alloc.Allocator }

func (p plainAlloc) Alloc(n uint64, s device.Stream) (device.Ptr, error) { return p.a.Alloc(n, s) }
func (p plainAlloc) Free(ptr device.Ptr, s device.Stream) error          { return p.a.Free(ptr, s) }
func (p plainAlloc) Stats() alloc.Stats                                  { return p.a.Stats() }
func (p plainAlloc) Trim() error                                         { return p.a.Trim() }
func (p plainAlloc) Close() error                                        { return p.a.Close() }

// TestAllocatorNamedAsServed: however an allocator is asked for (the
// choice, or the deprecated options that read as one), the manager's
// reports name what serves, by its name in the allocator registry: the
// account's Report, the manager's Report and its text, and the report at
// an out of memory; the kind stays what was asked.
func TestAllocatorNamedAsServed(t *testing.T) {
	type ask struct {
		opts  []Option
		noVM  bool
		kind  AllocatorKind
		serve string
	}
	tests := map[string]ask{
		"the default":             {kind: Pool, serve: alloc.NameExpandable},
		"the default, no VM":      {noVM: true, kind: Pool, serve: alloc.NamePool},
		"direct kind":             {opts: []Option{WithAllocatorChoice(account.Choice{Kind: Direct})}, kind: Direct, serve: alloc.NameDirect},
		"async kind":              {opts: []Option{WithAllocatorChoice(account.Choice{Kind: AsyncPool})}, kind: AsyncPool, serve: alloc.NameAsync},
		"a wrapper without names": {opts: []Option{WithWrap(func(a alloc.Allocator) alloc.Allocator { return plainAlloc{a} })}, kind: Pool, serve: alloc.NameExpandable},
		"under a cap":             {opts: []Option{WithCap(32 * MiB), WithAllocatorChoice(account.Choice{Kind: Direct})}, kind: Direct, serve: alloc.NameDirect},
		"the last choice wins":    {opts: []Option{WithAllocatorChoice(account.Choice{Kind: AsyncPool}), WithAllocatorChoice(account.Choice{Kind: Direct})}, kind: Direct, serve: alloc.NameDirect},
		// The deprecated options read as the choices they stand for.
		"deprecated: a pool configuration": {opts: []Option{WithPoolConfig(alloc.PoolConfig{KeepCache: true})}, kind: Pool, serve: alloc.NamePool},
		"deprecated: expandable off":       {opts: []Option{WithExpandable(false, alloc.ExpandableConfig{})}, kind: Pool, serve: alloc.NamePool},
		"deprecated: expandable on":        {opts: []Option{WithExpandable(true, alloc.ExpandableConfig{})}, kind: Pool, serve: alloc.NameExpandable},
		"deprecated: direct kind":          {opts: []Option{WithAllocator(Direct)}, kind: Direct, serve: alloc.NameDirect},
		"deprecated: kind, then a choice":  {opts: []Option{WithAllocator(Direct), WithAllocatorChoice(account.Choice{Kind: AsyncPool})}, kind: AsyncPool, serve: alloc.NameAsync},
		"deprecated: a choice, then kind":  {opts: []Option{WithAllocatorChoice(account.Choice{Kind: AsyncPool}), WithAllocator(Direct)}, kind: Direct, serve: alloc.NameDirect},
	}
	for _, e := range alloc.Allocators() {
		tests["entry "+e.Name] = ask{opts: []Option{WithAllocatorChoice(account.ChoiceOf(e))}, kind: e.Kind, serve: e.Name}
		tests["deprecated: entry "+e.Name] = ask{opts: []Option{WithAllocatorEntry(e)}, kind: e.Kind, serve: e.Name}
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			var dev device.Device = newSim(t, 64*MiB)
			if tc.noVM {
				dev = noVMDevice{dev}
			}
			var oomName string
			opts := append([]Option{WithOOMObserver(func(_ *alloc.OutOfMemoryError, r ManagerReport) { oomName = r.Memory.Allocator })}, tc.opts...)
			m, err := New(dev, opts...)
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			k, r := m.Account().Report()
			if k != tc.kind || r.Allocator != tc.serve {
				t.Fatalf("the account's Report = kind %v, %q; want kind %v served by %q", k, r.Allocator, tc.kind, tc.serve)
			}
			if dk, dr := AllocatorReport(m); dk != k || dr.Allocator != r.Allocator { // deprecated, the same
				t.Errorf("AllocatorReport = %v, %q; want the account's %v, %q", dk, dr.Allocator, k, r.Allocator)
			}
			rep := m.Report()
			head := fmt.Sprintf("manager: %s allocator, ", tc.serve)
			if s := rep.String(); !strings.HasPrefix(s, head) || rep.Allocator != tc.kind {
				t.Errorf("Report: kind %v, text:\n%s\nwant kind %v and a first line starting %q", rep.Allocator, s, tc.kind, head)
			}
			s, err := dev.NewStream()
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			if _, err := m.Account().Allocator().Alloc(1<<40, s); err == nil {
				t.Fatal("a TiB allocation succeeded")
			}
			if _, plain := m.Account().Allocator().(plainAlloc); !plain && oomName != tc.serve {
				t.Errorf("the out-of-memory report names %q; want %q", oomName, tc.serve)
			}
		})
	}
}

// TestAllocatorEntryKinds: an entry chooses what serves its own kind
// only; SetAllocator to another kind is served by that kind's choice, and
// back to the entry's kind by the entry; an entry not from the registry
// is refused.
func TestAllocatorEntryKinds(t *testing.T) {
	pool, err := alloc.Lookup("pool")
	if err != nil {
		t.Fatal(err)
	}
	m, _, _ := newManager(t, 64*MiB, WithAllocatorChoice(account.ChoiceOf(pool)))
	steps := []struct {
		kind  AllocatorKind
		serve string
	}{{Direct, alloc.NameDirect}, {Pool, alloc.NamePool}, {AsyncPool, alloc.NameAsync}, {Pool, alloc.NamePool}}
	for _, s := range steps {
		if err := m.SetAllocator(s.kind); err != nil {
			t.Fatalf("SetAllocator(%v): %v", s.kind, err)
		}
		if k, r := m.Account().Report(); k != s.kind || r.Allocator != s.serve {
			t.Errorf("after SetAllocator(%v): kind %v served by %q; want %q", s.kind, k, r.Allocator, s.serve)
		}
	}
	dev := newSim(t, 64*MiB)
	if _, err := New(dev, WithAllocatorChoice(account.ChoiceOf(alloc.Entry{Name: "mine", Kind: Direct}))); !errors.Is(err, device.ErrInvalidValue) {
		t.Errorf("New with an entry not from the registry: %v; want ErrInvalidValue", err)
	}
}
