package metrics_test

import (
	"context"
	"fmt"
	"net/http/httptest"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/vramkit/vram"
	"github.com/vramkit/vram/device/sim"
	"github.com/vramkit/vram/metrics"
)

// A manager's collector in a registry served over HTTP as /metrics; here
// one scrape is made in-process and a few lines of it printed.
func ExampleNewCollector() {
	dev, _ := sim.New(sim.Config{TotalBytes: 64 << 20, NoContext: true})
	defer dev.Close()
	m, _ := vram.New(dev)
	defer m.Close()

	solver, _ := m.Register(vram.ClientOptions{Name: "solver", Group: "batch"})
	_ = solver.Queue(map[string]vram.ArrayRequest{
		"state": {Shape: []int{4, 100_000}, DType: vram.Float32, ChunkAxis: 1},
	})
	_, _ = solver.Allocate(context.Background())

	reg := prometheus.NewRegistry()
	reg.MustRegister(metrics.NewCollector(m, metrics.Opts{}))
	handler := promhttp.HandlerFor(reg, promhttp.HandlerOpts{})
	// A program serves it: http.Handle("/metrics", handler).

	rec := httptest.NewRecorder()
	handler.ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	for line := range strings.Lines(rec.Body.String()) {
		for _, name := range []string{"vram_device_total_bytes ", "vram_allocator_in_use_bytes{",
			"vram_allocator_allocs_total{", "vram_client_held_bytes{", "vram_group_clients{"} {
			if strings.HasPrefix(line, name) {
				fmt.Print(line)
			}
		}
	}
	// Output:
	// vram_allocator_allocs_total{allocator="expandable"} 1
	// vram_allocator_in_use_bytes{allocator="expandable"} 1.6e+06
	// vram_client_held_bytes{client="solver",group="batch"} 1.6e+06
	// vram_device_total_bytes 6.7108864e+07
	// vram_group_clients{group="batch"} 1
}
