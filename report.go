package vram

// The manager's memory report: its allocator's alloc.MemoryReport, its
// pinned pool's, and each client's and group's share, cap and held bytes
// (torch.cuda.memory_summary, with the manager's clients beside it).

import (
	"fmt"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/vramkit/vram/alloc"
	"github.com/vramkit/vram/internal/units"
)

// ManagerReport is a manager's memory at one moment. A plain value.
type ManagerReport struct {
	Allocator   AllocatorKind      // the kind asked for; Memory.Allocator names what serves it
	Memory      alloc.MemoryReport // the device allocator's report (its Cap is WithCap's)
	Pinned      alloc.MemoryReport // the pinned host pool's; zero when the device has none
	Mode        LimitMode
	TotalMemory uint64         // bytes that shares are proportions of
	DeviceFree  uint64         // the device's free bytes (0 when it could not say)
	Clients     []ClientReport // open clients, by id
	Groups      []GroupReport  // stream groups with members, by name
}

// ClientReport is one client's share of a ManagerReport.
type ClientReport struct {
	ID         uint64
	Name       string // as Client.String: "name#id"
	Group      string
	Manual     bool    // a manual proportion (else the auto pool)
	Proportion float64 // share of TotalMemory
	Cap        uint64  // Proportion × TotalMemory, bytes
	Held       uint64  // device bytes its arrays take, as the allocator charges them
	Arrays     int     // labels it holds arrays under
}

// GroupReport is a stream group's sums over its members.
type GroupReport struct {
	Name    string
	Clients int
	Cap     uint64 // sum of the members' caps
	Held    uint64 // sum of what the members hold
}

// Report returns m's memory report. The allocator's figures and the
// clients' are each read at one moment, not both at the same one: an
// allocation in between may show in one and not the other. After Close
// it reports no clients.
func (m *Manager) Report() ManagerReport {
	var r ManagerReport
	r.Allocator, r.Memory = m.acct.Report()
	m.fillReport(&r)
	return r
}

// Report returns m's memory report.
//
// Deprecated: use m.Report().
func Report(m *Manager) ManagerReport { return m.Report() }

// AllocatorReport returns m's current allocator kind and its report, read
// together: the device allocator's part of Report, without the clients.
//
// Deprecated: use m.Account().Report().
func AllocatorReport(m *Manager) (AllocatorKind, alloc.MemoryReport) { return m.acct.Report() }

// fillReport adds everything but the device allocator's report to r.
// Takes m.mu; useMu may be held.
func (m *Manager) fillReport(r *ManagerReport) {
	if m.host.pinned != nil {
		r.Pinned = m.host.pinned.Report()
	}
	r.TotalMemory = m.total
	if free, _, err := m.dev.MemInfo(); err == nil {
		r.DeviceFree = free
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	r.Mode = m.mode
	groups := map[string]*GroupReport{}
	for _, c := range m.reg.all() {
		cr := ClientReport{ID: c.id, Name: c.String(), Group: c.group, Manual: c.isManual(),
			Proportion: m.proportionLocked(c), Cap: m.capLocked(c), Held: c.held, Arrays: len(c.arrays)}
		r.Clients = append(r.Clients, cr)
		g := groups[c.group]
		if g == nil {
			g = &GroupReport{Name: c.group}
			groups[c.group] = g
		}
		g.Clients++
		g.Cap += cr.Cap
		g.Held += cr.Held
	}
	for _, g := range groups {
		r.Groups = append(r.Groups, *g)
	}
	slices.SortFunc(r.Groups, func(a, b GroupReport) int { return strings.Compare(a.Name, b.Name) })
}

// String formats the report: the allocator's table, then one line per
// client and per group.
func (r ManagerReport) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "manager: %s allocator, %s limit mode, shares of %s, device free %s\n",
		r.Memory.Allocator, r.Mode, units.Format(r.TotalMemory), units.Format(r.DeviceFree))
	b.WriteString(r.Memory.String())
	if r.Pinned.Allocator != "" && (r.Pinned.Reserved > 0 || r.Pinned.OOMs > 0) {
		b.WriteString(r.Pinned.String())
	}
	if len(r.Clients) == 0 {
		b.WriteString("no clients\n")
		return b.String()
	}
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "client\tgroup\tpool\tshare\tcap\theld\tarrays")
	for _, c := range r.Clients {
		pool := "auto"
		if c.Manual {
			pool = "manual"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%.1f%%\t%s\t%s\t%d\n", c.Name, c.Group, pool, 100*c.Proportion,
			units.Format(c.Cap), units.Format(c.Held), c.Arrays)
	}
	fmt.Fprintln(tw, "group\tclients\t\t\tcap\theld\t")
	for _, g := range r.Groups {
		fmt.Fprintf(tw, "%s\t%d\t\t\t%s\t%s\t\n", g.Name, g.Clients, units.Format(g.Cap), units.Format(g.Held))
	}
	_ = tw.Flush()
	return b.String()
}

// observePinnedOOM sets the manager's out-of-memory observer, if any, on
// its pinned pool (the account's allocator's is set through its Config:
// accountConfig).
func (m *Manager) observePinnedOOM() {
	f, pinned := m.cfg.oom, m.host.pinned
	if f == nil || pinned == nil {
		return
	}
	pinned.SetOOMObserver(func(e *alloc.OutOfMemoryError) {
		var r ManagerReport
		m.fillReport(&r)
		r.Pinned = e.Report()
		f(e, r)
	})
}
