package main

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/vramkit/vram/alloc"
	"github.com/vramkit/vram/device"
	"github.com/vramkit/vram/device/sim"
	"github.com/vramkit/vram/internal/units"
	"github.com/vramkit/vram/trace"
)

func TestReplaySummary(t *testing.T) {
	tests := map[string]struct {
		args    []string
		reports int // memory reports in the text
	}{
		"with --summary":    {args: []string{"replay", "--summary", smallTrace}, reports: len(alloc.Names())}, // one per allocator
		"without --summary": {args: []string{"replay", smallTrace}, reports: 0},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			stdout, stderr, code := cli(t, "", tc.args...)
			if code != exitOK {
				t.Fatalf("exit %d; stderr:\n%s", code, stderr)
			}
			if got := strings.Count(stdout, "memory report"); got != tc.reports {
				t.Errorf("%d memory reports, want %d:\n%s", got, tc.reports, stdout)
			}
			if tc.reports > 0 {
				for _, w := range []string{"pool at its peak of reserved bytes", "largest free block", "fragmentation", "segments", "out of memory"} {
					if !strings.Contains(stdout, w) {
						t.Errorf("output does not contain %q:\n%s", w, stdout)
					}
				}
			}
			stdout, stderr, code = cli(t, "", append([]string{tc.args[0], "--json"}, tc.args[1:]...)...)
			if code != exitOK {
				t.Fatalf("--json: exit %d; stderr:\n%s", code, stderr)
			}
			var rows []replayRow
			if err := json.Unmarshal([]byte(stdout), &rows); err != nil {
				t.Fatal(err)
			}
			for _, r := range rows {
				s := r.Summary
				if (s != nil) != (tc.reports > 0) {
					t.Fatalf("%s: summary %+v, want one only with --summary", r.Allocator, s)
				}
				if s == nil {
					continue
				}
				if s.ReservedBytes != r.PeakReservedBytes || s.InUseBytes > r.PeakInUseBytes || s.LargestFreeBytes > s.CachedBytes ||
					s.Fragmentation < 0 || s.Fragmentation >= 1 || s.LayoutKnown != (r.Allocator != "async") {
					t.Errorf("%s: summary %+v does not fit the row (peak reserved %d, peak in use %d)",
						r.Allocator, s, r.PeakReservedBytes, r.PeakInUseBytes)
				}
			}
		})
	}
}

// TestPeakWatch: the report kept is at the peak of reserved bytes, at
// the moment of that peak with the most in use.
func TestPeakWatch(t *testing.T) {
	dev, err := sim.New(sim.Config{TotalBytes: 64 * units.MiB, AddressOnly: true, NoContext: true})
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Close()
	p, err := alloc.NewPool(dev, alloc.PoolConfig{})
	if err != nil {
		t.Fatal(err)
	}
	w := &peakWatch{Allocator: p}
	defer w.Close()
	s := dev.DefaultStream()
	const kib = units.KiB
	var ptrs []device.Ptr
	for _, n := range []uint64{512 * kib, 512 * kib, 0, 256 * kib} { // 0: free the first
		if n == 0 {
			if err := w.Free(ptrs[0], s); err != nil {
				t.Fatal(err)
			}
			continue
		}
		ptr, err := w.Alloc(n, s)
		if err != nil {
			t.Fatal(err)
		}
		ptrs = append(ptrs, ptr)
	}
	r := w.report(trace.Result{Final: p.Stats()})
	if r == nil || r.Reserved != 2*units.MiB || r.InUse != units.MiB || r.LargestFree != units.MiB || r.Allocs != 2 {
		t.Fatalf("report %+v: want 2 MiB reserved, 1 MiB in use and free in one block, after 2 allocs", r)
	}
}

func TestRunVerbosePrintsMemoryReport(t *testing.T) {
	tests := map[string]struct {
		args []string
		want bool
	}{
		"-v":      {args: []string{"run", "-v", "--device", "sim:vram=64MiB", "--runs", "100", "--steps", "4"}, want: true},
		"without": {args: []string{"run", "--device", "sim:vram=64MiB", "--runs", "100", "--steps", "4"}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			_, stderr, code := cli(t, "", tc.args...)
			if code != exitOK {
				t.Fatalf("exit %d; stderr:\n%s", code, stderr)
			}
			// The Pool kind is the expandable allocator on the simulator.
			got := strings.Contains(stderr, "expandable memory report") && strings.Contains(stderr, "inputs#")
			if got != tc.want {
				t.Errorf("stderr shows the memory report and clients: %v, want %v:\n%s", got, tc.want, stderr)
			}
		})
	}
}
