// How much host memory `vram run` needs, and how much the machine has.
//
// The job's host arrays hold the whole batch (24 bytes of inputs and
// samples × 8 + 4 bytes of outputs a run), and on a backed simulator the
// device arrays are host memory too. Every page of them is written, so a
// batch bigger than the memory the machine can give gets the process
// killed by the kernel's OOM killer, or stopped by the Go runtime with
// "fatal error: out of memory". runJob compares the two before it
// allocates anything and refuses such a batch as a usage error.
//
// Available memory is the library's figure (internal/meminfo): Linux's
// MemAvailable (/proc/meminfo), lowered to what the process's cgroup
// memory limit leaves, if one is set. Elsewhere it is unknown and the
// check is skipped.

package main

import (
	"fmt"
	"runtime"

	"github.com/vramkit/vram/device"
	"github.com/vramkit/vram/internal/meminfo"
	"github.com/vramkit/vram/internal/units"
)

// hostBytesPerRun is the host memory the job's host arrays take a run.
func hostBytesPerRun(samples int) uint64 { return 24 + uint64(samples)*8 + 4 }

// checkHostMemory refuses a batch whose host memory (host arrays, plus
// device arrays on a backed simulator) exceeds what the machine has
// available, as a usage error naming both figures and what to lower.
// With out (--out) the trajectories are no host array; with hostCap
// (--host-mem) the host arrays take at most that, the rest spilled to
// files.
func (a *app) checkHostMemory(js jobShape, info device.Info, double, out bool, hostCap uint64) error {
	avail, from, ok := a.hostAvailable()
	if !ok {
		a.log.Debug("host memory check skipped: available memory unknown", "os", runtime.GOOS)
		return nil
	}
	hostArrays := uint64(js.runs) * hostBytesPerRun(js.samples)
	need := hostArrays
	if out {
		need = uint64(js.runs) * (hostBytesPerRun(js.samples) - uint64(js.samples)*8)
	}
	if hostCap > 0 {
		need = min(need, hostCap)
	}
	onHost := need
	var onDevice uint64
	if info.Backend == "sim" && info.Backed {
		// The simulator's device memory is host memory, at most the
		// device's size or the batch's arrays (twice with two buffers).
		buffers := uint64(1)
		if double {
			buffers = 2
		}
		onDevice = min(info.TotalBytes, hostArrays*buffers)
		need += onDevice
	}
	a.log.Debug("host memory", "need", need, "host_arrays", hostArrays, "simulated_device", onDevice,
		"available", avail, "from", from)
	if need <= avail {
		return nil
	}
	what := fmt.Sprintf("%s of host arrays", units.Format(onHost))
	if onDevice > 0 {
		what += fmt.Sprintf(" and up to %s for the simulator's device memory", units.Format(onDevice))
	}
	return usagef("--runs %d with %d samples a run needs %s of host memory (%s), but only %s is available (%s); lower --runs or --samples/--steps, or give --out FILE.npy or --host-mem SIZE",
		js.runs, js.samples, units.Format(need), what, units.Format(avail), from)
}

// hostAvailable is the host memory available to this process and where
// the figure came from; ok is false where it is unknown.
func (a *app) hostAvailable() (avail uint64, from string, ok bool) {
	if a.hostMem != nil {
		return a.hostMem()
	}
	f := meminfo.Available()
	return f.Bytes, f.From, f.Known
}
