package alloc_test

import (
	"errors"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/vramkit/vram/alloc"
	"github.com/vramkit/vram/device"
	"github.com/vramkit/vram/device/sim"
	"github.com/vramkit/vram/internal/units"
)

// TestLookup: every name and alias, in any case, with space around and
// '-' for '_', finds its entry; anything else is refused with the names.
func TestLookup(t *testing.T) {
	tests := map[string]struct {
		name string
		want string // the entry's Name; "": refused
	}{
		"direct":           {"direct", alloc.NameDirect},
		"pool":             {"pool", alloc.NamePool},
		"async":            {"async", alloc.NameAsync},
		"expandable":       {"expandable", alloc.NameExpandable},
		"cubie's default":  {"default", alloc.NameDirect},
		"cubie's cupy":     {"cupy", alloc.NamePool},
		"cubie's async":    {"cupy_async", alloc.NameAsync},
		"hyphen for '_'":   {"cupy-async", alloc.NameAsync},
		"asyncpool":        {"asyncpool", alloc.NameAsync},
		"async-pool":       {"async-pool", alloc.NameAsync},
		"case and space":   {"  Expandable ", alloc.NameExpandable},
		"upper alias":      {"CUPY", alloc.NamePool},
		"empty":            {"", ""},
		"unknown":          {"pools", ""},
		"pinned is a host": {"pinned", ""},
		"two names":        {"pool,direct", ""},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			e, err := alloc.Lookup(tc.name)
			if tc.want == "" {
				if !errors.Is(err, device.ErrInvalidValue) {
					t.Fatalf("Lookup(%q) = %q, %v; want an error wrapping ErrInvalidValue", tc.name, e.Name, err)
				}
				for _, n := range alloc.Names() {
					if !strings.Contains(err.Error(), n) {
						t.Errorf("error %q does not list %q", err, n)
					}
				}
				return
			}
			if err != nil || e.Name != tc.want {
				t.Fatalf("Lookup(%q) = %q, %v; want %q", tc.name, e.Name, err, tc.want)
			}
		})
	}
}

// TestLookupClipsName: an error quotes a long name clipped.
func TestLookupClipsName(t *testing.T) {
	long := strings.Repeat("x", 10000)
	for _, f := range map[string]func(string) error{
		"Lookup":    func(s string) error { _, err := alloc.Lookup(s); return err },
		"ParseKind": func(s string) error { _, err := alloc.ParseKind(s); return err },
	} {
		if err := f(long); err == nil || len(err.Error()) > 400 {
			t.Errorf("error for a 10000-byte name: %d bytes; want a short error", len(err.Error()))
		}
	}
}

// TestParseKind: a kind's name or an alias of the allocator that names it
// gives the kind; the name of an allocator that names no kind is refused,
// saying whose kind it is.
func TestParseKind(t *testing.T) {
	tests := map[string]struct {
		s    string
		want alloc.Kind
		err  string // a substring of the error; "": none
	}{
		"pool":       {s: "pool", want: alloc.KindPool},
		"direct":     {s: "direct", want: alloc.KindDirect},
		"async":      {s: "async", want: alloc.KindAsync},
		"cupy":       {s: "cupy", want: alloc.KindPool},
		"default":    {s: "default", want: alloc.KindDirect},
		"cupy_async": {s: "Cupy-Async", want: alloc.KindAsync},
		"async_pool": {s: "async_pool", want: alloc.KindAsync},
		"expandable": {s: "expandable", err: "expandable is an allocator of kind pool"},
		"unknown":    {s: "fast", err: "want pool, direct or async (or cupy, default, asyncpool, async_pool, cupy_async)"},
		"empty":      {s: "", err: "want pool"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			k, err := alloc.ParseKind(tc.s)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) || !errors.Is(err, device.ErrInvalidValue) {
					t.Fatalf("ParseKind(%q) = %v, %v; want an error wrapping ErrInvalidValue saying %q", tc.s, k, err, tc.err)
				}
				return
			}
			if err != nil || k != tc.want {
				t.Fatalf("ParseKind(%q) = %v, %v; want %v", tc.s, k, err, tc.want)
			}
		})
	}
}

