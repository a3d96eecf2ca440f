package main

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/vramkit/vram/alloc"
	"github.com/vramkit/vram/device"
	"github.com/vramkit/vram/internal/units"
)

func TestInfoText(t *testing.T) {
	stdout, stderr, code := cli(t, "", "info", "--device", "sim:vram=1GiB")
	if code != exitOK {
		t.Fatalf("exit %d; stderr:\n%s", code, stderr)
	}
	for _, w := range []string{"device", "sim:0", "memory", "1 GiB total", "granularity", "allocators", "pool", "direct", "async",
		"stream-ordered pool, pinned host memory, 2-D copies, Go kernels"} {
		if !strings.Contains(stdout, w) {
			t.Errorf("info does not show %q:\n%s", w, stdout)
		}
	}
}

func TestInfoJSON(t *testing.T) {
	tests := map[string]struct {
		spec  string
		total uint64
	}{
		"1 GiB":   {"sim:vram=1GiB", units.GiB},
		"256 MiB": {"sim:vram=256MiB", 256 * units.MiB},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			stdout, stderr, code := cli(t, "", "info", "--json", "--device", tc.spec)
			if code != exitOK {
				t.Fatalf("exit %d; stderr:\n%s", code, stderr)
			}
			var rep infoReport
			if err := json.Unmarshal([]byte(stdout), &rep); err != nil {
				t.Fatalf("stdout is not one JSON object: %v\n%s", err, stdout)
			}
			if rep.Spec != tc.spec || rep.Fallback != "" || len(rep.Devices) != 1 {
				t.Fatalf("spec %q, fallback %q, %d devices; want %q, none, 1", rep.Spec, rep.Fallback, len(rep.Devices), tc.spec)
			}
			d := rep.Devices[0]
			if d.Backend != "sim" || d.TotalBytes != tc.total || d.FreeBytes > d.TotalBytes ||
				d.FreeBytes+d.ContextBytes > d.TotalBytes || d.Granularity == 0 || !d.Backed ||
				!d.Copy2D || !d.GoKernels || d.PTXKernels {
				t.Errorf("device %+v: want sim, %d bytes total, free + context ≤ total, a granularity, backed, 2-D copies and Go kernels but no PTX", d, tc.total)
			}
			al := rep.Allocators
			if al.Default != "expandable" || !slices.Equal(al.Kinds, alloc.Names()) || al.Granularity["pool"] != 512 ||
				al.Granularity["expandable"] != 512 || al.Pool.SmallSize == 0 {
				t.Errorf("allocators %+v: want default expandable (the simulator maps pages), every kind, pool and expandable rounding 512 and the pool's config", al)
			}
			if !al.AsyncKeepsAll || al.AsyncReleaseThreshold != 0 {
				t.Errorf("async pool: keeps all %v, threshold %d; want it to keep all freed memory by default", al.AsyncKeepsAll, al.AsyncReleaseThreshold)
			}
			// The JSON names are snake_case throughout.
			for _, key := range []string{`"small_size_bytes"`, `"max_medium_segment_bytes"`, `"async_keeps_all_freed": true`, `"context_bytes"`} {
				if !strings.Contains(stdout, key) {
					t.Errorf("info --json lacks %s:\n%s", key, stdout)
				}
			}
			if len(al.Unavailable) != 0 {
				t.Errorf("the simulator runs every allocator, but info says %v", al.Unavailable)
			}
		})
	}
}

// TestInfoAutoSaysWhy checks that auto names its reason for using the
// simulator, when it does.
func TestInfoAutoSaysWhy(t *testing.T) {
	stdout, stderr, code := cli(t, "", "info", "--json", "--device", "auto")
	if code != exitOK {
		t.Fatalf("exit %d; stderr:\n%s", code, stderr)
	}
	var rep infoReport
	if err := json.Unmarshal([]byte(stdout), &rep); err != nil {
		t.Fatal(err)
	}
	if rep.Devices[0].Backend == "sim" && rep.Fallback == "" {
		t.Errorf("auto chose the simulator without saying why: %+v", rep)
	}
	if rep.Devices[0].Backend == "cuda" && rep.Fallback != "" {
		t.Errorf("auto chose CUDA but reports a fallback: %q", rep.Fallback)
	}
}

