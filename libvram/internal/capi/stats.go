package capi

// Figures: each framework's books, the manager's Stats (the allocator's
// counters, the cap, the device and the books together) and its report.

import (
	"fmt"
	"strings"
	"text/tabwriter"

	"github.com/vramkit/vram"
	"github.com/vramkit/vram/internal/units"
)

// Books are one framework's allocations through a manager. Bytes are as
// asked, before the allocator's rounding (the allocator's own figures are
// after it). A plain value.
type Books struct {
	InUse     uint64 `json:"in_use"`      // bytes live
	PeakInUse uint64 `json:"peak_in_use"` // most bytes live at once since the last ResetPeaks
	Allocs    uint64 `json:"allocs"`      // successful allocations
	Frees     uint64 `json:"frees"`       // frees that took a pointer back
	OOMs      uint64 `json:"ooms"`        // allocations refused for want of memory (the cap's included)
}

func (b *Books) alloc(n uint64) {
	b.InUse += n
	b.PeakInUse = max(b.PeakInUse, b.InUse)
	b.Allocs++
}

func (b *Books) free(n uint64) {
	b.InUse -= n
	b.Frees++
}

// SourceBooks are one framework's books under its name.
type SourceBooks struct {
	Source string `json:"source"` // "c", "torch", "cupy" or "numba"
	Books
}

// Stats are a manager's figures at one moment. The allocator's bytes are
// as it spends them (after rounding); a framework's, as asked. A plain
// value, and the JSON the C library hands to Python.
type Stats struct {
	Handle       int64  `json:"handle"`
	Spec         string `json:"spec"`
	Device       int    `json:"device"`    // the device ordinal
	Backend      string `json:"backend"`   // "sim" or "cuda"
	Allocator    string `json:"allocator"` // the allocator kind: "pool" or "direct"
	InUse        uint64 `json:"in_use"`
	PeakInUse    uint64 `json:"peak_in_use"`
	Reserved     uint64 `json:"reserved"`
	PeakReserved uint64 `json:"peak_reserved"`
	Allocs       uint64 `json:"allocs"`
	Frees        uint64 `json:"frees"`
	CacheHits    uint64 `json:"cache_hits"`
	DeviceAllocs uint64 `json:"device_allocs"`
	DeviceFrees  uint64 `json:"device_frees"`
	Retries      uint64 `json:"retries"`
	OOMs         uint64 `json:"ooms"`
	Cap          uint64 `json:"cap"`      // bytes; 0: no cap
	CapUsed      uint64 `json:"cap_used"` // bytes charged against the cap
	DeviceFree   uint64 `json:"device_free"`
	DeviceTotal  uint64 `json:"device_total"`
	HookErrors   uint64 `json:"hook_errors"`
	// Sources are the frameworks' books, in Source order.
	Sources []SourceBooks `json:"sources"`
}

// Stats reads m's figures. The allocator's and the frameworks' are each
// read at one moment, not both at the same one.
func (m *Manager) Stats() (Stats, error) {
	done, err := m.use("stats")
	if err != nil {
		return Stats{}, err
	}
	defer done()
	_, rep := m.acct.Report()
	info := m.dev.Info()
	st := Stats{Handle: m.handle, Spec: m.spec, Device: m.ordinal, Backend: info.Backend, Allocator: rep.Allocator,
		InUse: rep.InUse, PeakInUse: rep.PeakInUse, Reserved: rep.Reserved, PeakReserved: rep.PeakReserved,
		Allocs: rep.Allocs, Frees: rep.Frees, CacheHits: rep.CacheHits, DeviceAllocs: rep.DeviceAllocs,
		DeviceFrees: rep.DeviceFrees, Retries: rep.Retries, OOMs: rep.OOMs, Cap: rep.Cap, CapUsed: rep.CapUsed}
	if free, total, err := m.dev.MemInfo(); err == nil {
		st.DeviceFree, st.DeviceTotal = free, total
	}
	m.mu.Lock()
	st.HookErrors = m.hookErrors
	for i, b := range m.books {
		st.Sources = append(st.Sources, SourceBooks{Source: Source(i).String(), Books: b})
	}
	m.mu.Unlock()
	return st, nil
}

// Report is the manager's memory report: its handle and device, the vram
// manager's report (allocator, cap, pinned pool, the client API's
// clients), each framework's books and the hook failures, as text.
func (m *Manager) Report() (string, error) {
	done, err := m.use("report")
	if err != nil {
		return "", err
	}
	defer done()
	return m.report(m.vm.Report()), nil
}

// report writes r with m's header, books and hook failures. Takes mu.
func (m *Manager) report(r vram.ManagerReport) string {
	var b strings.Builder
	fmt.Fprintf(&b, "vram manager %d on %s (device %d)\n", m.handle, m.spec, m.ordinal)
	b.WriteString(r.String())
	m.mu.Lock()
	books, hookErrs, lastHook := m.books, m.hookErrors, m.lastHook
	m.mu.Unlock()
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "framework\tin use\tpeak\tallocs\tfrees\tout of memory")
	for i, bk := range books {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%d\n", Source(i), units.Format(bk.InUse), units.Format(bk.PeakInUse), bk.Allocs, bk.Frees, bk.OOMs)
	}
	_ = tw.Flush()
	if hookErrs > 0 {
		fmt.Fprintf(&b, "hook errors  %d, the last: %s\n", hookErrs, lastHook)
	}
	return b.String()
}

// OOMReport is the manager's report at its last out of memory (the cap's
// refusals included), or "" when there has been none.
func (m *Manager) OOMReport() (string, error) {
	done, err := m.use("oom report")
	if err != nil {
		return "", err
	}
	defer done()
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.lastOOM, nil
}
