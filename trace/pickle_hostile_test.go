package trace_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/vramkit/vram/trace"
)

// pk builds a pickle opcode by opcode, for hostile inputs no encoder
// writes.
type pk struct{ bytes.Buffer }

func newPK() *pk { p := &pk{}; p.WriteString("\x80\x04"); return p }

func (p *pk) op(s string) *pk { p.WriteString(s); return p }

// str is a BINUNICODE string.
func (p *pk) str(s string) *pk {
	p.WriteByte('X')
	binary.Write(&p.Buffer, binary.LittleEndian, uint32(len(s)))
	p.WriteString(s)
	return p
}

// int is a BININT.
func (p *pk) int(v int32) *pk {
	p.WriteByte('J')
	binary.Write(&p.Buffer, binary.LittleEndian, v)
	return p
}

// get is a LONG_BINGET of memo entry i.
func (p *pk) get(i uint32) *pk {
	p.WriteByte('j')
	binary.Write(&p.Buffer, binary.LittleEndian, i)
	return p
}

// memo stores the stack's top as the next memo entry (MEMOIZE).
func (p *pk) memo() *pk { return p.op("\x94") }

// times writes f n times.
func (p *pk) times(n int, f func(*pk)) *pk {
	for range n {
		f(p)
	}
	return p
}

// snapshotAround writes a snapshot whose one history entry has the value
// that value writes as its "size".
func snapshotAround(value func(*pk)) []byte {
	p := newPK().op("}(").str("segments").op("]").str("device_traces").op("]]}(")
	p.str("action").str("alloc").str("addr").int(4096).str("size")
	value(p)
	p.op("uaa").op("u.")
	return p.Bytes()
}

// TestReadSnapshotHostileValues gives ReadSnapshot entries whose size is
// a value that printing whole would kill the process or flood the
// error: a dict that contains itself, two million nested lists, a
// 1 MiB string referred to 4096 times. Each is refused with a short
// message naming the value's type; a string that spells a number is
// named as a string.
func TestReadSnapshotHostileValues(t *testing.T) {
	tests := map[string]struct {
		value func(*pk)
		want  string
	}{
		"a dict that contains itself": {
			value: func(p *pk) { p.op("}").memo().str("me").get(0).op("s") },
			want:  `"size" is a dict of 1 keys`,
		},
		"two million nested lists": {
			value: func(p *pk) {
				p.times(2_000_000, func(p *pk) { p.op("]") }).times(2_000_000-1, func(p *pk) { p.op("a") })
			},
			want: `"size" is a list of 1 items`,
		},
		"a 1 MiB string 4096 times": {
			value: func(p *pk) {
				p.str(strings.Repeat("x", 1<<20)).memo().op("0(").times(4096, func(p *pk) { p.get(0) }).op("l")
			},
			want: `"size" is a list of 4096 items`,
		},
		"a 1 MiB string": {
			value: func(p *pk) { p.str(strings.Repeat("y", 1<<20)) },
			want:  `"size" is the string "yyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyy"… (1048576 bytes)`,
		},
		"the string 512": {
			value: func(p *pk) { p.str("512") },
			want:  `"size" is the string "512", want a non-negative integer`,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			data := snapshotAround(tc.value)
			_, err := trace.ReadSnapshot(bytes.NewReader(data))
			if !errors.Is(err, trace.ErrSnapshot) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("ReadSnapshot: %.300v; want ErrSnapshot saying %q", err, tc.want)
			}
			if n := len(err.Error()); n > 400 {
				t.Errorf("the error is %d bytes long; want a line", n)
			}
		})
	}
}

// TestReadSnapshotSharedBlocks gives ReadSnapshot one list of 2000
// blocks referred to from each of 2000 segments: 4 million blocks named
// in a pickle of a few dozen kilobytes. It is refused, by the bound of
// one segment, block or entry per 4 bytes, instead of multiplied.
func TestReadSnapshotSharedBlocks(t *testing.T) {
	const blocks, segments = 2000, 2000
	p := newPK().op("}(").str("device_traces").op("]]}(")
	p.str("action").str("alloc").str("addr").int(4096).str("size").int(512).op("uaa")
	p.str("segments").op("](")
	// memo 0: the key "size"; 1: "address"; 2: the blocks list; 3:
	// "total_size" (each stored and popped).
	p.str("size").memo().op("0").str("address").memo().op("0")
	p.op("](")
	for i := range blocks {
		p.op("}(").get(1).int(int32(i) * 512).get(0).int(512).op("u")
	}
	p.op("e").memo().op("0")
	p.str("total_size").memo().op("0")
	for i := range segments {
		p.op("}(").get(3).int(int32(i)).str("blocks").get(2).op("u")
	}
	p.op("eu.")
	data := p.Bytes()
	_, err := trace.ReadSnapshot(bytes.NewReader(data))
	if !errors.Is(err, trace.ErrSnapshot) || !strings.Contains(err.Error(), "more segments, blocks and history entries than one per 4") {
		t.Fatalf("ReadSnapshot of %d bytes naming %d blocks: %.300v; want it refused by the bound", len(data), blocks*segments, err)
	}
}

