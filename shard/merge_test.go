package shard_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vramkit/vram/npy"
	"github.com/vramkit/vram/shard"
)

// batchOf is a batch's output: an array of shape and dtype descr whose
// axis holds its runs.
type batchOf struct {
	shape []int
	axis  int
	descr string
}

// whole is the batch's output as one process writes it (C order): byte i
// is (7i + ⌊i/3⌋) mod 251, so that no run's data are another's.
func (b batchOf) whole(t *testing.T) []byte {
	t.Helper()
	h := npy.Header{Descr: b.descr, Shape: b.shape}
	n, err := h.DataBytes()
	if err != nil {
		t.Fatal(err)
	}
	data := make([]byte, n)
	for i := range data {
		data[i] = byte((i*7 + i/3) % 251)
	}
	return data
}

// writeParts writes the n shards' parts of b into out's directory, each
// the slice of whole its runs hold, with batch as their Batch.
func (b batchOf) writeParts(t *testing.T, out string, n int, batch string) {
	t.Helper()
	whole := b.whole(t)
	item, _ := npy.Header{Descr: b.descr}.ItemSize()
	total := b.shape[b.axis]
	blocks, inner := 1, item
	for i, d := range b.shape {
		if i < b.axis {
			blocks *= d
		} else if i > b.axis {
			inner *= d
		}
	}
	for i := range n {
		s := shard.Shard{Index: uint64(i), Count: uint64(n)}
		lo, hi := s.Range(uint64(total))
		shape := append([]int(nil), b.shape...)
		shape[b.axis] = int(hi - lo)
		p, err := shard.CreatePart(out, s, total, npy.Header{Descr: b.descr, Shape: shape}, shard.PartOptions{Axis: b.axis, Batch: json.RawMessage(batch)})
		if err != nil {
			t.Fatal(err)
		}
		runs := int(hi - lo)
		for k := range blocks {
			src := whole[(k*total+int(lo))*inner:][:runs*inner]
			if _, err := p.File().WriteAt(src, int64(k*runs*inner)); err != nil {
				t.Fatal(err)
			}
		}
		if err := p.Commit(); err != nil {
			t.Fatal(err)
		}
	}
}

// TestMergeIsTheWhole: parts on any run axis, of any dtype, split any way,
// gather into the bytes one process writes.
func TestMergeIsTheWhole(t *testing.T) {
	tests := map[string]struct {
		b      batchOf
		shards int
	}{
		"runs first":         {batchOf{shape: []int{10, 3}, axis: 0, descr: "<f4"}, 3},
		"runs in the middle": {batchOf{shape: []int{2, 11, 5}, axis: 1, descr: "<f8"}, 4},
		"runs last, bytes":   {batchOf{shape: []int{4, 2, 13}, axis: 2, descr: "|u1"}, 7},
		"one shard":          {batchOf{shape: []int{5}, axis: 0, descr: "<i4"}, 1},
		"as many as runs":    {batchOf{shape: []int{3, 6}, axis: 1, descr: "<i2"}, 6},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "r.npy")
			tc.b.writeParts(t, out, tc.shards, `{"seed": 1}`)
			res, err := shard.Merge(context.Background(), out, shard.MergeOptions{})
			if err != nil {
				t.Fatal(err)
			}
			f, err := npy.Open(out)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			got := make([]byte, f.DataBytes())
			if _, err := f.ReadAt(got, 0); err != nil {
				t.Fatal(err)
			}
			if string(got) != string(tc.b.whole(t)) || fmt.Sprint(f.Header()) != fmt.Sprint(npy.Header{Descr: tc.b.descr, Shape: tc.b.shape}) {
				t.Errorf("merged %v differs from the whole batch's %v", f.Header(), tc.b.shape)
			}
			if len(res.Parts) != tc.shards || res.Bytes != f.DataOffset()+f.DataBytes() || res.Removed {
				t.Errorf("Merged %+v", res)
			}
		})
	}
}

