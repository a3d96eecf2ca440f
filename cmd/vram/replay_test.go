package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vramkit/vram/alloc"
	"github.com/vramkit/vram/internal/sharedtraces"
	"github.com/vramkit/vram/internal/units"
	"github.com/vramkit/vram/trace"
)

// smallTrace is minimalloc's benchmark A (google/minimalloc,
// benchmarks/challenging/A.1048576.csv) as an RMM log: 154 buffers, each
// allocated and freed once, 308 events, whose offline placement fits in
// 1 MiB.
const smallTrace = "testdata/minimalloc_A.csv"

func TestReplayJSON(t *testing.T) {
	events, err := trace.ReadFile(smallTrace)
	if err != nil {
		t.Fatal(err)
	}
	sum := trace.Summarize(events)
	stdout, stderr, code := cli(t, "", "replay", "--json", smallTrace)
	if code != exitOK {
		t.Fatalf("exit %d; stderr:\n%s", code, stderr)
	}
	// Decode loosely first, to check the field names themselves.
	var raw []map[string]any
	if err := json.Unmarshal([]byte(stdout), &raw); err != nil {
		t.Fatalf("stdout is not a JSON array: %v\n%s", err, stdout)
	}
	for _, obj := range raw {
		for _, k := range []string{"allocator", "events", "peak_live_bytes", "peak_reserved_bytes", "device_allocs",
			"device_frees", "failed_allocs", "events_per_second", "page_bytes", "floor_pages", "peak_reserved_pages"} {
			if _, ok := obj[k]; !ok {
				t.Errorf("row %v lacks %q", obj, k)
			}
		}
	}
	var rows []replayRow
	if err := json.Unmarshal([]byte(stdout), &rows); err != nil {
		t.Fatal(err)
	}
	if len(rows) != len(alloc.Names()) {
		t.Fatalf("%d rows, want one per allocator (%v)", len(rows), alloc.Names())
	}
	byName := map[string]replayRow{}
	for i, r := range rows {
		if r.Allocator != alloc.Names()[i] {
			t.Errorf("row %d is %q, want %q", i, r.Allocator, alloc.Names()[i])
		}
		byName[r.Allocator] = r
		switch {
		case r.Events != 308 || r.Allocs != 154 || r.Frees != 154:
			t.Errorf("%s: %d events, %d allocs, %d frees; want 308, 154, 154", r.Allocator, r.Events, r.Allocs, r.Frees)
		case r.PeakLiveBytes != sum.PeakLive:
			t.Errorf("%s: peak live %d, the trace's is %d", r.Allocator, r.PeakLiveBytes, sum.PeakLive)
		case r.PeakReservedBytes < r.PeakLiveBytes || r.ReservedOverLive < 1:
			t.Errorf("%s: peak reserved %d below peak live %d", r.Allocator, r.PeakReservedBytes, r.PeakLiveBytes)
		case r.DeviceAllocs == 0 || r.FailedAllocs != 0 || r.EventsPerSecond <= 0 || r.UnmatchedFrees != 0:
			t.Errorf("%s: %+v", r.Allocator, r)
		case r.Trace != "minimalloc_A.csv":
			t.Errorf("trace %q", r.Trace)
		}
	}
	// Direct makes a device call per event; the pools cache.
	if d, p := byName["direct"], byName["pool"]; d.DeviceAllocs != 154 || d.DeviceFrees != 154 || p.DeviceAllocs >= d.DeviceAllocs || p.CacheHits == 0 {
		t.Errorf("direct %d/%d device allocs/frees (want 154 each); pool %d device allocs, %d cache hits",
			d.DeviceAllocs, d.DeviceFrees, p.DeviceAllocs, p.CacheHits)
	}
}

func TestReplaySmallDeviceFails(t *testing.T) {
	stdout, stderr, code := cli(t, "", "replay", "--json", "--allocator", "direct, pool", "--vram", "8MiB", smallTrace)
	if code != exitOK {
		t.Fatalf("exit %d; stderr:\n%s", code, stderr)
	}
	var rows []replayRow
	if err := json.Unmarshal([]byte(stdout), &rows); err != nil {
		t.Fatal(err)
	}
	if len(rows) != 2 || rows[0].Allocator != "direct" || rows[1].Allocator != "pool" {
		t.Fatalf("rows %+v: want direct then pool", rows)
	}
	// Direct spends a 2 MiB page on every block: 4 fit in 8 MiB, and the
	// trace has far more live at once.
	if rows[0].FailedAllocs == 0 || rows[0].DeviceBytes != 8<<20 {
		t.Errorf("direct on 8 MiB: %d failed allocations on a %d-byte device; want some on 8 MiB", rows[0].FailedAllocs, rows[0].DeviceBytes)
	}
	if rows[1].FailedAllocs != 0 {
		t.Errorf("pool on 8 MiB: %d failed allocations; the trace needs about 1 MiB", rows[1].FailedAllocs)
	}
}

