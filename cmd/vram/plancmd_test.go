package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// planJSON is the part of `vram plan --json` the tests read.
type planJSON struct {
	Chunks          int                         `json:"chunks"`
	ChunkLength     int                         `json:"chunk_length"`
	LastChunkLength int                         `json:"last_chunk_length"`
	TotalRuns       int                         `json:"total_runs"`
	Buffers         int                         `json:"buffers"`
	Granularity     uint64                      `json:"granularity"`
	Budget          uint64                      `json:"budget_bytes"`
	BytesPerChunk   uint64                      `json:"bytes_per_chunk"`
	ChunkedShapes   map[string]map[string][]int `json:"chunked_shapes"`
}

// issueExample is the request set of the issue: 1,000,000 runs of 201
// samples × 4 variables, float32; one run is 3,216 bytes.
const issueExample = `{"budget": 268435456, "granularity": 512, "buffers": 1,
 "requests": {"outputs": {"state": {"shape": [201, 4, 1000000],
   "dtype": "float32", "chunk_axis": 2, "unchunkable": false,
   "total_runs": 1000000}}}}`

func TestPlanRules(t *testing.T) {
	tests := map[string]struct {
		input string
		args  []string
		want  planJSON // fields compared: all but ChunkedShapes when nil
	}{
		// Rule: everything fits → one chunk of the full length.
		"fits in one chunk": {
			input: `{"budget": "1MiB", "requests": {"c": {"x": {"shape": [4, 1000], "dtype": "float64", "chunk_axis": 1}}}}`,
			want: planJSON{Chunks: 1, ChunkLength: 1000, LastChunkLength: 1000, TotalRuns: 1000, Buffers: 1, Granularity: 512,
				Budget: 1 << 20, BytesPerChunk: 32256, ChunkedShapes: map[string]map[string][]int{"c": {"x": {4, 1000}}}},
		},
		// Rule: the fewest chunks that fit, balanced. Lmax = 83,468 runs
		// (3,216 B each in 256 MiB), so 12 chunks of ⌈10⁶/12⌉ = 83,334.
		"issue example, chunked": {
			input: issueExample,
			want: planJSON{Chunks: 12, ChunkLength: 83334, LastChunkLength: 83326, TotalRuns: 1000000, Buffers: 1, Granularity: 512,
				Budget: 268435456, BytesPerChunk: 268002304, ChunkedShapes: map[string]map[string][]int{"outputs": {"state": {201, 4, 83334}}}},
		},
		// Rule: double buffering shares the budget between two buffers:
		// Lmax = 41,734, 24 chunks of 41,667.
		"double buffering": {
			input: issueExample,
			args:  []string{"--buffers", "2"},
			want: planJSON{Chunks: 24, ChunkLength: 41667, LastChunkLength: 41659, TotalRuns: 1000000, Buffers: 2, Granularity: 512,
				Budget: 268435456, BytesPerChunk: 2 * 134001152},
		},
		// Rule: bytes are counted in the allocator's granularity. 16 runs
		// of 100 B fit 1,700 B counted in units of 100 B, but not in units
		// of 512 B (2,048 B), where a buffer holds at most 15 runs (1,536 B).
		"granularity 100": {
			input: `{"budget": 1700, "granularity": 100, "requests": {"c": {"x": {"shape": [16, 25], "dtype": "float32"}}}}`,
			want: planJSON{Chunks: 1, ChunkLength: 16, LastChunkLength: 16, TotalRuns: 16, Buffers: 1, Granularity: 100,
				Budget: 1700, BytesPerChunk: 1600},
		},
		"granularity 512": {
			input: `{"budget": 1700, "granularity": 512, "requests": {"c": {"x": {"shape": [16, 25], "dtype": "float32"}}}}`,
			want: planJSON{Chunks: 2, ChunkLength: 8, LastChunkLength: 8, TotalRuns: 16, Buffers: 1, Granularity: 512,
				Budget: 1700, BytesPerChunk: 1024},
		},
		// Rule: unchunkable requests are allocated whole in every plan.
		"unchunkable plus chunked": {
			input: `{"budget": "64KiB", "requests": {
			  "in": {"table": {"shape": [8192], "dtype": "float32", "unchunkable": true}},
			  "out": {"x": {"shape": [100, 1000], "dtype": "float32", "chunk_axis": 1}}}}`,
			want: planJSON{Chunks: 13, ChunkLength: 77, LastChunkLength: 76, TotalRuns: 1000, Buffers: 1, Granularity: 512,
				Budget: 65536, BytesPerChunk: 32768 + 31232,
				ChunkedShapes: map[string]map[string][]int{"in": {"table": {8192}}, "out": {"x": {100, 77}}}},
		},
		// Host memory does not spend the device budget.
		"pinned is not counted": {
			input: `{"budget": 4096, "requests": {"c": {"x": {"shape": [1000, 1000], "dtype": "float64", "memory": "pinned"},
			                                            "y": {"shape": [1000, 8], "dtype": "uint8"}}}}`,
			want: planJSON{Chunks: 2, ChunkLength: 500, LastChunkLength: 500, TotalRuns: 1000, Buffers: 1, Granularity: 512,
				Budget: 4096, BytesPerChunk: 4096,
				ChunkedShapes: map[string]map[string][]int{"c": {"x": {500, 1000}, "y": {500, 8}}}},
		},
		// Flags override the input's values.
		"flags override": {
			input: issueExample,
			args:  []string{"--budget", "512MiB", "--granularity", "2MiB"},
			want: planJSON{Chunks: 6, ChunkLength: 166667, LastChunkLength: 166665, TotalRuns: 1000000, Buffers: 1, Granularity: 2 << 20,
				Budget: 512 << 20, BytesPerChunk: 536870912},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			args := append([]string{"plan", "--json", "--device", "sim"}, tc.args...)
			stdout, stderr, code := cli(t, tc.input, args...)
			if code != exitOK {
				t.Fatalf("exit %d; stderr:\n%s", code, stderr)
			}
			var got planJSON
			if err := json.Unmarshal([]byte(stdout), &got); err != nil {
				t.Fatalf("stdout is not one JSON object: %v\n%s", err, stdout)
			}
			var raw map[string]any
			if err := json.Unmarshal([]byte(stdout), &raw); err != nil {
				t.Fatal(err)
			}
			for _, k := range []string{"chunks", "chunk_length", "total_runs", "chunked_shapes", "bytes_per_chunk"} {
				if _, ok := raw[k]; !ok {
					t.Errorf("plan --json lacks %q", k)
				}
			}
			shapes := got.ChunkedShapes
			if tc.want.ChunkedShapes == nil {
				got.ChunkedShapes = nil
			}
			if !equalPlans(got, tc.want) {
				t.Errorf("plan\n got %+v\nwant %+v", got, tc.want)
			}
			if len(shapes) == 0 {
				t.Errorf("no chunked_shapes in %s", stdout)
			}
			if got.BytesPerChunk > got.Budget {
				t.Errorf("bytes per chunk %d over the budget %d", got.BytesPerChunk, got.Budget)
			}
		})
	}
}

