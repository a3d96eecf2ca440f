package vram

import (
	"errors"
	"strings"
	"testing"

	"github.com/vramkit/vram/account"
	"github.com/vramkit/vram/alloc"
	"github.com/vramkit/vram/device"
	"github.com/vramkit/vram/internal/units"
)

// TestParseAllocConf: good configurations become the managers they say;
// bad ones are refused with an error that names the key at fault.
func TestParseAllocConf(t *testing.T) {
	good := map[string]func(t *testing.T, m *Manager){
		"": func(t *testing.T, m *Manager) {
			if _, ok := m.Account().Allocator().(*alloc.Expandable); !ok {
				t.Errorf("allocator %T; want the Pool kind's default on the simulator, *alloc.Expandable", m.Account().Allocator())
			}
		},
		"kind:pool,expandable:false": func(t *testing.T, m *Manager) {
			if _, ok := m.Account().Allocator().(*alloc.Pool); !ok {
				t.Errorf("allocator %T; want *alloc.Pool", m.Account().Allocator())
			}
		},
		" Kind : pool , expandable : TRUE , release_threshold : 4MiB ": func(t *testing.T, m *Manager) {
			e, ok := m.Account().Allocator().(*alloc.Expandable)
			if !ok || e.Config().ReleaseThreshold != 4*units.MiB {
				t.Errorf("allocator %T; want *alloc.Expandable keeping 4 MiB on Trim", m.Account().Allocator())
			}
		},
		"kind:async,release_threshold:1GiB": func(t *testing.T, m *Manager) {
			a, ok := m.Account().Allocator().(*alloc.AsyncPool)
			if !ok || a.ReleaseThreshold() != units.GiB {
				t.Errorf("allocator %T; want *alloc.AsyncPool keeping 1 GiB", m.Account().Allocator())
			}
		},
		"kind:direct,limit:8MiB": func(t *testing.T, m *Manager) {
			l, ok := m.Account().Allocator().(*alloc.Limit)
			if !ok || l.Cap() != 8*units.MiB {
				t.Errorf("allocator %T; want a Limit of 8 MiB", m.Account().Allocator())
			} else if _, ok := l.Upstream().(*alloc.Direct); !ok {
				t.Errorf("limit over %T; want *alloc.Direct", l.Upstream())
			}
		},
	}
	for conf, check := range good {
		t.Run("good/"+conf, func(t *testing.T) {
			opts, err := ParseAllocConf(conf)
			if err != nil {
				t.Fatal(err)
			}
			m, err := New(newSim(t, 64*MiB), opts...)
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			check(t, m)
		})
	}
	bad := map[string]string{ // configuration → what the error must name
		"kind:pool,expandible:true":        `unknown key "expandible"`,
		"kind:pools":                       `kind "pools"`,
		"kind:expandable":                  "kind:pool,expandable:true",
		"expandable:yes":                   `expandable "yes"`,
		"limit:lots":                       `limit "lots"`,
		"limit:0":                          `limit "0"`,
		"release_threshold:-1":             `release_threshold "-1"`,
		"kind:pool,kind:async":             `key "kind" is given twice`,
		"kind:pool,":                       "empty entry",
		"limit":                            `key "limit" has no value`,
		"kind=pool":                        "separated by ':', not '='; write \"kind:pool\"",
		"kind:pool,limit = 8GiB":           "write \"limit:8GiB\"",
		"kind:async,expandable:true":       "expandable applies to kind pool",
		"kind:direct,release_threshold:1G": "kind direct caches nothing",
		"kind:pool,release_threshold:1GiB": "needs expandable:true",
	}
	for conf, want := range bad {
		t.Run("bad/"+conf, func(t *testing.T) {
			_, err := ParseAllocConf(conf)
			if !errors.Is(err, ErrAllocConf) || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), AllocConfEnv) {
				t.Errorf("ParseAllocConf(%q) = %v; want ErrAllocConf naming %s", conf, err, want)
			}
		})
	}
}