// TestReplayHeaderShowsTracePeak checks that the text header gives the
// trace's own peak of live bytes, not that of the first allocator's
// replay, which is lower when it refuses allocations.
func TestReplayHeaderShowsTracePeak(t *testing.T) {
	events, err := trace.ReadFile(smallTrace)
	if err != nil {
		t.Fatal(err)
	}
	want := trace.Summarize(events).PeakLive
	args := []string{"replay", "--allocator", "direct,pool", "--vram", "8MiB", smallTrace}
	stdout, stderr, code := cli(t, "", args...)
	if code != exitOK {
		t.Fatalf("exit %d; stderr:\n%s", code, stderr)
	}
	head := fmt.Sprintf("minimalloc_A.csv: 308 events, peak live %s (floor: 1 page of 2 MiB),", units.Format(want))
	if !strings.Contains(stdout, head) {
		t.Errorf("header does not give the trace's peak live %d bytes (%q):\n%s", want, head, stdout)
	}
	stdout, stderr, code = cli(t, "", append([]string{"--json"}, args...)...)
	if code != exitOK {
		t.Fatalf("exit %d; stderr:\n%s", code, stderr)
	}
	var rows []replayRow
	if err := json.Unmarshal([]byte(stdout), &rows); err != nil {
		t.Fatal(err)
	}
	// Direct refuses some allocations on 8 MiB, so its replay peaks
	// lower than the trace; both rows carry the trace's peak.
	if len(rows) != 2 || rows[0].FailedAllocs == 0 || rows[0].PeakLiveBytes >= want {
		t.Fatalf("rows %+v: want direct to refuse allocations and peak below the trace's %d bytes", rows, want)
	}
	for _, r := range rows {
		if r.TracePeakLiveBytes != want {
			t.Errorf("%s: trace_peak_live_bytes %d, want %d", r.Allocator, r.TracePeakLiveBytes, want)
		}
	}
}

// TestReplayFloor: every replay row gives the simulated device's page,
// the floor (the pages the trace's peak live bytes need) and its own peak
// in pages, in --json and beside each allocator in the table. The trace
// peaks at 5 MiB + 1.2 MiB live, four pages of 2 MiB, which Expandable
// maps: the 3 MiB block fits where the 5 MiB one was.
func TestReplayFloor(t *testing.T) {
	path := filepath.Join(t.TempDir(), "floor.csv")
	log := trace.Header + "\n" +
		"0,0,allocate,0x1000,5242880,0\n" +
		"0,1,allocate,0x2000,1258496,0\n" +
		"0,2,free,0x1000,5242880,0\n" +
		"0,3,allocate,0x3000,3146240,0\n"
	if err := os.WriteFile(path, []byte(log), 0o644); err != nil {
		t.Fatal(err)
	}
	stdout, stderr, code := cli(t, "", "replay", "--json", path)
	if code != exitOK {
		t.Fatalf("exit %d; stderr:\n%s", code, stderr)
	}
	var rows []replayRow
	if err := json.Unmarshal([]byte(stdout), &rows); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{}
	for _, r := range rows {
		if r.PageBytes != 2*units.MiB || r.FloorPages != 4 {
			t.Errorf("%s: page %d bytes, floor %d pages; want 2 MiB and 4", r.Allocator, r.PageBytes, r.FloorPages)
		}
		if pages := (r.PeakReservedBytes + r.PageBytes - 1) / r.PageBytes; r.PeakReservedPages != pages || pages < r.FloorPages {
			t.Errorf("%s: peak reserved %d bytes in %d pages; want ⌈bytes / page⌉ = %d, at least the floor",
				r.Allocator, r.PeakReservedBytes, r.PeakReservedPages, pages)
		}
		want[r.Allocator] = fmt.Sprintf("%d (+%d)", r.PeakReservedPages, r.PeakReservedPages-r.FloorPages)
	}
	if len(rows) != len(alloc.Names()) || want["expandable"] != "4 (+0)" {
		t.Errorf("rows %v; want one per allocator, Expandable at the floor, 4 (+0)", want)
	}
	text, stderr, code := cli(t, "", "replay", path)
	if code != exitOK {
		t.Fatalf("exit %d; stderr:\n%s", code, stderr)
	}
	if !strings.Contains(text, "(floor: 4 pages of 2 MiB)") || !strings.Contains(text, "PAGES (OVER FLOOR)") {
		t.Errorf("the header or the table lacks the floor:\n%s", text)
	}
	for kind, cell := range want {
		if !strings.Contains(text, cell) {
			t.Errorf("%s's row lacks its pages %q:\n%s", kind, cell, text)
		}
	}
}

