package broker

// Prometheus metrics of a broker, read from its status and counters at
// scrape time (`vram broker --metrics-addr`). Per device: its total, the
// sums of guaranteed parts, limits and holdings, what is free, the leases
// and claims waiting, and counters of claims, reclaims and missed
// deadlines; per lease (labelled by device, lease id, name and pid): its
// guaranteed part, limit, borrowed and held bytes, whether it is asked to
// shrink or overdue, and the deadlines it missed. Lease labels go when
// the lease does, so the series stay bounded by the broker's limits.

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
)

// collector is a prometheus.Collector of one Server.
type collector struct {
	s     *Server
	descs map[string]*prometheus.Desc
}

// NewCollector returns a Prometheus collector of s's metrics, named
// vram_broker_*.
func NewCollector(s *Server) prometheus.Collector {
	dev := []string{"device", "name"}
	lease := []string{"device", "lease", "name", "pid"}
	d := func(name, help string, labels []string) *prometheus.Desc {
		return prometheus.NewDesc(prometheus.BuildFQName("vram", "broker", name), help, labels, nil)
	}
	return &collector{s: s, descs: map[string]*prometheus.Desc{
		"total":      d("device_total_bytes", "Device memory the broker divides.", dev),
		"guaranteed": d("device_guaranteed_bytes", "Sum of the leases' guaranteed parts (never over the total).", dev),
		"granted":    d("device_granted_bytes", "Sum of the leases' limits.", dev),
		"held":       d("device_held_bytes", "Sum of what the leases hold, their processes' contexts included.", dev),
		"free":       d("device_free_bytes", "Device memory neither granted nor held.", dev),
		"leases":     d("device_leases", "Leases on the device.", dev),
		"waiting":    d("device_claims_waiting", "Claims waiting for memory that is lent out.", dev),
		"claims":     d("claims_total", "Claims that waited, by how they ended.", append(dev, "result")),
		"reclaims":   d("reclaims_total", "Requests to borrowers to shrink.", dev),
		"missed":     d("reclaim_deadlines_missed_total", "Requests to shrink whose deadline passed first.", dev),
		"lguar":      d("lease_guaranteed_bytes", "The lease's guaranteed part.", lease),
		"llimit":     d("lease_limit_bytes", "The lease's limit: what it may occupy now.", lease),
		"lborrowed":  d("lease_borrowed_bytes", "What the lease occupies beyond its guaranteed part.", lease),
		"lheld":      d("lease_held_bytes", "What the lease holds, its context included.", lease),
		"lshrink":    d("lease_shrink_requested", "1 while the lease is asked to shrink.", lease),
		"loverdue":   d("lease_overdue", "1 while the lease is past its deadline to shrink.", lease),
		"lmissed":    d("lease_deadlines_missed", "Deadlines to shrink the lease has missed.", lease),
	}}
}

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range c.descs {
		ch <- d
	}
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	st := c.s.Status()
	gauge := func(name string, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(c.descs[name], prometheus.GaugeValue, v, labels...)
	}
	counter := func(name string, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(c.descs[name], prometheus.CounterValue, float64(v), labels...)
	}
	flag := func(b bool) float64 {
		if b {
			return 1
		}
		return 0
	}
	for _, d := range st.Devices {
		idx := strconv.Itoa(d.Index)
		gauge("total", float64(d.Total), idx, d.Name)
		gauge("guaranteed", float64(d.Guaranteed), idx, d.Name)
		gauge("granted", float64(d.Granted), idx, d.Name)
		gauge("held", float64(d.Held), idx, d.Name)
		gauge("free", float64(d.Free), idx, d.Name)
		gauge("leases", float64(len(d.Leases)), idx, d.Name)
		gauge("waiting", float64(len(d.Claims)), idx, d.Name)
		k := c.s.counters(d.Index)
		for result, n := range map[string]uint64{"granted": k.granted, "timeout": k.timedOut, "cancelled": k.cancelled, "released": k.released} {
			counter("claims", n, idx, d.Name, result)
		}
		counter("reclaims", k.reclaims, idx, d.Name)
		counter("missed", k.missed, idx, d.Name)
		for _, l := range d.Leases {
			labels := []string{idx, l.ID, l.Name, strconv.FormatUint(uint64(l.PID), 10)}
			gauge("lguar", float64(l.Guaranteed), labels...)
			gauge("llimit", float64(l.Limit), labels...)
			gauge("lborrowed", float64(l.Borrowed), labels...)
			gauge("lheld", float64(l.Holds()), labels...)
			gauge("lshrink", flag(l.Reclaim != nil), labels...)
			gauge("loverdue", flag(l.Reclaim != nil && l.Reclaim.Overdue), labels...)
			gauge("lmissed", float64(l.MissedDeadlines), labels...)
		}
	}
}
