package metrics_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/goleak"

	"github.com/vramkit/vram"
	"github.com/vramkit/vram/account"
	"github.com/vramkit/vram/device"
	"github.com/vramkit/vram/device/sim"
	"github.com/vramkit/vram/metrics"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

const mib = 1 << 20

// newManager returns a manager on a 64 MiB simulator with no context
// memory, closed (with the device) when the test ends.
func newManager(t *testing.T, opts ...vram.Option) (*vram.Manager, *sim.Device) {
	t.Helper()
	dev, err := sim.New(sim.Config{TotalBytes: 64 * mib, NoContext: true})
	if err != nil {
		t.Fatal(err)
	}
	m, err := vram.New(dev, opts...)
	if err != nil {
		dev.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := m.Close(); err != nil {
			t.Error(err)
		}
		if err := dev.Close(); err != nil && !errors.Is(err, device.ErrClosed) {
			t.Error(err)
		}
	})
	return m, dev
}

func register(t *testing.T, m *vram.Manager, name, group string) *vram.Client {
	t.Helper()
	c, err := m.Register(vram.ClientOptions{Name: name, Group: group})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func allocate(t *testing.T, m *vram.Manager, c *vram.Client, reqs map[string]vram.ArrayRequest) {
	t.Helper()
	if err := c.Queue(reqs); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Allocate(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// TestCollectValues checks every metric's value against figures worked
// out by hand from the requests, the proportion rules and the pool's
// 512-byte rounding.
func TestCollectValues(t *testing.T) {
	m, dev := newManager(t)
	solver := register(t, m, "solver", "batch")
	output := register(t, m, "output", "batch")
	other := register(t, m, "loader", "io")
	if err := other.SetManualProportion(0.25); err != nil {
		t.Fatal(err)
	}
	// 8,000 B and 16,000 B: 8,192 + 16,384 held at 512-byte rounding.
	allocate(t, m, solver, map[string]vram.ArrayRequest{
		"state":  {Shape: []int{2, 1000}, DType: vram.Float32, ChunkAxis: 1},
		"params": {Shape: []int{4, 1000}, DType: vram.Float32, ChunkAxis: 1},
	})
	// 80,000 B: 80,384 held.
	allocate(t, m, other, map[string]vram.ArrayRequest{
		"buf": {Shape: []int{10, 2, 1000}, DType: vram.Float32, ChunkAxis: 2},
	})
	_ = output

	// The device's own account of what the pool reserved.
	free, _, err := dev.MemInfo()
	if err != nil {
		t.Fatal(err)
	}
	reserved := m.Account().Allocator().Stats().Reserved
	if reserved == 0 || 64*mib-free != reserved {
		t.Fatalf("the pool reserved %d bytes but the device has %d of %d free", reserved, free, 64*mib)
	}

	c := metrics.NewCollector(m, metrics.Opts{})
	const inUse = 8192 + 16384 + 80384
	want := fmt.Sprintf(`
# HELP vram_device_free_bytes Device memory free now, bytes, as the driver (or simulator) reports it.
# TYPE vram_device_free_bytes gauge
vram_device_free_bytes %d
# HELP vram_device_total_bytes Device memory in all, bytes.
# TYPE vram_device_total_bytes gauge
vram_device_total_bytes 6.7108864e+07
# HELP vram_device_info The device the manager runs on: always 1, with its backend, name and ordinal as labels.
# TYPE vram_device_info gauge
vram_device_info{backend="sim",name="vram simulator",ordinal="0"} 1
# HELP vram_allocator_in_use_bytes Bytes in live allocations, after the allocator's rounding.
# TYPE vram_allocator_in_use_bytes gauge
vram_allocator_in_use_bytes{allocator="expandable"} %d
# HELP vram_allocator_reserved_bytes Bytes the allocator holds from the device: live allocations plus its cache.
# TYPE vram_allocator_reserved_bytes gauge
vram_allocator_reserved_bytes{allocator="expandable"} %d
# HELP vram_allocator_allocs_total Successful allocations.
# TYPE vram_allocator_allocs_total counter
vram_allocator_allocs_total{allocator="expandable"} 3
# HELP vram_allocator_frees_total Successful frees.
# TYPE vram_allocator_frees_total counter
vram_allocator_frees_total{allocator="expandable"} 0
# HELP vram_allocator_oom_total Allocations that failed for want of device memory.
# TYPE vram_allocator_oom_total counter
vram_allocator_oom_total{allocator="expandable"} 0
# HELP vram_client_held_bytes Device bytes the client's arrays take, as the allocator charges them.
# TYPE vram_client_held_bytes gauge
vram_client_held_bytes{client="loader",group="io"} 80384
vram_client_held_bytes{client="output",group="batch"} 0
vram_client_held_bytes{client="solver",group="batch"} 24576
# HELP vram_client_proportion The client's share of device memory, a fraction from 0 to 1.
# TYPE vram_client_proportion gauge
vram_client_proportion{client="loader",group="io"} 0.25
vram_client_proportion{client="output",group="batch"} 0.375
vram_client_proportion{client="solver",group="batch"} 0.375
# HELP vram_client_cap_bytes The client's share of device memory in bytes: its proportion of the manager's total.
# TYPE vram_client_cap_bytes gauge
vram_client_cap_bytes{client="loader",group="io"} 1.6777216e+07
vram_client_cap_bytes{client="output",group="batch"} 2.5165824e+07
vram_client_cap_bytes{client="solver",group="batch"} 2.5165824e+07
# HELP vram_group_clients Clients registered in the stream group.
# TYPE vram_group_clients gauge
vram_group_clients{group="batch"} 2
vram_group_clients{group="io"} 1
`, free, inUse, reserved)
	names := []string{"vram_device_free_bytes", "vram_device_total_bytes", "vram_device_info",
		"vram_allocator_in_use_bytes", "vram_allocator_reserved_bytes", "vram_allocator_allocs_total",
		"vram_allocator_frees_total", "vram_allocator_oom_total", "vram_client_held_bytes",
		"vram_client_proportion", "vram_client_cap_bytes", "vram_group_clients"}
	if err := testutil.CollectAndCompare(c, strings.NewReader(want), names...); err != nil {
		t.Error(err)
	}

	// Freeing an array shows at the next scrape: no state is kept.
	if err := solver.Free("params"); err != nil {
		t.Fatal(err)
	}
	want = `
# HELP vram_allocator_frees_total Successful frees.
# TYPE vram_allocator_frees_total counter
vram_allocator_frees_total{allocator="expandable"} 1
# HELP vram_allocator_in_use_bytes Bytes in live allocations, after the allocator's rounding.
# TYPE vram_allocator_in_use_bytes gauge
vram_allocator_in_use_bytes{allocator="expandable"} 88576
# HELP vram_allocator_peak_in_use_bytes Most bytes in live allocations at once since the allocator was made or its peaks reset.
# TYPE vram_allocator_peak_in_use_bytes gauge
vram_allocator_peak_in_use_bytes{allocator="expandable"} 104960
`
	if err := testutil.CollectAndCompare(c, strings.NewReader(want),
		"vram_allocator_frees_total", "vram_allocator_in_use_bytes", "vram_allocator_peak_in_use_bytes"); err != nil {
		t.Error(err)
	}
	if got := value(t, c, "vram_client_held_bytes", map[string]string{"client": "solver", "group": "batch"}); got != 8192 {
		t.Errorf("solver holds %v bytes after freeing params, want 8192", got)
	}
}

// value gathers c and returns the value of the series name with the
// given label values, failing the test when there is no such series.
func value(t *testing.T, c prometheus.Collector, name string, labels map[string]string) float64 {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(c)
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
	series:
		for _, m := range f.GetMetric() {
			got := map[string]string{}
			for _, lp := range m.GetLabel() {
				got[lp.GetName()] = lp.GetValue()
			}
			for k, v := range labels {
				if got[k] != v {
					continue series
				}
			}
			if g := m.GetGauge(); g != nil {
				return g.GetValue()
			}
			return m.GetCounter().GetValue()
		}
	}
	t.Fatalf("no series %s%v", name, labels)
	return 0
}

// TestCollectAllocatorKinds checks the allocator label and the counters
// that tell the allocators apart: the pool's cache hits, direct's device
// call per allocation.
func TestCollectAllocatorKinds(t *testing.T) {
	tests := map[string]struct {
		kind                                        vram.AllocatorKind
		label                                       string
		deviceAllocs, deviceFrees, cacheHits, frees float64
	}{
		// Two rounds of the same two arrays: the pool carves all four
		// from one segment (one device allocation, three cache hits);
		// direct goes to the device every time, and the second round
		// frees the first round's arrays.
		"pool":   {vram.Pool, "expandable", 1, 0, 3, 2}, // on the simulator the Pool kind is Expandable
		"direct": {vram.Direct, "direct", 4, 2, 0, 2},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			m, _ := newManager(t, vram.WithAllocatorChoice(account.Choice{Kind: tc.kind}))
			cl := register(t, m, "a", "")
			for range 2 {
				allocate(t, m, cl, map[string]vram.ArrayRequest{
					"x": {Shape: []int{1000}, DType: vram.Float64, Unchunkable: true},
					"y": {Shape: []int{3000}, DType: vram.Int32, Unchunkable: true},
				})
			}
			c := metrics.NewCollector(m, metrics.Opts{})
			want := fmt.Sprintf(`
# HELP vram_allocator_allocs_total Successful allocations.
# TYPE vram_allocator_allocs_total counter
vram_allocator_allocs_total{allocator=%[1]q} 4
# HELP vram_allocator_frees_total Successful frees.
# TYPE vram_allocator_frees_total counter
vram_allocator_frees_total{allocator=%[1]q} %[5]v
# HELP vram_allocator_cache_hits_total Allocations served from the allocator's cache, without a device allocation.
# TYPE vram_allocator_cache_hits_total counter
vram_allocator_cache_hits_total{allocator=%[1]q} %[4]v
# HELP vram_allocator_device_allocs_total Device allocations the allocator made.
# TYPE vram_allocator_device_allocs_total counter
vram_allocator_device_allocs_total{allocator=%[1]q} %[2]v
# HELP vram_allocator_device_frees_total Device frees the allocator made.
# TYPE vram_allocator_device_frees_total counter
vram_allocator_device_frees_total{allocator=%[1]q} %[3]v
# HELP vram_group_clients Clients registered in the stream group.
# TYPE vram_group_clients gauge
vram_group_clients{group="default"} 1
`, tc.label, tc.deviceAllocs, tc.deviceFrees, tc.cacheHits, tc.frees)
			if err := testutil.CollectAndCompare(c, strings.NewReader(want),
				"vram_allocator_allocs_total", "vram_allocator_frees_total", "vram_allocator_cache_hits_total",
				"vram_allocator_device_allocs_total", "vram_allocator_device_frees_total", "vram_group_clients"); err != nil {
				t.Error(err)
			}
		})
	}
}