func TestReplayText(t *testing.T) {
	stdout, stderr, code := cli(t, "", "replay", smallTrace, smallTrace)
	if code != exitOK {
		t.Fatalf("exit %d; stderr:\n%s", code, stderr)
	}
	if got := strings.Count(stdout, "ALLOCATOR"); got != 2 {
		t.Errorf("%d tables for two traces:\n%s", got, stdout)
	}
	for _, w := range []string{"minimalloc_A.csv: 308 events", "PEAK RESERVED", "RESERVED/LIVE", "direct", "pool", "async"} {
		if !strings.Contains(stdout, w) {
			t.Errorf("output does not contain %q:\n%s", w, stdout)
		}
	}
}

func TestReplayPlot(t *testing.T) {
	tests := map[string]struct {
		file  string
		magic []byte
	}{
		"png": {"replay.png", []byte("\x89PNG\r\n\x1a\n")},
		"svg": {"replay.SVG", []byte("<svg")},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), tc.file)
			stdout, stderr, code := cli(t, "", "replay", "--plot", path, smallTrace)
			if code != exitOK {
				t.Fatalf("exit %d; stderr:\n%s", code, stderr)
			}
			data, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Contains(data[:min(len(data), 512)], tc.magic) || len(data) < 1000 {
				t.Errorf("%s: %d bytes that do not look like %s", path, len(data), name)
			}
			if !strings.Contains(stdout, "plot: "+path) {
				t.Errorf("output does not name the plot:\n%s", stdout)
			}
		})
	}
}

