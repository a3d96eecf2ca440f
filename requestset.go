package vram

// A request set as JSON: what Plan plans (the requests of each client, a
// budget, a granularity, buffers in flight), as vram plan reads it.
//
//	{"budget": 268435456, "granularity": 512, "buffers": 1,
//	 "requests": {"outputs": {"state": {"shape": [201, 4, 1000000],
//	   "dtype": "float32", "chunk_axis": 2, "unchunkable": false,
//	   "total_runs": 1000000}}}}
//
// It is decoded by hand, one level at a time, rather than straight into
// structs, so that every mistake is reported with the path of the value
// at fault and what was expected there ("requests.outputs.state.shape[2]:
// -5 is not a dimension; dimensions are integers of at least 1"), unknown
// keys are refused (a misspelt "chunk_axsi" would otherwise be ignored
// silently), and every message is the same whichever order Go's maps
// iterate in. It encodes as encoding/json writes its fields.
//
// A request set is untrusted input, and its cost is bounded: ReadRequestSet
// reads at most MaxRequestSetBytes, held once, decoded by encoding/json a
// level at a time (memory a small multiple of the input, time linear in
// it apart from sorting each object's keys); a message quotes at most 40
// bytes of a bad value or name, with its length, never the whole.

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/vramkit/vram/internal/units"
)

// ErrRequestSet: a request set that cannot be read.
var ErrRequestSet = errors.New("bad request set")

// MaxRequestSetBytes bounds how much of a request set ReadRequestSet reads.
const MaxRequestSetBytes = 64 << 20

// RequestSet is what Plan plans, as vram plan reads it from JSON:
//
//	{"budget": "256MiB", "granularity": 512, "buffers": 1,
//	 "requests": {"outputs": {"state": {"shape": [201, 4, 1000000],
//	   "dtype": "float32", "chunk_axis": 2, "unchunkable": false,
//	   "total_runs": 1000000, "memory": "device"}}}}
//
// "requests" maps client → label → ArrayRequest, whose fields and defaults
// the keys are; "budget" and "granularity" are bytes, or sizes with a
// unit. Zero Budget, Granularity or Buffers mean "not given": the caller
// fills them (vram plan: from the device, the allocator, 1). A plain
// value.
type RequestSet struct {
	Budget      uint64 `json:"budget,omitempty"`      // device bytes the plan may use
	Granularity uint64 `json:"granularity,omitempty"` // the allocator's rounding unit in bytes
	Buffers     int    `json:"buffers,omitempty"`     // chunk buffers in flight
	// Requests maps client → label → request, each one validated.
	Requests map[string]map[string]ArrayRequest `json:"requests"`
}

// ReadRequestSet reads and checks a request set from r, at most
// MaxRequestSetBytes of it. Every error wraps ErrRequestSet but a read's.
func ReadRequestSet(r io.Reader) (RequestSet, error) {
	data, err := io.ReadAll(io.LimitReader(r, MaxRequestSetBytes+1))
	if err != nil {
		return RequestSet{}, err
	}
	if len(data) > MaxRequestSetBytes {
		return RequestSet{}, fmt.Errorf("over %s; a request set is a small JSON object: %w", units.Format(MaxRequestSetBytes), ErrRequestSet)
	}
	var s RequestSet
	err = s.UnmarshalJSON(data)
	return s, err
}

// UnmarshalJSON decodes and checks one request set; every error wraps
// ErrRequestSet and names the path of the value at fault. s is set only
// when data is a good request set.
func (s *RequestSet) UnmarshalJSON(data []byte) error {
	var in RequestSet
	if len(bytes.TrimSpace(data)) == 0 {
		return fmt.Errorf(`empty input; want a JSON object such as {"requests": {"client": {"label": {"shape": [4, 1000], "dtype": "float32"}}}}: %w`, ErrRequestSet)
	}
	top, err := decodeObject(data, "")
	if err != nil {
		return err
	}
	if err := onlyKeys(top, "", "budget", "granularity", "buffers", "requests"); err != nil {
		return err
	}
	if err := in.decodeFigures(top); err != nil {
		return err
	}
	rawReqs, ok := top["requests"]
	if !ok {
		return fmt.Errorf(`missing "requests": want {"requests": {CLIENT: {LABEL: {"shape": [...], "dtype": "float32", ...}}}}: %w`, ErrRequestSet)
	}
	if in.Requests, err = decodeClients(rawReqs); err != nil {
		return err
	}
	*s = in
	return nil
}