// TestMergeRefuses: a set of parts that is not one batch's, whole, is
// refused with the sentinel that says why, and no output is left.
func TestMergeRefuses(t *testing.T) {
	b := batchOf{shape: []int{3, 12}, axis: 1, descr: "<f4"}
	tests := map[string]struct {
		setup func(t *testing.T, out string) []string
		want  error
		says  string
	}{
		"no parts": {setup: func(t *testing.T, out string) []string { return nil }, want: shard.ErrMissingPart, says: "no parts of"},
		"a part missing": {setup: func(t *testing.T, out string) []string {
			b.writeParts(t, out, 3, "")
			remove(t, strings.TrimSuffix(out, ".npy")+".shard-1-of-3.json")
			return nil
		}, want: shard.ErrMissingPart, says: "runs 4-7 of 12 are in no part: shard 1/3"},
		"two splits": {setup: func(t *testing.T, out string) []string {
			b.writeParts(t, out, 2, "")
			b.writeParts(t, out, 3, "")
			return nil
		}, want: shard.ErrDuplicatePart, says: "runs 0-3 are in both"},
		"two batches": {setup: func(t *testing.T, out string) []string {
			b.writeParts(t, out, 2, `{"seed": 1}`)
			other := filepath.Join(t.TempDir(), "r.npy")
			b.writeParts(t, other, 2, `{"seed": 2}`)
			move(t, other, out, "r.shard-1-of-2")
			return nil
		}, want: shard.ErrPartMismatch, says: `batch {"seed":2}`},
		"another dtype": {setup: func(t *testing.T, out string) []string {
			b.writeParts(t, out, 2, "")
			other := filepath.Join(t.TempDir(), "r.npy")
			batchOf{shape: b.shape, axis: 1, descr: "<i4"}.writeParts(t, other, 2, "")
			move(t, other, out, "r.shard-1-of-2")
			return nil
		}, want: shard.ErrPartMismatch, says: `"<i4"`},
		"another shape": {setup: func(t *testing.T, out string) []string {
			b.writeParts(t, out, 2, "")
			other := filepath.Join(t.TempDir(), "r.npy")
			batchOf{shape: []int{4, 12}, axis: 1, descr: "<f4"}.writeParts(t, other, 2, "")
			move(t, other, out, "r.shard-1-of-2")
			return nil
		}, want: shard.ErrPartMismatch, says: "(4, 6)"},
		"a part rewritten": {setup: func(t *testing.T, out string) []string {
			b.writeParts(t, out, 2, "")
			f, err := npy.OpenWrite(strings.TrimSuffix(out, ".npy") + ".shard-0-of-2.npy")
			if err != nil {
				t.Fatal(err)
			}
			_, err = f.WriteAt([]byte{1, 2, 3}, 5)
			if err = errors.Join(err, f.Close()); err != nil {
				t.Fatal(err)
			}
			return nil
		}, want: shard.ErrPartData, says: "run the shard again"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "r.npy")
			parts := tc.setup(t, out)
			_, err := shard.Merge(context.Background(), out, shard.MergeOptions{Parts: parts})
			if !errors.Is(err, tc.want) || !contains(err, tc.says) {
				t.Fatalf("Merge = %v; want %v saying %q", err, tc.want, tc.says)
			}
			if _, err := os.Stat(out); !os.IsNotExist(err) {
				t.Errorf("a refused merge left %s (%v)", out, err)
			}
		})
	}
}