func TestReplayErrors(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.csv")
	if err := os.WriteFile(bad, []byte("Thread,Time,Action,Pointer,Size,Stream\n0,0.0,allocate,0x10,notasize,0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	empty := filepath.Join(dir, "empty.csv")
	if err := os.WriteFile(empty, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	headerOnly := filepath.Join(dir, "header.csv")
	if err := os.WriteFile(headerOnly, []byte(trace.Header+"\n\n# nothing\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := map[string]struct {
		args []string
		code int
		want string
	}{
		"no trace":      {nil, exitUsage, "needs at least one TRACE.csv"},
		"bad allocator": {[]string{"--allocator", "pool,slab", smallTrace}, exitUsage, `--allocator "slab": want direct (or default), pool`},
		"no allocator":  {[]string{"--allocator", ",", smallTrace}, exitUsage, "names no allocator"},
		"bad vram":      {[]string{"--vram", "0", smallTrace}, exitUsage, `--vram "0"`},
		"vram below a page": {[]string{"--vram", "1MiB", smallTrace}, exitUsage,
			"--vram 1MiB: want at least 2 MiB, one page of the simulated device"},
		"empty file": {[]string{empty}, exitFailure,
			empty + " is empty: want an RMM logging CSV, the header Thread,Time,Action,Pointer,Size,Stream"},
		"header only":    {[]string{headerOnly}, exitFailure, headerOnly + " holds no allocation events"},
		"bad device":     {[]string{"--device", "bogus", smallTrace}, exitUsage, `--device "bogus": unknown backend "bogus"`},
		"bad sim option": {[]string{"--device", "sim:colour=red", smallTrace}, exitUsage, `unknown sim option "colour"`},
		"plot format":    {[]string{"--plot", filepath.Join(dir, "x.gif"), smallTrace}, exitUsage, ".png or .svg"},
		"plot two":       {[]string{"--plot", filepath.Join(dir, "x.png"), smallTrace, smallTrace}, exitUsage, "one trace"},
		"missing file":   {[]string{filepath.Join(dir, "none.csv")}, exitFailure, "none.csv"},
		"malformed line": {[]string{bad}, exitFailure, "notasize"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			stdout, stderr, code := cli(t, "", append([]string{"replay", "--json"}, tc.args...)...)
			if code != tc.code {
				t.Errorf("exit %d, want %d; stderr:\n%s", code, tc.code, stderr)
			}
			if stdout != "" {
				t.Errorf("stdout not empty:\n%s", stdout)
			}
			if !strings.Contains(stderr, tc.want) {
				t.Errorf("stderr does not contain %q:\n%s", tc.want, stderr)
			}
		})
	}
}

// streamsTrace writes a log of n allocations, each on a stream of its
// own, and returns its path.
func streamsTrace(t *testing.T, n int) string {
	t.Helper()
	events := make([]trace.Event, 0, 2*n)
	for i := range n {
		p := uint64(i+1) << 12
		events = append(events,
			trace.Event{Action: trace.Allocate, Pointer: p, Size: 4096, Stream: uint64(i + 1)},
			trace.Event{Action: trace.Free, Pointer: p, Size: 4096, Stream: uint64(i + 1)})
	}
	path := filepath.Join(t.TempDir(), "streams.csv")
	if err := trace.WriteFile(path, events); err != nil {
		t.Fatal(err)
	}
	return path
}

// A log of 200,000 distinct streams is refused with an error that says
// why (it once ran for minutes, quadratic in the streams); one of 60,000
// replays.
func TestReplayManyStreams(t *testing.T) {
	_, stderr, code := cli(t, "", "replay", streamsTrace(t, 200000))
	if code != exitFailure || !strings.Contains(stderr, "200000 distinct streams, more than the 65536") {
		t.Errorf("exit %d, stderr %q: want the log refused for its streams", code, stderr)
	}
	stdout, stderr, code := cli(t, "", "replay", "--json", "--allocator", "direct", streamsTrace(t, 60000))
	if code != exitOK || !strings.Contains(stdout, `"allocs": 60000`) {
		t.Errorf("60,000 streams: exit %d, stderr %q, stdout %.200q", code, stderr, stdout)
	}
}

// Under a cancelled context replay stops at once: reading the file, and
// the replay itself, look at the context (the replay stops within 256
// allocator calls of a cancellation; trace.TestReplayCancel counts them).
func TestReplayCancelled(t *testing.T) {
	path := streamsTrace(t, 1000)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	var out, errb bytes.Buffer
	code := runContext(ctx, []string{"replay", path}, strings.NewReader(""), &out, &errb)
	if code == exitOK || !strings.Contains(errb.String(), "read trace: "+path+": stopped before its end: context canceled") || strings.Contains(out.String(), "direct") {
		t.Errorf("cancelled replay: exit %d, stdout %q, stderr %q; want it stopped, naming the trace, with context canceled", code, out.String(), errb.String())
	}
	r := ctxReader{ctx, strings.NewReader("data")}
	if n, err := r.Read(make([]byte, 4)); n != 0 || !errors.Is(err, context.Canceled) {
		t.Errorf("ctxReader under a cancelled context read %d bytes, %v", n, err)
	}
}

// TestReplaySnapshotInput replays a PyTorch snapshot and checks its
// events and PyTorch's figures against the CSV made from it and the
// traces' README.
func TestReplaySnapshotInput(t *testing.T) {
	pickle := filepath.Join(sharedtraces.Dir(t), "W_medium_512_training.pickle")
	if _, err := os.Stat(pickle); err != nil {
		t.Skipf("no snapshot: %v", err)
	}
	stdout, stderr, code := cli(t, "", "replay", "--json", "--allocator", "pool", pickle)
	if code != exitOK {
		t.Fatalf("exit %d; stderr:\n%s", code, stderr)
	}
	var rows []replayRow
	if err := json.Unmarshal([]byte(stdout), &rows); err != nil {
		t.Fatal(err)
	}
	if len(rows) != 1 || rows[0].PyTorch == nil {
		t.Fatalf("want one row with PyTorch's figures, got %s", stdout)
	}
	r, p := rows[0], rows[0].PyTorch
	if r.Events != 15625 || r.TracePeakLiveBytes != 12428595208 || p.LiveAtStartBlocks != 664 {
		t.Errorf("%d events, peak live %d, %d live at start; want the CSV's 15625, 12428595208, 664",
			r.Events, r.TracePeakLiveBytes, p.LiveAtStartBlocks)
	}
	if p.PeakReservedBytes != 12660506624 || p.Segments != 400 || fmt.Sprintf("%.3f", p.ReservedOverLive) != "1.018" {
		t.Errorf("PyTorch peak reserved %d, %d segments, ratio %.3f; want 12660506624, 400, 1.018",
			p.PeakReservedBytes, p.Segments, p.ReservedOverLive)
	}
	text, _, code := cli(t, "", "replay", "--allocator", "pool", pickle)
	if code != exitOK || !strings.Contains(text, "pytorch (recorded)") {
		t.Errorf("exit %d; the table lacks PyTorch's row:\n%s", code, text)
	}
}

// TestReplaySnapshotOut writes a replay as a PyTorch snapshot and has
// Python's pickle check it.
func TestReplaySnapshotOut(t *testing.T) {
	python, pyErr := exec.LookPath("python3")
	// The first allocator named is recorded; Expandable's page maps are
	// recorded as PyTorch's expandable segments.
	for _, allocators := range []string{"pool,direct", "expandable"} {
		t.Run(allocators, func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "replay.pickle")
			_, stderr, code := cli(t, "", "replay", "--allocator", allocators, "--snapshot-out", out, smallTrace)
			if code != exitOK {
				t.Fatalf("exit %d; stderr:\n%s", code, stderr)
			}
			snap, err := trace.ReadSnapshotFile(out)
			if err != nil {
				t.Fatal(err)
			}
			if s := trace.Summarize(snap.Events); s.Allocs != 154 || s.Frees != 154 {
				t.Errorf("the snapshot holds %d allocs and %d frees, want the trace's 154 and 154", s.Allocs, s.Frees)
			}
			if pyErr != nil {
				t.Skipf("python3 not found (%v): the pickle was not checked by Python", pyErr)
			}
			// The allocators keep memory cached after the last free: the
			// check finds it as segments.
			check := filepath.Join("..", "..", "trace", "testdata", "check_snapshot.py")
			if b, err := exec.Command(python, check, out, "154", "154").CombinedOutput(); err != nil {
				t.Fatalf("python3 %s: %v\n%s", check, err, b)
			}
		})
	}
}

// TestReplaySnapshotOutRefused refuses a --snapshot-out (or a --plot)
// that cannot be written, or not without destroying a file: the trace
// itself (by its name, another name or a link), a directory, a device.
// The trace is left as it was.
func TestReplaySnapshotOutRefused(t *testing.T) {
	dir := t.TempDir()
	tr := filepath.Join(dir, "trace.csv")
	orig, err := os.ReadFile(smallTrace)
	must(t, err)
	must(t, os.WriteFile(tr, orig, 0o644))
	link := filepath.Join(dir, "link.pickle")
	must(t, os.Symlink("trace.csv", link))
	svg := filepath.Join(dir, "trace.svg")
	must(t, os.WriteFile(svg, orig, 0o644))
	tests := map[string]struct {
		args []string
		want string
	}{
		"two traces":         {[]string{"--snapshot-out", filepath.Join(t.TempDir(), "a.pickle"), smallTrace, smallTrace}, "one trace"},
		"no such folder":     {[]string{"--snapshot-out", filepath.Join(t.TempDir(), "missing", "a.pickle"), smallTrace}, "does not exist"},
		"the trace":          {[]string{"--snapshot-out", tr, tr}, "is the input"},
		"the trace, renamed": {[]string{"--snapshot-out", filepath.Join(dir, ".", "trace.csv"), tr}, "is the input"},
		"a link to it":       {[]string{"--snapshot-out", link, tr}, "is the input"},
		"a directory":        {[]string{"--snapshot-out", dir, tr}, "not a regular file"},
		"a device":           {[]string{"--snapshot-out", os.DevNull, tr}, "not a regular file"},
		"--plot the trace":   {[]string{"--plot", svg, svg}, "is the input"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			_, stderr, code := cli(t, "", append([]string{"replay"}, tc.args...)...)
			if code != exitUsage || !strings.Contains(stderr, tc.want) {
				t.Errorf("exit %d, want %d saying %q; stderr:\n%s", code, exitUsage, tc.want, stderr)
			}
			for _, p := range []string{tr, svg} {
				if b, err := os.ReadFile(p); err != nil || !bytes.Equal(b, orig) {
					t.Errorf("%s after the refused replay: %d bytes (%v), want it as it was", p, len(b), err)
				}
			}
		})
	}
}
