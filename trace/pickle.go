package trace

// A bounded reader of the pickles PyTorch memory snapshots are.
//
// torch.cuda.memory._dump_snapshot pickles plain data: dicts, lists and
// tuples of strings, integers, floats, booleans and None. decodePickle
// reads exactly that subset of the pickle protocol (protocols 2 to 5, the
// opcodes Python and og-rek write for such data) and refuses every other
// opcode, so nothing in a pickle is ever called, imported or built but
// those values. It is a stack machine over the opcodes, one pass, no
// recursion, so a hostile nesting costs its bytes and nothing more.
//
// Bound, stated and enforced: every opcode is at least one byte and adds
// at most one stack slot, list item, dict entry or memo entry (16 to
// about 64 bytes each), and the strings are the input's own bytes, so
// decoding allocates at most MaxPickleBytesPerByte bytes per byte of
// input (TestDecodePickleBound measures the worst cases); integers are at
// most 64 bits and dict keys at most maxPickleKey bytes, so no opcode
// costs more than a fixed amount of time (hashing a key). Containers keep
// Python's reference semantics: a list memoized and then appended to is
// the same list wherever it is referred to, and a list may contain
// itself; readers of the value walk fixed paths, never the whole graph.

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
)

// MaxPickleBytesPerByte bounds the bytes decodePickle allocates per byte
// of its input (see the file overview).
const MaxPickleBytesPerByte = 128

// maxPickleKey bounds a dict key's length in bytes: the keys of a
// snapshot are names such as "total_size".
const maxPickleKey = 256

// pyList is a pickled list: a reference, as in Python.
type pyList struct{ items []any }

// pyTuple is a pickled tuple.
type pyTuple []any

// pyDict is a pickled dict, a reference; its keys are strings, int64s,
// float64s, bools or nil. An empty one holds no map.
type pyDict struct{ m map[any]any }

// pyMark is the stack's mark object.
type pyMark struct{}

// pickleDecoder is one decoding's state.
type pickleDecoder struct {
	r     *bufio.Reader
	n     int64 // bytes read
	stack []any
	marks []int // stack lengths at each MARK, innermost last
	memo  map[uint32]any
	buf   []byte
}

// decodePickle reads one pickle from r and returns its value and the
// bytes it read.
func decodePickle(r io.Reader) (any, int64, error) {
	d := &pickleDecoder{r: bufio.NewReaderSize(r, 1<<16), memo: map[uint32]any{}}
	v, err := d.run()
	if err != nil {
		return nil, d.n, fmt.Errorf("byte %d: %w", d.n, err)
	}
	return v, d.n, nil
}

func (d *pickleDecoder) run() (any, error) {
	for {
		op, err := d.byte()
		if err != nil {
			return nil, err
		}
		if op == '.' { // STOP
			if len(d.stack) != 1 || len(d.marks) != 0 {
				return nil, fmt.Errorf("STOP with %d values on the stack, want 1", len(d.stack))
			}
			return d.stack[0], nil
		}
		if err := d.step(op); err != nil {
			return nil, err
		}
	}
}

// step runs one opcode other than STOP.
func (d *pickleDecoder) step(op byte) error {
	switch op {
	case 0x80: // PROTO
		v, err := d.byte()
		if err == nil && (v < 2 || v > 5) {
			err = fmt.Errorf("pickle protocol %d: want 2 to 5", v)
		}
		return err
	case 0x95: // FRAME: a length, and the frame's opcodes follow
		_, err := d.uint(8)
		return err
	case '(': // MARK
		d.marks = append(d.marks, len(d.stack))
		d.stack = append(d.stack, pyMark{})
		return nil
	case '0', '2', '1': // POP, DUP, POP_MARK
		return d.stackOp(op)
	case 'N':
		d.push(nil)
	case 0x88, 0x89: // NEWTRUE, NEWFALSE
		d.push(op == 0x88)
	case 'J', 'K', 'M', 0x8a, 0x8b: // BININT, BININT1, BININT2, LONG1, LONG4
		return d.int(op)
	case 'I', 'L', 'F': // INT, LONG, FLOAT as text (og-rek writes INT past 2³¹)
		return d.text(op)
	case 'G': // BINFLOAT
		u, err := d.fixed(8)
		if err == nil {
			d.push(math.Float64frombits(binary.BigEndian.Uint64(u)))
		}
		return err
	case 0x8c, 'X', 0x8d: // SHORT_BINUNICODE, BINUNICODE, BINUNICODE8
		return d.str(map[byte]int{0x8c: 1, 'X': 4, 0x8d: 8}[op])
	default:
		return d.container(op)
	}
	return nil
}

