// The checks of `vram run`'s flags: the batch's fixed figures, refused
// with a usage error that says what to give before anything is opened.

package main

import (
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/vramkit/vram/batch"
	"github.com/vramkit/vram/internal/userfile"
	"github.com/vramkit/vram/shard"
)

// runFlags is `vram run`'s flags, each read once into its type: sizes
// in bytes (sizeFlag), checked into a jobShape by check.
type runFlags struct {
	runs, steps, samples int
	dt                   float64
	vram                 sizeFlag // --vram: the simulator's memory, or a cap on a GPU
	allocator            string   // --allocator ("": $VRAM_ALLOC_CONF's, else the manager's default)
	doubleBuffer         bool     // --double-buffer: --buffers 2
	buffers              int      // --buffers: 1 to 3; 0 chosen by the batch
	verify               int
	seed                 uint64
	metricsAddr          string   // --metrics-addr: serve /metrics here during the job ("": don't)
	out                  string   // --out: the trajectories' .npy file ("": not kept)
	hostMem              sizeFlag // --host-mem: cap on the job's host RAM (0 bytes: none)
	shard                string   // --shard i/N ("": the scheduler's environment, else the whole batch)
	devices              string   // --devices: several devices in one process ("": --device alone)
	broker               string   // --socket (or the deprecated --broker): the node broker's socket ("": no lease; runlease.go)
	kernelDelay          time.Duration
}

// jobShape is the batch's fixed figures, checked.
type jobShape struct {
	runs    int // the job's runs: the batch's, or its shard's
	steps   uint32
	every   uint32
	samples int
	dt      float32
	dtFlag  float64 // --dt as given
	// shard is the job's share of the batch (shard.One: all of it); its
	// runs are the batch's first … first+runs−1 of total.
	shard        shard.Shard
	first, total int
}

func (f runFlags) check() (jobShape, error) {
	var js jobShape
	if f.runs < 1 || f.runs > math.MaxInt32 {
		return js, usagef("--runs %d: want 1 to %d", f.runs, math.MaxInt32)
	}
	if f.steps < 1 || f.steps > math.MaxInt32 {
		return js, usagef("--steps %d: want at least 1", f.steps)
	}
	samples := f.samples
	if samples == 0 {
		samples = f.steps + 1
	}
	if samples < 2 || samples > f.steps+1 || f.steps%(samples-1) != 0 {
		return js, usagef("--samples %d with --steps %d: want 2 to %d samples, with steps a multiple of samples−1 (e.g. --samples %d)",
			f.samples, f.steps, f.steps+1, f.steps+1)
	}
	if !(f.dt > 0) || math.IsInf(f.dt, 0) || float32(f.dt) == 0 {
		return js, usagef("--dt %v: want a positive time step", f.dt)
	}
	if err := checkStable(f.dt, f.runs, f.seed); err != nil {
		return js, err
	}
	if tEnd := f.dt * float64(f.steps); maxDrive*tEnd >= 100*math.Pi {
		return js, usagef("--steps %d × --dt %v = %.4g time units: the drive cos(Ωt), Ω ≤ %v, must stay within |Ωt| < 100π; keep steps × dt below %.4g",
			f.steps, f.dt, tEnd, maxDrive, 100*math.Pi/maxDrive)
	}
	if f.verify < 1 {
		return js, usagef("--verify %d: want at least 1 run to check", f.verify)
	}
	if f.allocator != "" {
		if _, err := lookupAllocator(f.allocator); err != nil {
			return js, err
		}
	}
	if f.metricsAddr != "" {
		if err := checkMetricsAddr(f.metricsAddr); err != nil {
			return js, err
		}
	}
	if f.buffers < 0 || f.buffers > batch.MaxBuffers || (f.doubleBuffer && f.buffers != 0 && f.buffers != 2) {
		return js, usagef("--buffers %d (--double-buffer %v): want 1 to %d buffers in flight, or neither flag for as many as buy something",
			f.buffers, f.doubleBuffer, batch.MaxBuffers)
	}
	if err := checkNPYName("--out", f.out); err != nil {
		return js, err
	}
	if f.out != "" {
		if _, _, err := userfile.Check(f.out, userfile.Options{}); err != nil {
			return js, usagef("--out: %w", err)
		}
	}
	return jobShape{
		runs:    f.runs,
		steps:   uint32(f.steps),
		every:   uint32(f.steps / (samples - 1)),
		samples: samples,
		dt:      float32(f.dt),
		dtFlag:  f.dt,
		shard:   shard.One,
		total:   f.runs,
	}, nil
}

// bufferCount is the buffers in flight asked for: --buffers, 2 with
// --double-buffer, 0 for the batch to choose.
func (f runFlags) bufferCount() int {
	if f.doubleBuffer {
		return 2
	}
	return f.buffers
}

// bytesNote says, for a size flag's text given without a unit, that it
// was read as bytes (--vram 64 is 64 bytes, not 64 MiB); "" otherwise.
func bytesNote(text string) string {
	t := strings.TrimSpace(text)
	if t == "" || strings.TrimLeft(t, "0123456789") != "" {
		return ""
	}
	return fmt.Sprintf(" (read as %s bytes: a size without a unit is bytes; write %sMiB or %sGiB for more)", t, t, t)
}

// checkNPYName refuses a .npy output of what (a flag, an argument) whose
// name does not end in .npy: the file is a NumPy array, and a shard's part
// and manifest are named after it ("" is no output).
func checkNPYName(what, path string) error {
	if path == "" || strings.HasSuffix(path, ".npy") {
		return nil
	}
	return usagef("%s %q: want a file name ending in .npy (the file is a NumPy array, and a shard's parts are named after it)", what, path)
}
