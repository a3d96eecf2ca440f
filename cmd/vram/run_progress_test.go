package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestRunJSONOverlap checks that --json reports the pipeline's copy,
// compute and exposed copy times, consistently: with one buffer nothing
// overlaps, so all the copying is exposed; with two, at most all of it.
func TestRunJSONOverlap(t *testing.T) {
	for _, double := range []bool{false, true} {
		t.Run(map[bool]string{false: "one buffer", true: "two buffers"}[double], func(t *testing.T) {
			var out, errb bytes.Buffer
			args := append([]string{"run", "--json"}, smallRun...)
			if double {
				args = append(args, "--double-buffer")
			} else {
				args = append(args, "--buffers", "1")
			}
			if code := run(args, &out, &errb); code != exitOK {
				t.Fatalf("exit %d: %s", code, errb.String())
			}
			var rep map[string]any
			if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
				t.Fatal(err)
			}
			cp, okc := rep["copy_seconds"].(float64)
			comp, okk := rep["compute_seconds"].(float64)
			exp, oke := rep["exposed_copy_seconds"].(float64)
			if !okc || !okk || !oke || cp <= 0 || comp <= 0 || exp < 0 || exp > cp {
				t.Fatalf("copy_seconds %v, compute_seconds %v, exposed_copy_seconds %v: want positive copy and compute times and exposed within copy",
					rep["copy_seconds"], rep["compute_seconds"], rep["exposed_copy_seconds"])
			}
			if !double && exp != cp {
				t.Errorf("one buffer: exposed %v s of %v s of copies; with nothing overlapping, want all", exp, cp)
			}
		})
	}
}

// TestRunProgressLines runs the job with stderr not a terminal and checks
// the lines a batch system's log gets: one as each set-up step begins,
// then one per chunk when chunks come slower than the interval, and only
// the last when they come faster.
func TestRunProgressLines(t *testing.T) {
	chunkLine := regexp.MustCompile(`(?m)^vram run\[\d+\]: chunk (\d+) of (\d+) done \(\d+%\): .* in, .* out, [0-9.]+ s into the batch$`)
	tests := map[string]struct {
		every     time.Duration
		allChunks bool
	}{
		"interval shorter than a chunk": {every: time.Nanosecond, allChunks: true},
		"interval longer than the job":  {every: time.Hour},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			var out, errb bytes.Buffer
			chunks := 0
			a := &app{ctx: context.Background(), stdin: strings.NewReader(""), stdout: &out, stderr: &errb,
				progressEvery: tc.every, onChunkDone: func(_, of int) { chunks = of }}
			if code := a.execute(append([]string{"run", "--json"}, smallRun...)); code != exitOK {
				t.Fatalf("exit %d: %s", code, errb.String())
			}
			log := errb.String()
			for _, step := range []string{"set-up: open the device", "set-up: load the oscillator kernel",
				"set-up: plan and allocate the device arrays", "set-up: fill the inputs", "run the batch (", "verify the results ("} {
				if !strings.Contains(log, jobTag()+": "+step) {
					t.Errorf("no line for %q in the log:\n%s", step, log)
				}
			}
			lines := chunkLine.FindAllStringSubmatch(log, -1)
			want := 1
			if tc.allChunks {
				want = chunks
			}
			if chunks < 4 || len(lines) != want || lines[len(lines)-1][1] != lines[len(lines)-1][2] {
				t.Errorf("%d chunk lines for %d chunks, want %d ending with the last:\n%s", len(lines), chunks, want, log)
			}
		})
	}
}

// TestLineProgressHeartbeat checks that a set-up step that lasts says so
// every interval, and that nothing is written after Finish.
func TestLineProgressHeartbeat(t *testing.T) {
	var buf syncBuffer
	p := newLineProgress(&buf, 10*time.Millisecond, "vram run[7]")
	p.Phase("fill the inputs")
	deadline := time.Now().Add(5 * time.Second)
	for !strings.Contains(buf.String(), "still fill the inputs") && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	p.Finish()
	p.Finish()
	got := buf.String()
	if !strings.HasPrefix(got, "vram run[7]: set-up: fill the inputs\n") || !strings.Contains(got, "vram run[7]: set-up: still fill the inputs (") {
		t.Fatalf("log %q: want the step, then that it still runs", got)
	}
	p.Phase("late")
	if buf.String() != got {
		t.Errorf("a line after Finish: %q", strings.TrimPrefix(buf.String(), got))
	}
}