// container runs the opcodes that build lists, tuples and dicts and use
// the memo.
func (d *pickleDecoder) container(op byte) error {
	switch op {
	case ']':
		d.push(&pyList{})
	case ')':
		d.push(pyTuple{})
	case '}':
		d.push(&pyDict{})
	case 'l', 't', 'd': // LIST, TUPLE, DICT: from the items above the mark
		items, err := d.popMark()
		if err != nil {
			return err
		}
		switch op {
		case 'l':
			d.push(&pyList{items: items})
		case 't':
			d.push(pyTuple(items))
		default:
			dict := &pyDict{}
			if err := setItems(dict, items); err != nil {
				return err
			}
			d.push(dict)
		}
	case 0x85, 0x86, 0x87: // TUPLE1, TUPLE2, TUPLE3
		n := int(op-0x85) + 1
		items, err := d.popN(n)
		if err != nil {
			return err
		}
		d.push(pyTuple(items))
	case 'a', 'e', 's', 'u': // APPEND, APPENDS, SETITEM, SETITEMS
		return d.extend(op)
	case 'q', 'r', 0x94, 'h', 'j': // BINPUT, LONG_BINPUT, MEMOIZE, BINGET, LONG_BINGET
		return d.memoOp(op)
	default:
		return fmt.Errorf("opcode %s: not one a PyTorch snapshot uses (only plain dicts, lists, tuples, strings, numbers, booleans and None are read): %w",
			strconv.QuoteRune(rune(op)), errPickleOp)
	}
	return nil
}

// errPickleOp: an opcode outside the subset read.
var errPickleOp = errors.New("unsupported pickle opcode")

func (d *pickleDecoder) stackOp(op byte) error {
	switch op {
	case '1':
		_, err := d.popMark()
		return err
	case '0':
		if len(d.stack) == 0 || d.topIsMark() {
			return errors.New("POP of an empty stack")
		}
		d.stack = d.stack[:len(d.stack)-1]
	case '2':
		if len(d.stack) == 0 || d.topIsMark() {
			return errors.New("DUP of an empty stack")
		}
		d.push(d.stack[len(d.stack)-1])
	}
	return nil
}

func (d *pickleDecoder) topIsMark() bool {
	return len(d.marks) > 0 && d.marks[len(d.marks)-1] == len(d.stack)-1
}

// extend appends to the list, or sets items of the dict, below the
// values it takes.
func (d *pickleDecoder) extend(op byte) error {
	var items []any
	var err error
	switch op {
	case 'a':
		items, err = d.popN(1)
	case 's':
		items, err = d.popN(2)
	default:
		items, err = d.popMark()
	}
	if err != nil {
		return err
	}
	if len(d.stack) == 0 || d.topIsMark() {
		return errors.New("nothing to append to or set items of")
	}
	switch c := d.stack[len(d.stack)-1].(type) {
	case *pyList:
		if op == 's' || op == 'u' {
			return errors.New("SETITEM on a list")
		}
		c.items = append(c.items, items...)
	case *pyDict:
		if op == 'a' || op == 'e' {
			return errors.New("APPEND to a dict")
		}
		return setItems(c, items)
	default:
		return fmt.Errorf("append to or set items of %s", describe(c))
	}
	return nil
}