// TestInfoNoCUDA checks that asking for CUDA where there is none fails
// with exit 1 and names the driver library that would not load.
func TestInfoNoCUDA(t *testing.T) {
	if dev, err := device.Open("cuda"); err == nil {
		dev.Close()
		t.Skip("a CUDA device is present; this test needs a machine without one")
	}
	stdout, stderr, code := cli(t, "", "info", "--device", "cuda")
	if code != exitFailure {
		t.Errorf("exit %d, want %d; stderr:\n%s", code, exitFailure, stderr)
	}
	if stdout != "" {
		t.Errorf("stdout not empty:\n%s", stdout)
	}
	if !strings.Contains(stderr, "libcuda.so.1") || !strings.Contains(stderr, "--device sim") {
		t.Errorf("stderr does not name the driver library:\n%s", stderr)
	}
}

// TestInfoAllocConf: info shows the allocator $VRAM_ALLOC_CONF configures,
// as vram run would use it, and refuses a bad value before it prints
// anything, in one line naming the variable and the key.
func TestInfoAllocConf(t *testing.T) {
	for name, tc := range map[string]struct {
		conf     string
		code     int
		wantDef  string // the default the JSON names
		wantCap  uint64
		wantText string // in the text, or in the error
	}{
		"unset":          {code: exitOK, wantDef: "expandable", wantText: "(default expandable)"},
		"direct":         {conf: "kind:direct", code: exitOK, wantDef: "direct", wantText: `(direct as $VRAM_ALLOC_CONF "kind:direct" sets it)`},
		"segment pool":   {conf: "kind:pool,expandable:false,limit:256MiB", code: exitOK, wantDef: "pool", wantCap: 256 * units.MiB, wantText: "sets it, capped at 256 MiB)"},
		"a bad kind":     {conf: "kind:bogus", code: exitUsage, wantText: `VRAM_ALLOC_CONF "kind:bogus": kind "bogus": want pool, direct, async`},
		"an unknown key": {conf: "kind:pool,expandible:true", code: exitUsage, wantText: `unknown key "expandible"`},
	} {
		t.Run(name, func(t *testing.T) {
			t.Setenv("VRAM_ALLOC_CONF", tc.conf)
			stdout, stderr, code := cli(t, "", "info", "--device", "sim:vram=1GiB")
			if code != tc.code {
				t.Fatalf("exit %d, want %d; stderr:\n%s", code, tc.code, stderr)
			}
			if tc.code != exitOK {
				if stdout != "" || !strings.Contains(stderr, tc.wantText) || strings.Count(strings.TrimSpace(stderr), "\n") != 1 {
					t.Errorf("stdout %q, stderr %q; want nothing printed and one error line (and the usage hint) saying %q", stdout, stderr, tc.wantText)
				}
				return
			}
			if !strings.Contains(stdout, tc.wantText) {
				t.Errorf("info does not say %q:\n%s", tc.wantText, stdout)
			}
			stdout, stderr, code = cli(t, "", "info", "--json", "--device", "sim:vram=1GiB")
			var rep infoReport
			if code != exitOK || json.Unmarshal([]byte(stdout), &rep) != nil {
				t.Fatalf("info --json: exit %d, stdout %q, stderr %q", code, stdout, stderr)
			}
			if al := rep.Allocators; al.Default != tc.wantDef || al.CapBytes != tc.wantCap || al.Conf != tc.conf {
				t.Errorf("allocators: default %q, cap %d, conf %q; want %q, %d, %q", al.Default, al.CapBytes, al.Conf, tc.wantDef, tc.wantCap, tc.conf)
			}
		})
	}
}
