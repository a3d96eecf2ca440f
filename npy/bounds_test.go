package npy

import (
	"bytes"
	"encoding/binary"
	"errors"
	"slices"
	"strings"
	"testing"
)

// rawHeader is a version 2.0 .npy header holding dict, as is.
func rawHeader(dict string) []byte {
	b := append([]byte(Magic), 2, 0)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(dict)))
	return append(b, dict...)
}

// TestReadHeaderErrorsAreShort reads headers of up to a megabyte that are
// wrong in their dict, their descr, a key or a dimension: each error
// quotes a clipped piece of the header, never the whole.
func TestReadHeaderErrorsAreShort(t *testing.T) {
	mib := strings.Repeat("x", 1<<20-100)
	dims := strings.Repeat("1, ", 100_000)
	tests := map[string]struct {
		dict string
		want string
	}{
		"not a dict":              {mib, `header "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"… (1048476 bytes): not a dict`},
		"a long descr":            {"{'descr': '" + mib + "', 'fortran_order': False, 'shape': (1,), }", `descr "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"… (1048476 bytes): want a simple type`},
		"a long key":              {"{'" + mib + "': 1}", `unknown key "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"… (1048476 bytes)`},
		"a long dimension":        {"{'descr': '<f4', 'fortran_order': False, 'shape': (" + mib + ",), }", `shape dimension "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"… (1048476 bytes) is not a length`},
		"many dimensions":         {"{'descr': '<f4', 'fortran_order': False, 'shape': (" + dims + "-1), }", `shape dimension "-1" is not a length`},
		"a descr with many zeros": {"{'descr': '<x" + strings.Repeat("0", 1<<19) + "4', 'fortran_order': False, 'shape': (1,), }", "want a simple type"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			_, _, err := ReadHeader(bytes.NewReader(rawHeader(tc.dict)))
			if !errors.Is(err, ErrFormat) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("%.300v; want ErrFormat saying %q", err, tc.want)
			}
			if n := len(err.Error()); n > 400 {
				t.Errorf("the error is %d bytes of a %d-byte header", n, len(tc.dict))
			}
		})
	}
}

// TestHeaderString clips what a message shows of a header.
func TestHeaderString(t *testing.T) {
	many := make([]int, 20)
	for i := range many {
		many[i] = 1
	}
	tests := map[string]struct {
		h    Header
		want string
	}{
		"plain":   {Header{Descr: "<f4", Shape: []int{251, 2, 4000000}}, `"<f4" (251, 2, 4000000)`},
		"Fortran": {Header{Descr: "<f8", Fortran: true, Shape: []int{3}}, `"<f8" (3), Fortran order`},
		"long":    {Header{Descr: "<f" + strings.Repeat("0", 100) + "4", Shape: many}, `"<f00000000000000000000000000000000000000"… (103 bytes) (1, 1, 1, 1, 1, 1, 1, 1, … 20 dimensions in all)`},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if got := tc.h.String(); got != tc.want {
				t.Errorf("%s, want %s", got, tc.want)
			}
		})
	}
}

// FuzzReadHeader: any input is read or refused with ErrFormat, with an
// error of a line; a header read is encoded to the same header, and the
// bytes read are at most the input's.
func FuzzReadHeader(f *testing.F) {
	for _, h := range []Header{{Descr: "<f4", Shape: []int{251, 2, 4000000}}, {Descr: "|u1", Fortran: true, Shape: []int{}}} {
		b, _ := h.Encode()
		f.Add(b)
	}
	f.Add(rawHeader("{'descr': '<i8', 'shape': (3L, 4), 'fortran_order': True}"))
	f.Fuzz(func(t *testing.T, data []byte) {
		h, off, err := ReadHeader(bytes.NewReader(data))
		if err != nil {
			if len(err.Error()) > 600 {
				t.Fatalf("an error of %d bytes for %d bytes of input", len(err.Error()), len(data))
			}
			return
		}
		if off > int64(len(data)) {
			t.Fatalf("read %d bytes of %d", off, len(data))
		}
		b, err := h.Encode()
		if err != nil {
			return // a header read may be too long to write as version 1 or 2 (not the case for vram's)
		}
		back, _, err := ReadHeader(bytes.NewReader(b))
		if err != nil || back.Descr != h.Descr || back.Fortran != h.Fortran || !slices.Equal(back.Shape, h.Shape) {
			t.Fatalf("%v encoded and read back as %v (%v)", h, back, err)
		}
	})
}
