package shard_test

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/vramkit/vram/npy"
	"github.com/vramkit/vram/shard"
)

// f32 is a float32 array header of shape.
func f32(shape ...int) npy.Header { return npy.Header{Descr: "<f4", Shape: shape} }

// TestCreatePartRefuses: a part that cannot be the shard's is refused
// before anything is written.
func TestCreatePartRefuses(t *testing.T) {
	one := shard.Shard{Index: 1, Count: 3} // of 10 runs: runs 3-5
	tests := map[string]struct {
		out   string
		s     shard.Shard
		total int
		h     npy.Header
		o     shard.PartOptions
		want  string
	}{
		"not a shard":           {out: "r.npy", s: shard.Shard{Index: 3, Count: 3}, total: 10, h: f32(3), want: "index 3 of 3 shards"},
		"not an .npy":           {out: "r.dat", s: one, total: 10, h: f32(3), want: "must end in .npy"},
		"more shards than runs": {out: "r.npy", s: one, total: 2, h: f32(1), want: "has no runs"},
		"wrong length":          {out: "r.npy", s: one, total: 10, h: f32(4), want: "want C order and 3 runs (runs 3-5)"},
		"no such axis":          {out: "r.npy", s: one, total: 10, h: f32(3), o: shard.PartOptions{Axis: 1}, want: "on axis 1"},
		"Fortran order":         {out: "r.npy", s: one, total: 10, h: npy.Header{Descr: "<f4", Shape: []int{3}, Fortran: true}, want: "want C order"},
		"batch not JSON":        {out: "r.npy", s: one, total: 10, h: f32(3), o: shard.PartOptions{Batch: json.RawMessage("{seed")}, want: "not a JSON value"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			_, err := shard.CreatePart(filepath.Join(dir, tc.out), tc.s, tc.total, tc.h, tc.o)
			if !errors.Is(err, shard.ErrShard) || !contains(err, tc.want) {
				t.Fatalf("CreatePart = %v; want an error wrapping ErrShard saying %q", err, tc.want)
			}
			if left, _ := os.ReadDir(dir); len(left) != 0 {
				t.Errorf("a refused part left %d files", len(left))
			}
		})
	}
}

// TestPartCommit: a committed part is in place with its manifest, which
// vouches for its data; a later try of the shard leaves both as they were
// until it commits, and an aborted one leaves them alone.
func TestPartCommit(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "r.npy")
	s := shard.Shard{Index: 1, Count: 2, From: "--shard"}
	write := func(value float32, commit bool) {
		t.Helper()
		p, err := shard.CreatePart(out, s, 7, f32(2, 4), shard.PartOptions{Axis: 1, Batch: json.RawMessage(`{"seed": 7}`)})
		if err != nil {
			t.Fatal(err)
		}
		if p.Path() != filepath.Join(dir, "r.shard-1-of-2.npy") {
			t.Errorf("Path = %s", p.Path())
		}
		data := make([]byte, 2*4*4)
		for i := 0; i < len(data); i += 4 {
			binary.LittleEndian.PutUint32(data[i:], uint32(value))
		}
		if _, err := p.File().WriteAt(data, 0); err != nil {
			t.Fatal(err)
		}
		if commit {
			err = p.Commit()
		} else {
			err = p.Abort()
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	write(1, true)
	first := readAll(t, dir)
	m := readManifest(t, filepath.Join(dir, "r.shard-1-of-2.json"))
	data := first["r.shard-1-of-2.npy"]
	f, err := npy.Open(filepath.Join(dir, "r.shard-1-of-2.npy"))
	if err != nil {
		t.Fatal(err)
	}
	off := f.DataOffset()
	f.Close()
	want := shard.Manifest{Part: "r.shard-1-of-2.npy", Shard: 1, Shards: 2, From: "--shard", FirstRun: 3, Runs: 4, TotalRuns: 7, Axis: 1,
		DataBytes: 32, DataCRC32C: fmt.Sprintf("%08x", crc32.Checksum(data[off:], crc32.MakeTable(crc32.Castagnoli)))}
	if m.Batch = nil; fmt.Sprint(m) != fmt.Sprint(want) {
		t.Errorf("manifest %+v; want %+v", m, want)
	}
	write(2, false)
	if after := readAll(t, dir); !sameFiles(first, after) {
		t.Errorf("an aborted try changed the directory: %v", slices.Sorted(maps.Keys(after)))
	}
	write(2, true)
	if after := readAll(t, dir); sameFiles(first, after) || len(after) != 2 {
		t.Errorf("a committed try left %v, the first try's", slices.Sorted(maps.Keys(after)))
	}
}

func readManifest(t *testing.T, path string) shard.Manifest {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	m, err := shard.ParseManifest(path, b)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// readAll reads every file of dir by name.
func readAll(t *testing.T, dir string) map[string][]byte {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	files := map[string][]byte{}
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		files[e.Name()] = b
	}
	return files
}

func sameFiles(a, b map[string][]byte) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || string(v) != string(w) {
			return false
		}
	}
	return true
}

func contains(err error, s string) bool { return err != nil && strings.Contains(err.Error(), s) }