// setItems sets the key, value pairs of kv in dict.
func setItems(dict *pyDict, kv []any) error {
	if len(kv)%2 != 0 {
		return fmt.Errorf("%d values to set as dict items: want pairs", len(kv))
	}
	for i := 0; i < len(kv); i += 2 {
		k := kv[i]
		switch kk := k.(type) {
		case string:
			if len(kk) > maxPickleKey {
				return fmt.Errorf("dict key %s: at most %d bytes", describe(kk), maxPickleKey)
			}
		case int64, float64, bool, nil:
		default:
			return fmt.Errorf("dict key %s: want a string, a number, a boolean or None", describe(k))
		}
		if dict.m == nil {
			dict.m = make(map[any]any, len(kv)/2)
		}
		dict.m[k] = kv[i+1]
	}
	return nil
}

func (d *pickleDecoder) memoOp(op byte) error {
	var idx uint64
	var err error
	switch op {
	case 0x94:
		idx = uint64(len(d.memo))
	case 'q', 'h':
		idx, err = d.uint(1)
	default:
		idx, err = d.uint(4)
	}
	if err != nil {
		return err
	}
	if op == 'h' || op == 'j' {
		v, ok := d.memo[uint32(idx)]
		if !ok {
			return fmt.Errorf("memo entry %d was never stored", idx)
		}
		d.push(v)
		return nil
	}
	if len(d.stack) == 0 || d.topIsMark() {
		return errors.New("memoize an empty stack")
	}
	if idx > math.MaxUint32 {
		return fmt.Errorf("memo entry %d: too many", idx)
	}
	d.memo[uint32(idx)] = d.stack[len(d.stack)-1]
	return nil
}

// int pushes an integer opcode's value, as an int64.
func (d *pickleDecoder) int(op byte) error {
	switch op {
	case 'J':
		u, err := d.uint(4)
		d.push(int64(int32(uint32(u))))
		return err
	case 'K':
		u, err := d.uint(1)
		d.push(int64(u))
		return err
	case 'M':
		u, err := d.uint(2)
		d.push(int64(u))
		return err
	}
	lenBytes := 1
	if op == 0x8b {
		lenBytes = 4
	}
	n, err := d.uint(lenBytes)
	if err != nil {
		return err
	}
	if n > 8 {
		return fmt.Errorf("an integer of %d bytes: at most 8 (64 bits) are read", n)
	}
	b, err := d.fixed(int(n))
	if err != nil {
		return err
	}
	var v uint64
	for i := len(b) - 1; i >= 0; i-- {
		v = v<<8 | uint64(b[i])
	}
	if n > 0 && n < 8 && b[n-1]&0x80 != 0 { // negative: sign-extend
		v |= ^uint64(0) << (8 * n)
	}
	d.push(int64(v))
	return nil
}

// maxPickleLine bounds a text opcode's line: a 64-bit integer or a
// float needs fewer.
const maxPickleLine = 64

// text pushes the value of a text INT, LONG or FLOAT: a decimal line
// ("I01" and "I00" are True and False, as in Python; a LONG ends in "L").
func (d *pickleDecoder) text(op byte) error {
	line, err := d.line()
	if err != nil {
		return err
	}
	switch {
	case op == 'I' && line == "01":
		d.push(true)
		return nil
	case op == 'I' && line == "00":
		d.push(false)
		return nil
	case op == 'F':
		f, err := strconv.ParseFloat(line, 64)
		if err != nil {
			return fmt.Errorf("FLOAT %s: not a float", describe(line))
		}
		d.push(f)
		return nil
	}
	if op == 'L' {
		line = strings.TrimSuffix(line, "L")
	}
	n, err := strconv.ParseInt(line, 10, 64)
	if err != nil {
		return fmt.Errorf("integer %s: want a decimal of at most 64 bits", describe(line))
	}
	d.push(n)
	return nil
}

// line reads up to a newline, at most maxPickleLine bytes.
func (d *pickleDecoder) line() (string, error) {
	var b []byte
	for {
		c, err := d.byte()
		if err != nil {
			return "", err
		}
		if c == '\n' {
			return string(b), nil
		}
		if len(b) == maxPickleLine {
			return "", fmt.Errorf("a text opcode's line is longer than %d bytes", maxPickleLine)
		}
		b = append(b, c)
	}
}

