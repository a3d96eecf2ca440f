package share

import (
	"errors"
	"fmt"
	"math"
	"math/bits"
	"strconv"
	"strings"
)

// MinAutoPool is the smallest proportion of the total the auto pool may be
// left with while it has members.
const MinAutoPool = 0.05

// Unit is 1 in the fixed-point unit proportions are kept in, so that
// adding and removing 100,000 members leaves no rounding drift.
const Unit uint64 = 1_000_000_000_000

// MinAutoUnits is MinAutoPool in Unit.
const MinAutoUnits = uint64(MinAutoPool * float64(Unit))

// ErrProportion: a proportion out of range, or one the pools cannot give
// (a manual total over 1, an auto pool under MinAutoPool). The vram
// package exports it as vram.ErrProportion.
var ErrProportion = errors.New("proportion refused")

// ToUnits converts a proportion to Unit; zero (the auto pool) is allowed
// only when allowZero.
func ToUnits(p float64, allowZero bool) (uint64, error) {
	if math.IsNaN(p) || p < 0 || p > 1 || (p == 0 && !allowZero) {
		return 0, fmt.Errorf("proportion %v: want 0 < p ≤ 1 (or 0 for the auto pool): %w", p, ErrProportion)
	}
	u := uint64(math.Round(p * float64(Unit)))
	if p > 0 && u == 0 {
		return 0, fmt.Errorf("proportion %v is below the smallest share, %v: %w", p, 1/float64(Unit), ErrProportion)
	}
	return u, nil
}

// Pools is the state of one division: the sum of the manual proportions
// and the number of auto members. A member is described to it by its
// units: its manual proportion in Unit, or 0 for the auto pool. The zero
// value has no members and calls them "member"; New names them. A Pools
// is a plain value: its owner's mutex protects it.
type Pools struct {
	noun   string // what a member is called in messages ("client", "lease")
	manual uint64 // sum of manual proportions, in Unit
	auto   int    // members in the auto pool
}

// New returns empty pools whose messages call a member noun.
func New(noun string) Pools { return Pools{noun: noun} }

func (p *Pools) member() string {
	if p.noun == "" {
		return "member"
	}
	return p.noun
}

// Manual is the sum of the manual proportions, in Unit.
func (p *Pools) Manual() uint64 { return p.manual }

// Auto is the number of members in the auto pool.
func (p *Pools) Auto() int { return p.auto }

// Reset empties the pools.
func (p *Pools) Reset() { p.manual, p.auto = 0, 0 }

// Join adds a member with units (0: the auto pool). It returns a warning
// to log when a manual member leaves the auto pool under MinAutoPool with
// no auto members. A refusal wraps ErrProportion and changes nothing.
func (p *Pools) Join(units uint64) (warn string, err error) {
	if units == 0 {
		if left := Unit - p.manual; left < MinAutoUnits {
			n := p.member()
			return "", fmt.Errorf("an auto %s needs at least %s left by the manual %ss, and they leave %s; lower a manual proportion or give this %s one: %w",
				n, Pct(MinAutoUnits), n, Pct(left), n, ErrProportion)
		}
		p.auto++
		return "", nil
	}
	warn, err = p.check(p.manual+units, p.auto, units)
	if err != nil {
		return "", err
	}
	p.manual += units
	return warn, nil
}

// Leave takes out a member that joined with units.
func (p *Pools) Leave(units uint64) {
	if units > 0 {
		p.manual -= units
	} else {
		p.auto--
	}
}

// Move moves a member from units from to units to (either may be 0, the
// auto pool), as a Leave and a Join; a refusal puts it back, leaving the
// pools as they were.
func (p *Pools) Move(from, to uint64) (warn string, err error) {
	p.Leave(from)
	warn, err = p.Join(to)
	if err != nil {
		if from > 0 {
			p.manual += from
		} else {
			p.auto++
		}
	}
	return warn, err
}

