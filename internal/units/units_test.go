package units

import (
	"errors"
	"math"
	"strconv"
	"testing"
)

func TestParseSize(t *testing.T) {
	tests := map[string]struct {
		in   string
		want uint64
		err  bool
	}{
		"plain":       {in: "4096", want: 4096},
		"MiB":         {in: "256MiB", want: 256 << 20},
		"GiB spaced":  {in: "2 GiB", want: 2 << 30},
		"GB decimal":  {in: "1.5GB", want: 1_500_000_000},
		"short G":     {in: "8g", want: 8 << 30},
		"bytes":       {in: "512B", want: 512},
		"fraction":    {in: "0.5KiB", want: 512},
		"empty":       {in: "", err: true},
		"negative":    {in: "-1MiB", err: true},
		"garbage":     {in: "lots", err: true},
		"bad unit":    {in: "5 parsecs", err: true},
		"overflow":    {in: "99999999TiB", err: true},
		"max uint":    {in: "18446744073709551615", want: 18446744073709551615},
		"nan":         {in: "NaN", err: true},
		"inf":         {in: "Inf GiB", err: true},
		"upper case":  {in: "64KIB", want: 64 << 10},
		"kb is 1000s": {in: "3kB", want: 3000},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, err := ParseSize(tc.in)
			if tc.err {
				if !errors.Is(err, ErrBadSize) {
					t.Fatalf("ParseSize(%q) = %d, %v; want ErrBadSize", tc.in, got, err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("ParseSize(%q) = %d, %v; want %d", tc.in, got, err, tc.want)
			}
		})
	}
}

func TestFormat(t *testing.T) {
	tests := map[uint64]string{
		0: "0 B", 512: "512 B", 1536: "1.5 KiB", 256 << 20: "256 MiB",
		80 << 30: "80 GiB", 3 << 40: "3 TiB", (1 << 30) + (1 << 29): "1.5 GiB",
	}
	for in, want := range tests {
		if got := Format(in); got != want {
			t.Errorf("Format(%d) = %q, want %q", in, got, want)
		}
	}
}

func TestRoundUp(t *testing.T) {
	tests := []struct {
		n, g, want uint64
		ok         bool
	}{
		{0, 512, 0, true}, {1, 512, 512, true}, {512, 512, 512, true},
		{513, 512, 1024, true}, {7, 0, 7, true},
		{^uint64(0), 512, 0, false},
	}
	for _, tc := range tests {
		got, ok := RoundUp(tc.n, tc.g)
		if got != tc.want || ok != tc.ok {
			t.Errorf("RoundUp(%d, %d) = %d, %v; want %d, %v", tc.n, tc.g, got, ok, tc.want, tc.ok)
		}
	}
}

func TestSaturating(t *testing.T) {
	const max = math.MaxUint64
	tests := map[string]struct{ got, want uint64 }{
		"add":          {SatAdd(2, 3), 5},
		"add to max":   {SatAdd(max-1, 1), max},
		"add past max": {SatAdd(max, 1), max},
		"mul":          {SatMul(1<<32, 1<<31), 1 << 63},
		"mul past max": {SatMul(1<<32, 1<<32), max},
		"mul by zero":  {SatMul(max, 0), 0},
	}
	for name, tc := range tests {
		if tc.got != tc.want {
			t.Errorf("%s: %d, want %d", name, tc.got, tc.want)
		}
	}
}

// TestSizeError: ParseSize's error says what it read and why, apart, for
// a caller that quotes the text itself; its message quotes the text once.
func TestSizeError(t *testing.T) {
	tests := map[string]struct{ in, reason string }{
		"empty":    {"  ", "empty"},
		"negative": {"-1GiB", "is negative"},
		"overflow": {"99999999999TiB", "overflows 64 bits"},
		"junk":     {"12 parsecs", "want a number with an optional unit such as 512MiB or 2GB"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			_, err := ParseSize(tc.in)
			var se *SizeError
			if !errors.As(err, &se) || !errors.Is(err, ErrBadSize) || se.Text != tc.in || se.Reason != tc.reason {
				t.Fatalf("ParseSize(%q) = %v; want a SizeError of %q, %q wrapping ErrBadSize", tc.in, err, tc.in, tc.reason)
			}
			if want := strconv.Quote(tc.in) + ": " + tc.reason + ": not a byte size"; err.Error() != want {
				t.Errorf("message %q, want %q", err, want)
			}
		})
	}
}
