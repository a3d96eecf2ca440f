package trace

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"testing"

	ogorek "github.com/kisielk/og-rek"
)

// valueFrom builds a plain value from data, a program for a small stack
// machine: each byte pushes a scalar (its operand bytes following) or
// wraps the values on top into a list, tuple or dict.
func valueFrom(data []byte) any {
	var st []any
	next := func(n int) []byte {
		b := make([]byte, n)
		k := copy(b, data)
		data = data[k:]
		return b
	}
	for len(data) > 0 && len(st) < 1000 {
		op := data[0]
		data = data[1:]
		switch op % 9 {
		case 0:
			st = append(st, nil)
		case 1:
			st = append(st, op&0x10 != 0)
		case 2:
			st = append(st, int64(binary.LittleEndian.Uint64(next(8))))
		case 3:
			st = append(st, int64(int8(next(1)[0])))
		case 4:
			st = append(st, string(next(int(next(1)[0]))))
		case 5:
			st = append(st, math.Float64frombits(binary.LittleEndian.Uint64(next(8))))
		case 6, 7, 8:
			k := min(int(op/9)%5, len(st))
			items := append([]any(nil), st[len(st)-k:]...)
			st = st[:len(st)-k]
			switch op % 9 {
			case 6:
				st = append(st, items)
			case 7:
				st = append(st, ogorek.Tuple(items))
			default:
				m := map[any]any{}
				for i, v := range items {
					m[fmt.Sprint("k", i, len(st))] = v
				}
				st = append(st, m)
			}
		}
	}
	return st
}

// samePickled reports whether got, as decodePickle returns it, is want,
// as valueFrom built it.
func samePickled(want, got any) bool {
	switch w := want.(type) {
	case []any:
		g, ok := got.(*pyList)
		return ok && sameItems(w, g.items)
	case ogorek.Tuple:
		g, ok := got.(pyTuple)
		return ok && sameItems(w, g)
	case map[any]any:
		g, ok := got.(*pyDict)
		if !ok || len(g.m) != len(w) {
			return false
		}
		for k, v := range w {
			if gv, ok := g.m[k]; !ok || !samePickled(v, gv) {
				return false
			}
		}
		return true
	case float64:
		g, ok := got.(float64)
		return ok && math.Float64bits(g) == math.Float64bits(w)
	}
	return want == got
}

func sameItems(want, got []any) bool {
	if len(want) != len(got) {
		return false
	}
	for i := range want {
		if !samePickled(want[i], got[i]) {
			return false
		}
	}
	return true
}

// FuzzPickleRoundTrip: a plain value that og-rek (the writer of
// WriteSnapshot) encodes, at protocol 2 or 4, decodePickle reads back as
// the same value.
func FuzzPickleRoundTrip(f *testing.F) {
	f.Add([]byte{0, 1, 2, 1, 2, 3, 4, 5, 6, 7, 8, 3, 200, 4, 3, 'a', 'b', 'c', 6 + 9*3, 8 + 9*2})
	f.Add([]byte{2, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f, 2, 0, 0, 0, 0, 0, 0, 0, 0x80, 6 + 9*2})
	f.Fuzz(func(t *testing.T, data []byte) {
		want := valueFrom(data)
		proto := 2
		if len(data) > 0 && data[0]&1 == 1 {
			proto = 4
		}
		var buf bytes.Buffer
		if err := ogorek.NewEncoderWithConfig(&buf, &ogorek.EncoderConfig{Protocol: proto, StrictUnicode: true}).Encode(want); err != nil {
			t.Skip(err)
		}
		got, n, err := decodePickle(bytes.NewReader(buf.Bytes()))
		if err != nil {
			t.Fatalf("decode og-rek's protocol %d pickle of %d bytes: %v", proto, buf.Len(), err)
		}
		if n != int64(buf.Len()) {
			t.Errorf("read %d bytes of %d", n, buf.Len())
		}
		if !samePickled(want, got) {
			t.Fatalf("decoded %s, want the value encoded (protocol %d)", describe(got), proto)
		}
	})
}

// FuzzDecodePickle: any input is decoded or refused with an error, never
// a panic, and never reads past its STOP.
func FuzzDecodePickle(f *testing.F) {
	f.Add([]byte("\x80\x04}(\x8c\x01a]\x94h\x00a\x85u."))
	f.Add([]byte("\x80\x02(I99999999999\nL12L\nF1.5\n\x88\x89Nt."))
	f.Fuzz(func(t *testing.T, data []byte) {
		_, n, err := decodePickle(bytes.NewReader(data))
		if n > int64(len(data)) {
			t.Fatalf("read %d bytes of %d", n, len(data))
		}
		if err == nil && data[n-1] != '.' {
			t.Fatalf("decoded without ending on a STOP (byte %d is %q)", n-1, data[n-1])
		}
	})
}