// check checks that the pools can have a manual total of manual with auto
// auto members, once a member asks for asked of it; it returns a warning
// to log when the auto pool would be left under MinAutoPool with no auto
// members.
func (p *Pools) check(manual uint64, auto int, asked uint64) (warn string, err error) {
	n := p.member()
	if manual > Unit {
		// The most this member could have: what 100% leaves, less the
		// auto pool's minimum while it has members.
		limit := Unit
		if auto > 0 {
			limit -= MinAutoUnits
		}
		over := manual - min(manual, limit)
		why := ""
		if auto > 0 {
			why = fmt.Sprintf(" (the auto pool's %d %s(s) keep at least %s)", auto, n, Pct(MinAutoUnits))
		}
		return "", fmt.Errorf("manual proportions would total %s, over 100%%%s; %s: %w",
			Pct(manual), why, suggest(asked-min(asked, over), "lower the others"), ErrProportion)
	}
	left := Unit - manual
	if left < MinAutoUnits {
		if auto > 0 {
			short := MinAutoUnits - left
			return "", fmt.Errorf("manual proportions would total %s, leaving %s for the auto pool's %d %s(s), under the minimum %s; %s: %w",
				Pct(manual), Pct(left), auto, n, Pct(MinAutoUnits), suggest(asked-min(asked, short), "move the auto "+n+"s to manual"), ErrProportion)
		}
		warn = fmt.Sprintf("vram: manual proportions total %s, leaving %s for the auto pool, under the minimum %s: auto %ss will be refused",
			Pct(manual), Pct(left), Pct(MinAutoUnits), n)
	}
	return warn, nil
}

// Proportion is the share of a member with units: its manual proportion,
// or its equal part of the auto pool (0 when the auto pool is empty).
func (p *Pools) Proportion(units uint64) float64 {
	if units > 0 {
		return float64(units) / float64(Unit)
	}
	if p.auto == 0 {
		return 0
	}
	return float64(Unit-p.manual) / float64(p.auto) / float64(Unit)
}

// AutoShare is the proportion the auto members split: 1 − the manual
// total while there are auto members, else 0.
func (p *Pools) AutoShare() float64 {
	if p.auto == 0 {
		return 0
	}
	return float64(Unit-p.manual) / float64(Unit)
}

// Bytes is the share of total bytes of a member with units, rounded down
// and computed exactly (128-bit), so that the members' shares never add up
// to more than total.
func (p *Pools) Bytes(units, total uint64) uint64 {
	if units > 0 {
		return mulDiv(units, total, Unit)
	}
	if p.auto == 0 {
		return 0
	}
	// ⌊(Unit − manual) × total / Unit⌋ / auto = ⌊(Unit − manual) × total / (Unit × auto)⌋.
	return mulDiv(Unit-p.manual, total, Unit) / uint64(p.auto)
}

// mulDiv is ⌊a × b / d⌋ for a ≤ d (so the quotient fits in 64 bits).
func mulDiv(a, b, d uint64) uint64 {
	hi, lo := bits.Mul64(a, b)
	q, _ := bits.Div64(hi, lo, d)
	return q
}

// Pct formats u (in Unit) as an exact percentage, trailing zeros trimmed
// ("33.33%", "5%"), so that figures compared in one message never round to
// the same text.
func Pct(u uint64) string { return decimal(u, Unit/100) + "%" }

// decimal formats v/scale (scale a power of ten) with the decimals it
// needs.
func decimal(v, scale uint64) string {
	s := strconv.FormatUint(v/scale, 10)
	if f := v % scale; f > 0 {
		digits := len(strconv.FormatUint(scale, 10)) - 1
		s += "." + strings.TrimRight(fmt.Sprintf("%0*d", digits, f), "0")
	}
	return s
}

// suggest says what proportion a refused member may ask for, given the
// most it can have, u (in Unit), and the other way out, else. The figure
// is rounded down to 0.0001 (more decimals if that leaves nothing), so
// that asking for it is accepted.
func suggest(u uint64, other string) string {
	if u == 0 {
		return "no manual proportion fits beside the others; " + other
	}
	step := Unit / 10_000
	for step > 1 && u/step == 0 {
		step /= 10
	}
	p := u / step * step
	return fmt.Sprintf("ask for a proportion of at most %s (%s) or %s", decimal(p, Unit), Pct(p), other)
}