// TestMergeRemovesParts: RemoveParts leaves the output alone in its
// directory; a cancelled context stops before the first part and leaves
// no output.
func TestMergeRemovesParts(t *testing.T) {
	b := batchOf{shape: []int{9}, axis: 0, descr: "<f4"}
	dir := t.TempDir()
	out := filepath.Join(dir, "r.npy")
	b.writeParts(t, out, 3, "")
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := shard.Merge(ctx, out, shard.MergeOptions{RemoveParts: true}); !errors.Is(err, context.Canceled) {
		t.Fatalf("Merge under a cancelled context = %v", err)
	}
	if files := readAll(t, dir); len(files) != 6 {
		t.Fatalf("a cancelled merge left %d files, want the 6 of the parts", len(files))
	}
	res, err := shard.Merge(context.Background(), out, shard.MergeOptions{RemoveParts: true})
	if err != nil || !res.Removed {
		t.Fatalf("Merge = %+v, %v", res, err)
	}
	if files := readAll(t, dir); len(files) != 1 || files["r.npy"] == nil {
		t.Errorf("left %d files; want r.npy alone", len(files))
	}
}

func remove(t *testing.T, path string) {
	t.Helper()
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
}

// move replaces out's part stem (and its manifest) by other's.
func move(t *testing.T, other, out, stem string) {
	t.Helper()
	for _, ext := range []string{".npy", ".json"} {
		if err := os.Rename(filepath.Join(filepath.Dir(other), stem+ext), filepath.Join(filepath.Dir(out), stem+ext)); err != nil {
			t.Fatal(err)
		}
	}
}

// FuzzParseManifest: any manifest is read as a part of a batch that obeys
// the shard rule, names its own part, says its run axis and carries a
// checksum, or refused with an error of a line.
func FuzzParseManifest(f *testing.F) {
	f.Add([]byte(`{"part": "r.shard-1-of-2.npy", "shard": 1, "shards": 2, "from": "--shard", "first_run": 150, "runs": 150,
		"total_runs": 300, "axis": 2, "batch": {"seed": 7}, "data_bytes": 25200, "data_crc32c": "0123abcd"}`))
	f.Add([]byte(`{"part": "r.shard-0-of-1.npy", "shards": 1, "runs": 1, "total_runs": 1, "axis": 0, "data_crc32c": "ffffffff"}`))
	f.Add([]byte(`{"part": "", "first_run": 9223372036854775807}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := shard.ParseManifest("dir/r.shard-1-of-2.json", data)
		if err != nil {
			if len(err.Error()) > 600 {
				t.Fatalf("an error of %d bytes for %d bytes of manifest", len(err.Error()), len(data))
			}
			return
		}
		lo, hi := shard.Shard{Index: m.Shard, Count: m.Shards}.Range(uint64(m.TotalRuns))
		if m.Part != "r.shard-1-of-2.npy" || m.Shard != 1 || m.Shards != 2 || uint64(m.FirstRun) != lo || uint64(m.Runs) != hi-lo || m.Axis < 0 || len(m.DataCRC32C) != 8 {
			t.Fatalf("accepted %+v", m)
		}
	})
}

// TestParseManifestErrorsAreShort: a manifest naming a part of 60,000
// bytes is refused with the name clipped; one an older vram wrote (no
// run axis) is refused saying so.
func TestParseManifestErrorsAreShort(t *testing.T) {
	long := strings.Repeat("p", 60_000)
	for name, m := range map[string]string{
		"no runs":         `{"part": "` + long + `", "runs": 0}`,
		"another's part":  `{"part": "` + long + `", "shard": 1, "shards": 2, "first_run": 150, "runs": 150, "total_runs": 300, "axis": 2}`,
		"a long checksum": `{"part": "r.shard-1-of-2.npy", "shard": 1, "shards": 2, "first_run": 150, "runs": 150, "total_runs": 300, "axis": 2, "data_crc32c": "` + long + `"}`,
		"no run axis":     `{"part": "r.shard-1-of-2.npy", "shard": 1, "shards": 2, "first_run": 150, "runs": 150, "total_runs": 300, "samples": 21, "data_crc32c": "0123abcd"}`,
	} {
		t.Run(name, func(t *testing.T) {
			_, err := shard.ParseManifest("dir/r.shard-1-of-2.json", []byte(m))
			if err == nil || len(err.Error()) > 400 {
				t.Errorf("%.300v (%d bytes); want a short error", err, len(fmt.Sprint(err)))
			}
		})
	}
}
