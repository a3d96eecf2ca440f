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
// Available memory is Linux's MemAvailable (/proc/meminfo), lowered to
// what a cgroup memory limit leaves, if one is set (v2 memory.max less
// memory.current, or v1 memory.limit_in_bytes less memory.usage_in_bytes).
// Elsewhere it is unknown and the check is skipped.

package main

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"

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
	if runtime.GOOS != "linux" {
		return 0, "", false
	}
	return linuxAvailable(meminfo.Path, "/sys/fs/cgroup")
}

// linuxAvailable reads MemAvailable from the meminfo file and lowers it to
// what a cgroup memory limit under cgroupRoot leaves.
func linuxAvailable(meminfoPath, cgroupRoot string) (uint64, string, bool) {
	f, err := os.Open(meminfoPath)
	if err != nil {
		return 0, "", false
	}
	defer f.Close()
	avail, ok := meminfo.Available(f)
	if !ok {
		return 0, "", false
	}
	from := "MemAvailable in " + meminfoPath
	for _, files := range [][2]string{
		{"memory.max", "memory.current"},                                 // cgroup v2
		{"memory/memory.limit_in_bytes", "memory/memory.usage_in_bytes"}, // cgroup v1
	} {
		limitPath := filepath.Join(cgroupRoot, files[0])
		limit, ok1 := readCgroupBytes(limitPath)
		used, ok2 := readCgroupBytes(filepath.Join(cgroupRoot, files[1]))
		if !ok1 || !ok2 {
			continue
		}
		left := uint64(0)
		if limit > used {
			left = limit - used
		}
		if left < avail {
			avail, from = left, "the cgroup limit "+limitPath+" less what is in use"
		}
		break
	}
	return avail, from, true
}

// noCgroupLimit: cgroup limits at or above this mean no limit (v1 writes
// the largest page-aligned int64, v2 writes "max").
const noCgroupLimit = 1 << 62

// readCgroupBytes reads a cgroup memory file holding a byte count; ok is
// false when it is missing, unreadable, or says there is no limit.
func readCgroupBytes(path string) (uint64, bool) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, false
	}
	n, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	if err != nil || n >= noCgroupLimit {
		return 0, false // includes "max"
	}
	return n, true
}