// TestDecodePickleBound decodes the pickles that cost the most per byte
// (a value per opcode byte, memo entries, dict entries, deep nesting,
// one long key hashed many times) and checks what each allocates against
// MaxPickleBytesPerByte. The times are logged, not asserted.
func TestDecodePickleBound(t *testing.T) {
	const n = 200_000
	key := strings.Repeat("k", 256)
	tests := map[string][]byte{
		"empty dicts":          newPK().op("(").times(n, func(p *pk) { p.op("}") }).op("l.").Bytes(),
		"empty lists memoized": newPK().op("(").times(n, func(p *pk) { p.op("]").memo() }).op("l.").Bytes(),
		"duplicates":           newPK().op("(K\x00").times(n, func(p *pk) { p.op("2") }).op("l.").Bytes(),
		"duplicates memoized":  newPK().op("(K\x00").times(n, func(p *pk) { p.op("2").memo() }).op("l.").Bytes(),
		"dict entries":         newPK().op("}(").times(n, func(p *pk) { p.int(int32(p.Len())).op("2") }).op("u.").Bytes(),
		"nested lists":         newPK().times(n, func(p *pk) { p.op("]") }).times(n-1, func(p *pk) { p.op("a") }).op(".").Bytes(),
		"tuples of one":        newPK().op("(").times(n, func(p *pk) { p.op("N\x85") }).op("l.").Bytes(),
		"a long key, many times": newPK().op("}").op("\x8c\xff").op(key[:255]).memo().op("0(").
			times(n/4, func(p *pk) { p.get(0).get(0) }).op("u.").Bytes(),
	}
	for name, data := range tests {
		t.Run(name, func(t *testing.T) {
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			start := time.Now()
			v, err := trace.DecodePickle(bytes.NewReader(data))
			took := time.Since(start)
			runtime.ReadMemStats(&after)
			if err != nil {
				t.Fatal(err)
			}
			runtime.KeepAlive(v)
			per := float64(after.TotalAlloc-before.TotalAlloc) / float64(len(data))
			t.Logf("%d bytes: %.1f bytes allocated per byte, %.1f ns per byte", len(data), per, float64(took.Nanoseconds())/float64(len(data)))
			if per > trace.MaxPickleBytesPerByte {
				t.Errorf("%.1f bytes allocated per byte of pickle, more than the bound %d", per, trace.MaxPickleBytesPerByte)
			}
		})
	}
}

// TestReadSnapshotWrongTypes refuses a snapshot whose lists are of the
// wrong type, "blocks" as much as "segments", naming the type.
func TestReadSnapshotWrongTypes(t *testing.T) {
	entry := func(p *pk) *pk {
		return p.str("device_traces").op("]]}(").str("action").str("alloc").str("addr").int(4096).str("size").int(512).op("uaa")
	}
	tests := map[string]struct {
		data []byte
		want string
	}{
		"segments a dict": {entry(newPK().op("}(")).str("segments").op("}u.").Bytes(), `"segments" is a dict of 0 keys, want a list`},
		"blocks an integer": {entry(newPK().op("}(")).str("segments").op("]}(").str("total_size").int(1).str("blocks").int(5).op("uau.").Bytes(),
			`segments[0]: "blocks" is the integer 5, want a list`},
		"a block a string": {entry(newPK().op("}(")).str("segments").op("]}(").str("total_size").int(1).str("blocks").op("]").str("b").op("auau.").Bytes(),
			`segments[0].blocks[0] is the string "b", want a dict`},
		"a pickle of a class": {[]byte("\x80\x02cos\nsystem\n."), "not one a PyTorch snapshot uses"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			_, err := trace.ReadSnapshot(bytes.NewReader(tc.data))
			if !errors.Is(err, trace.ErrSnapshot) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("ReadSnapshot: %v; want ErrSnapshot saying %q", err, tc.want)
			}
		})
	}
}