// TestKindString: a kind is named by its first allocator; a value that is
// no kind says so.
func TestKindString(t *testing.T) {
	tests := map[string]struct {
		k    alloc.Kind
		want string
	}{
		"pool":    {alloc.KindPool, "pool"},
		"direct":  {alloc.KindDirect, "direct"},
		"async":   {alloc.KindAsync, "async"},
		"no kind": {alloc.Kind(9), "allocator(9)"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if got := tc.k.String(); got != tc.want {
				t.Errorf("String() = %q; want %q", got, tc.want)
			}
			if tc.k.String() == tc.want && !strings.HasPrefix(tc.want, "allocator(") {
				if k, err := alloc.ParseKind(tc.want); err != nil || k != tc.k {
					t.Errorf("ParseKind(%q) = %v, %v; want %v", tc.want, k, err, tc.k)
				}
			}
		})
	}
}

// TestRegistryTable: names and aliases are unique, spelled as Lookup
// reads them; every kind from 0 up has an entry and at most one preferred
// entry; each entry's Config is a field of Configs, and each field is one
// entry's; Needs is an interface.
func TestRegistryTable(t *testing.T) {
	seen := map[string]string{}
	configs := map[reflect.Type]string{}
	preferred := map[alloc.Kind]int{}
	for _, e := range alloc.Allocators() {
		for _, n := range append([]string{e.Name}, e.Aliases...) {
			if other, ok := seen[n]; ok {
				t.Errorf("%q names both %s and %s", n, other, e.Name)
			}
			seen[n] = e.Name
			if n != strings.ToLower(n) || strings.ContainsAny(n, "- \t,:") {
				t.Errorf("%s: name %q is not as Lookup reads names", e.Name, n)
			}
		}
		if e.Needs != nil && e.Needs.Kind() != reflect.Interface {
			t.Errorf("%s needs %v, not an interface", e.Name, e.Needs)
		}
		if e.Config != nil {
			configs[e.Config] = e.Name
		}
		if e.Preferred {
			preferred[e.Kind]++
		}
		if e.Summary == "" {
			t.Errorf("%s has no summary", e.Name)
		}
		if got := e.Kind.String(); !slices.ContainsFunc(e.Kind.Allocators(), func(o alloc.Entry) bool { return o.Name == got }) {
			t.Errorf("%s: kind %q is not named by one of its allocators", e.Name, got)
		}
	}
	ct := reflect.TypeFor[alloc.Configs]()
	for i := range ct.NumField() {
		if _, ok := configs[ct.Field(i).Type]; !ok {
			t.Errorf("Configs.%s is the configuration of no entry", ct.Field(i).Name)
		}
		delete(configs, ct.Field(i).Type)
	}
	for typ, name := range configs {
		t.Errorf("%s takes %v, which is no field of Configs", name, typ)
	}
	for k, n := range preferred {
		if n > 1 {
			t.Errorf("kind %v has %d preferred allocators", k, n)
		}
	}
	if got := alloc.Names(); !slices.Equal(got, []string{"direct", "pool", "async", "expandable"}) {
		t.Errorf("Names() = %q; the order is the replays' and listings'", got)
	}
}

// TestEntryNew: each entry makes its allocator on a device with every
// ability, reported under the entry's name; on a device without what it
// Needs, Supported is false and New fails with ErrNotSupported.
func TestEntryNew(t *testing.T) {
	full := openSimT(t, sim.Config{TotalBytes: units.GiB, AddressOnly: true})
	bare := plainDevice{full}
	s, err := full.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for _, e := range alloc.Allocators() {
		t.Run(e.Name, func(t *testing.T) {
			if !e.Supported(full) {
				t.Fatalf("the simulator lacks %v", e.Needs)
			}
			a, err := e.New(full, alloc.Configs{})
			if err != nil {
				t.Fatalf("New: %v", err)
			}
			p, err := a.Alloc(units.MiB, s)
			if err != nil {
				t.Fatalf("Alloc: %v", err)
			}
			if err := a.Free(p, s); err != nil {
				t.Fatalf("Free: %v", err)
			}
			if got := alloc.ReportOf(a).Allocator; got != e.Name {
				t.Errorf("its report names it %q; want %q", got, e.Name)
			}
			if err := a.Close(); err != nil {
				t.Fatalf("Close: %v", err)
			}
			if e.Needs == nil {
				if !e.Supported(bare) {
					t.Error("Supported(a bare device) is false for an allocator that needs nothing")
				}
				return
			}
			if e.Supported(bare) {
				t.Errorf("Supported(a device without %v) is true", e.Needs)
			}
			if _, err := e.New(bare, alloc.Configs{}); !errors.Is(err, device.ErrNotSupported) {
				t.Errorf("New on a device without %v = %v; want ErrNotSupported", e.Needs, err)
			}
		})
	}
	if _, err := (alloc.Entry{Name: "mine"}).New(full, alloc.Configs{}); !errors.Is(err, device.ErrInvalidValue) {
		t.Errorf("New of an entry not in the registry = %v; want ErrInvalidValue", err)
	}
}

