package vram

// The transaction's warnings (cubie's), through the manager's log/slog
// logger (WithLogger), made as cubie makes them: once the group's budget
// is read and its first plan made, before anything is evicted, freed or
// allocated.
//
//   - In the Active limit mode, a group whose members already hold more
//     than CapWarnFraction of their caps (the arrays being replaced
//     counted free, as the budget counts them): what is left to plan with
//     is small, so the batch runs in many chunks or is refused.
//   - A group whose requests, at full length, are more than
//     RequestWarnFactor times the device's free memory, when they do not
//     fit in one chunk, even when the plan then fails.
//
// Neither speaks of the plan the manager makes: a chunked plan fills its
// budget by design.

import (
	"strconv"

	"github.com/vramkit/vram/internal/units"
)

const (
	// CapWarnFraction: in Active mode, a group whose members hold more
	// than this fraction of the sum of their caps before an allocation is
	// warned of.
	CapWarnFraction = 0.95
	// RequestWarnFactor: a group whose queued requests, at full length,
	// are more than this many times the device's free memory is warned
	// of.
	RequestWarnFactor = 20
	// RequestWarning is the message of that warning, for a logger that
	// treats it apart (vram run, whose batches are chunked on purpose,
	// demotes it to debug).
	RequestWarning = "vram: a stream group's requests are more than 20 times the device's free memory"
)

// warn logs the group's warnings, given its first plan's error.
func (tx *allocTx) warn(planErr error) {
	m, gb := tx.m, &tx.gb
	if held := gb.held - min(gb.held, gb.replaced); gb.mode == Active && gb.caps > 0 && float64(held) > CapWarnFraction*float64(gb.caps) {
		m.log.Warn("vram: a stream group holds more than 95% of its members' caps before this allocation; it plans with what is left, in many chunks or not at all",
			"group", tx.group, "held", units.Format(held), "caps", units.Format(gb.caps),
			"percent", float64(held)*100/float64(gb.caps))
	}
	if !tx.wantsRoom(planErr) { // it fits in one chunk, or the requests themselves are wrong
		return
	}
	var full uint64
	for _, c := range tx.requesters {
		full = satAdd(full, fullDeviceBytes(tx.q[c]))
	}
	if gb.free > 0 && full > satMul(RequestWarnFactor, gb.free) {
		planned := "refused"
		if planErr == nil {
			planned = strconv.Itoa(tx.plan.Chunks) + " chunks"
		}
		m.log.Warn(RequestWarning,
			"group", tx.group, "requested", units.Format(full), "free", units.Format(gb.free), "plan", planned)
	}
}

// fullDeviceBytes is the device bytes of reqs at their full shapes.
func fullDeviceBytes(reqs map[string]ArrayRequest) uint64 {
	var sum uint64
	for _, r := range reqs {
		if !r.Memory.OnDevice() {
			continue
		}
		n, _ := elements(r.Shape)
		sum = satAdd(sum, satMul(n, r.DType.Size()))
	}
	return sum
}
