package broker

// Checks of every request before it reaches the table. Each error names
// the field at fault and quotes its value, clipped; a request that
// passes has sizes within its device, a proportion the share rules can
// read, a name of bounded printable text and a lease id that is not 0.

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/vramkit/vram/broker/brokerpb"
	"github.com/vramkit/vram/internal/share"
	"github.com/vramkit/vram/internal/units"
)

// MaxNameBytes bounds a lease's name.
const MaxNameBytes = 128

// clipLen bounds how much of an untrusted string an error quotes.
const clipLen = 40

// clip quotes at most clipLen bytes of s, saying how long it was.
func clip(s string) string {
	if len(s) <= clipLen {
		return strconv.Quote(s)
	}
	cut := clipLen
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return fmt.Sprintf("%s… (%d bytes)", strconv.Quote(s[:cut]), len(s))
}

// checkID refuses lease id 0.
func checkID(id uint64) error {
	if id == 0 {
		return fmt.Errorf("lease_id 0: want a nonzero id chosen by the client: %w", ErrInvalid)
	}
	return nil
}

// checkName refuses a name that is too long, not UTF-8, or has
// characters that are not printable.
func checkName(name string) error {
	if len(name) > MaxNameBytes {
		return fmt.Errorf("spec.name %s: want at most %d bytes: %w", clip(name), MaxNameBytes, ErrInvalid)
	}
	if !utf8.ValidString(name) {
		return fmt.Errorf("spec.name %s: want UTF-8 text: %w", clip(name), ErrInvalid)
	}
	for _, r := range name {
		if !strconv.IsPrint(r) {
			return fmt.Errorf("spec.name %s: character %U is not printable: %w", clip(name), r, ErrInvalid)
		}
	}
	return nil
}

// checkProportion reads field as a share of the device: 0 (the auto
// pool) or 0 < p ≤ 1.
func checkProportion(field string, p float64) (uint64, error) {
	if math.IsNaN(p) || math.IsInf(p, 0) || p < 0 || p > 1 {
		return 0, fmt.Errorf("%s %v: want 0 < p ≤ 1, or 0 for the auto pool: %w", field, p, ErrInvalid)
	}
	u, err := share.ToUnits(p, true)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", field, err)
	}
	return u, nil
}

// checkSize refuses field bytes past the device's total.
func checkSize(field string, n uint64, d *device) error {
	if n > d.total {
		return fmt.Errorf("%s %d (%s): more than device %d's %s: %w", field, n, units.Format(n), d.index, units.Format(d.total), ErrInvalid)
	}
	return nil
}

// spec is a checked LeaseSpec.
type spec struct {
	dev   *device
	name  string
	asked float64
	units uint64
	cap   uint64
}

// deviceList names the broker's devices by index and name: "0
// (cuda:0); 1 (cuda:1)".
func deviceList(devs []*device) string {
	names := make([]string, len(devs))
	for i, d := range devs {
		names[i] = fmt.Sprintf("%d (%s)", d.index, d.name)
	}
	return strings.Join(names, "; ")
}

// checkSpec checks a LeaseSpec against the broker's devices.
func checkSpec(ps *brokerpb.LeaseSpec, devs []*device) (spec, error) {
	if ps == nil {
		return spec{}, fmt.Errorf("spec: missing: %w", ErrInvalid)
	}
	if int64(ps.GetDevice()) >= int64(len(devs)) {
		return spec{}, fmt.Errorf("spec.device %d: want the index of one of the broker's devices, %s: %w", ps.GetDevice(), deviceList(devs), ErrInvalid)
	}
	d := devs[ps.GetDevice()]
	if err := checkName(ps.GetName()); err != nil {
		return spec{}, err
	}
	u, err := checkProportion("spec.proportion", ps.GetProportion())
	if err != nil {
		return spec{}, err
	}
	if err := checkSize("spec.cap_bytes", ps.GetCapBytes(), d); err != nil {
		return spec{}, err
	}
	return spec{dev: d, name: ps.GetName(), asked: ps.GetProportion(), units: u, cap: ps.GetCapBytes()}, nil
}

// checkAcquire checks an AcquireRequest.
func checkAcquire(req *brokerpb.AcquireRequest, devs []*device) (spec, error) {
	if err := checkID(req.GetLeaseId()); err != nil {
		return spec{}, err
	}
	sp, err := checkSpec(req.GetSpec(), devs)
	if err != nil {
		return spec{}, err
	}
	if !req.GetRejoin() && (req.GetHeldBytes() != 0 || req.GetLimitBytes() != 0) {
		return spec{}, fmt.Errorf("held_bytes %d, limit_bytes %d: only a rejoin says what it holds: %w", req.GetHeldBytes(), req.GetLimitBytes(), ErrInvalid)
	}
	if err := checkSize("held_bytes", req.GetHeldBytes(), sp.dev); err != nil {
		return spec{}, err
	}
	if err := checkSize("limit_bytes", req.GetLimitBytes(), sp.dev); err != nil {
		return spec{}, err
	}
	return sp, nil
}

// checkHeld refuses a report of more than the device has beside the
// lease's context.
func checkHeld(held uint64, l *lease) error {
	d := l.dev
	if held > d.total-l.ctx {
		return fmt.Errorf("held_bytes %d (%s): more than device %d's %s less the %s context: %w", held, units.Format(held), d.index, units.Format(d.total), units.Format(l.ctx), ErrInvalid)
	}
	return nil
}
