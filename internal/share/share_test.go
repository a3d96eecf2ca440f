package share

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
)

func units(t *testing.T, p float64) uint64 {
	t.Helper()
	u, err := ToUnits(p, true)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

func TestToUnits(t *testing.T) {
	for name, tc := range map[string]struct {
		p         float64
		allowZero bool
		want      uint64
		err       bool
	}{
		"half":                  {p: 0.5, want: Unit / 2},
		"one":                   {p: 1, want: Unit},
		"auto allowed":          {p: 0, allowZero: true, want: 0},
		"auto refused":          {p: 0, err: true},
		"negative":              {p: -0.1, allowZero: true, err: true},
		"over one":              {p: 1.0000001, err: true},
		"NaN":                   {p: math.NaN(), err: true},
		"infinite":              {p: math.Inf(1), err: true},
		"below the smallest":    {p: 1e-13, err: true},
		"the smallest share":    {p: 1e-12, want: 1},
		"rounded to the unit":   {p: 0.1234567890123, want: 123456789012},
		"negative zero is auto": {p: math.Copysign(0, -1), allowZero: true, want: 0},
	} {
		t.Run(name, func(t *testing.T) {
			got, err := ToUnits(tc.p, tc.allowZero)
			if tc.err {
				if !errors.Is(err, ErrProportion) {
					t.Fatalf("ToUnits(%v) = %d, %v; want ErrProportion", tc.p, got, err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("ToUnits(%v) = %d, %v; want %d", tc.p, got, err, tc.want)
			}
		})
	}
}

// Bytes rounds down, exactly: three auto members of 100 bytes get 33 each
// (99 in all, never 100.00000001 split as 34+33+33).
func TestBytes(t *testing.T) {
	for name, tc := range map[string]struct {
		manual []float64 // manual members first
		auto   int
		ask    float64 // the member asked about (0: an auto one)
		total  uint64
		want   uint64
	}{
		"three auto of 100 B":        {auto: 3, total: 100, want: 33},
		"manual 0.3 of 100 MiB":      {manual: []float64{0.3}, ask: 0.3, total: 100 << 20, want: 31457280},
		"auto beside 0.3 of 100 MiB": {manual: []float64{0.3}, auto: 2, total: 100 << 20, want: 36700160},
		"whole of 2^64−1":            {manual: []float64{1}, ask: 1, total: math.MaxUint64, want: math.MaxUint64},
		"auto of 2^64−1 alone":       {auto: 1, total: math.MaxUint64, want: math.MaxUint64},
		"no auto member":             {manual: []float64{0.5}, total: 1000, want: 0},
		"1/3 of 80 GB, rounded down": {manual: []float64{1.0 / 3}, ask: 1.0 / 3, total: 80e9, want: 26666666666},
	} {
		t.Run(name, func(t *testing.T) {
			p := New("lease")
			for _, m := range tc.manual {
				if _, err := p.Join(units(t, m)); err != nil {
					t.Fatal(err)
				}
			}
			for range tc.auto {
				if _, err := p.Join(0); err != nil {
					t.Fatal(err)
				}
			}
			if got := p.Bytes(units(t, tc.ask), tc.total); got != tc.want {
				t.Errorf("Bytes = %d, want %d", got, tc.want)
			}
		})
	}
}

// The words of a refusal name the members as the owner calls them.
func TestRefusalNamesTheMembers(t *testing.T) {
	p := New("lease")
	if _, err := p.Join(0); err != nil {
		t.Fatal(err)
	}
	_, err := p.Join(units(t, 0.99))
	if !errors.Is(err, ErrProportion) || !strings.Contains(err.Error(), "the auto pool's 1 lease(s)") {
		t.Fatalf("got %v", err)
	}
	if p.Manual() != 0 || p.Auto() != 1 {
		t.Errorf("a refusal changed the pools: manual %d, auto %d", p.Manual(), p.Auto())
	}
	var zero Pools
	if _, err := zero.Join(Unit); err != nil {
		t.Fatal(err)
	}
	if _, err := zero.Join(0); err == nil || !strings.Contains(err.Error(), "an auto member needs") {
		t.Fatalf("got %v", err)
	}
}

func ExamplePools() {
	p := New("lease")
	_, _ = p.Join(0)               // an auto lease
	_, _ = p.Join(Unit / 4)        // a manual lease of 25%
	fmt.Println(p.Bytes(0, 1000))  // the auto lease: what the manual ones leave
	fmt.Println(p.Proportion(0))   // the same as a proportion
	_, err := p.Join(Unit * 3 / 4) // would leave the auto pool nothing
	fmt.Println(err != nil, p.Manual() == Unit/4)
	// Output:
	// 750
	// 0.75
	// true true
}
