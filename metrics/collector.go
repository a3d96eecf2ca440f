// The Collector: one prometheus.Desc per metric, made once, and a Collect
// that reads the manager each time it is called.
//
// Every value comes from the manager's public, concurrency-safe methods
// at scrape time, each under its own lock: a scrape is not one atomic
// snapshot (an allocation may land between reading the allocator's bytes
// and a client's held bytes), but each value was true at some moment of
// the scrape, which is what a gauge promises.

package metrics

import (
	"errors"
	"fmt"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/vramkit/vram"
	"github.com/vramkit/vram/alloc"
	"github.com/vramkit/vram/device"
)

// DefaultNamespace prefixes every metric name unless Opts says otherwise.
const DefaultNamespace = "vram"

// Opts configures a Collector. The zero value is ready to use. NewCollector
// reads it once; do not change ConstLabels while it runs.
type Opts struct {
	// Namespace prefixes every metric name ("vram_device_free_bytes");
	// "" means DefaultNamespace.
	Namespace string
	// ConstLabels are added to every metric, for a process that exports
	// several managers to one registry, e.g. {"gpu": "0"}.
	ConstLabels prometheus.Labels
}

// Collector is a prometheus.Collector for one vram.Manager. It reads the
// manager at scrape time and holds nothing between scrapes.
//
// A Collector is safe for concurrent use: the registry may scrape it from
// several goroutines at once, while the manager is in use.
type Collector struct {
	m *vram.Manager

	deviceInfo  *prometheus.Desc
	deviceFree  *prometheus.Desc
	deviceTotal *prometheus.Desc

	stats []statMetric

	largestFree   *prometheus.Desc
	fragmentation *prometheus.Desc

	clientHeld       *prometheus.Desc
	clientCap        *prometheus.Desc
	clientProportion *prometheus.Desc
	groupClients     *prometheus.Desc
}

// statMetric is one alloc.Stats field as a metric.
type statMetric struct {
	desc  *prometheus.Desc
	kind  prometheus.ValueType
	value func(alloc.Stats) uint64
}

// Label names.
const (
	labelAllocator = "allocator" // the allocator registry's name of what serves (alloc.Names)
	labelClient    = "client"    // the client's name
	labelGroup     = "group"     // its stream group
)

