package trace

// Reading and writing RMM's logging CSV.
//
// RMM's logging_resource_adaptor writes
//
//	Thread,Time,Action,Pointer,Size,Stream
//
// one line per call. Read is lenient where logs in the wild differ and
// strict where a mistake would change a replay: columns are found by the
// header's names (in any order, extra columns ignored, case ignored), or
// taken in RMM's order when there is no header; pointers and streams may
// be hex (with or without 0x) or decimal; blank lines, '#' comments,
// CRLF line ends, a UTF-8 byte-order mark, double quotes around a field
// and clock times (RMM's own "13:04:05.250000") are accepted. A line that cannot be read is an error naming the line,
// the field and what was expected.
//
// A log is untrusted input, and what reading it costs is bounded: lines
// of at most 1 MiB (a longer one is an error), read one at a time through
// a buffer of that size at most, and a fixed 48-byte Event per event
// kept; time is linear in the input. Errors quote at most clipLen bytes
// of a bad line or field (Replay's bounds are in replay.go).

import (
	"bufio"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"math"
	"os"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/vramkit/vram/alloc"
	"github.com/vramkit/vram/internal/units"
	"github.com/vramkit/vram/internal/userfile"
)

// Header is the header line Write writes (RMM's, without the newline);
// alloc.Trace writes the same.
const Header = alloc.TraceHeader

// ErrMalformed is wrapped by Read's errors on input that is not an
// allocation log.
var ErrMalformed = errors.New("malformed allocation log")

// column indexes of the fields in a line; -1 when absent.
type columns struct {
	thread, time, action, pointer, size, stream int
	n                                           int // fields a line must have at least
}

// rmmColumns is RMM's order, used when a log has no header.
var rmmColumns = columns{thread: 0, time: 1, action: 2, pointer: 3, size: 4, stream: 5, n: 5}

// maxLineBytes bounds a line of a log, its end included.
const maxLineBytes = 1 << 20

// Read reads an allocation log in RMM's logging CSV.
func Read(r io.Reader) ([]Event, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), maxLineBytes)
	var (
		events []Event
		cols   columns
		found  bool // cols known
		line   int
		fields []string
	)
	for sc.Scan() {
		line++
		text := sc.Text()
		if line == 1 {
			text = strings.TrimPrefix(text, "\uFEFF")
		}
		text = strings.TrimSpace(text)
		if text == "" || text[0] == '#' {
			continue
		}
		fields = splitFields(fields[:0], text)
		if !found {
			found = true
			if isHeader(fields) {
				c, err := headerColumns(fields)
				if err != nil {
					return nil, fmt.Errorf("trace: line %d: %w", line, err)
				}
				cols = c
				continue
			}
			cols = rmmColumns
		}
		e, err := parseEvent(fields, cols)
		if err != nil {
			return nil, fmt.Errorf("trace: line %d (%q): %w", line, clip(text), err)
		}
		events = append(events, e)
	}
	if err := sc.Err(); errors.Is(err, bufio.ErrTooLong) {
		return nil, fmt.Errorf("trace: line %d is longer than a line may be (%s): %w", line+1, units.Format(maxLineBytes), ErrMalformed)
	} else if err != nil {
		return nil, fmt.Errorf("trace: after line %d: %w", line, err)
	}
	return events, nil
}

// ReadFile reads the allocation log in the named file.
func ReadFile(path string) ([]Event, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("trace: %w", err)
	}
	defer f.Close()
	events, err := Read(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return events, nil
}

// splitFields splits a line at commas, trimming spaces and double quotes
// around each field.
func splitFields(dst []string, text string) []string {
	for {
		i := strings.IndexByte(text, ',')
		f := text
		if i >= 0 {
			f = text[:i]
		}
		f = strings.TrimSpace(f)
		if len(f) >= 2 && f[0] == '"' && f[len(f)-1] == '"' {
			f = strings.TrimSpace(f[1 : len(f)-1])
		}
		dst = append(dst, f)
		if i < 0 {
			return dst
		}
		text = text[i+1:]
	}
}

// isHeader reports whether a first line is a header: its action column (or
// any column) names a field rather than holding a value.
func isHeader(fields []string) bool {
	for _, f := range fields {
		switch strings.ToLower(f) {
		case "action", "pointer", "size", "thread", "time", "stream":
			return true
		}
	}
	return false
}

