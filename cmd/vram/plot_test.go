package main

import (
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