func equalPlans(a, b planJSON) bool {
	if len(a.ChunkedShapes) != len(b.ChunkedShapes) {
		return false
	}
	for c, labels := range a.ChunkedShapes {
		if len(labels) != len(b.ChunkedShapes[c]) {
			return false
		}
		for l, s := range labels {
			if !slices.Equal(s, b.ChunkedShapes[c][l]) {
				return false
			}
		}
	}
	a.ChunkedShapes, b.ChunkedShapes = nil, nil
	return a.Chunks == b.Chunks && a.ChunkLength == b.ChunkLength && a.LastChunkLength == b.LastChunkLength &&
		a.TotalRuns == b.TotalRuns && a.Buffers == b.Buffers && a.Granularity == b.Granularity &&
		a.Budget == b.Budget && a.BytesPerChunk == b.BytesPerChunk
}

func TestPlanErrors(t *testing.T) {
	tests := map[string]struct {
		input string
		args  []string
		code  int
		want  []string
		never []string // nor stderr this
	}{
		"nothing chunkable": {
			input: `{"budget": 1024, "requests": {"c": {"x": {"shape": [4096], "dtype": "float32", "unchunkable": true}}}}`,
			code:  exitFailure, want: []string{"16 KiB", "1 KiB", "none of them can be chunked", "does not fit and cannot be chunked"},
		},
		"unchunkable fills the budget": {
			input: `{"budget": 4096, "requests": {"c": {"t": {"shape": [2048], "dtype": "float32", "unchunkable": true},
			                                        "x": {"shape": [10, 100], "dtype": "float32", "chunk_axis": 1}}}}`,
			code: exitFailure, want: []string{"unchunkable arrays need 8 KiB but the budget is 4 KiB"},
		},
		"one run too large": {
			input: `{"budget": 4096, "requests": {"c": {"x": {"shape": [2000, 100], "dtype": "float32", "chunk_axis": 1}}}}`,
			code:  exitFailure, want: []string{"one run needs 8 KiB", "budget is 4 KiB", "raise the budget by 4 KiB", "one run does not fit"},
		},
		// Rule 1: an axis of length 1 is not chunkable; no such axis is a
		// mistake unless the request says it is unchunkable.
		"axis of length 1": {
			input: `{"budget": 256, "requests": {"c": {"x": {"shape": [1, 100], "dtype": "int32"}}}}`,
			code:  exitFailure, want: []string{"the arrays need 512 B but the budget is 256 B, and none of them can be chunked"},
		},
		"no such axis": {
			input: `{"budget": 256, "requests": {"c": {"x": {"shape": [4, 100], "dtype": "int32", "chunk_axis": 2}}}}`,
			code:  exitFailure, want: []string{`requests.c.x.chunk_axis: give the run axis, 0 to 1, or "unchunkable": true: chunk axis 2 is past shape [4 100]`},
		},
		"marked unchunkable": {
			input: `{"budget": 256, "requests": {"c": {"x": {"shape": [4, 100], "dtype": "int32", "unchunkable": true}}}}`,
			code:  exitFailure, want: []string{"the arrays need 2 KiB but the budget is 256 B, and none of them can be chunked"},
		},
		"runs disagree": {
			input: `{"budget": 4096, "requests": {"a": {"x": {"shape": [10, 100], "dtype": "float32", "chunk_axis": 1}},
			                                     "b": {"y": {"shape": [10, 99], "dtype": "float32", "chunk_axis": 1}}}}`,
			code: exitFailure, want: []string{"99 runs: b/y", "100 runs: a/x"},
		},
		"unknown dtype": {input: `{"requests": {"c": {"x": {"shape": [4], "dtype": "float8"}}}}`, code: exitFailure, want: []string{`stdin: requests.c.x.dtype: unknown dtype "float8"`}},
		"negative dim":  {input: `{"requests": {"c": {"x": {"shape": [4, -1], "dtype": "int32"}}}}`, code: exitFailure, want: []string{"requests.c.x.shape[1] is -1"}},
		"missing field": {input: `{"requests": {"c": {"x": {"dtype": "int32"}}}}`, code: exitFailure, want: []string{`requests.c.x: missing "shape"`}},
		"wrong type":    {input: `{"requests": {"c": {"x": {"shape": 4, "dtype": "int32"}}}}`, code: exitFailure, want: []string{"requests.c.x.shape: want an array", "got a number 4"}},
		"not JSON":      {input: "budget: 1\n", code: exitFailure, want: []string{"invalid JSON at line 1"}},
		"buffers four":  {input: `{"buffers": 4, "requests": {"c": {"x": {"shape": [4], "dtype": "int32"}}}}`, code: exitFailure, want: []string{"stdin: buffers is 4; want 1, or up to 3 buffers in flight"}},
		"no such file":  {args: []string{"/nonexistent/requests.json"}, code: exitFailure, want: []string{"/nonexistent/requests.json"}},
		"past the device": {input: `{"requests": {"c": {"t": {"shape": [1099511627776], "dtype": "float64", "unchunkable": true}}}}`, args: []string{"--device", "sim:vram=1GiB"},
			code: exitFailure, want: []string{"or shrink them: that is 8 TiB more than the device's 1 GiB in all: does not fit and cannot be chunked\n"}, never: []string{"raise the budget", "--budget overrides"}},
		"past the budget given": {input: `{"budget": "1GiB", "requests": {"c": {"t": {"shape": [1099511627776], "dtype": "float64", "unchunkable": true}}}}`,
			code: exitFailure, want: []string{"or raise the budget by 8 TiB", "--budget overrides"}},
		"double, too small": {input: `{"budget": 1000, "requests": {"c": {"x": {"shape": [128, 100], "dtype": "float32", "chunk_axis": 1}}}}`, args: []string{"--buffers", "2"}, code: exitFailure, want: []string{"2 × 512 B per run", "fewer buffers", "--budget and --buffers override"}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			args := append([]string{"plan", "--json", "--device", "sim"}, tc.args...)
			stdout, stderr, code := cli(t, tc.input, args...)
			if code != tc.code {
				t.Errorf("exit %d, want %d; stderr:\n%s", code, tc.code, stderr)
			}
			if stdout != "" {
				t.Errorf("stdout not empty on an error:\n%s", stdout)
			}
			for _, w := range tc.want {
				if !strings.Contains(stderr, w) {
					t.Errorf("stderr does not contain %q:\n%s", w, stderr)
				}
			}
			for _, w := range tc.never {
				if strings.Contains(stderr, w) {
					t.Errorf("stderr says %q:\n%s", w, stderr)
				}
			}
		})
	}
}

