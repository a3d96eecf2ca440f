package main

import (
	"encoding/binary"
	"math"
	"path/filepath"
	"slices"
	"testing"

	"github.com/vramkit/vram"
	"github.com/vramkit/vram/internal/oscillator"
)

// valueAt is the float32 the test writes for run i's sample k of
// variable v: every value distinct, so a value read from the wrong place
// shows.
func valueAt(i, k, v int) float32 { return float32(i) + float32(k)/1024 + float32(v)/4 }

// writeTraj makes a --out file of runs × samples and drains it in chunks
// of chunk runs, as the batch's writer does; it returns the file.
func writeTraj(t *testing.T, runs, samples, chunk int, spread []int) *trajFile {
	t.Helper()
	tf, err := createTrajFile(filepath.Join(t.TempDir(), "r.npy"), runs, samples)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tf.done(true) })
	tf.keepRuns(spread)
	for start := 0; start < runs; start += chunk {
		n := min(chunk, runs-start)
		ld := chunk + 3 // a staging array longer than the chunk, as after a re-cut
		data := make([]byte, samples*2*ld*4)
		for k := range samples {
			for v := range 2 {
				for i := range n {
					binary.LittleEndian.PutUint32(data[((2*k+v)*ld+i)*4:], math.Float32bits(valueAt(start+i, k, v)))
				}
			}
		}
		st, err := vram.WrapHost(data, []int{samples, 2, ld}, vram.Float32)
		if err != nil {
			t.Fatal(err)
		}
		if err := tf.drain(vram.Span{Axis: 2, Start: start, Len: n}, st); err != nil {
			t.Fatal(err)
		}
	}
	return tf
}

// checkSamples checks that got holds the values writeTraj wrote for the
// runs idx.
func checkSamples(t *testing.T, idx []int, got [][]oscillator.Sample, samples int) {
	t.Helper()
	if len(got) != len(idx) {
		t.Fatalf("%d runs back for %d asked", len(got), len(idx))
	}
	for q, i := range idx {
		for k := range samples {
			if want := (oscillator.Sample{X: float64(valueAt(i, k, 0)), V: float64(valueAt(i, k, 1))}); got[q][k] != want {
				t.Fatalf("run %d sample %d: %+v, want %+v", i, k, got[q][k], want)
			}
		}
	}
}

// The runs to verify come back with the values written, whether read back
// as their chunk was written or read from the file afterwards, in one
// pass.
func TestTrajReadBack(t *testing.T) {
	const runs, samples, chunk = 70000, 5, 9000
	spread := spreadRuns(runs, 7)
	tf := writeTraj(t, runs, samples, chunk, spread)
	tests := map[string]struct {
		idx  []int
		kept bool // all read back as written
	}{
		"spread and chunk ends": {idx: []int{0, 8999, 9000, 11666, 17999, 69999}, kept: true},
		"others, from the file": {idx: []int{1, 2, 5000, 5001, 40000, 69998}},
		"a mix":                 {idx: []int{0, 3, 9000, 23332, 64000}},
		"none":                  {},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, err := tf.samplesOf(tc.idx)
			if err != nil {
				t.Fatal(err)
			}
			checkSamples(t, tc.idx, got, samples)
			direct, err := tf.readRuns(tc.idx)
			if err != nil {
				t.Fatal(err)
			}
			checkSamples(t, tc.idx, direct, samples)
			tf.mu.Lock()
			kept := 0
			for _, i := range tc.idx {
				if tf.kept[i] != nil {
					kept++
				}
			}
			tf.mu.Unlock()
			if tc.kept && kept != len(tc.idx) {
				t.Errorf("%d of the %d runs were read back as their chunks were written; want all", kept, len(tc.idx))
			}
		})
	}
}

// everyG is runs 0, g, 2g, … ng, g runs readGap bytes apart.
func everyG(n int) []int {
	var idx []int
	for k := range n + 1 {
		idx = append(idx, k*readGap/4)
	}
	return idx
}

// The runs of a row are read in groups: runs within readGap of the next
// in one read, never more than readSpan bytes, in the file's order.
func TestReadGroups(t *testing.T) {
	const g = readGap / 4 // runs in readGap bytes
	tests := map[string]struct {
		idx  []int
		want [][2]int // first and last run of each read
	}{
		// 3g and 3g+1: one chunk's last run and the next one's first.
		"chunk ends pair up": {[]int{0, 3 * g, 3*g + 1, 6 * g}, [][2]int{{0, 0}, {3 * g, 3*g + 1}, {6 * g, 6 * g}}},
		"within the gap":     {[]int{10, 10 + g, 10 + 2*g}, [][2]int{{10, 10 + 2*g}}},
		"past the gap":       {[]int{10, 11 + g}, [][2]int{{10, 10}, {11 + g, 11 + g}}},
		// readSpan holds 16g runs: 0 … 15g in one read (4 bytes short
		// of it), 16g … 20g in the next.
		"at most a span": {everyG(20), [][2]int{{0, 15 * g}, {16 * g, 20 * g}}},
		"one run":        {[]int{7}, [][2]int{{7, 7}}},
		"none":           {nil, nil},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			var got [][2]int
			for _, r := range readGroups(tc.idx) {
				got = append(got, [2]int{tc.idx[r[0]], tc.idx[r[1]]})
				if n := (tc.idx[r[1]] - tc.idx[r[0]] + 1) * 4; n > readSpan {
					t.Errorf("a read of %d bytes: want at most %d", n, readSpan)
				}
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("reads %v, want %v", got, tc.want)
			}
		})
	}
}
