package main

import (
	"encoding/json"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/vramkit/vram/internal/units"
)

// `vram run --host-mem 96MiB --vram 64MiB --out` keeps its process's RSS
// within --host-mem and the simulated device's memory, give or take
// 64 MiB for the process's own (the runtime, the test binary it runs as,
// the race detector's; the job's heap is a few MiB): its host arrays and
// pinned staging are within --host-mem by the books (what the library
// asks for, batch's TestRunHostMemWithinLimit), and the simulator maps
// exactly what it is asked for, host and device, off the Go heap. The
// figure is the kernel's peak RSS of the child (getrusage's maxrss).
// Before, the simulator's pinned buffers were Go heap: a 4M-run job
// under --host-mem 512MiB peaked at 1029 MiB after a re-cut.
func TestRunHostMemRSS(t *testing.T) {
	const hostMem, vramBytes, own = 96 << 20, 64 << 20, 64 << 20
	out := filepath.Join(t.TempDir(), "r.npy")
	c := startChild(t, []string{"run", "--json", "--runs", "1000000", "--steps", "20", "--samples", "21",
		"--vram", "64MiB", "--host-mem", "96MiB", "--out", out})
	st, stderr := c.wait(t)
	if !st.Success() {
		t.Fatalf("exit %d; stderr:\n%s", st.ExitCode(), stderr)
	}
	var r runReport
	if err := json.Unmarshal(c.stdout.Bytes(), &r); err != nil || !r.Verified {
		t.Fatalf("report %q (%v): want it verified", c.stdout.String(), err)
	}
	ru, ok := st.SysUsage().(*syscall.Rusage)
	if !ok {
		t.Skip("no rusage for the child")
	}
	peak := uint64(ru.Maxrss) << 10 // kB on Linux
	if peak > hostMem+vramBytes+own {
		t.Errorf("peak RSS %s; want at most --host-mem %s, --vram %s and %s of the process's own",
			units.Format(peak), units.Format(hostMem), units.Format(vramBytes), units.Format(own))
	}
	t.Logf("peak RSS %s; %d chunks, %d re-cuts, %s of staging pinned", units.Format(peak), r.ChunksRun, len(r.Recuts), units.Format(r.PinnedBytes))
}
