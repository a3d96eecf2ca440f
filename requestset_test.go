package vram_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"testing"

	"github.com/vramkit/vram"
)

func TestRequestSetErrors(t *testing.T) {
	tests := map[string]struct {
		json string
		want []string // substrings of the message
	}{
		"empty":             {``, []string{"empty input"}},
		"duplicate label":   {`{"requests": {"a": {"x": {"shape": [4], "dtype": "int32"}, "x": {"shape": [8], "dtype": "int32"}}}}`, []string{`requests.a: key "x" is given twice`}},
		"duplicate client":  {`{"requests": {"a": {"x": {"shape": [4], "dtype": "int32"}}, "a": {"y": {"shape": [4], "dtype": "int32"}}}}`, []string{`requests: key "a" is given twice`}},
		"duplicate field":   {`{"requests": {"a": {"x": {"shape": [4], "dtype": "int32", "dtype": "float64"}}}}`, []string{`requests.a.x: key "dtype" is given twice`}},
		"duplicate budget":  {`{"budget": 1, "budget": 2, "requests": {"a": {"x": {"shape": [4], "dtype": "int32"}}}}`, []string{`top level: key "budget" is given twice`}},
		"invalid utf-8":     {"{\"requests\": {\"a\": {\"x\xff\": {\"shape\": [4], \"dtype\": \"int32\"}}}}", []string{"requests.a: key", "not valid UTF-8"}},
		"lone surrogate":    {`{"requests": {"\udc00": {"x": {"shape": [4], "dtype": "int32"}}}}`, []string{"requests: key", "not valid UTF-8"}},
		"syntax":            {"{\n  \"requests\": {,}\n}", []string{"invalid JSON at line 2, column"}},
		"trailing garbage":  {`{"requests": {}} x`, []string{"invalid JSON"}},
		"not an object":     {`[1, 2]`, []string{"want a JSON object, got an array"}},
		"null":              {`null`, []string{"want a JSON object, got null"}},
		"missing requests":  {`{"budget": 1024}`, []string{`missing "requests"`}},
		"unknown top key":   {`{"requests": {}, "budgte": 1}`, []string{`unknown key "budgte"`, "budget, granularity, buffers, requests"}},
		"empty requests":    {`{"requests": {}}`, []string{"requests is empty"}},
		"requests a list":   {`{"requests": []}`, []string{"requests: want a JSON object, got an array"}},
		"client not object": {`{"requests": {"a": 3}}`, []string{"requests.a: want a JSON object, got a number 3"}},
		"client empty":      {`{"requests": {"a": {}}}`, []string{"requests.a has no arrays"}},
		"missing shape":     {`{"requests": {"a": {"x": {"dtype": "float32"}}}}`, []string{`requests.a.x: missing "shape"`}},
		"missing dtype":     {`{"requests": {"a": {"x": {"shape": [4]}}}}`, []string{`requests.a.x: missing "dtype"`, "float32"}},
		"unknown dtype":     {`{"requests": {"a": {"x": {"shape": [4], "dtype": "float8"}}}}`, []string{`unknown dtype "float8"`, "float64"}},
		"dtype a number":    {`{"requests": {"a": {"x": {"shape": [4], "dtype": 4}}}}`, []string{"requests.a.x.dtype: want a string, got a number 4"}},
		"negative dim":      {`{"requests": {"a": {"x": {"shape": [4, -5], "dtype": "int32"}}}}`, []string{"requests.a.x.shape[1] is -5", "at least 1"}},
		"zero dim":          {`{"requests": {"a": {"x": {"shape": [0], "dtype": "int32"}}}}`, []string{"shape[0] is 0"}},
		"fractional dim":    {`{"requests": {"a": {"x": {"shape": [2.5], "dtype": "int32"}}}}`, []string{"shape[0]: want an integer, got a number 2.5"}},
		"dim a string":      {`{"requests": {"a": {"x": {"shape": ["4"], "dtype": "int32"}}}}`, []string{`shape[0]: want an integer, got a string "4"`}},
		"shape a string":    {`{"requests": {"a": {"x": {"shape": "4x4", "dtype": "int32"}}}}`, []string{"shape: want an array of dimensions", `got a string "4x4"`}},
		"unknown req key":   {`{"requests": {"a": {"x": {"shape": [4], "dtype": "int32", "chunk_axsi": 0}}}}`, []string{`requests.a.x: unknown key "chunk_axsi"`}},
		"chunk_axis string": {`{"requests": {"a": {"x": {"shape": [4], "dtype": "int32", "chunk_axis": "0"}}}}`, []string{"chunk_axis: want an integer"}},
		"chunk_axis neg":    {`{"requests": {"a": {"x": {"shape": [4], "dtype": "int32", "chunk_axis": -1}}}}`, []string{"chunk_axis is -1"}},
		"chunk_axis past":   {`{"requests": {"a": {"x": {"shape": [4, 1000], "dtype": "int32", "chunk_axis": 2}}}}`, []string{`requests.a.x.chunk_axis: give the run axis, 0 to 1, or "unchunkable": true: chunk axis 2 is past shape [4 1000]`}},
		"unchunkable int":   {`{"requests": {"a": {"x": {"shape": [4], "dtype": "int32", "unchunkable": 1}}}}`, []string{"unchunkable: want true or false, got a number 1"}},
		"total_runs zero":   {`{"requests": {"a": {"x": {"shape": [4], "dtype": "int32", "total_runs": 0}}}}`, []string{"total_runs is 0"}},
		"memory unknown":    {`{"requests": {"a": {"x": {"shape": [4], "dtype": "int32", "memory": "host"}}}}`, []string{`unknown memory type "host"`, "pinned"}},
		"memory managed":    {`{"requests": {"a": {"x": {"shape": [4], "dtype": "int32", "memory": "managed"}}}}`, []string{"requests.a.x:", "managed (unified) memory is not supported"}},
		"runs disagree":     {`{"requests": {"a": {"x": {"shape": [4, 10], "dtype": "int32", "chunk_axis": 1, "total_runs": 9}}}}`, []string{"requests.a.x:", "total runs 9 differs from the length 10"}},
		"budget negative":   {`{"budget": -1, "requests": {"a": {"x": {"shape": [4], "dtype": "int32"}}}}`, []string{"budget: want a positive whole number of bytes", "-1"}},
		"budget zero":       {`{"budget": 0, "requests": {"a": {"x": {"shape": [4], "dtype": "int32"}}}}`, []string{"budget is 0"}},
		"budget bad unit":   {`{"budget": "12 parsecs", "requests": {"a": {"x": {"shape": [4], "dtype": "int32"}}}}`, []string{"budget:", "not a byte size"}},
		"budget a bool":     {`{"budget": true, "requests": {"a": {"x": {"shape": [4], "dtype": "int32"}}}}`, []string{"budget: want a number of bytes", "a boolean true"}},
		"granularity float": {`{"granularity": 1.5, "requests": {"a": {"x": {"shape": [4], "dtype": "int32"}}}}`, []string{"granularity: want a positive whole number"}},
		"buffers zero":      {`{"buffers": 0, "requests": {"a": {"x": {"shape": [4], "dtype": "int32"}}}}`, []string{"buffers is 0", "want 1 buffer in flight or more"}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			_, err := unmarshalSet([]byte(tc.json))
			if err == nil {
				t.Fatalf("ReadRequestSet(%s) = nil error, want one containing %q", tc.json, tc.want)
			}
			if !errors.Is(err, vram.ErrRequestSet) {
				t.Errorf("error %q does not wrap ErrRequestSet", err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
}

func TestRequestSetValues(t *testing.T) {
	const in = `{"budget": "256MiB", "granularity": 512, "buffers": 2,
	 "requests": {
	  "outputs": {"state": {"shape": [201, 4, 1000000], "dtype": "float32", "chunk_axis": 2,
	                        "unchunkable": false, "total_runs": 1000000}},
	  "inputs": {"params": {"shape": [1000, 4], "dtype": "float64"},
	             "table": {"shape": [64], "dtype": "int32", "unchunkable": true, "memory": "pinned"},
	             "big": {"shape": [1e3], "dtype": "u1", "chunk_axis": 5, "unchunkable": true},
	             "scalar": {"shape": [], "dtype": "float64"}}}}`
	got, err := unmarshalSet([]byte(in))
	if err != nil {
		t.Fatal(err)
	}
	if got.Budget != 256<<20 || got.Granularity != 512 || got.Buffers != 2 {
		t.Errorf("budget, granularity, buffers = %d, %d, %d; want %d, 512, 2", got.Budget, got.Granularity, got.Buffers, 256<<20)
	}
	tests := map[string]struct {
		client, label string
		want          vram.ArrayRequest
	}{
		"all given":           {"outputs", "state", vram.ArrayRequest{Shape: []int{201, 4, 1000000}, DType: vram.Float32, ChunkAxis: 2, TotalRuns: 1000000}},
		"defaults":            {"inputs", "params", vram.ArrayRequest{Shape: []int{1000, 4}, DType: vram.Float64}},
		"unchunkable, pinned": {"inputs", "table", vram.ArrayRequest{Shape: []int{64}, DType: vram.Int32, Unchunkable: true, Memory: vram.Pinned}},
		"alias, axis past":    {"inputs", "big", vram.ArrayRequest{Shape: []int{1000}, DType: vram.Uint8, ChunkAxis: 5, Unchunkable: true}},
		"scalar":              {"inputs", "scalar", vram.ArrayRequest{Shape: []int{}, DType: vram.Float64}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			r, ok := got.Requests[tc.client][tc.label]
			if !ok {
				t.Fatalf("no request %s.%s in %+v", tc.client, tc.label, got.Requests)
			}
			if r.Shape == nil || !slices.Equal(r.Shape, tc.want.Shape) || r.DType != tc.want.DType || r.ChunkAxis != tc.want.ChunkAxis ||
				r.Unchunkable != tc.want.Unchunkable || r.TotalRuns != tc.want.TotalRuns || r.Memory != tc.want.Memory {
				t.Errorf("got %+v, want %+v", r, tc.want)
			}
		})
	}
}

// FuzzRequestSet checks that any input either parses into a request
// set that obeys the documented invariants or fails with ErrRequestSet, in a
// message of a line whatever the input's values.
func FuzzRequestSet(f *testing.F) {
	f.Add([]byte(`{"budget": 268435456, "granularity": 512, "buffers": 1, "requests": {"outputs": {"state": {"shape": [201, 4, 1000000], "dtype": "float32", "chunk_axis": 2, "unchunkable": false, "total_runs": 1000000}}}}`))
	f.Add([]byte(`{"requests": {"a": {"x": {"shape": [4], "dtype": "int32"}}}}`))
	f.Add([]byte(`{"budget": "1GiB", "requests": {"a": {"x": {"shape": [1e2, 3], "dtype": "bool", "memory": "mapped"}}}}`))
	f.Add([]byte(`{"requests": {"a": {"x": {"shape": [-1], "dtype": 7}}}}`))
	f.Add([]byte(`{"budget": 1048576, "requests": {"c": {"x": {"shape": [9223372036854775807], "dtype": "uint8"}}}}`))
	f.Add([]byte(`{"budget": 1048576, "requests": {"c": {"x": {"shape": [9223372036854775807], "dtype": "uint8"}, "x": {"shape": [3], "dtype": "uint8"}}}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		in, err := unmarshalSet(data)
		if err != nil {
			if !errors.Is(err, vram.ErrRequestSet) {
				t.Fatalf("error %.200q does not wrap ErrRequestSet", err)
			}
			if len(err.Error()) > 1024 {
				t.Fatalf("an error of %d bytes for %d bytes of input: %.200q…", len(err.Error()), len(data), err)
			}
			return
		}
		if in.Buffers < 0 {
			t.Fatalf("buffers %d", in.Buffers)
		}
		if len(in.Requests) == 0 {
			t.Fatal("parsed with no requests")
		}
		for c, reqs := range in.Requests {
			if len(reqs) == 0 {
				t.Fatalf("client %q parsed with no arrays", c)
			}
			for l, r := range reqs {
				if r.Shape == nil || (len(r.Shape) > 0 && slices.Min(r.Shape) < 1) {
					t.Fatalf("%s.%s: shape %v", c, l, r.Shape)
				}
				if err := r.Validate(); err != nil {
					t.Fatalf("%s.%s: parsed a request that does not validate: %v", c, l, err)
				}
			}
		}
		checkInputPlans(t, in)
	})
}

// checkInputPlans plans a parsed request set (with its budget, or 1 MiB)
// and checks that Plan either refuses it with a documented error or
// returns a plan whose figures hold exactly, whatever the run count:
// huge run counts once gave negative chunk counts.
func checkInputPlans(t *testing.T, in vram.RequestSet) {
	t.Helper()
	budget := in.Budget
	if budget == 0 {
		budget = 1 << 20
	}
	opts := vram.PlanOptions{Granularity: in.Granularity, Buffers: in.Buffers}
	p, err := vram.Plan(in.Requests, budget, opts)
	if err != nil {
		if !errors.Is(err, vram.ErrUnchunkable) && !errors.Is(err, vram.ErrRunTooLarge) && !errors.Is(err, vram.ErrRunsMismatch) {
			t.Fatalf("Plan of a parsed request set: %v", err)
		}
		return
	}
	n := uint64(p.TotalRuns)
	switch {
	case p.Chunks < 1 || p.ChunkLength < 0 || p.LastChunkLength < 0 || p.TotalRuns < 0:
		t.Fatalf("plan with negative figures: %+v", p)
	case p.BytesPerChunk > budget:
		t.Fatalf("plan spends %d of a budget of %d", p.BytesPerChunk, budget)
	case n > 0 && (uint64(p.Chunks-1)*uint64(p.ChunkLength) >= n || uint64(p.Chunks)*uint64(p.ChunkLength) < n):
		t.Fatalf("%d chunks of %d do not cover %d runs exactly", p.Chunks, p.ChunkLength, n)
	case p.Chunks > 1 && uint64(p.LastChunkLength) != n-uint64(p.Chunks-1)*uint64(p.ChunkLength):
		t.Fatalf("last chunk %d for %d chunks of %d, %d runs", p.LastChunkLength, p.Chunks, p.ChunkLength, n)
	}
}

// TestRequestSetErrorsAreShort gives request sets whose bad
// value is a megabyte long (a dtype, a key, a size, a number): each
// error quotes a clipped piece of it, never the whole.
func TestRequestSetErrorsAreShort(t *testing.T) {
	long := strings.Repeat("x", 1<<20)
	digits := strings.Repeat("9", 1<<20)
	tests := map[string]struct {
		json string
		want string
	}{
		"a dtype":         {`{"requests": {"c": {"x": {"shape": [4], "dtype": "` + long + `"}}}}`, `unknown dtype "xxxxxxxx`},
		"a memory type":   {`{"requests": {"c": {"x": {"shape": [4], "dtype": "float32", "memory": "` + long + `"}}}}`, `unknown memory type "xxxx`},
		"a client's name": {`{"requests": {"` + long + `": {"x": {"shape": [-4], "dtype": "float32"}}}}`, `dimensions must be at least 1`},
		"an unknown key":  {`{"requests": {"c": {"x": {"shape": [4], "dtype": "float32", "` + long + `": 1}}}}`, `unknown key "xxxx`},
		"a budget":        {`{"budget": "` + long + `", "requests": {"c": {"x": {"shape": [4], "dtype": "float32"}}}}`, `budget: "xxxx`},
		"a number":        {`{"requests": {"c": {"x": {"shape": [` + digits + `], "dtype": "float32"}}}}`, `want an integer, got a number`},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			_, err := unmarshalSet([]byte(tc.json))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("%.300v; want an error saying %q", err, tc.want)
			}
			if n := len(err.Error()); n > 400 {
				t.Errorf("an error of %d bytes: %.200q…", n, err)
			}
		})
	}
}

// unmarshalSet reads data as a request set, as vram plan does.
func unmarshalSet(data []byte) (vram.RequestSet, error) {
	return vram.ReadRequestSet(bytes.NewReader(data))
}

// TestRequestSetJSON: a request set written by encoding/json reads back
// the same, through ReadRequestSet or as a field of a larger value, and
// one over MaxRequestSetBytes is refused unread.
func TestRequestSetJSON(t *testing.T) {
	want := vram.RequestSet{Budget: 1 << 20, Buffers: 2, Requests: map[string]map[string]vram.ArrayRequest{
		"c": {"x": {Shape: []int{4, 100}, DType: vram.Float32, ChunkAxis: 1, TotalRuns: 100},
			"t": {Shape: []int{8}, DType: vram.Int32, Unchunkable: true, Memory: vram.Pinned}},
	}}
	b, err := json.Marshal(struct{ Set vram.RequestSet }{want})
	if err != nil {
		t.Fatal(err)
	}
	var got struct{ Set vram.RequestSet }
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatalf("%s: %v", b, err)
	}
	if fmt.Sprint(got.Set) != fmt.Sprint(want) {
		t.Errorf("read back %+v; want %+v", got.Set, want)
	}
	var bad struct{ Set vram.RequestSet }
	if err := json.Unmarshal([]byte(`{"Set": {"requests": {"c": {"x": {"shape": [4], "dtype": "int32", "chunk_axsi": 0}}}}}`), &bad); !errors.Is(err, vram.ErrRequestSet) {
		t.Errorf("a misspelt key in a larger value: %v; want ErrRequestSet", err)
	}
	if _, err := vram.ReadRequestSet(io.LimitReader(neverEnding('x'), vram.MaxRequestSetBytes+2)); !errors.Is(err, vram.ErrRequestSet) || !strings.Contains(err.Error(), "over 64 MiB") {
		t.Errorf("a request set of 64 MiB and more: %v; want ErrRequestSet saying it is over 64 MiB", err)
	}
}

// neverEnding is an endless stream of one byte.
type neverEnding byte

func (b neverEnding) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = byte(b)
	}
	return len(p), nil
}