// NewCollector returns a Collector for m. Register it with a
// prometheus.Registerer; it exports (with the default namespace):
//
//	vram_device_info{backend, name, ordinal}        1, for the device's identity
//	vram_device_free_bytes                          device memory free now
//	vram_device_total_bytes                         device memory in all
//	vram_allocator_in_use_bytes{allocator}          bytes in live allocations
//	vram_allocator_reserved_bytes{allocator}        bytes held from the device (live and cached)
//	vram_allocator_peak_in_use_bytes{allocator}     most bytes in use at once
//	vram_allocator_peak_reserved_bytes{allocator}   most bytes reserved at once
//	vram_allocator_allocs_total{allocator}          successful allocations
//	vram_allocator_frees_total{allocator}           successful frees
//	vram_allocator_cache_hits_total{allocator}      allocations served without a device call
//	vram_allocator_device_allocs_total{allocator}   device allocations made
//	vram_allocator_device_frees_total{allocator}    device frees made
//	vram_allocator_retries_total{allocator}         allocations retried after trimming the cache
//	vram_allocator_oom_total{allocator}             allocations that failed for want of memory
//	vram_allocator_largest_free_bytes{allocator}    the largest cached free block
//	vram_allocator_fragmentation{allocator}         1 − largest free block / cached bytes
//	vram_client_held_bytes{client, group}           device bytes the client's arrays take
//	vram_client_cap_bytes{client, group}            the client's share of device memory, bytes
//	vram_client_proportion{client, group}           that share as a fraction of the device
//	vram_group_clients{group}                       clients in the stream group
//
// The allocator label names the manager's current allocator as the
// allocator registry does (account.Account.Report: "expandable" for the Pool
// kind served by alloc.Expandable), as vram run's report and the manager's
// memory report do; the allocator's counters start again from 0 when
// SetAllocator replaces it, under the new label. Clients that share a name within a group are
// summed into one series, so that the series stay few and unique as
// clients come and go (client ids are never reused; names usually are).
// Device memory that cannot be read (the device is closed) is left out of
// the scrape; any other error reading it is reported to the registry as
// an invalid metric.
func NewCollector(m *vram.Manager, o Opts) *Collector {
	ns := o.Namespace
	if ns == "" {
		ns = DefaultNamespace
	}
	desc := func(sub, name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc(prometheus.BuildFQName(ns, sub, name), help, labels, o.ConstLabels)
	}
	stat := func(name, help string, kind prometheus.ValueType, value func(alloc.Stats) uint64) statMetric {
		return statMetric{desc: desc("allocator", name, help, labelAllocator), kind: kind, value: value}
	}
	gauge, counter := prometheus.GaugeValue, prometheus.CounterValue
	return &Collector{
		m: m,
		deviceInfo: desc("device", "info", "The device the manager runs on: always 1, with its backend, name and ordinal as labels.",
			"backend", "name", "ordinal"),
		deviceFree:  desc("device", "free_bytes", "Device memory free now, bytes, as the driver (or simulator) reports it."),
		deviceTotal: desc("device", "total_bytes", "Device memory in all, bytes."),
		stats: []statMetric{
			stat("in_use_bytes", "Bytes in live allocations, after the allocator's rounding.", gauge,
				func(s alloc.Stats) uint64 { return s.InUse }),
			stat("reserved_bytes", "Bytes the allocator holds from the device: live allocations plus its cache.", gauge,
				func(s alloc.Stats) uint64 { return s.Reserved }),
			stat("peak_in_use_bytes", "Most bytes in live allocations at once since the allocator was made or its peaks reset.", gauge,
				func(s alloc.Stats) uint64 { return s.PeakInUse }),
			stat("peak_reserved_bytes", "Most bytes held from the device at once since the allocator was made or its peaks reset.", gauge,
				func(s alloc.Stats) uint64 { return s.PeakReserved }),
			stat("allocs_total", "Successful allocations.", counter,
				func(s alloc.Stats) uint64 { return s.Allocs }),
			stat("frees_total", "Successful frees.", counter,
				func(s alloc.Stats) uint64 { return s.Frees }),
			stat("cache_hits_total", "Allocations served from the allocator's cache, without a device allocation.", counter,
				func(s alloc.Stats) uint64 { return s.CacheHits }),
			stat("device_allocs_total", "Device allocations the allocator made.", counter,
				func(s alloc.Stats) uint64 { return s.DeviceAllocs }),
			stat("device_frees_total", "Device frees the allocator made.", counter,
				func(s alloc.Stats) uint64 { return s.DeviceFrees }),
			stat("retries_total", "Allocations retried after trimming the cache.", counter,
				func(s alloc.Stats) uint64 { return s.Retries }),
			stat("oom_total", "Allocations that failed for want of device memory.", counter,
				func(s alloc.Stats) uint64 { return s.OOMs }),
		},
		largestFree: desc("allocator", "largest_free_bytes",
			"The largest free block in the allocator's cache, bytes (not exported for an allocator whose cache is the device's).", labelAllocator),
		fragmentation: desc("allocator", "fragmentation",
			"The share of the allocator's cached bytes outside its largest free block: 1 - largest free block / cached bytes, 0 when nothing is cached.", labelAllocator),
		clientHeld: desc("client", "held_bytes", "Device bytes the client's arrays take, as the allocator charges them.",
			labelClient, labelGroup),
		clientCap: desc("client", "cap_bytes", "The client's share of device memory in bytes: its proportion of the manager's total.",
			labelClient, labelGroup),
		clientProportion: desc("client", "proportion", "The client's share of device memory, a fraction from 0 to 1.",
			labelClient, labelGroup),
		groupClients: desc("group", "clients", "Clients registered in the stream group.", labelGroup),
	}
}

