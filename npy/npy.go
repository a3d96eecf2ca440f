// Package npy reads and writes NumPy .npy files (format versions 1.0 and
// 2.0) in pieces: a header, then the data written or read at byte
// offsets, so that a file much larger than memory can be filled as its
// parts become ready, by one process or several.
//
// # Format
//
// A .npy file is the magic "\x93NUMPY", a major and minor version byte,
// the header's length (uint16 little-endian in 1.0, uint32 in 2.0), and
// the header: a Python dict literal such as
//
//	{'descr': '<f4', 'fortran_order': False, 'shape': (251, 2, 4000000), }
//
// padded with spaces and ended by a newline so that the data starts at a
// multiple of 64 bytes. The data follows with no gap: the array's
// elements in C order (the last index varies fastest) unless
// fortran_order is True, each in the byte order and type descr names.
// numpy.load reads such a file, and numpy.load(path, mmap_mode="r")
// maps it. Element (i0, i1, …, ik) of a C-order array of shape
// (n0, n1, …, nk) lies at byte
//
//	DataOffset + itemsize × (((i0·n1 + i1)·n2 + i2)… ·nk + ik)
//
// # Writing in parts
//
// Create writes the header and sets the file to its full size (on most
// file systems a sparse file: no disk is used until written), so every
// part can be written in any order with WriteAt, whose offsets count from
// the first data byte. Several writers — goroutines, or processes that
// each write a shard's rows of one preallocated file — may do so at
// once: create the file once (Create), then have each writer open it with
// OpenWrite and write only its own byte ranges; writes to disjoint ranges
// do not interfere. Bytes never written read as zeros.
//
// A File is safe for concurrent WriteAt and ReadAt calls; Close must not
// race with them.
//
// # Untrusted headers
//
// A .npy file may come from anywhere, so ReadHeader (and Open) bound what
// a header may cost: at most 1 MiB of header is read (numpy's own limit
// is 10,000 bytes unless told otherwise), held once and parsed in one
// pass, so memory is at most a few bytes per header byte (the header and
// its shape) and time linear in its length; a shape must describe fewer
// than 2⁶³ bytes. Errors quote at most 40 bytes of a bad piece, with its
// length (Header.String clips the same way), never the whole header.
package npy

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
)

// ErrFormat is wrapped by errors about a file or header that is not a
// .npy this package can read.
var ErrFormat = errors.New("npy: bad format")

// Magic starts every .npy file.
const Magic = "\x93NUMPY"

// Align is the multiple of bytes the data starts at.
const Align = 64

// Header is what a .npy header says. A plain value.
type Header struct {
	// Descr is the NumPy type string: '<f4', '<f8', '<i4', '<i8', '|u1',
	// '<u4', '<c8', '<c16', '|b1', … (byte order, kind, size).
	Descr string
	// Fortran is true for Fortran (column-major) order; vram writes C
	// order.
	Fortran bool
	// Shape is the array's shape; empty for a scalar.
	Shape []int
}

// ItemSize is the bytes of one element, from Descr ('<f4' → 4).
func (h Header) ItemSize() (int, error) {
	d := h.Descr
	if len(d) < 3 || !strings.ContainsRune("<>|=", rune(d[0])) || !strings.ContainsRune("biufc", rune(d[1])) {
		return 0, fmt.Errorf("descr %s: want a simple type such as '<f4': %w", clip(d), ErrFormat)
	}
	n, err := strconv.Atoi(d[2:])
	if err != nil || n < 1 {
		return 0, fmt.Errorf("descr %s: bad item size: %w", clip(d), ErrFormat)
	}
	return n, nil
}

// String is the header for a message: its descr and shape, clipped
// (a header read from a file may be a megabyte long), e.g.
// "'<f4' (251, 2, 4000000)".
func (h Header) String() string {
	order := ""
	if h.Fortran {
		order = ", Fortran order"
	}
	return clip(h.Descr) + " " + shapeString(h.Shape) + order
}

// clipBytes is the most of an untrusted string a message quotes.
const clipBytes = 40

// clip quotes s for a message: at most clipBytes of it, and its length
// when longer.
func clip(s string) string {
	if len(s) > clipBytes {
		return fmt.Sprintf("%q… (%d bytes)", s[:clipBytes], len(s))
	}
	return fmt.Sprintf("%q", s)
}

