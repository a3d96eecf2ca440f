// `vram run --out`: the runs to verify read back from the file, in file
// order and in large reads.
//
// A run's samples lie one row apart in the file (row 2k+v holds every
// run's sample k of variable v), 4 × runs bytes apart: reading a run on
// its own takes 2 × samples reads. The runs to verify are read back
// together instead, row by row in the file's order, one read for each
// group of them that lies within readGap of the next (chunk boundaries
// come in pairs: one chunk's last run and the next one's first), so the
// file is passed over once. The runs of a chunk are read back as soon as
// the writer has written it (readBack), while its pages are still in the
// page cache: a file larger than the cache is then never read from disk
// to be verified. Verification takes them from there (samplesOf).

package main

import (
	"encoding/binary"
	"fmt"
	"math"
	"slices"

	"github.com/vramkit/vram"
	"github.com/vramkit/vram/internal/oscillator"
)

const (
	// readGap is the most bytes between two runs of a row read in one
	// read: reading them costs less than a second read.
	readGap = 64 << 10
	// readSpan is the most bytes of one read.
	readSpan = 1 << 20
)

// spreadRuns is want of runs 0 … n−1 spread evenly over them, the first
// and the last among them, in order.
func spreadRuns(n, want int) []int {
	want = min(want, n)
	idx := make([]int, 0, want)
	for k := range want {
		if want == 1 {
			return append(idx, 0)
		}
		idx = append(idx, int(int64(k)*int64(n-1)/int64(want-1)))
	}
	return idx
}

// keepRuns says which runs to read back wherever they fall (spreadRuns),
// besides each chunk's first and last; call it before the first drain.
func (t *trajFile) keepRuns(spread []int) {
	t.spread = slices.Clone(spread)
	slices.Sort(t.spread)
}

// readBack reads back the runs of chunk sp to verify (its first and last
// and the spread runs in it), just written, and keeps them for samplesOf.
func (t *trajFile) readBack(sp vram.Span) error {
	end := sp.Start + sp.Len
	lo, _ := slices.BinarySearch(t.spread, sp.Start)
	hi, _ := slices.BinarySearch(t.spread, end)
	idx := append([]int{sp.Start, end - 1}, t.spread[lo:hi]...)
	slices.Sort(idx)
	idx = slices.Compact(idx)
	got, err := t.readRuns(idx)
	if err != nil {
		return err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.kept == nil {
		t.kept = map[int][]oscillator.Sample{}
	}
	for k, i := range idx {
		t.kept[i] = got[k]
	}
	return nil
}

// samplesOf is the samples of the runs idx (sorted, without repeats): those
// read back as their chunks were written, and the others read from the
// file now, in one pass.
func (t *trajFile) samplesOf(idx []int) ([][]oscillator.Sample, error) {
	out := make([][]oscillator.Sample, len(idx))
	var rest []int
	t.mu.Lock()
	for k, i := range idx {
		if out[k] = t.kept[i]; out[k] == nil {
			rest = append(rest, i)
		}
	}
	t.mu.Unlock()
	if len(rest) == 0 {
		return out, nil
	}
	got, err := t.readRuns(rest)
	if err != nil {
		return nil, err
	}
	for k, j := 0, 0; k < len(idx); k++ {
		if out[k] == nil {
			out[k], j = got[j], j+1
		}
	}
	return out, nil
}

// readRuns reads the samples of the runs idx (sorted, without repeats)
// from the file: row by row, in the file's order, one read for the runs
// of a row within readGap of one another.
func (t *trajFile) readRuns(idx []int) ([][]oscillator.Sample, error) {
	out := make([][]oscillator.Sample, len(idx))
	for k := range out {
		out[k] = make([]oscillator.Sample, t.samples)
	}
	groups := readGroups(idx)
	buf := make([]byte, readSpan)
	for row := range 2 * t.samples {
		for _, g := range groups {
			j, e := g[0], g[1]
			b := buf[:(idx[e]-idx[j]+1)*4]
			if _, err := t.f.ReadAt(b, int64(row*t.runs+idx[j])*4); err != nil {
				return nil, fmt.Errorf("read runs %d-%d back from %s: %w", idx[j], idx[e], t.path, err)
			}
			for q := j; q <= e; q++ {
				x := float64(math.Float32frombits(binary.LittleEndian.Uint32(b[(idx[q]-idx[j])*4:])))
				if s := &out[q][row/2]; row%2 == 0 {
					s.X = x
				} else {
					s.V = x
				}
			}
		}
	}
	return out, nil
}

// readGroups cuts the runs idx (sorted, without repeats) into the groups
// one read of a row takes: from idx[g[0]] to idx[g[1]], each run within
// readGap bytes of the next and at most readSpan bytes in all.
func readGroups(idx []int) [][2]int {
	var groups [][2]int
	for j := 0; j < len(idx); {
		e := j
		for e+1 < len(idx) && (idx[e+1]-idx[e])*4 <= readGap && (idx[e+1]-idx[j]+1)*4 <= readSpan {
			e++
		}
		groups = append(groups, [2]int{j, e})
		j = e + 1
	}
	return groups
}
