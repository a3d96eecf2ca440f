package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
)

// scrape fetches url on a connection of its own (no keep-alive, so no
// client goroutine outlives it) and returns the series by name and
// labels, e.g. `vram_group_clients{group="oscillators"}`.
func scrape(t *testing.T, url string) map[string]float64 {
	t.Helper()
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := client.Get(url)
	if err != nil {
		t.Fatalf("scrape %s: %v", url, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("scrape %s: %s\n%s", url, resp.Status, body)
	}
	series := map[string]float64{}
	sc := bufio.NewScanner(bytes.NewReader(body))
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			t.Fatalf("scrape line %q: %v", line, err)
		}
		series[line[:i]] = v
	}
	return series
}

// TestRunMetrics runs the batch job with --metrics-addr on a loopback
// port, scrapes /metrics once the batch is allocated, and checks the
// values against the job's own report; then checks the server is gone.
func TestRunMetrics(t *testing.T) {
	var out, errb bytes.Buffer
	var url string
	var got map[string]float64
	a := &app{ctx: context.Background(), stdin: strings.NewReader(""), stdout: &out, stderr: &errb,
		onMetrics: func(u string) {
			url = u
			got = scrape(t, u)
		}}
	args := append([]string{"run", "--json", "--metrics-addr", "127.0.0.1:0"}, smallRun...)
	if code := a.execute(args); code != exitOK {
		t.Fatalf("exit %d; stderr:\n%s", code, errb.String())
	}
	var r runReport
	if err := json.Unmarshal(out.Bytes(), &r); err != nil {
		t.Fatalf("stdout is not one JSON object: %v\n%s", err, out.String())
	}
	if url == "" || got == nil {
		t.Fatal("the job served no metrics")
	}
	if r.MetricsURL != url || !strings.HasPrefix(url, "http://127.0.0.1:") || !strings.HasSuffix(url, "/metrics") {
		t.Errorf("metrics URL %q in the report, %q served", r.MetricsURL, url)
	}
	if !strings.Contains(errb.String(), "serving metrics on "+url) {
		t.Errorf("stderr does not say where the metrics are:\n%s", errb.String())
	}
	// The outputs' arrays at the planned chunk length, each rounded to
	// the pool's 512 bytes: trajectories [21, 2, L] float32, status [L]
	// int32; the inputs: init [2, L], params [4, L] float32.
	round := func(n int) float64 { return float64((n + 511) / 512 * 512) }
	L := r.ChunkLength
	want := map[string]float64{
		`vram_run_chunks`:                                                   float64(r.Chunks),
		`vram_run_chunks_done_total`:                                        0,
		`vram_device_total_bytes`:                                           1 << 20,
		`vram_group_clients{group="oscillators"}`:                           2,
		`vram_client_held_bytes{client="outputs",group="oscillators"}`:      round(21*2*L*4) + round(L*4),
		`vram_client_held_bytes{client="inputs",group="oscillators"}`:       round(2*L*4) + round(4*L*4),
		`vram_allocator_allocs_total{allocator="` + r.Allocator + `"}`:      4,
		`vram_allocator_in_use_bytes{allocator="` + r.Allocator + `"}`:      round(21*2*L*4) + round(L*4) + round(2*L*4) + round(4*L*4),
		`vram_device_info{backend="sim",name="vram simulator",ordinal="0"}`: 1,
	}
	for k, v := range want {
		if g, ok := got[k]; !ok || g != v {
			t.Errorf("%s = %v (present %v), want %v", k, g, ok, v)
		}
	}
	if got["vram_device_free_bytes"] >= 1<<20 || got[`vram_client_cap_bytes{client="inputs",group="oscillators"}`] != 1<<19 {
		t.Errorf("device free %v, inputs' cap %v: want the arrays to take device memory and a cap of half the device",
			got["vram_device_free_bytes"], got[`vram_client_cap_bytes{client="inputs",group="oscillators"}`])
	}
	if _, ok := got["go_goroutines"]; !ok {
		t.Error("no Go runtime metrics")
	}
	// The server stopped with the job.
	host := strings.TrimSuffix(strings.TrimPrefix(url, "http://"), "/metrics")
	if c, err := net.DialTimeout("tcp", host, time.Second); err == nil {
		c.Close()
		t.Errorf("%s still accepts connections after the job", host)
	}
}

func TestRunMetricsAddrErrors(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	tests := map[string]struct {
		addr string
		code int
		want string
	}{
		"no port":    {"9090", exitUsage, `--metrics-addr "9090": want host:port, such as :9090`},
		"bad port":   {"127.0.0.1:http2", exitUsage, "want host:port"},
		"port range": {"127.0.0.1:70000", exitUsage, "want host:port"},
		"port taken": {taken.Addr().String(), exitFailure, fmt.Sprintf("serve metrics on --metrics-addr %s", taken.Addr())},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			stdout, stderr, code := cli(t, "", append([]string{"run", "--json", "--metrics-addr", tc.addr}, smallRun...)...)
			if code != tc.code || stdout != "" || !strings.Contains(stderr, tc.want) {
				t.Errorf("exit %d (want %d), stdout %q, stderr %q; want it to contain %q", code, tc.code, stdout, stderr, tc.want)
			}
		})
	}
}

func TestScrapeURL(t *testing.T) {
	tests := map[string]struct {
		addr net.Addr
		want string
	}{
		"loopback":    {&net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 9090}, "http://127.0.0.1:9090/metrics"},
		"every v4":    {&net.TCPAddr{IP: net.IPv4zero, Port: 9090}, "http://localhost:9090/metrics"},
		"every v6":    {&net.TCPAddr{IP: net.IPv6unspecified, Port: 1}, "http://localhost:1/metrics"},
		"v6 loopback": {&net.TCPAddr{IP: net.IPv6loopback, Port: 2}, "http://[::1]:2/metrics"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if got := scrapeURL(tc.addr); got != tc.want {
				t.Errorf("scrapeURL(%v) = %q, want %q", tc.addr, got, tc.want)
			}
		})
	}
}