// TestPlanDefaultsFromDevice leaves budget and granularity to the device
// and the allocator.
func TestPlanDefaultsFromDevice(t *testing.T) {
	const in = `{"requests": {"c": {"x": {"shape": [1000, 1000000], "dtype": "float32", "chunk_axis": 1}}}}`
	tests := map[string]struct {
		args     []string
		wantGran uint64
	}{
		"pool":   {[]string{"--allocator", "pool"}, 512},
		"direct": {[]string{"--allocator", "direct"}, 0}, // the device's own
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			args := append([]string{"plan", "--json", "--device", "sim:vram=1GiB"}, tc.args...)
			stdout, stderr, code := cli(t, in, args...)
			if code != exitOK {
				t.Fatalf("exit %d; stderr:\n%s", code, stderr)
			}
			var got planJSON
			if err := json.Unmarshal([]byte(stdout), &got); err != nil {
				t.Fatal(err)
			}
			if got.Budget == 0 || got.Budget > 1<<30 {
				t.Errorf("budget %d: want the free memory of a 1 GiB device", got.Budget)
			}
			if tc.wantGran != 0 && got.Granularity != tc.wantGran {
				t.Errorf("granularity %d, want %d", got.Granularity, tc.wantGran)
			}
			if tc.wantGran == 0 && got.Granularity < 4096 {
				t.Errorf("granularity %d: want the device's page size", got.Granularity)
			}
			if got.Chunks < 4 || got.BytesPerChunk > got.Budget {
				t.Errorf("%d chunks of %d bytes for a budget of %d: want ≥ 4 that fit", got.Chunks, got.BytesPerChunk, got.Budget)
			}
		})
	}
}

func TestPlanTextFromFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "requests.json")
	if err := os.WriteFile(path, []byte(issueExample), 0o644); err != nil {
		t.Fatal(err)
	}
	stdout, stderr, code := cli(t, "", "plan", "--device", "sim", path)
	if code != exitOK {
		t.Fatalf("exit %d; stderr:\n%s", code, stderr)
	}
	for _, w := range []string{"12 chunks × 83334 runs", "last chunk 83326", "256 MiB (given)", "outputs", "state", "201×4×1000000", "201×4×83334"} {
		if !strings.Contains(stdout, w) {
			t.Errorf("output does not contain %q:\n%s", w, stdout)
		}
	}
}
