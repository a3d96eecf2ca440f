package main

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/vramkit/vram"
	"github.com/vramkit/vram/device/sim"
)

// TestManagerAllocOptions: vram run's manager takes its allocator from
// $VRAM_ALLOC_CONF unless --allocator is given, and --allocator pool is the
// segment Pool and expandable Expandable, as in replay and bench.
func TestManagerAllocOptions(t *testing.T) {
	tests := map[string]struct {
		flag string // "": not given
		env  string
		want string // the manager's allocator, %T
	}{
		"default":                       {"", "", "*alloc.Expandable"},
		"flag pool":                     {"pool", "", "*alloc.Pool"},
		"flag expandable":               {"expandable", "", "*alloc.Expandable"},
		"flag direct":                   {"direct", "", "*alloc.Direct"},
		"flag async":                    {"async", "", "*alloc.AsyncPool"},
		"env direct":                    {"", "kind:direct", "*alloc.Direct"},
		"env segment pool":              {"", "kind:pool,expandable:false", "*alloc.Pool"},
		"env async":                     {"", "kind:async,release_threshold:0", "*alloc.AsyncPool"},
		"flag wins over env":            {"direct", "kind:async", "*alloc.Direct"},
		"flag pool wins over env":       {"pool", "kind:pool,expandable:true", "*alloc.Pool"},
		"flag expandable wins over env": {"expandable", "kind:pool,expandable:false", "*alloc.Expandable"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Setenv(vram.AllocConfEnv, tc.env)
			opts, err := managerAllocOptions(tc.flag)
			if err != nil {
				t.Fatalf("managerAllocOptions: %v", err)
			}
			dev, err := sim.New(sim.Config{TotalBytes: 64 << 20, AddressOnly: true, NoContext: true})
			if err != nil {
				t.Fatal(err)
			}
			defer dev.Close()
			m, err := vram.New(dev, opts...)
			if err != nil {
				t.Fatalf("vram.New: %v", err)
			}
			defer m.Close()
			if got := fmt.Sprintf("%T", m.Account().Allocator()); got != tc.want {
				t.Errorf("allocator %s; want %s", got, tc.want)
			}
		})
	}
}

// TestRunAllocConf: vram run honours $VRAM_ALLOC_CONF, and a bad one is a
// usage error that names the bad key.
func TestRunAllocConf(t *testing.T) {
	tests := map[string]struct {
		env, want string // want: the report's allocator, or a substring of stderr
		code      int
	}{
		"direct":      {"kind:direct", "direct", exitOK},
		"async":       {"kind:async", "async", exitOK},
		"unknown key": {"kind:pool,expandible:true", `unknown key "expandible"`, exitUsage},
		"bad value":   {"limit:lots", `limit "lots": want a size`, exitUsage},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Setenv(vram.AllocConfEnv, tc.env)
			stdout, stderr, code := cli(t, "", append([]string{"run", "--json"}, smallRun...)...)
			if code != tc.code {
				t.Fatalf("exit %d, want %d; stderr:\n%s", code, tc.code, stderr)
			}
			if tc.code != exitOK {
				if !strings.Contains(stderr, tc.want) || !strings.Contains(stderr, vram.AllocConfEnv) {
					t.Errorf("stderr does not name %s and %q:\n%s", vram.AllocConfEnv, tc.want, stderr)
				}
				return
			}
			var r runReport
			if err := json.Unmarshal([]byte(stdout), &r); err != nil {
				t.Fatalf("stdout is not one JSON object: %v\n%s", err, stdout)
			}
			if r.Allocator != tc.want {
				t.Errorf("allocator %q; want %q", r.Allocator, tc.want)
			}
		})
	}
}
