// Package metrics exports a vram.Manager's state to Prometheus.
//
// A Collector reads the manager when it is scraped, and only then: the
// device's free and total memory, the allocator's counters (bytes in use
// and reserved, their peaks, allocations, frees, cache hits, device
// allocations and frees, retries, out-of-memory failures, the largest
// cached free block and fragmentation) labelled by the allocator that
// serves, by its name in the allocator registry (package alloc), each
// client's held bytes, cap and proportion labelled by client name and
// stream group, and the number of clients in each group.
// It starts no goroutine and keeps no state between scrapes, so there is
// nothing to stop: unregister it, or drop the registry, when the manager
// is closed.
//
//	reg := prometheus.NewRegistry()
//	reg.MustRegister(metrics.NewCollector(m, metrics.Opts{}))
//	http.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
//
// The package owns the metric names and their meaning (see NewCollector
// for the list). It does not own the manager, the device or the HTTP
// server: it never closes, resets or changes the manager, and serving
// /metrics is the program's business (the vram command does it for `vram
// run --metrics-addr`).
package metrics