// decodeFigures decodes the budget, granularity and buffers of top.
func (s *RequestSet) decodeFigures(top map[string]json.RawMessage) error {
	var err error
	if raw, ok := top["budget"]; ok {
		if s.Budget, err = decodeSize(raw, "budget"); err != nil {
			return err
		}
	}
	if raw, ok := top["granularity"]; ok {
		if s.Granularity, err = decodeSize(raw, "granularity"); err != nil {
			return err
		}
	}
	if raw, ok := top["buffers"]; ok {
		b, err := decodeInt(raw, "buffers")
		if err != nil {
			return err
		}
		if b < 1 {
			return fmt.Errorf("buffers is %d; want 1 buffer in flight or more: %w", b, ErrRequestSet)
		}
		s.Buffers = b
	}
	return nil
}

// decodeClients decodes "requests": client → label → request.
func decodeClients(raw json.RawMessage) (map[string]map[string]ArrayRequest, error) {
	clients, err := decodeObject(raw, "requests")
	if err != nil {
		return nil, err
	}
	if len(clients) == 0 {
		return nil, fmt.Errorf("requests is empty; give at least one client with one array: %w", ErrRequestSet)
	}
	out := make(map[string]map[string]ArrayRequest, len(clients))
	for _, client := range sortedKeys(clients) {
		path := "requests." + clipKey(client)
		labels, err := decodeObject(clients[client], path)
		if err != nil {
			return nil, err
		}
		if len(labels) == 0 {
			return nil, fmt.Errorf("%s has no arrays; give at least one {LABEL: {...}}: %w", path, ErrRequestSet)
		}
		reqs := make(map[string]ArrayRequest, len(labels))
		for _, label := range sortedKeys(labels) {
			req, err := parseRequest(labels[label], path+"."+clipKey(label))
			if err != nil {
				return nil, err
			}
			reqs[label] = req
		}
		out[client] = reqs
	}
	return out, nil
}

// parseRequest decodes one array request at path. Its fields and their
// defaults are ArrayRequest's: chunk_axis 0, total_runs 0 (the
// length of the chunk axis), memory "device".
func parseRequest(raw json.RawMessage, path string) (ArrayRequest, error) {
	var req ArrayRequest
	obj, err := decodeObject(raw, path)
	if err != nil {
		return req, err
	}
	if err := onlyKeys(obj, path, "shape", "dtype", "chunk_axis", "unchunkable", "total_runs", "memory"); err != nil {
		return req, err
	}
	rawShape, ok := obj["shape"]
	if !ok {
		return req, fmt.Errorf(`%s: missing "shape"; want an array of dimensions such as [201, 4, 1000000]: %w`, path, ErrRequestSet)
	}
	if req.Shape, err = decodeShape(rawShape, path+".shape"); err != nil {
		return req, err
	}
	rawDType, ok := obj["dtype"]
	if !ok {
		return req, fmt.Errorf(`%s: missing "dtype"; want one of %s: %w`, path, dtypeNames(), ErrRequestSet)
	}
	name, err := decodeString(rawDType, path+".dtype")
	if err != nil {
		return req, err
	}
	if req.DType, err = ParseDType(name); err != nil {
		return req, fmt.Errorf("%s.dtype: unknown dtype %s; want one of %s: %w", path, clipQuoted(name), dtypeNames(), ErrRequestSet)
	}
	if raw, ok := obj["chunk_axis"]; ok {
		if req.ChunkAxis, err = decodeInt(raw, path+".chunk_axis"); err != nil {
			return req, err
		}
		if req.ChunkAxis < 0 {
			return req, fmt.Errorf("%s.chunk_axis is %d; axes count from 0: %w", path, req.ChunkAxis, ErrRequestSet)
		}
	}
	if raw, ok := obj["unchunkable"]; ok {
		if err := json.Unmarshal(raw, &req.Unchunkable); err != nil {
			return req, fmt.Errorf("%s.unchunkable: want true or false, got %s: %w", path, describeJSON(raw), ErrRequestSet)
		}
	}
	if n := len(req.Shape); n > 0 && !req.Unchunkable && req.ChunkAxis >= n {
		// The library takes it as unchunkable (cubie's rule); here it is a
		// typing mistake that would plan the array whole, unsaid.
		return req, fmt.Errorf(`%s.chunk_axis: give the run axis, 0 to %d, or "unchunkable": true: chunk axis %d is past shape %v: %w`,
			path, n-1, req.ChunkAxis, req.Shape, ErrRequestSet)
	}
	if raw, ok := obj["total_runs"]; ok {
		if req.TotalRuns, err = decodeInt(raw, path+".total_runs"); err != nil {
			return req, err
		}
		if req.TotalRuns < 1 {
			return req, fmt.Errorf("%s.total_runs is %d; want at least 1: %w", path, req.TotalRuns, ErrRequestSet)
		}
	}
	if raw, ok := obj["memory"]; ok {
		name, err := decodeString(raw, path+".memory")
		if err != nil {
			return req, err
		}
		if req.Memory, err = ParseMemoryType(name); err != nil {
			return req, fmt.Errorf("%s.memory: unknown memory type %s; want device, pinned, mapped or pageable: %w", path, clipQuoted(name), ErrRequestSet)
		}
	}
	if err := req.Validate(); err != nil {
		return req, fmt.Errorf("%s: %w (%w)", path, err, ErrRequestSet)
	}
	return req, nil
}

