package npy

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
)

func TestHeaderRoundTrip(t *testing.T) {
	long := make([]int, 3000) // a header past 64 KiB needs version 2.0
	for i := range long {
		long[i] = 1
	}
	for _, h := range []Header{
		{Descr: "<f4", Shape: []int{251, 2, 4000000}},
		{Descr: "<i4", Shape: []int{7}},
		{Descr: "<f8", Shape: []int{}},
		{Descr: "|u1", Fortran: true, Shape: []int{3, 0}},
		{Descr: "<c16", Shape: long},
	} {
		b, err := h.Encode()
		if err != nil {
			t.Fatalf("%v: %v", h, err)
		}
		if len(b)%Align != 0 || b[len(b)-1] != '\n' {
			t.Errorf("%s %d dims: header of %d bytes, want a multiple of %d ending in a newline", h.Descr, len(h.Shape), len(b), Align)
		}
		got, off, err := ReadHeader(bytes.NewReader(b))
		if err != nil {
			t.Fatalf("%s %d dims: read back: %v", h.Descr, len(h.Shape), err)
		}
		if off != int64(len(b)) || got.Descr != h.Descr || got.Fortran != h.Fortran || !slices.Equal(got.Shape, h.Shape) {
			t.Errorf("read back %v at %d, want %v at %d", got, off, h, len(b))
		}
	}
}

func TestReadHeaderRefuses(t *testing.T) {
	enc := func(dict string) []byte {
		b := append([]byte(Magic), 1, 0)
		b = binary.LittleEndian.AppendUint16(b, uint16(len(dict)))
		return append(b, dict...)
	}
	for name, b := range map[string][]byte{
		"no magic":     []byte("PK\x03\x04 not numpy at all"),
		"short":        []byte(Magic),
		"version 9":    append([]byte(Magic), 9, 0, 0, 0),
		"not a dict":   enc("descr"),
		"no shape":     enc("{'descr': '<f4', 'fortran_order': False, }"),
		"structured":   enc("{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (2,), }"),
		"bad shape":    enc("{'descr': '<f4', 'fortran_order': False, 'shape': (2, x), }"),
		"bad order":    enc("{'descr': '<f4', 'fortran_order': maybe, 'shape': (2,), }"),
		"bad descr":    enc("{'descr': 'f4', 'fortran_order': False, 'shape': (2,), }"),
		"too big":      enc("{'descr': '<f8', 'fortran_order': False, 'shape': (4611686018427387904, 4), }"),
		"unknown key":  enc("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), 'x': 1}"),
		"cut off dict": enc("{'descr': '<f4', 'fortran_order': False, 'shape': (2,"),
	} {
		if _, _, err := ReadHeader(bytes.NewReader(b)); !errors.Is(err, ErrFormat) {
			t.Errorf("%s: got %v, want ErrFormat", name, err)
		}
	}
}

// TestWriteInParts writes a C-order [3, 2, 5] float32 file one column
// block at a time, out of order, and reads it back whole.
func TestWriteInParts(t *testing.T) {
	path := filepath.Join(t.TempDir(), "a.npy")
	h := Header{Descr: "<f4", Shape: []int{3, 2, 5}}
	f, err := Create(path, h, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	// Two writers: one per block of columns, as shards would.
	for _, cols := range [][2]int{{3, 5}, {0, 3}} {
		w, err := OpenWrite(path)
		if err != nil {
			t.Fatal(err)
		}
		for row := range 6 {
			var b []byte
			for c := cols[0]; c < cols[1]; c++ {
				b = binary.LittleEndian.AppendUint32(b, math.Float32bits(float32(row*5+c)))
			}
			if _, err := w.WriteAt(b, int64(row*5+cols[0])*4); err != nil {
				t.Fatal(err)
			}
		}
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := f.WriteAt(make([]byte, 8), f.DataBytes()-4); err == nil {
		t.Error("a write past the data succeeded")
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	r, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	b := make([]byte, r.DataBytes())
	if _, err := r.ReadAt(b, 0); err != nil {
		t.Fatal(err)
	}
	for i := range 30 {
		if got := math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:])); got != float32(i) {
			t.Fatalf("element %d = %v, want %d", i, got, i)
		}
	}
	st, _ := os.Stat(path)
	if st.Size() != r.DataOffset()+120 {
		t.Errorf("file of %d bytes, want %d", st.Size(), r.DataOffset()+120)
	}
}

// numpyPython is a python3 with numpy, or "" (the reason in why).
func numpyPython() (py, why string) {
	for _, p := range []string{"/usr/bin/python3", "python3"} {
		if path, err := exec.LookPath(p); err == nil {
			if exec.Command(path, "-c", "import numpy").Run() == nil {
				return path, ""
			}
		}
	}
	return "", "no python3 with numpy (install it: apt-get install -y python3-numpy)"
}

// TestNumpyRoundTrip has numpy load (plainly and memory-mapped) a file
// written here, and this package read one numpy wrote.
func TestNumpyRoundTrip(t *testing.T) {
	py, why := numpyPython()
	if py == "" {
		t.Skip(why)
	}
	dir := t.TempDir()
	ours := filepath.Join(dir, "ours.npy")
	f, err := Create(ours, Header{Descr: "<i4", Shape: []int{2, 3, 4}}, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	var b []byte
	for i := range 24 {
		b = binary.LittleEndian.AppendUint32(b, uint32(i*7))
	}
	// Written back to front in two parts.
	if _, err := f.WriteAt(b[48:], 48); err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(b[:48], 0); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	theirs := filepath.Join(dir, "theirs.npy")
	script := `
import sys, numpy as np
for mode in (None, "r"):
    a = np.load(sys.argv[1], mmap_mode=mode)
    assert a.shape == (2, 3, 4) and a.dtype == np.int32 and a.flags.c_contiguous, (a.shape, a.dtype)
    assert (np.asarray(a).ravel() == np.arange(24) * 7).all(), a
np.save(sys.argv[2], np.arange(6, dtype="<f8").reshape(3, 2))
`
	out, err := exec.Command(py, "-c", script, ours, theirs).CombinedOutput()
	if err != nil {
		t.Fatalf("numpy: %v\n%s", err, out)
	}
	r, err := Open(theirs)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if h := r.Header(); h.Descr != "<f8" || !slices.Equal(h.Shape, []int{3, 2}) || h.Fortran {
		t.Fatalf("numpy's header read as %+v", h)
	}
	got := make([]byte, 48)
	if _, err := r.ReadAt(got, 0); err != nil {
		t.Fatal(err)
	}
	for i := range 6 {
		if v := math.Float64frombits(binary.LittleEndian.Uint64(got[8*i:])); v != float64(i) {
			t.Errorf("element %d = %v, want %d", i, v, i)
		}
	}
}
