// `vram run --metrics-addr`: the manager's state and the job's progress
// served to Prometheus on /metrics while the job runs.
//
// The server listens before the batch starts and is shut down (gracefully,
// in-flight scrapes finishing) when the job ends, before the manager is
// closed. What it serves is read at scrape time: vram/metrics's collector
// for the manager (device memory, allocator counters, clients and
// groups), the job's own chunk and run counters, and the Go runtime's and
// the process's standard metrics.

package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/vramkit/vram"
	"github.com/vramkit/vram/metrics"
)

// Timeouts of the metrics server. A scrape takes milliseconds; these only
// bound what a slow or stuck client can hold: a request being read, a
// response being written (a client that pipelines requests and never
// reads), an idle keep-alive connection.
const (
	metricsReadTimeout  = 10 * time.Second
	metricsWriteTimeout = 10 * time.Second
	metricsIdleTimeout  = 30 * time.Second
	// defaultMetricsGrace is how long the end of the job waits for
	// scrapes in flight before it closes their connections.
	defaultMetricsGrace = time.Second
)

// checkMetricsAddr refuses a --metrics-addr that is not host:port.
func checkMetricsAddr(addr string) error {
	_, port, err := net.SplitHostPort(addr)
	if err == nil {
		var n int
		n, err = strconv.Atoi(port)
		if err == nil && (n < 0 || n > 65535) {
			err = errors.New("port out of range")
		}
	}
	if err != nil {
		return usagef("--metrics-addr %q: want host:port, such as :9090 (every interface) or 127.0.0.1:9090", addr)
	}
	return nil
}

// jobMetrics are the batch job's own progress metrics. A nil *jobMetrics
// records nothing. Safe for concurrent use.
type jobMetrics struct {
	chunks     prometheus.Gauge
	chunksDone prometheus.Counter
	runsDone   prometheus.Counter
}

func newJobMetrics() *jobMetrics {
	return &jobMetrics{
		chunks: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "vram", Subsystem: "run", Name: "chunks",
			Help: "Chunks the batch job's plan has.",
		}),
		chunksDone: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "vram", Subsystem: "run", Name: "chunks_done_total",
			Help: "Chunks of the batch job copied in, computed and copied back.",
		}),
		runsDone: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "vram", Subsystem: "run", Name: "runs_done_total",
			Help: "Runs of the batch job whose results are back on the host.",
		}),
	}
}

func (m *jobMetrics) planned(chunks int) {
	if m != nil {
		m.chunks.Set(float64(chunks))
	}
}

func (m *jobMetrics) chunkDone(runs int) {
	if m != nil {
		m.chunksDone.Inc()
		m.runsDone.Add(float64(runs))
	}
}

// metricsServer serves /metrics until close.
type metricsServer struct {
	srv  *http.Server
	done chan error // Serve's result
	url  string     // where to scrape, for people
	job  *jobMetrics
}

// serveMetrics starts serving m's metrics and the job's on addr. A
// failure to listen (the port is taken, the host is not this machine's)
// is a runtime error naming the address.
func (a *app) serveMetrics(addr string, m *vram.Manager) (*metricsServer, error) {
	job := newJobMetrics()
	reg := prometheus.NewRegistry()
	reg.MustRegister(
		metrics.NewCollector(m, metrics.Opts{}),
		job.chunks, job.chunksDone, job.runsDone,
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)
	var lc net.ListenConfig
	ln, err := lc.Listen(a.ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("serve metrics on --metrics-addr %s: %w; pick another port, or a host:port of this machine", addr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{
		ErrorLog:      slog.NewLogLogger(a.log.Handler(), slog.LevelWarn),
		ErrorHandling: promhttp.ContinueOnError, // serve what can be read
	}))
	s := &metricsServer{
		srv: &http.Server{
			Handler:           mux,
			ReadHeaderTimeout: 5 * time.Second,
			ReadTimeout:       metricsReadTimeout,
			WriteTimeout:      cmp.Or(a.metricsWriteTimeout, metricsWriteTimeout),
			IdleTimeout:       metricsIdleTimeout,
			ErrorLog:          slog.NewLogLogger(a.log.Handler(), slog.LevelDebug),
		},
		done: make(chan error, 1),
		url:  scrapeURL(ln.Addr()),
		job:  job,
	}
	if n := a.metricsSendBuffer; n > 0 {
		s.srv.ConnState = func(c net.Conn, st http.ConnState) {
			if tc, ok := c.(*net.TCPConn); ok && st == http.StateNew {
				_ = tc.SetWriteBuffer(n)
			}
		}
	}
	go func() { s.done <- s.srv.Serve(ln) }()
	a.log.Debug("serving metrics", "addr", ln.Addr().String())
	return s, nil
}

// startMetrics serves /metrics for the job when --metrics-addr asks; nil
// when it does not.
func (a *app) startMetrics(f runFlags, m *vram.Manager) (*metricsServer, error) {
	if f.metricsAddr == "" {
		return nil, nil
	}
	ms, err := a.serveMetrics(f.metricsAddr, m)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(a.stderr, "vram: serving metrics on %s while the job runs\n", ms.url)
	return ms, nil
}

// close stops the server: it lets scrapes in flight finish for up to
// grace, then closes the connections still open (a client that stopped
// reading), and waits for the server to be done. The error says what did
// not stop cleanly.
func (s *metricsServer) close(grace time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), grace)
	defer cancel()
	err := s.srv.Shutdown(ctx)
	if err != nil {
		err = fmt.Errorf("scrapes still in flight after %v, their connections closed: %w", grace, errors.Join(err, s.srv.Close()))
	}
	if serr := <-s.done; !errors.Is(serr, http.ErrServerClosed) {
		err = errors.Join(err, serr)
	}
	if err != nil {
		return fmt.Errorf("stop the metrics server: %w", err)
	}
	return nil
}

// stop closes the server at the end of the job. A server that does not
// stop cleanly is a warning: the job's results do not depend on it.
func (s *metricsServer) stop(a *app) {
	grace := a.metricsGrace
	if grace <= 0 {
		grace = defaultMetricsGrace
	}
	if err := s.close(grace); err != nil {
		fmt.Fprintf(a.stderr, "vram: warning: %v\n", err)
	}
}

// scrapeURL is the URL of /metrics on addr; a listener on every interface
// is shown as localhost.
func scrapeURL(addr net.Addr) string {
	host, port, err := net.SplitHostPort(addr.String())
	if err != nil {
		return "http://" + addr.String() + "/metrics"
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
		host = "localhost"
	}
	return "http://" + net.JoinHostPort(host, port) + "/metrics"
}
