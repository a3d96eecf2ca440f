package units

import (
	"errors"
	"fmt"
	"math"
	"math/bits"
	"strconv"
	"strings"
)

// Byte multiples.
const (
	KiB uint64 = 1 << 10
	MiB uint64 = 1 << 20
	GiB uint64 = 1 << 30
	TiB uint64 = 1 << 40
)

// ErrBadSize is returned by ParseSize for text that is not a byte size.
var ErrBadSize = errors.New("not a byte size")

// SizeError is ParseSize's error: the text it could not read and why. It
// wraps ErrBadSize; its message quotes the text clipped.
type SizeError struct {
	Text   string // as given
	Reason string // why, without the text: "is negative", "overflows 64 bits", …
}

func (e *SizeError) Error() string {
	return quote(e.Text) + ": " + e.Reason + ": " + ErrBadSize.Error()
}

func (e *SizeError) Unwrap() error { return ErrBadSize }

var suffixes = []struct {
	name string
	mult float64
}{
	// Longest first so that "KiB" is not read as "B".
	{"kib", 1 << 10}, {"mib", 1 << 20}, {"gib", 1 << 30}, {"tib", 1 << 40},
	{"kb", 1e3}, {"mb", 1e6}, {"gb", 1e9}, {"tb", 1e12},
	{"k", 1 << 10}, {"m", 1 << 20}, {"g", 1 << 30}, {"t", 1 << 40},
	{"b", 1},
}

// quote quotes s, a size's text (from a flag, a file, the environment),
// for a message: at most 40 bytes of it, and its length when longer.
func quote(s string) string {
	if len(s) > 40 {
		return fmt.Sprintf("%q… (%d bytes)", s[:40], len(s))
	}
	return fmt.Sprintf("%q", s)
}

// ParseSize reads a byte size: a non-negative number with an optional
// suffix (B, KB/MB/GB/TB in powers of 1000, KiB/MiB/GiB/TiB or K/M/G/T in
// powers of 1024), case-insensitive, spaces allowed before the suffix.
func ParseSize(s string) (uint64, error) {
	t := strings.ToLower(strings.TrimSpace(s))
	if t == "" {
		return 0, &SizeError{s, "empty"}
	}
	mult := 1.0
	for _, sf := range suffixes {
		if strings.HasSuffix(t, sf.name) {
			mult = sf.mult
			t = strings.TrimSpace(strings.TrimSuffix(t, sf.name))
			break
		}
	}
	if u, err := strconv.ParseUint(t, 10, 64); err == nil {
		if mult == 1 {
			return u, nil
		}
		if float64(u)*mult >= math.MaxUint64 {
			return 0, &SizeError{s, "overflows 64 bits"}
		}
	}
	f, err := strconv.ParseFloat(t, 64)
	if err != nil || math.IsNaN(f) || math.IsInf(f, 0) {
		return 0, &SizeError{s, "want a number with an optional unit such as 512MiB or 2GB"}
	}
	if f < 0 {
		return 0, &SizeError{s, "is negative"}
	}
	v := f * mult
	if v >= math.MaxUint64 {
		return 0, &SizeError{s, "overflows 64 bits"}
	}
	return uint64(math.Round(v)), nil
}

// Format writes n bytes in binary units with up to one decimal
// ("512 B", "1.5 KiB", "256 MiB", "80.0 GiB").
func Format(n uint64) string {
	switch {
	case n < KiB:
		return strconv.FormatUint(n, 10) + " B"
	case n < MiB:
		return trim(float64(n)/float64(KiB)) + " KiB"
	case n < GiB:
		return trim(float64(n)/float64(MiB)) + " MiB"
	case n < TiB:
		return trim(float64(n)/float64(GiB)) + " GiB"
	default:
		return trim(float64(n)/float64(TiB)) + " TiB"
	}
}

func trim(f float64) string {
	s := strconv.FormatFloat(f, 'f', 1, 64)
	return strings.TrimSuffix(s, ".0")
}

// SatAdd is a + b, or math.MaxUint64 where the sum would overflow: a
// figure of bytes that stands for "more than can be counted".
func SatAdd(a, b uint64) uint64 {
	s, carry := bits.Add64(a, b, 0)
	if carry != 0 {
		return math.MaxUint64
	}
	return s
}

// SatMul is a × b, or math.MaxUint64 where the product would overflow.
func SatMul(a, b uint64) uint64 {
	hi, lo := bits.Mul64(a, b)
	if hi != 0 {
		return math.MaxUint64
	}
	return lo
}

// RoundUp rounds n up to a multiple of g (g > 0). It reports false when the
// result would overflow.
func RoundUp(n, g uint64) (uint64, bool) {
	if g == 0 {
		return n, true
	}
	r := n % g
	if r == 0 {
		return n, true
	}
	if n > math.MaxUint64-(g-r) {
		return 0, false
	}
	return n + (g - r), true
}
