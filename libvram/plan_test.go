//go:build cgo

package main

// vram_plan's Go side (plan.go): the answers it gives for each kind of
// question, in JSON, without a library build.

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/vramkit/vram"
)

func TestPlan(t *testing.T) {
	// req is one owner's one request, as JSON.
	req := func(label, body string) string { return `{"c": {"` + label + `": ` + body + `}}` }
	for name, tc := range map[string]struct {
		in       string
		chunks   int    // of the plan; 0 when refused
		length   int    // chunk length
		kind     string // of the refusal
		inMsg    string
		badInput bool
	}{
		// 4 × 100 float32 = 1600 B in 10000 B: one chunk of all 100 runs.
		"fits": {in: `{"requests": ` + req("x", `{"shape": [4, 100], "dtype": "float32", "chunk_axis": 1}`) + `, "budget": 10000, "granularity": 1}`,
			chunks: 1, length: 100},
		// 1600 B in 1000 B: 16 B a run, 62 runs fit, so 2 chunks of 50.
		"chunked": {in: `{"requests": ` + req("x", `{"shape": [4, 100], "dtype": "float32", "chunk_axis": 1}`) + `, "budget": 1000, "granularity": 1}`,
			chunks: 2, length: 50},
		"unchunkable": {in: `{"requests": ` + req("x", `{"shape": [4096], "dtype": "uint8", "unchunkable": true}`) + `, "budget": 1000, "granularity": 1}`,
			kind: "unchunkable", inMsg: "unchunkable"},
		// One run is 4000 B.
		"run too large": {in: `{"requests": ` + req("x", `{"shape": [1000, 10], "dtype": "float32", "chunk_axis": 1}`) + `, "budget": 1000, "granularity": 1}`,
			kind: "run_too_large", inMsg: "run"},
		"runs disagree": {in: `{"requests": {"a": {"x": {"shape": [2, 2], "dtype": "float32", "chunk_axis": 1}}, "b": {"y": {"shape": [3, 3], "dtype": "float32", "chunk_axis": 1}}}, "budget": 100000}`,
			kind: "runs_mismatch", inMsg: "runs"},
		"bad dtype":   {in: `{"requests": ` + req("x", `{"shape": [4], "dtype": "float16"}`) + `, "budget": 1}`, badInput: true},
		"bad memory":  {in: `{"requests": ` + req("x", `{"shape": [4], "dtype": "float32", "memory": "managed?"}`) + `, "budget": 1}`, badInput: true},
		"not JSON":    {in: `{"requests": `, badInput: true},
		"wrong types": {in: `{"requests": [1, 2]}`, badInput: true},
	} {
		t.Run(name, func(t *testing.T) {
			out, err := plan([]byte(tc.in))
			if tc.badInput {
				if !errors.Is(err, vram.ErrInvalidRequest) {
					t.Errorf("plan: %v, want an error wrapping ErrInvalidRequest", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			b, err := json.Marshal(out)
			if err != nil {
				t.Fatal(err)
			}
			var back planOutput // what the caller reads
			if err := json.Unmarshal(b, &back); err != nil {
				t.Fatalf("%s: %v", b, err)
			}
			switch {
			case tc.kind != "":
				if back.Plan != nil || back.Error == nil || back.Error.Kind != tc.kind || !strings.Contains(back.Error.Message, tc.inMsg) {
					t.Errorf("answer %s; want a refusal %q naming %q", b, tc.kind, tc.inMsg)
				}
				if f := back.Error.Figures; tc.kind != "runs_mismatch" && (f == nil || f.Budget != 1000 || f.Need <= f.Budget) {
					t.Errorf("figures %+v; want the budget, 1000 B, and more needed", f)
				}
			case back.Error != nil || back.Plan == nil || back.Plan.Chunks != tc.chunks || back.Plan.ChunkLength != tc.length:
				t.Errorf("answer %s; want %d chunks of %d", b, tc.chunks, tc.length)
			}
		})
	}
}
