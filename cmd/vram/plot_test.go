package main

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

func TestPlotUnit(t *testing.T) {
	tests := map[string]struct {
		top   float64
		unit  string
		scale float64
	}{
		"bytes": {500, "B", 1},
		"KiB":   {4096, "KiB", 1 << 10},
		"MiB":   {90 << 20, "MiB", 1 << 20},
		"GiB":   {3.6 * (1 << 30), "GiB", 1 << 30},
		"TiB":   {2 << 40, "TiB", 1 << 40},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if unit, scale := plotUnit(tc.top); unit != tc.unit || scale != tc.scale {
				t.Errorf("plotUnit(%v) = %s, %v; want %s, %v", tc.top, unit, scale, tc.unit, tc.scale)
			}
		})
	}
}

func TestByteTicks(t *testing.T) {
	tests := map[string]struct {
		lo, hi float64
		want   []float64
		labels []string // when given
	}{
		"0 to 6":     {0, 6.1, []float64{0, 1, 2, 3, 4, 5, 6}, []string{"0", "1", "2", "3", "4", "5", "6"}},
		"0 to 130":   {0, 130, []float64{0, 20, 40, 60, 80, 100, 120}, nil},
		"0 to 1.3":   {0, 1.3, []float64{0, 0.2, 0.4, 0.6, 0.8, 1, 1.2}, []string{"0.0", "0.2", "0.4", "0.6", "0.8", "1.0", "1.2"}},
		"0 to 10":    {0, 10, []float64{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, nil},
		"0 to 45":    {0, 45, []float64{0, 5, 10, 15, 20, 25, 30, 35, 40, 45}, nil},
		"empty span": {3, 3, []float64{3}, []string{"3"}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			var got []float64
			var labels []string
			for _, tk := range (byteTicks{}).Ticks(tc.lo, tc.hi) {
				if tk.Label == "" {
					t.Errorf("tick %v has no label", tk.Value)
				}
				got = append(got, tk.Value)
				labels = append(labels, tk.Label)
			}
			if tc.labels != nil && !slices.Equal(labels, tc.labels) {
				t.Errorf("labels %q, want %q", labels, tc.labels)
			}
			if !slices.EqualFunc(got, tc.want, func(a, b float64) bool { return a-b < 1e-9 && b-a < 1e-9 }) {
				t.Errorf("ticks %v, want %v", got, tc.want)
			}
		})
	}
}

// --plot writes through a temporary file and a rename: a failed write
// leaves the old file whole and no temporary file behind.
func TestWriteFileAtomic(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "replay.svg")
	if err := os.WriteFile(path, []byte("old plot"), 0o644); err != nil {
		t.Fatal(err)
	}
	boom := errors.New("disk full")
	err := writeFileAtomic(path, func(w io.Writer) error {
		io.WriteString(w, "half a new")
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("err = %v, want the writer's", err)
	}
	if b, _ := os.ReadFile(path); string(b) != "old plot" {
		t.Errorf("after a failed write the file holds %q, want the old plot", b)
	}
	check := func(want string) {
		t.Helper()
		entries, _ := os.ReadDir(dir)
		if len(entries) != 1 {
			t.Errorf("%d files in the folder, want only the plot (no temporary file left)", len(entries))
		}
		if b, _ := os.ReadFile(path); string(b) != want {
			t.Errorf("the file holds %q, want %q", b, want)
		}
	}
	check("old plot")
	if err := writeFileAtomic(path, func(w io.Writer) error { _, err := io.WriteString(w, "new plot"); return err }); err != nil {
		t.Fatal(err)
	}
	check("new plot")
	if st, err := os.Stat(path); err != nil || st.Mode().Perm()&0o044 == 0 {
		t.Errorf("plot mode %v, %v: want readable by others, as os.Create makes it", st.Mode(), err)
	}
}
