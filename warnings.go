package vram

// cubie's warnings, through the manager's log/slog logger (WithLogger),
// made once a group is allocated: in the Active limit mode, a group whose
// members hold more than CapWarnFraction of their caps (the next batch
// will chunk or be refused; in Passive mode caps bound nothing), and a client whose requests at full
// length are more than RequestWarnFactor times the memory the group could
// plan with (its batch takes that many chunks or more).

import (
	"github.com/vramkit/vram/internal/units"
)

const (
	// CapWarnFraction: a group whose members hold more than this
	// fraction of the sum of their caps after an allocation is warned of.
	CapWarnFraction = 0.95
	// RequestWarnFactor: a client whose queued requests, at full length,
	// are more than this many times the group's budget is warned of.
	RequestWarnFactor = 20
)

// warn logs the group's warnings after an allocation.
func (tx *allocTx) warn() {
	m := tx.m
	m.mu.Lock()
	var caps, held uint64
	for _, c := range m.reg.members(tx.group) {
		caps += m.capLocked(c)
		held += c.held
	}
	m.mu.Unlock()
	if tx.gb.mode == Active && caps > 0 && float64(held) > CapWarnFraction*float64(caps) {
		m.log.Warn("vram: a stream group holds more than 95% of its members' caps",
			"group", tx.group, "held", units.Format(held), "caps", units.Format(caps),
			"percent", float64(held)*100/float64(caps), "mode", tx.gb.mode.String())
	}
	budget := tx.gb.budget
	for _, c := range tx.requesters {
		full := fullDeviceBytes(tx.q[c])
		if budget > 0 && full > satMul(RequestWarnFactor, budget) {
			m.log.Warn("vram: a client's requests are more than 20 times the memory available to its group",
				"client", c.String(), "group", tx.group, "requested", units.Format(full),
				"available", units.Format(budget), "chunks", tx.plan.Chunks)
		}
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