// str pushes a string whose length is a lenBytes-byte little-endian
// integer. It is read as it comes, never allocated ahead of its bytes.
func (d *pickleDecoder) str(lenBytes int) error {
	n, err := d.uint(lenBytes)
	if err != nil {
		return err
	}
	if n > math.MaxInt32 {
		return fmt.Errorf("a string of %d bytes: at most %d", n, math.MaxInt32)
	}
	var b []byte
	for uint64(len(b)) < n {
		chunk := int(min(n-uint64(len(b)), 1<<16))
		start := len(b)
		b = slices.Grow(b, chunk)[:start+chunk]
		if _, err := io.ReadFull(d.r, b[start:]); err != nil {
			return fmt.Errorf("a string of %d bytes: %w", n, noEOF(err))
		}
		d.n += int64(chunk)
	}
	d.push(string(b))
	return nil
}

func (d *pickleDecoder) push(v any) { d.stack = append(d.stack, v) }

// popMark pops the values above the innermost mark, and the mark.
func (d *pickleDecoder) popMark() ([]any, error) {
	if len(d.marks) == 0 {
		return nil, errors.New("no MARK on the stack")
	}
	m := d.marks[len(d.marks)-1]
	d.marks = d.marks[:len(d.marks)-1]
	items := append([]any(nil), d.stack[m+1:]...)
	clear(d.stack[m:])
	d.stack = d.stack[:m]
	return items, nil
}

// popN pops n values, none of them a mark.
func (d *pickleDecoder) popN(n int) ([]any, error) {
	floor := 0
	if len(d.marks) > 0 {
		floor = d.marks[len(d.marks)-1] + 1
	}
	if len(d.stack)-floor < n {
		return nil, fmt.Errorf("%d values wanted on the stack, %d there", n, len(d.stack)-floor)
	}
	items := append([]any(nil), d.stack[len(d.stack)-n:]...)
	clear(d.stack[len(d.stack)-n:])
	d.stack = d.stack[:len(d.stack)-n]
	return items, nil
}

func (d *pickleDecoder) byte() (byte, error) {
	b, err := d.r.ReadByte()
	if err != nil {
		return 0, fmt.Errorf("the pickle ends before its STOP: %w", noEOF(err))
	}
	d.n++
	return b, nil
}

// fixed reads n bytes (n ≤ 8).
func (d *pickleDecoder) fixed(n int) ([]byte, error) {
	if cap(d.buf) < 8 {
		d.buf = make([]byte, 8)
	}
	b := d.buf[:n]
	if _, err := io.ReadFull(d.r, b); err != nil {
		return nil, fmt.Errorf("the pickle ends inside an opcode: %w", noEOF(err))
	}
	d.n += int64(n)
	return b, nil
}

// uint reads an n-byte little-endian unsigned integer.
func (d *pickleDecoder) uint(n int) (uint64, error) {
	b, err := d.fixed(n)
	if err != nil {
		return 0, err
	}
	var v uint64
	for i := n - 1; i >= 0; i-- {
		v = v<<8 | uint64(b[i])
	}
	return v, nil
}

func noEOF(err error) error {
	if errors.Is(err, io.EOF) {
		return io.ErrUnexpectedEOF
	}
	return err
}

// describe names a decoded value for an error message: its type and,
// for a scalar, its value (a string clipped to 40 bytes), never a
// container's contents.
func describe(v any) string {
	switch x := v.(type) {
	case nil:
		return "None"
	case string:
		if len(x) > 40 {
			return fmt.Sprintf("the string %q… (%d bytes)", x[:40], len(x))
		}
		return fmt.Sprintf("the string %q", x)
	case int64:
		return fmt.Sprintf("the integer %d", x)
	case float64:
		return fmt.Sprintf("the float %g", x)
	case bool:
		return fmt.Sprintf("the boolean %v", x)
	case *pyList:
		return fmt.Sprintf("a list of %d items", len(x.items))
	case pyTuple:
		return fmt.Sprintf("a tuple of %d items", len(x))
	case *pyDict:
		return fmt.Sprintf("a dict of %d keys", len(x.m))
	}
	return fmt.Sprintf("a %T", v)
}
