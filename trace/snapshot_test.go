package trace_test

import (
	"bytes"
	"errors"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	ogorek "github.com/kisielk/og-rek"

	"github.com/vramkit/vram/internal/sharedtraces"
	"github.com/vramkit/vram/trace"
)

// TestReadSnapshotMatchesCSV reads the original PyTorch snapshots of the
// shared traces and checks them against the CSVs converted from them and
// the figures docs/command.md gives of what PyTorch reserved.
func TestReadSnapshotMatchesCSV(t *testing.T) {
	dir := sharedtraces.Dir(t)
	tests := map[string]struct {
		liveAtStart  int
		peakReserved uint64
		segments     int
		peakAlloc    uint64
	}{
		"W_medium_512_training": {liveAtStart: 664, peakReserved: 12660506624, segments: 400, peakAlloc: 12435476996},
		"k_fullstep":            {liveAtStart: 324, peakReserved: 61111009280, segments: 1010, peakAlloc: 55078640128},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			pickle := filepath.Join(dir, name+".pickle")
			if _, err := os.Stat(pickle); err != nil {
				t.Skipf("no snapshot: %v", err)
			}
			snap, err := trace.ReadSnapshotFile(pickle)
			if err != nil {
				t.Fatal(err)
			}
			want, err := trace.ReadFile(filepath.Join(dir, name+".csv"))
			if err != nil {
				t.Fatal(err)
			}
			got := snap.Events
			if len(got) != len(want) {
				t.Fatalf("%d events, the CSV has %d", len(got), len(want))
			}
			for i := range want {
				g, w := got[i], want[i]
				if g.Action != w.Action || g.Size != w.Size || g.Pointer != w.Pointer || g.Stream != w.Stream {
					t.Fatalf("event %d: %v, the CSV has %v", i, g, w)
				}
				if d := g.Time - w.Time; d > 1e-9 || d < -1e-9 {
					t.Fatalf("event %d at %v s, the CSV at %v s", i, g.Time, w.Time)
				}
			}
			if g, w := trace.PeakLive(got), trace.PeakLive(want); g != w {
				t.Errorf("peak live %d, the CSV's %d", g, w)
			}
			if snap.LiveAtStart != tc.liveAtStart {
				t.Errorf("%d blocks live at start, want %d", snap.LiveAtStart, tc.liveAtStart)
			}
			p := snap.PyTorch
			if p.PeakReserved != tc.peakReserved || p.Segments != tc.segments || p.PeakAllocated != tc.peakAlloc {
				t.Errorf("PyTorch peak reserved %d, segments %d, peak allocated %d; want %d, %d, %d",
					p.PeakReserved, p.Segments, p.PeakAllocated, tc.peakReserved, tc.segments, tc.peakAlloc)
			}
		})
	}
}

func TestReadSnapshotRefusesOtherInput(t *testing.T) {
	tests := map[string][]byte{
		"csv":        []byte(trace.Header + "\n0,0,allocate,0x10,8,0\n"),
		"not a dict": {0x80, 0x02, 'K', 0x07, '.'}, // the int 7
		"empty dict": {0x80, 0x02, '}', '.'},       // {}
		"truncated":  {0x80, 0x04, 0x95},           // a frame cut short
	}
	for name, in := range tests {
		t.Run(name, func(t *testing.T) {
			_, err := trace.ReadSnapshot(bytes.NewReader(in))
			if !errors.Is(err, trace.ErrSnapshot) {
				t.Fatalf("err %v, want ErrSnapshot", err)
			}
		})
	}
}

// TestReadSnapshotRefusesHugeSizes: sizes each below 2^63 that add up
// past it (a segment's and a segment_free's) are refused, not walked back
// through in wrapping int64 (PyTorch's figures once read 0 reserved at
// start for a snapshot that held 2^64−2 bytes).
func TestReadSnapshotRefusesHugeSizes(t *testing.T) {
	const big = int64(math.MaxInt64)
	tests := map[string]map[string]any{
		"history past a segment": {
			"segments": []any{map[string]any{"address": int64(0x1000), "total_size": big, "blocks": []any{}}},
			"device_traces": []any{[]any{
				map[string]any{"action": "segment_free", "addr": int64(0x9000), "size": big, "stream": int64(0), "time_us": int64(1)},
			}},
		},
		"segments": {
			"segments": []any{
				map[string]any{"address": int64(0x1000), "total_size": big, "blocks": []any{}},
				map[string]any{"address": int64(0x2000), "total_size": big, "blocks": []any{}},
				map[string]any{"address": int64(0x3000), "total_size": big, "blocks": []any{}},
			},
			"device_traces": []any{[]any{
				map[string]any{"action": "alloc", "addr": int64(0x1000), "size": int64(8), "stream": int64(0), "time_us": int64(1)},
			}},
		},
	}
	for name, snap := range tests {
		t.Run(name, func(t *testing.T) {
			var buf bytes.Buffer
			if err := ogorek.NewEncoderWithConfig(&buf, &ogorek.EncoderConfig{Protocol: 4, StrictUnicode: true}).Encode(snap); err != nil {
				t.Fatal(err)
			}
			s, err := trace.ReadSnapshot(&buf)
			if !errors.Is(err, trace.ErrSnapshot) || !strings.Contains(err.Error(), "trace.MaxSize") {
				var f trace.PyTorchFigures
				if s != nil {
					f = s.PyTorch
				}
				t.Fatalf("ReadSnapshot = %v (PyTorch figures %+v); want it refused, naming trace.MaxSize", err, f)
			}
		})
	}
}

