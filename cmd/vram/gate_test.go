package main

// Gate figures of `vram run` (package internal/gate): the host memory
// fixed jobs ask for. More rows belong here as the job's host side gains
// figures of its own (pinned bytes, resident memory).

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/vramkit/vram/internal/gate"
)

// heapSlack is the noise of the heap bytes a job allocates: goroutines'
// timers and channels, a few KiB of 100 MiB.
const heapSlack = 0.01

// TestGateHostMemory: two fixed jobs on the default simulator (256 MiB,
// several chunks), with two buffers chosen so that no measurement picks
// them: the whole batch in host memory, and --out under --host-mem. Per
// job: the pinned staging held at the end (the report's staging_bytes)
// and the bytes the job asked the Go heap for (runtime.MemStats'
// TotalAlloc over the job, which on the simulator includes its pinned
// host buffers and host arrays).
func TestGateHostMemory(t *testing.T) {
	gate.Need(t)
	jobs := map[string][]string{
		"100000 runs, 2 buffers":                         {},
		"100000 runs, 2 buffers, --host-mem 32MiB --out": {"--host-mem", "32MiB", "--out", filepath.Join(t.TempDir(), "o.npy")},
	}
	var figs []gate.Figure
	for name, extra := range jobs {
		args := append([]string{"run", "--json", "--runs", "100000", "--buffers", "2"}, extra...)
		runtime.GC()
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		stdout, stderr, code := cli(t, "", args...)
		runtime.ReadMemStats(&after)
		if code != exitOK {
			t.Fatalf("vram %s: exit %d:\n%s", strings.Join(args, " "), code, stderr)
		}
		var r runReport
		if err := json.Unmarshal([]byte(stdout), &r); err != nil {
			t.Fatal(err)
		}
		if !r.Verified {
			t.Fatalf("vram %s: not verified: %+v", strings.Join(args, " "), r)
		}
		prefix := fmt.Sprintf("host/vram run %s: ", name)
		figs = append(figs,
			gate.Figure{Name: prefix + "pinned staging", Value: float64(r.StagingBytes), Unit: "bytes", Better: gate.Lower},
			gate.Figure{Name: prefix + "Go heap allocated", Value: float64(after.TotalAlloc - before.TotalAlloc), Unit: "bytes", Better: gate.Lower, Slack: heapSlack})
	}
	gate.Record(t, figs...)
}