// TestCollectOOM injects an out-of-memory failure and checks it is
// counted.
func TestCollectOOM(t *testing.T) {
	m, dev := newManager(t, vram.WithAllocatorChoice(account.Choice{Kind: vram.Direct}))
	cl := register(t, m, "a", "g")
	dev.Faults().OOMAtAlloc(1)
	err := cl.Queue(map[string]vram.ArrayRequest{"x": {Shape: []int{1000}, DType: vram.Float64}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cl.Allocate(context.Background()); !errors.Is(err, vram.ErrOutOfMemory) {
		t.Fatalf("Allocate with an injected OOM: %v, want ErrOutOfMemory", err)
	}
	c := metrics.NewCollector(m, metrics.Opts{})
	want := `
# HELP vram_allocator_oom_total Allocations that failed for want of device memory.
# TYPE vram_allocator_oom_total counter
vram_allocator_oom_total{allocator="direct"} 1
# HELP vram_allocator_allocs_total Successful allocations.
# TYPE vram_allocator_allocs_total counter
vram_allocator_allocs_total{allocator="direct"} 0
# HELP vram_client_held_bytes Device bytes the client's arrays take, as the allocator charges them.
# TYPE vram_client_held_bytes gauge
vram_client_held_bytes{client="a",group="g"} 0
`
	if err := testutil.CollectAndCompare(c, strings.NewReader(want),
		"vram_allocator_oom_total", "vram_allocator_allocs_total", "vram_client_held_bytes"); err != nil {
		t.Error(err)
	}
}

// TestCollectSameNameSummed checks that clients sharing a name and group
// make one series, summed, and that a closed client drops out.
func TestCollectSameNameSummed(t *testing.T) {
	m, _ := newManager(t)
	w1 := register(t, m, "worker", "w")
	w2 := register(t, m, "worker", "w")
	w3 := register(t, m, "worker", "w")
	for _, w := range []*vram.Client{w1, w2} {
		if err := w.SetManualProportion(0.125); err != nil {
			t.Fatal(err)
		}
		allocate(t, m, w, map[string]vram.ArrayRequest{"x": {Shape: []int{256}, DType: vram.Float32}}) // 1,024 B
	}
	if err := w3.Close(); err != nil {
		t.Fatal(err)
	}
	c := metrics.NewCollector(m, metrics.Opts{Namespace: "job", ConstLabels: prometheus.Labels{"gpu": "0"}})
	want := `
# HELP job_client_held_bytes Device bytes the client's arrays take, as the allocator charges them.
# TYPE job_client_held_bytes gauge
job_client_held_bytes{client="worker",gpu="0",group="w"} 2048
# HELP job_client_proportion The client's share of device memory, a fraction from 0 to 1.
# TYPE job_client_proportion gauge
job_client_proportion{client="worker",gpu="0",group="w"} 0.25
# HELP job_client_cap_bytes The client's share of device memory in bytes: its proportion of the manager's total.
# TYPE job_client_cap_bytes gauge
job_client_cap_bytes{client="worker",gpu="0",group="w"} 1.6777216e+07
# HELP job_group_clients Clients registered in the stream group.
# TYPE job_group_clients gauge
job_group_clients{gpu="0",group="w"} 2
`
	if err := testutil.CollectAndCompare(c, strings.NewReader(want),
		"job_client_held_bytes", "job_client_proportion", "job_client_cap_bytes", "job_group_clients"); err != nil {
		t.Error(err)
	}
}

// TestCollectClosed checks a scrape after the manager and the device are
// closed: no clients, no device memory, and no error.
func TestCollectClosed(t *testing.T) {
	m, dev := newManager(t)
	cl := register(t, m, "a", "g")
	allocate(t, m, cl, map[string]vram.ArrayRequest{"x": {Shape: []int{100}, DType: vram.Float32}})
	c := metrics.NewCollector(m, metrics.Opts{})
	if n := testutil.CollectAndCount(c, "vram_client_held_bytes"); n != 1 {
		t.Fatalf("%d held-bytes series while the client is open, want 1", n)
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	if err := dev.Close(); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(c)
	if _, err := reg.Gather(); err != nil {
		t.Fatalf("a scrape after close failed: %v", err)
	}
	for name, want := range map[string]int{
		"vram_client_held_bytes": 0, "vram_group_clients": 0, "vram_device_free_bytes": 0,
		"vram_device_info": 1, "vram_allocator_allocs_total": 1,
	} {
		if n := testutil.CollectAndCount(c, name); n != want {
			t.Errorf("%s: %d series after close, want %d", name, n, want)
		}
	}
}

// TestCollectorLint checks the metric names and help against
// Prometheus's conventions, and that a pedantic registry accepts the
// collector (every metric it sends was described).
func TestCollectorLint(t *testing.T) {
	m, _ := newManager(t)
	cl := register(t, m, "a", "g")
	allocate(t, m, cl, map[string]vram.ArrayRequest{"x": {Shape: []int{100}, DType: vram.Float32}})
	c := metrics.NewCollector(m, metrics.Opts{})
	problems, err := testutil.CollectAndLint(c)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("lint: %s: %s", p.Metric, p.Text)
	}
	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(c); err != nil {
		t.Fatal(err)
	}
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	if len(fams) != 20 {
		t.Errorf("%d metric families, want 20 (3 device, 13 allocator, 3 client, 1 group)", len(fams))
	}
	// Describe sends as many descriptions as there are families.
	ch := make(chan *prometheus.Desc, 64)
	c.Describe(ch)
	close(ch)
	if len(ch) != 20 {
		t.Errorf("Describe sent %d descriptions, want 20", len(ch))
	}
}

// TestCollectConcurrent scrapes while clients allocate and free, under
// the race detector, and checks that every scrape succeeds and is
// self-consistent.
func TestCollectConcurrent(t *testing.T) {
	m, _ := newManager(t)
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(metrics.NewCollector(m, metrics.Opts{}))
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for w := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cl, err := m.Register(vram.ClientOptions{Name: fmt.Sprintf("w%d", w), Group: fmt.Sprintf("g%d", w%2)})
			if err != nil {
				errs <- err
				return
			}
			defer cl.Close()
			for i := range 30 {
				err := cl.Queue(map[string]vram.ArrayRequest{"x": {Shape: []int{1000 + i}, DType: vram.Float64, Unchunkable: true}})
				if err == nil {
					_, err = cl.Allocate(context.Background())
					if errors.Is(err, vram.ErrNothingQueued) {
						err = nil // the other member of the group allocated it
					}
				}
				if err == nil {
					err = cl.Free("x")
				}
				if err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	for range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 30 {
				fams, err := reg.Gather()
				if err != nil {
					errs <- err
					return
				}
				var inUse, reserved float64
				for _, f := range fams {
					switch f.GetName() {
					case "vram_allocator_in_use_bytes":
						inUse = f.GetMetric()[0].GetGauge().GetValue()
					case "vram_allocator_reserved_bytes":
						reserved = f.GetMetric()[0].GetGauge().GetValue()
					}
				}
				if inUse > reserved {
					errs <- fmt.Errorf("a scrape shows %v bytes in use but %v reserved", inUse, reserved)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// TestCollectLayout: the largest free block and fragmentation are the
// manager's report's; the async pool, whose cache is the device's, has
// neither.
func TestCollectLayout(t *testing.T) {
	tests := map[string]struct {
		kind   vram.AllocatorKind
		label  string // what serves the kind on the simulator
		layout bool
	}{
		"pool":   {kind: vram.Pool, label: "expandable", layout: true},
		"direct": {kind: vram.Direct, label: "direct", layout: true},
		"async":  {kind: vram.AsyncPool, label: "async"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			m, _ := newManager(t, vram.WithAllocatorChoice(account.Choice{Kind: tc.kind}))
			c := register(t, m, "c", "g")
			allocate(t, m, c, map[string]vram.ArrayRequest{"a": {Shape: []int{3, 1000}, DType: vram.Float32, ChunkAxis: 1}})
			col := metrics.NewCollector(m, metrics.Opts{})
			r := vram.Report(m).Memory
			names := []string{"vram_allocator_largest_free_bytes", "vram_allocator_fragmentation"}
			if !tc.layout {
				if n := testutil.CollectAndCount(col, names...); n != 0 {
					t.Errorf("%d layout series for %s, want none", n, name)
				}
				return
			}
			if tc.kind == vram.Pool && (r.LargestFree == 0 || r.Fragmentation() != 0) {
				t.Fatalf("pool report %+v: want the rest of its one small segment free in one block", r)
			}
			lbl := map[string]string{"allocator": tc.label}
			if got := value(t, col, names[0], lbl); got != float64(r.LargestFree) {
				t.Errorf("largest free %v, want %d", got, r.LargestFree)
			}
			if got := value(t, col, names[1], lbl); got != r.Fragmentation() {
				t.Errorf("fragmentation %v, want %v", got, r.Fragmentation())
			}
		})
	}
}