// FuzzReadSnapshot: any input is read or refused with an error, never a
// panic, and a snapshot read gives a log whose frees free live blocks.
func FuzzReadSnapshot(f *testing.F) {
	var buf bytes.Buffer
	_ = trace.WriteSnapshot(&buf, trace.History{
		Segments: []trace.SnapshotSegment{{Addr: 1 << 20, Size: 2 << 20, Blocks: []trace.SnapshotBlock{
			{Addr: 1 << 20, Size: 1 << 20, Allocated: true}, {Addr: 2 << 20, Size: 1 << 20}}}},
		Entries: []trace.SnapshotEntry{
			{Action: "segment_alloc", Addr: 1 << 20, Size: 2 << 20},
			{Action: "free_requested", Addr: 3 << 20, Size: 512, TimeUS: 5},
			{Action: "alloc", Addr: 1 << 20, Size: 1 << 20, TimeUS: 9},
		},
	})
	f.Add(buf.Bytes())
	f.Add([]byte{0x80, 0x02, '}', '.'})
	f.Fuzz(func(t *testing.T, data []byte) {
		snap, err := trace.ReadSnapshot(bytes.NewReader(data))
		if err != nil {
			return
		}
		if s := trace.Summarize(snap.Events); s.UnmatchedFrees != 0 || s.Reallocs > s.Allocs {
			t.Fatalf("a snapshot read as a log with %d unmatched frees", s.UnmatchedFrees)
		}
	})
}

// BenchmarkReadSnapshot reads the shared PyTorch snapshots (decoding the
// pickle and building the log).
func BenchmarkReadSnapshot(b *testing.B) {
	dir := sharedtraces.Dir(b)
	for _, name := range []string{"W_medium_512_training", "k_fullstep"} {
		data, err := os.ReadFile(filepath.Join(dir, name+".pickle"))
		if err != nil {
			b.Skipf("no snapshot: %v", err)
		}
		b.Run(name, func(b *testing.B) {
			b.SetBytes(int64(len(data)))
			for b.Loop() {
				if _, err := trace.ReadSnapshot(bytes.NewReader(data)); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// TestReadSnapshotRules checks the rules of reading a snapshot on small
// hand-made ones: which blocks are live at start, which free entries
// count, and PyTorch's figures walked back from the segments.
func TestReadSnapshotRules(t *testing.T) {
	entry := func(action string, addr, size, us int64) map[string]any {
		return map[string]any{"action": action, "addr": addr, "size": size, "stream": int64(0), "time_us": us}
	}
	segment := func(addr, total, allocated int64, blocks ...map[string]any) map[string]any {
		bl := make([]any, len(blocks))
		for i, b := range blocks {
			bl[i] = b
		}
		return map[string]any{"address": addr, "total_size": total, "allocated_size": allocated, "blocks": bl}
	}
	block := func(addr, size int64, state string) map[string]any {
		return map[string]any{"address": addr, "size": size, "state": state}
	}
	tests := map[string]struct {
		segments []any
		trace    []any
		want     []string // events as Event.String
		figures  trace.PyTorchFigures
	}{
		"free before alloc and an untouched live block are live at start, in address order": {
			segments: []any{segment(0x1000, 0x3000, 0x1800,
				block(0x1000, 0x800, "active_allocated"), block(0x1800, 0x1000, "active_allocated"), block(0x2800, 0x1800, "inactive"))},
			trace: []any{
				entry("free_requested", 0x2800, 0x100, 100), entry("free_completed", 0x2800, 0x100, 101),
				entry("alloc", 0x1800, 0x1000, 102),
			},
			want: []string{"0,0,allocate,0x1000,2048,0", "0,0,allocate,0x2800,256,0",
				"0,0.000001,free,0x2800,256,0", "0,0.000003,allocate,0x1800,4096,0"},
			figures: trace.PyTorchFigures{PeakReserved: 0x3000, ReservedAtStart: 0x3000, PeakAllocated: 0x1800, Segments: 1},
		},
		"free_completed is the free where there is no free_requested": {
			segments: []any{segment(0x1000, 0x2000, 0)},
			trace: []any{
				entry("segment_alloc", 0x1000, 0x2000, 10), entry("alloc", 0x1000, 0x800, 12),
				entry("free_completed", 0x1000, 0x800, 15),
			},
			want:    []string{"0,0.000003,allocate,0x1000,2048,0", "0,0.000006,free,0x1000,2048,0"},
			figures: trace.PyTorchFigures{PeakReserved: 0x2000, PeakAllocated: 0x800, Segments: 1, SegmentAllocs: 1},
		},
		"a segment freed during the history counts, and its bytes were held at start": {
			segments: []any{segment(0x1000, 0x1000, 0)},
			trace: []any{
				entry("alloc", 0x9000, 0x400, 1), entry("free_requested", 0x9000, 0x400, 2),
				entry("free_completed", 0x9000, 0x400, 3), entry("segment_free", 0x8000, 0x4000, 4),
			},
			want:    []string{"0,0.000001,allocate,0x9000,1024,0", "0,0.000002,free,0x9000,1024,0"},
			figures: trace.PyTorchFigures{PeakReserved: 0x5000, ReservedAtStart: 0x5000, PeakAllocated: 0x400, Segments: 2, SegmentFrees: 1},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			var buf bytes.Buffer
			snap := map[string]any{"segments": tc.segments, "device_traces": []any{tc.trace}}
			if err := ogorek.NewEncoderWithConfig(&buf, &ogorek.EncoderConfig{Protocol: 4, StrictUnicode: true}).Encode(snap); err != nil {
				t.Fatal(err)
			}
			s, err := trace.ReadSnapshot(&buf)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, e := range s.Events {
				got = append(got, e.String())
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("events\n%q\nwant\n%q", got, tc.want)
			}
			if s.PyTorch != tc.figures {
				t.Errorf("PyTorch figures %+v, want %+v", s.PyTorch, tc.figures)
			}
		})
	}
}