// headerColumns finds the columns by name.
func headerColumns(fields []string) (columns, error) {
	c := columns{thread: -1, time: -1, action: -1, pointer: -1, size: -1, stream: -1}
	for i, f := range fields {
		var dst *int
		switch strings.ToLower(f) {
		case "thread":
			dst = &c.thread
		case "time":
			dst = &c.time
		case "action":
			dst = &c.action
		case "pointer":
			dst = &c.pointer
		case "size":
			dst = &c.size
		case "stream":
			dst = &c.stream
		default:
			continue
		}
		if *dst >= 0 {
			return c, fmt.Errorf("header names column %q twice: %w", clip(f), ErrMalformed)
		}
		*dst = i
	}
	var missing []string
	if c.action < 0 {
		missing = append(missing, "Action")
	}
	if c.pointer < 0 {
		missing = append(missing, "Pointer")
	}
	if c.size < 0 {
		missing = append(missing, "Size")
	}
	if len(missing) > 0 {
		return c, fmt.Errorf("header %q lacks column %s (want %s): %w",
			clip(strings.Join(fields, ",")), strings.Join(missing, ", "), Header, ErrMalformed)
	}
	// Optional trailing columns may be missing from short lines.
	c.n = max(c.action, c.pointer, c.size) + 1
	return c, nil
}

func parseEvent(fields []string, c columns) (Event, error) {
	var e Event
	if len(fields) < c.n {
		return e, fmt.Errorf("%d fields, want at least %d (%s): %w", len(fields), c.n, Header, ErrMalformed)
	}
	get := func(i int) string {
		if i < 0 || i >= len(fields) {
			return ""
		}
		return fields[i]
	}
	switch strings.ToLower(get(c.action)) {
	case "allocate", "alloc", "allocation":
		e.Action = Allocate
	case "free", "deallocate":
		e.Action = Free
	case "allocate failure", "allocate_failure", "allocation failure":
		e.Action = AllocateFailure
	default:
		return e, fmt.Errorf("action %q: want allocate, free or allocate failure: %w", clip(get(c.action)), ErrMalformed)
	}
	var err error
	if e.Pointer, err = parseAddress(get(c.pointer)); err != nil {
		return e, fmt.Errorf("pointer %q: want an address in hex (0x7f00) or decimal: %w", clip(get(c.pointer)), ErrMalformed)
	}
	if e.Size, err = parseNumber(get(c.size)); err != nil {
		return e, fmt.Errorf("size %q: want a whole number of bytes: %w", clip(get(c.size)), ErrMalformed)
	}
	if e.Size > MaxSize && e.Action != AllocateFailure {
		return e, fmt.Errorf("size %d bytes: no device holds %s or more; want at most %d (trace.MaxSize): %w",
			e.Size, units.Format(MaxSize+1), uint64(MaxSize), ErrMalformed)
	}
	if s := get(c.stream); s != "" {
		if e.Stream, err = parseAddress(s); err != nil {
			return e, fmt.Errorf("stream %q: want a stream handle in hex or decimal: %w", clip(s), ErrMalformed)
		}
	}
	if s := get(c.time); s != "" {
		if e.Time, err = parseTime(s); err != nil {
			return e, fmt.Errorf("time %q: want seconds (0.25) or a clock time (13:04:05.250): %w", clip(s), ErrMalformed)
		}
	}
	if s := get(c.thread); s != "" {
		if e.Thread, err = parseNumber(s); err != nil {
			// Some loggers write thread ids as text: keep them apart.
			h := fnv.New64a()
			h.Write([]byte(s))
			e.Thread = h.Sum64()
		}
	}
	return e, nil
}

// MaxSize is the largest size an allocate or free event may have: sizes
// of 2^63 bytes and more are refused, as no device holds them (and sums of
// them would wrap).
const MaxSize = 1<<63 - 1

// clipLen is how much of a line or field an error message quotes.
const clipLen = 80

// clip cuts s to at most clipLen bytes (at a rune boundary) for an error
// message, marking the cut with "…" and the length: a line of a megabyte
// is not echoed whole.
func clip(s string) string {
	if len(s) <= clipLen {
		return s
	}
	cut := clipLen
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return fmt.Sprintf("%s… (%d bytes)", s[:cut], len(s))
}