// TestExpandableNeedsVirtualMemory: asking for Expandable on a device
// without virtual memory fails New, saying so.
func TestExpandableNeedsVirtualMemory(t *testing.T) {
	e, err := alloc.Lookup(alloc.NameExpandable)
	if err != nil {
		t.Fatal(err)
	}
	_, err = New(noVMDevice{newSim(t, 64*MiB)}, WithAllocatorChoice(account.ChoiceOf(e)))
	if !errors.Is(err, device.ErrNotSupported) {
		t.Errorf("New with Expandable chosen on a device without virtual memory = %v; want ErrNotSupported", err)
	}
	m, err := New(noVMDevice{newSim(t, 64*MiB)})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if _, ok := m.Account().Allocator().(*alloc.Pool); !ok {
		t.Errorf("default allocator on a device without virtual memory is %T; want *alloc.Pool", m.Account().Allocator())
	}
}

// noVMDevice hides the simulator's virtual memory.
type noVMDevice struct{ device.Device }

// TestReadAllocConf: the configuration reads as one value, an
// account.Choice and a cap, and its options give only what it names (no
// choice when it names no allocator, so an earlier one stands).
func TestReadAllocConf(t *testing.T) {
	expandable, pool := poolEntry(alloc.NameExpandable), poolEntry(alloc.NamePool)
	tests := map[string]struct {
		want    AllocConf
		options int
	}{
		"":            {want: AllocConf{}},
		"limit:8MiB":  {want: AllocConf{Cap: 8 * units.MiB}, options: 1},
		"kind:direct": {want: AllocConf{Allocator: account.Choice{Kind: Direct}, chosen: true}, options: 1},
		"kind:pool,expandable:true,release_threshold:4MiB,limit:1GiB": {want: AllocConf{Allocator: account.Choice{Kind: Pool, Entry: expandable,
			Configs: alloc.Configs{Expandable: alloc.ExpandableConfig{ReleaseThreshold: 4 * units.MiB}}}, Cap: units.GiB, chosen: true}, options: 2},
		"expandable:false": {want: AllocConf{Allocator: account.Choice{Kind: Pool, Entry: pool}, chosen: true}, options: 1},
		"kind:async,release_threshold:0": {want: AllocConf{Allocator: account.Choice{Kind: AsyncPool,
			Configs: alloc.Configs{Async: alloc.AsyncConfig{ReleaseAtSync: true}}}, chosen: true}, options: 1},
	}
	for conf, tc := range tests {
		t.Run(conf, func(t *testing.T) {
			got, err := ReadAllocConf(conf)
			if err != nil {
				t.Fatal(err)
			}
			if got.Allocator.Kind != tc.want.Allocator.Kind || got.Allocator.Entry.Name != tc.want.Allocator.Entry.Name ||
				got.Allocator.Configs != tc.want.Allocator.Configs || got.Cap != tc.want.Cap || got.chosen != tc.want.chosen {
				t.Errorf("ReadAllocConf = %+v; want %+v", got, tc.want)
			}
			if n := len(got.Options()); n != tc.options {
				t.Errorf("%d options; want %d", n, tc.options)
			}
		})
	}
}

// FuzzParseAllocConf: any $VRAM_ALLOC_CONF is read or refused with
// ErrAllocConf, in a message of a line, never a panic.
func FuzzParseAllocConf(f *testing.F) {
	for _, s := range []string{"kind:pool,expandable:true,limit:8GiB,release_threshold:1GiB", "kind=pool", "kind:async,release_threshold:1G", "limit:0", ",", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		opts, err := ParseAllocConf(s)
		if err != nil {
			if !errors.Is(err, ErrAllocConf) {
				t.Fatalf("%q: error %v does not wrap ErrAllocConf", s, err)
			}
			if len(err.Error()) > 1024 { // each of at most three quoted pieces is 40 bytes, escaped up to 4 bytes each
				t.Fatalf("an error of %d bytes for %d bytes", len(err.Error()), len(s))
			}
			return
		}
		var c config
		for _, o := range opts {
			o(&c)
		}
	})
}