// shapeString writes a shape for a message, at most 8 dimensions of it.
func shapeString(shape []int) string {
	var b strings.Builder
	b.WriteString("(")
	for i, d := range shape {
		if i == 8 {
			fmt.Fprintf(&b, ", … %d dimensions in all", len(shape))
			break
		}
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(strconv.Itoa(d))
	}
	b.WriteString(")")
	return b.String()
}

// Elements is the number of elements the shape holds.
func (h Header) Elements() (int64, error) {
	n := int64(1)
	for _, d := range h.Shape {
		if d < 0 {
			return 0, fmt.Errorf("shape %s has a negative dimension: %w", shapeString(h.Shape), ErrFormat)
		}
		if d != 0 && n > math.MaxInt64/int64(d) {
			return 0, fmt.Errorf("shape %s has more than 2^63 elements: %w", shapeString(h.Shape), ErrFormat)
		}
		n *= int64(d)
	}
	return n, nil
}

// DataBytes is the size of the data: elements × item size.
func (h Header) DataBytes() (int64, error) {
	size, err := h.ItemSize()
	if err != nil {
		return 0, err
	}
	n, err := h.Elements()
	if err != nil {
		return 0, err
	}
	if n > math.MaxInt64/int64(size) {
		return 0, fmt.Errorf("shape %s of %s is more than 2^63 bytes: %w", shapeString(h.Shape), clip(h.Descr), ErrFormat)
	}
	return n * int64(size), nil
}

// Encode returns the magic, version, length and header, padded so that
// data written right after it starts at a multiple of Align: its length
// is the data's offset. Version 1.0 is used when the header fits, else
// 2.0.
func (h Header) Encode() ([]byte, error) {
	if _, err := h.DataBytes(); err != nil {
		return nil, err
	}
	var dict strings.Builder
	order := "False"
	if h.Fortran {
		order = "True"
	}
	fmt.Fprintf(&dict, "{'descr': '%s', 'fortran_order': %s, 'shape': (", h.Descr, order)
	for i, d := range h.Shape {
		if i > 0 {
			dict.WriteString(" ")
		}
		dict.WriteString(strconv.Itoa(d) + ",")
	}
	if len(h.Shape) > 1 {
		// numpy writes (2, 3) not (2, 3,); both parse.
		s := strings.TrimSuffix(dict.String(), ",")
		dict.Reset()
		dict.WriteString(s)
	}
	dict.WriteString("), }")
	body := dict.String()
	for _, v := range []struct {
		major  byte
		lenLen int
	}{{1, 2}, {2, 4}} {
		pre := len(Magic) + 2 + v.lenLen
		total := (pre + len(body) + 1 + Align - 1) / Align * Align
		hlen := total - pre
		if v.lenLen == 2 && hlen > math.MaxUint16 {
			continue
		}
		out := make([]byte, 0, total)
		out = append(out, Magic...)
		out = append(out, v.major, 0)
		if v.lenLen == 2 {
			out = binary.LittleEndian.AppendUint16(out, uint16(hlen))
		} else {
			out = binary.LittleEndian.AppendUint32(out, uint32(hlen))
		}
		out = append(out, body...)
		for len(out) < total-1 {
			out = append(out, ' ')
		}
		return append(out, '\n'), nil
	}
	return nil, fmt.Errorf("header of %d bytes is too long: %w", len(body), ErrFormat)
}

// maxHeader bounds the header ReadHeader accepts (numpy's own limit is
// 10,000 bytes unless told otherwise).
const maxHeader = 1 << 20