// decodeObject decodes a JSON object into its members.
func decodeObject(raw json.RawMessage, path string) (map[string]json.RawMessage, error) {
	var obj map[string]json.RawMessage
	err := json.Unmarshal(raw, &obj)
	if err == nil && obj == nil { // JSON null
		err = errors.New("null")
	}
	if err != nil {
		var syn *json.SyntaxError
		if errors.As(err, &syn) {
			line, col := jsonPosition(raw, syn.Offset)
			return nil, fmt.Errorf("invalid JSON at line %d, column %d: %v: %w", line, col, syn, ErrRequestSet)
		}
		where := "the input"
		if path != "" {
			where = path
		}
		return nil, fmt.Errorf("%s: want a JSON object, got %s: %w", where, describeJSON(raw), ErrRequestSet)
	}
	if err := checkKeys(raw, path); err != nil {
		return nil, err
	}
	return obj, nil
}

// checkKeys refuses an object (raw, already known to be one) with a key
// given twice, which encoding/json would resolve silently to the last
// one, or a key that is not valid UTF-8 text: encoding/json decodes
// invalid bytes and lone surrogate escapes to U+FFFD, so two different
// labels could become one. The literal U+FFFD is refused with them.
func checkKeys(raw json.RawMessage, path string) error {
	where := "top level"
	if path != "" {
		where = path
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	if _, err := dec.Token(); err != nil { // '{'
		return fmt.Errorf("%s: %v: %w", where, err, ErrRequestSet)
	}
	seen := map[string]bool{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return fmt.Errorf("%s: %v: %w", where, err, ErrRequestSet)
		}
		key, _ := tok.(string)
		if strings.ContainsRune(key, utf8.RuneError) {
			return fmt.Errorf("%s: key %s is not valid UTF-8 (invalid bytes, a lone surrogate escape, or U+FFFD); name clients and labels in UTF-8 text: %w",
				where, clipQuoted(key), ErrRequestSet)
		}
		if seen[key] {
			return fmt.Errorf("%s: key %s is given twice; give each key once: %w", where, clipQuoted(key), ErrRequestSet)
		}
		seen[key] = true
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			return fmt.Errorf("%s.%s: %v: %w", where, clipKey(key), err, ErrRequestSet)
		}
	}
	return nil
}

// onlyKeys refuses members of obj not in allowed.
func onlyKeys(obj map[string]json.RawMessage, path string, allowed ...string) error {
	for _, k := range sortedKeys(obj) {
		if !slices.Contains(allowed, k) {
			where := "top level"
			if path != "" {
				where = path
			}
			return fmt.Errorf("%s: unknown key %s; the keys are %s: %w", where, clipQuoted(k), strings.Join(allowed, ", "), ErrRequestSet)
		}
	}
	return nil
}

// decodeInt decodes a JSON integer that fits an int.
func decodeInt(raw json.RawMessage, path string) (int, error) {
	raw = bytes.TrimSpace(raw)
	if jsonKind(raw) != "number" {
		return 0, fmt.Errorf("%s: want an integer, got %s: %w", path, describeJSON(raw), ErrRequestSet)
	}
	v, err := strconv.ParseInt(string(raw), 10, 64)
	if err != nil {
		f, ferr := strconv.ParseFloat(string(raw), 64)
		if ferr == nil && f == math.Trunc(f) && math.Abs(f) < 1<<53 {
			v, err = int64(f), nil // 1e6 is an integer written as a float
		}
	}
	if err != nil {
		return 0, fmt.Errorf("%s: want an integer, got %s: %w", path, describeJSON(raw), ErrRequestSet)
	}
	return int(v), nil
}