// Describe sends every metric's description. It implements
// prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.deviceInfo
	ch <- c.deviceFree
	ch <- c.deviceTotal
	for _, s := range c.stats {
		ch <- s.desc
	}
	ch <- c.largestFree
	ch <- c.fragmentation
	ch <- c.clientHeld
	ch <- c.clientCap
	ch <- c.clientProportion
	ch <- c.groupClients
}

// Collect reads the manager and sends the current values. It implements
// prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	c.collectDevice(ch)
	c.collectAllocator(ch)
	c.collectClients(ch)
}

func (c *Collector) collectDevice(ch chan<- prometheus.Metric) {
	info := c.m.Device().Info()
	ch <- prometheus.MustNewConstMetric(c.deviceInfo, prometheus.GaugeValue, 1,
		info.Backend, info.Name, strconv.Itoa(info.Ordinal))
	free, total, err := c.m.MemInfo()
	switch {
	case errors.Is(err, device.ErrClosed):
		// A closed device has no memory to report.
	case err != nil:
		err = fmt.Errorf("vram metrics: read device memory of %s %d: %w", info.Backend, info.Ordinal, err)
		ch <- prometheus.NewInvalidMetric(c.deviceFree, err)
	default:
		ch <- prometheus.MustNewConstMetric(c.deviceFree, prometheus.GaugeValue, float64(free))
		ch <- prometheus.MustNewConstMetric(c.deviceTotal, prometheus.GaugeValue, float64(total))
	}
}

func (c *Collector) collectAllocator(ch chan<- prometheus.Metric) {
	_, r := c.m.Account().Report()
	name := r.Allocator
	for _, s := range c.stats {
		ch <- prometheus.MustNewConstMetric(s.desc, s.kind, float64(s.value(r.Stats)), name)
	}
	if r.Layout {
		ch <- prometheus.MustNewConstMetric(c.largestFree, prometheus.GaugeValue, float64(r.LargestFree), name)
		ch <- prometheus.MustNewConstMetric(c.fragmentation, prometheus.GaugeValue, r.Fragmentation(), name)
	}
}

// clientKey is one client series: clients with the same name in the same
// group are summed into it.
type clientKey struct{ name, group string }

type clientSums struct {
	held, cap  uint64
	proportion float64
}

func (c *Collector) collectClients(ch chan<- prometheus.Metric) {
	sums := map[clientKey]*clientSums{}
	var order []clientKey // first-seen order, for a stable output
	groups := map[string]int{}
	var groupOrder []string
	for _, cl := range c.m.Clients() {
		// Each read gives zero once the client is closed: a client
		// closed during the scrape (before the last check) is left out
		// rather than reported half.
		group, p, capBytes := cl.Group(), cl.Proportion(), cl.Cap()
		if group == "" || cl.Closed() {
			continue
		}
		k := clientKey{cl.Name(), group}
		s := sums[k]
		if s == nil {
			s = &clientSums{}
			sums[k] = s
			order = append(order, k)
		}
		s.held += cl.Held()
		s.cap += capBytes
		s.proportion += p
		if groups[group] == 0 {
			groupOrder = append(groupOrder, group)
		}
		groups[group]++
	}
	for _, k := range order {
		s := sums[k]
		ch <- prometheus.MustNewConstMetric(c.clientHeld, prometheus.GaugeValue, float64(s.held), k.name, k.group)
		ch <- prometheus.MustNewConstMetric(c.clientCap, prometheus.GaugeValue, float64(s.cap), k.name, k.group)
		ch <- prometheus.MustNewConstMetric(c.clientProportion, prometheus.GaugeValue, s.proportion, k.name, k.group)
	}
	for _, g := range groupOrder {
		ch <- prometheus.MustNewConstMetric(c.groupClients, prometheus.GaugeValue, float64(groups[g]), g)
	}
}

// Check at compile time that Collector is a prometheus.Collector.
var _ prometheus.Collector = (*Collector)(nil)