// TestEntryNewConfig: New hands each allocator its own configuration.
func TestEntryNewConfig(t *testing.T) {
	dev := openSimT(t, sim.Config{TotalBytes: units.GiB, AddressOnly: true})
	c := alloc.Configs{
		Pool:  alloc.PoolConfig{SmallSegment: 4 * units.MiB},
		Async: alloc.AsyncConfig{ReleaseThreshold: 3 * units.MiB},
	}
	pool := newEntryT(t, alloc.NamePool, dev, c).(*alloc.Pool)
	if got := pool.Config().SmallSegment; got != 4*units.MiB {
		t.Errorf("pool's small segment %d; want the Configs' 4 MiB", got)
	}
	async := newEntryT(t, alloc.NameAsync, dev, c).(*alloc.AsyncPool)
	if got := async.ReleaseThreshold(); got != 3*units.MiB {
		t.Errorf("async pool's release threshold %d; want the Configs' 3 MiB", got)
	}
}

func newEntryT(t *testing.T, name string, dev device.Device, c alloc.Configs) alloc.Allocator {
	t.Helper()
	e, err := alloc.Lookup(name)
	if err != nil {
		t.Fatal(err)
	}
	a, err := e.New(dev, c)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	t.Cleanup(func() { a.Close() })
	return a
}

// refusingVM has virtual memory the driver refuses, as a CUDA device
// without VMM support does.
type refusingVM struct{ *sim.Device }

func (refusingVM) VMGranularity() uint64 { return 0 }

// TestKindNew: a kind is served by its preferred allocator where the
// device has what it needs, else by its first, also when the device has
// the interface but refuses.
func TestKindNew(t *testing.T) {
	full := openSimT(t, sim.Config{TotalBytes: units.GiB, AddressOnly: true})
	tests := map[string]struct {
		k    alloc.Kind
		dev  device.Device
		want string // "": an error
	}{
		"pool, virtual memory":    {alloc.KindPool, full, alloc.NameExpandable},
		"pool, none":              {alloc.KindPool, plainDevice{full}, alloc.NamePool},
		"pool, refused":           {alloc.KindPool, refusingVM{full}, alloc.NamePool},
		"direct":                  {alloc.KindDirect, full, alloc.NameDirect},
		"async":                   {alloc.KindAsync, full, alloc.NameAsync},
		"async without the pool":  {alloc.KindAsync, plainDevice{full}, ""},
		"a value that is no kind": {alloc.Kind(7), full, ""},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			a, e, err := tc.k.New(tc.dev, alloc.Configs{})
			if tc.want == "" {
				if err == nil {
					a.Close()
					t.Fatalf("New = %s; want an error", e.Name)
				}
				return
			}
			if err != nil {
				t.Fatalf("New: %v", err)
			}
			defer a.Close()
			if e.Name != tc.want || alloc.ReportOf(a).Allocator != tc.want || e.Kind != tc.k {
				t.Errorf("New = %s (report %q, kind %v); want %s of kind %v", e.Name, alloc.ReportOf(a).Allocator, e.Kind, tc.want, tc.k)
			}
		})
	}
}

// FuzzLookup: Lookup and ParseKind never panic, agree with each other,
// and what they find is found again by its name.
func FuzzLookup(f *testing.F) {
	for _, s := range []string{"pool", "cupy-async", " Default ", "expandable", "", "x", "pool\x00"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		e, err := alloc.Lookup(s)
		k, kerr := alloc.ParseKind(s)
		if err != nil {
			if kerr == nil {
				t.Fatalf("ParseKind(%q) = %v, but Lookup refuses it", s, k)
			}
			return
		}
		again, err := alloc.Lookup(e.Name)
		if err != nil || again.Name != e.Name {
			t.Fatalf("Lookup(%q) = %s, but Lookup(%q) = %s, %v", s, e.Name, e.Name, again.Name, err)
		}
		if kerr == nil && k != e.Kind {
			t.Fatalf("ParseKind(%q) = %v; Lookup gives %s of kind %v", s, k, e.Name, e.Kind)
		}
		if kerr == nil && k.String() != e.Name {
			t.Fatalf("ParseKind(%q) = %v, but %s does not name it", s, k, e.Name)
		}
	})
}