// decodeSize decodes a byte count: an integer, or a string with a unit
// ("256MiB"). It must be positive.
func decodeSize(raw json.RawMessage, path string) (uint64, error) {
	raw = bytes.TrimSpace(raw)
	switch jsonKind(raw) {
	case "string":
		var s string
		_ = json.Unmarshal(raw, &s)
		n, err := units.ParseSize(s)
		if err != nil {
			return 0, fmt.Errorf("%s: %v: %w", path, err, ErrRequestSet)
		}
		if n == 0 {
			return 0, fmt.Errorf("%s is 0; want a positive number of bytes: %w", path, ErrRequestSet)
		}
		return n, nil
	case "number":
		n, err := strconv.ParseUint(string(raw), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("%s: want a positive whole number of bytes (or a string such as \"256MiB\"), got %s: %w", path, describeJSON(raw), ErrRequestSet)
		}
		if n == 0 {
			return 0, fmt.Errorf("%s is 0; want a positive number of bytes: %w", path, ErrRequestSet)
		}
		return n, nil
	}
	return 0, fmt.Errorf("%s: want a number of bytes such as 268435456 or \"256MiB\", got %s: %w", path, describeJSON(raw), ErrRequestSet)
}

// decodeString decodes a JSON string.
func decodeString(raw json.RawMessage, path string) (string, error) {
	var s string
	if err := json.Unmarshal(raw, &s); err != nil || jsonKind(raw) != "string" {
		return "", fmt.Errorf("%s: want a string, got %s: %w", path, describeJSON(raw), ErrRequestSet)
	}
	return s, nil
}

// decodeShape decodes a shape: an array of dimensions ≥ 1 ([] is a
// scalar, one element, as vram.ArrayRequest takes it).
func decodeShape(raw json.RawMessage, path string) ([]int, error) {
	var elems []json.RawMessage
	if err := json.Unmarshal(raw, &elems); err != nil || jsonKind(raw) != "array" {
		return nil, fmt.Errorf("%s: want an array of dimensions such as [201, 4, 1000000], got %s: %w", path, describeJSON(raw), ErrRequestSet)
	}
	shape := make([]int, len(elems))
	for i, e := range elems {
		d, err := decodeInt(e, fmt.Sprintf("%s[%d]", path, i))
		if err != nil {
			return nil, err
		}
		if d < 1 {
			return nil, fmt.Errorf("%s[%d] is %d; dimensions must be at least 1: %w", path, i, d, ErrRequestSet)
		}
		shape[i] = d
	}
	return shape, nil
}

// kind names the JSON type of raw.
func jsonKind(raw json.RawMessage) string {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 {
		return "nothing"
	}
	switch raw[0] {
	case '{':
		return "object"
	case '[':
		return "array"
	case '"':
		return "string"
	case 't', 'f':
		return "boolean"
	case 'n':
		return "null"
	}
	return "number"
}

// maxQuoted is the most of an input's string a message quotes.
const maxQuoted = 40

// clipQuote quotes s for a message: at most maxQuoted bytes of it, and
// its length when longer.
func clipQuoted(s string) string {
	if len(s) > maxQuoted {
		return fmt.Sprintf("%q… (%d bytes)", s[:maxQuoted], len(s))
	}
	return fmt.Sprintf("%q", s)
}

// clipKey is a client or label name as a message's path writes it: as
// it is, or clipped (and quoted) when long.
func clipKey(k string) string {
	if len(k) > maxQuoted {
		return clipQuoted(k)
	}
	return k
}

// describe names raw's type and, when short, shows it.
func describeJSON(raw json.RawMessage) string {
	raw = bytes.TrimSpace(raw)
	k := jsonKind(raw)
	if k == "null" || k == "nothing" {
		return k
	}
	if len(raw) <= 40 {
		return fmt.Sprintf("%s %s", articled(k), raw)
	}
	return articled(k)
}

func articled(k string) string {
	if strings.ContainsAny(k[:1], "aeiou") {
		return "an " + k
	}
	return "a " + k
}

// position turns a byte offset into a 1-based line and column.
func jsonPosition(data []byte, off int64) (line, col int) {
	if off > int64(len(data)) {
		off = int64(len(data))
	}
	before := data[:off]
	line = bytes.Count(before, []byte("\n")) + 1
	col = int(off) - bytes.LastIndexByte(before, '\n')
	return line, col
}

// dtypeNames lists the dtypes the manager knows.
func dtypeNames() string {
	var names []string
	for _, d := range DTypes() {
		names = append(names, d.String())
	}
	return strings.Join(names, ", ")
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