// TestRunMetricsStuckClient has a metrics client pipeline requests and
// never read its responses: the job still succeeds, and stopping the
// server is a warning. The job is run up to three times for the warning,
// in case a loaded machine still has the server between two requests
// (idle, so it stops cleanly) when the job ends.
func TestRunMetricsStuckClient(t *testing.T) {
	var stderr string
	for range 3 {
		var warned bool
		if warned, stderr = runMetricsStuckClient(t); warned {
			return
		}
	}
	t.Errorf("stderr %q: want a warning that the metrics server did not stop cleanly (3 tries)", stderr)
}

// runMetricsStuckClient runs the job with a stuck metrics client once and
// reports whether it warned that the server did not stop cleanly.
func runMetricsStuckClient(t *testing.T) (warned bool, stderr string) {
	t.Helper()
	var out bytes.Buffer
	var errb syncBuffer // the server's handlers may log after it is closed
	var conn net.Conn
	defer func() {
		if conn != nil {
			conn.Close()
		}
	}()
	a := &app{ctx: context.Background(), stdin: strings.NewReader(""), stdout: &out, stderr: &errb,
		metricsGrace: 100 * time.Millisecond,
		// A loaded machine can take longer than the server's 10 s write
		// timeout to run the job, and the timeout would then free the
		// stuck scrape before the job ends: keep it stuck.
		metricsWriteTimeout: 10 * time.Minute,
		// A small send buffer on the server's side too: it blocks after
		// a few responses, not after the megabytes loopback autotuning
		// gives, which a loaded machine may not produce before the job
		// ends (the server, still between two requests, then stops
		// cleanly).
		metricsSendBuffer: 4096,
		onMetrics: func(u string) {
			pu, err := url.Parse(u)
			if err != nil {
				t.Error(err)
				return
			}
			if conn, err = net.Dial("tcp", pu.Host); err != nil {
				t.Error(err)
				return
			}
			// Far more responses than the socket buffers hold: a small
			// receive buffer turns off the kernel's autotuning, which on
			// loopback can grow to hold thousands of responses.
			if tc, ok := conn.(*net.TCPConn); ok {
				if err := tc.SetReadBuffer(4096); err != nil {
					t.Error(err)
				}
			}
			req := []byte("GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
			_ = conn.SetWriteDeadline(time.Now().Add(2 * time.Second))
			for range 4000 {
				if _, err := conn.Write(req); err != nil {
					break
				}
			}
			// Wait for the first response, so the scrapes are under way
			// however slowly the machine runs (a connection whose first
			// request has not been read yet would close as idle), then let
			// the server fill the socket buffers and block writing.
			_ = conn.SetReadDeadline(time.Now().Add(30 * time.Second))
			if _, err := conn.Read(make([]byte, 1)); err != nil {
				t.Error(err)
			}
			time.Sleep(time.Second)
		}}
	args := append([]string{"run", "--metrics-addr", "127.0.0.1:0"}, smallRun...)
	if code := a.execute(args); code != exitOK {
		t.Fatalf("exit %d, stderr:\n%s", code, errb.String())
	}
	if !strings.Contains(out.String(), "verified") {
		t.Errorf("stdout %q: want the report", out.String())
	}
	return strings.Contains(errb.String(), "vram: warning: stop the metrics server: scrapes still in flight after 100ms"), errb.String()
}

// failWriter fails every write, as stdout on /dev/full does.
type failWriter struct{}

var errFull = errors.New("no space left on device")

func (failWriter) Write([]byte) (int, error) { return 0, errFull }

// TestRunWriteErrors checks that `vram run` exits 1 when its report
// cannot be written, in text and in JSON, like every other command.
func TestRunWriteErrors(t *testing.T) {
	for _, format := range []string{"text", "json"} {
		t.Run(format, func(t *testing.T) {
			var errb bytes.Buffer
			args := append([]string{"run"}, smallRun...)
			if format == "json" {
				args = append(args, "--json")
			}
			code := run(args, failWriter{}, &errb)
			if code != exitFailure || !strings.Contains(errb.String(), "write the report: no space left on device") {
				t.Errorf("exit %d, stderr %q; want exit 1 and the write error", code, errb.String())
			}
		})
	}
}

// syncBuffer is a bytes.Buffer safe for concurrent use.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