// parseTime reads seconds ("0.25", "8e-06") or, as RMM's own logger
// writes it, a clock time ("13:04:05.250000"), which becomes seconds since
// midnight.
func parseTime(s string) (float64, error) {
	var secs float64
	if h, rest, ok := strings.Cut(s, ":"); ok {
		m, sec, ok := strings.Cut(rest, ":")
		if !ok {
			return 0, ErrMalformed
		}
		hh, err1 := strconv.ParseUint(h, 10, 32)
		mm, err2 := strconv.ParseUint(m, 10, 32)
		ss, err3 := strconv.ParseFloat(sec, 64)
		if err1 != nil || err2 != nil || err3 != nil || mm >= 60 || ss < 0 || ss >= 61 {
			return 0, ErrMalformed
		}
		secs = float64(hh)*3600 + float64(mm)*60 + ss
	} else {
		t, err := strconv.ParseFloat(s, 64)
		if err != nil {
			return 0, err
		}
		secs = t
	}
	if math.IsNaN(secs) || math.IsInf(secs, 0) || secs < 0 {
		return 0, ErrMalformed
	}
	return secs, nil
}

// parseNumber reads a decimal number, or hex with a 0x prefix.
func parseNumber(s string) (uint64, error) {
	if len(s) > 2 && s[0] == '0' && (s[1] == 'x' || s[1] == 'X') {
		return strconv.ParseUint(s[2:], 16, 64)
	}
	return strconv.ParseUint(s, 10, 64)
}

// parseAddress reads hex with a 0x prefix, hex without one when it has a
// hex letter, or decimal.
func parseAddress(s string) (uint64, error) {
	if len(s) > 2 && s[0] == '0' && (s[1] == 'x' || s[1] == 'X') {
		return strconv.ParseUint(s[2:], 16, 64)
	}
	if strings.ContainsAny(s, "abcdefABCDEF") {
		return strconv.ParseUint(s, 16, 64)
	}
	return strconv.ParseUint(s, 10, 64)
}

// Writer writes events as RMM logging CSV, the header first. Not safe for
// concurrent use.
type Writer struct {
	w      *bufio.Writer
	line   []byte
	header bool // header written
}

// NewWriter returns a Writer on w. Call Flush when done.
func NewWriter(w io.Writer) *Writer {
	return &Writer{w: bufio.NewWriter(w), line: make([]byte, 0, 128)}
}

// writeHeader writes the header line unless it has been written.
func (w *Writer) writeHeader() error {
	if w.header {
		return nil
	}
	w.header = true
	if _, err := w.w.WriteString(Header + "\n"); err != nil {
		return fmt.Errorf("trace: write: %w", err)
	}
	return nil
}

// Write writes one event (after the header, on the first call).
func (w *Writer) Write(e Event) error {
	if err := w.writeHeader(); err != nil {
		return err
	}
	b := w.line[:0]
	b = strconv.AppendUint(b, e.Thread, 10)
	b = append(b, ',')
	b = strconv.AppendFloat(b, e.Time, 'f', -1, 64)
	b = append(b, ',')
	b = append(b, e.Action.String()...)
	b = append(b, ",0x"...)
	b = strconv.AppendUint(b, e.Pointer, 16)
	b = append(b, ',')
	b = strconv.AppendUint(b, e.Size, 10)
	b = append(b, ',')
	b = strconv.AppendUint(b, e.Stream, 10)
	b = append(b, '\n')
	w.line = b
	if _, err := w.w.Write(b); err != nil {
		return fmt.Errorf("trace: write: %w", err)
	}
	return nil
}

// Flush writes what is buffered (the header alone for an empty log).
func (w *Writer) Flush() error {
	if err := w.writeHeader(); err != nil {
		return err
	}
	if err := w.w.Flush(); err != nil {
		return fmt.Errorf("trace: write: %w", err)
	}
	return nil
}

// Write writes events to w as RMM logging CSV.
func Write(w io.Writer, events []Event) error {
	tw := NewWriter(w)
	for _, e := range events {
		if err := tw.Write(e); err != nil {
			return err
		}
	}
	return tw.Flush()
}

// WriteFile writes events to the named file as RMM logging CSV, whole or
// not at all (written beside path and renamed into place once complete;
// a path that exists and is not a regular file is refused).
func WriteFile(path string, events []Event) error {
	if err := userfile.Write(path, userfile.Options{}, func(w io.Writer) error { return Write(w, events) }); err != nil {
		return fmt.Errorf("trace: %s: %w", path, err)
	}
	return nil
}