// ReadHeader reads a .npy header from r and returns it and the data's
// offset (the bytes read).
func ReadHeader(r io.Reader) (Header, int64, error) {
	pre := make([]byte, len(Magic)+2)
	if _, err := io.ReadFull(r, pre); err != nil {
		return Header{}, 0, fmt.Errorf("read the magic: %v: %w", err, ErrFormat)
	}
	if string(pre[:len(Magic)]) != Magic {
		return Header{}, 0, fmt.Errorf("no %q magic at the start (%q): %w", Magic, pre[:len(Magic)], ErrFormat)
	}
	var hlen int
	switch major := pre[len(Magic)]; major {
	case 1:
		var b [2]byte
		if _, err := io.ReadFull(r, b[:]); err != nil {
			return Header{}, 0, fmt.Errorf("read the header length: %v: %w", err, ErrFormat)
		}
		hlen = int(binary.LittleEndian.Uint16(b[:]))
	case 2, 3:
		var b [4]byte
		if _, err := io.ReadFull(r, b[:]); err != nil {
			return Header{}, 0, fmt.Errorf("read the header length: %v: %w", err, ErrFormat)
		}
		hlen = int(binary.LittleEndian.Uint32(b[:]))
	default:
		return Header{}, 0, fmt.Errorf("format version %d.%d: want 1.0, 2.0 or 3.0: %w", major, pre[len(Magic)+1], ErrFormat)
	}
	if hlen > maxHeader {
		return Header{}, 0, fmt.Errorf("header of %d bytes: at most %d: %w", hlen, maxHeader, ErrFormat)
	}
	body := make([]byte, hlen)
	if _, err := io.ReadFull(r, body); err != nil {
		return Header{}, 0, fmt.Errorf("read the header: %v: %w", err, ErrFormat)
	}
	off := int64(len(pre)) + 2 + int64(hlen)
	if pre[len(Magic)] != 1 {
		off += 2
	}
	h, err := parseDict(string(bytes.TrimRight(body, " \n\x00")))
	return h, off, err
}

// parseDict reads the header dict: its keys descr, fortran_order and
// shape, in any order.
func parseDict(s string) (Header, error) {
	var h Header
	bad := func(what string) (Header, error) {
		return Header{}, fmt.Errorf("header %s: %s: %w", clip(s), what, ErrFormat)
	}
	if !strings.HasPrefix(s, "{") || !strings.HasSuffix(s, "}") {
		return bad("not a dict")
	}
	rest := strings.TrimSpace(s[1 : len(s)-1])
	seen := map[string]bool{}
	for rest != "" {
		key, after, ok := cutQuoted(rest)
		if !ok {
			return bad("a key is not quoted")
		}
		after = strings.TrimSpace(after)
		if !strings.HasPrefix(after, ":") {
			return bad("no ':' after key " + clip(key))
		}
		after = strings.TrimSpace(after[1:])
		var err error
		switch key {
		case "descr":
			h.Descr, after, ok = cutQuoted(after)
			if !ok {
				return bad("descr is not a simple quoted type (structured dtypes are not supported)")
			}
		case "fortran_order":
			switch {
			case strings.HasPrefix(after, "True"):
				h.Fortran, after = true, after[4:]
			case strings.HasPrefix(after, "False"):
				after = after[5:]
			default:
				return bad("fortran_order is not True or False")
			}
		case "shape":
			h.Shape, after, err = cutShape(after)
			if err != nil {
				return bad(err.Error())
			}
		default:
			return bad("unknown key " + clip(key))
		}
		seen[key] = true
		after = strings.TrimSpace(after)
		after = strings.TrimPrefix(after, ",")
		rest = strings.TrimSpace(after)
	}
	if !seen["descr"] || !seen["fortran_order"] || !seen["shape"] {
		return bad("want the keys descr, fortran_order and shape")
	}
	if _, err := h.DataBytes(); err != nil {
		return Header{}, err
	}
	return h, nil
}

// cutQuoted reads a '…' or "…" string at the start of s.
func cutQuoted(s string) (string, string, bool) {
	if len(s) < 2 || (s[0] != '\'' && s[0] != '"') {
		return "", s, false
	}
	end := strings.IndexByte(s[1:], s[0])
	if end < 0 {
		return "", s, false
	}
	return s[1 : 1+end], s[end+2:], true
}

// cutShape reads a tuple of integers at the start of s: (), (3,), (2, 3).
func cutShape(s string) ([]int, string, error) {
	if !strings.HasPrefix(s, "(") {
		return nil, s, errors.New("shape is not a tuple")
	}
	end := strings.IndexByte(s, ')')
	if end < 0 {
		return nil, s, errors.New("shape tuple is not closed")
	}
	shape := []int{}
	for _, f := range strings.Split(s[1:end], ",") {
		f = strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(f), "L"))
		if f == "" {
			continue
		}
		d, err := strconv.Atoi(f)
		if err != nil || d < 0 {
			return nil, s, fmt.Errorf("shape dimension %s is not a length", clip(f))
		}
		shape = append(shape, d)
	}
	return shape, s[end+1:], nil
}
