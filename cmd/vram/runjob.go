// `vram run`: the example batch job.
//
// N damped, driven oscillators are integrated with RK4 over T steps,
// saving S samples each (package internal/oscillator owns the kernel, in
// Go for the simulator and PTX for CUDA, and the float64 reference). The
// job is written the way a batch GPU program uses vram:
//
//  1. Two clients, "inputs" (initial states [2, N] and parameters [4, N])
//     and "outputs" (trajectories [S, 2, N] float32 and status [N] int32),
//     register in one stream group and queue their requests; one
//     AllocateQueue plans the group together, so when the batch does not
//     fit the device it is cut into chunks along the run axis, and each
//     client gets chunk-length arrays (two sets with --double-buffer).
//  2. The host arrays are full-length and pinned. For each chunk the job
//     copies that chunk's inputs in, launches the kernel over the chunk's
//     runs and copies its outputs back into place, all ordered on the
//     group's stream.
//  3. With --double-buffer, chunk i+1's inputs are copied in (on the
//     group's stream) while chunk i's kernel runs on a second stream, and
//     chunk i−1's outputs are copied out; events order the two streams so
//     that a buffer is refilled only after the kernel that read it, and
//     rewritten only after the copy that read it out.
//  4. A sample of runs spread over every chunk — and the first and last
//     run of each chunk, where an off-by-one would show — is checked
//     against the float64 host reference; the job fails if any disagrees.

package main

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/vramkit/vram"
	"github.com/vramkit/vram/alloc"
	"github.com/vramkit/vram/device"
	"github.com/vramkit/vram/device/sim"
	"github.com/vramkit/vram/internal/oscillator"
	"github.com/vramkit/vram/internal/units"
)

// errVerify marks results that disagree with the reference.
var errVerify = errors.New("results do not match the float64 reference")

// Defaults of `vram run`: on the simulator's 256 MiB the batch (about
// 800 MiB of device arrays) takes four chunks, and the whole job a few
// seconds on two cores.
const (
	defaultRuns    = 400_000
	defaultSteps   = 250
	defaultDt      = 0.01
	defaultVerify  = 64
	defaultRunVRAM = "256MiB"
	// maxDrive is the largest drive frequency Ω the job draws; with
	// |Ω·t| < 100π (the PTX cosine's accurate range) it bounds steps × dt.
	maxDrive = 4.0
	// minOmega, maxOmega bound the natural frequencies ω the job draws,
	// and minZeta, maxZeta the damping ratios ζ (runAt).
	minOmega, maxOmega = 0.5, 4.0
	minZeta, maxZeta   = 0.02, 0.5
	// rk4Limit bounds ω·dt for RK4 to stay stable on every oscillator
	// the job draws. A run's RK4 step multiplies its state by
	// R(z) = 1 + z + z²/2 + z³/6 + z⁴/24 with z = λ·dt, λ = ω(−ζ ± i√(1−ζ²)),
	// and grows without bound once |R(z)| > 1. Along those rays the edge
	// of |R| ≤ 1 lies at |z| = 2.83 for ζ → 0, 2.95 at ζ = 0.1 and 2.6225
	// at ζ = 0.5, the least for ζ in [minZeta, maxZeta); rk4Limit stays
	// just inside it (TestRK4Limit checks both).
	rk4Limit = 2.62
	// stabilityScanRuns is the largest batch whose runs check --dt
	// one by one; a larger batch draws ω so close to maxOmega that the
	// bound is used instead.
	stabilityScanRuns = 1 << 22
)

type runFlags struct {
	runs, steps, samples int
	dt                   float64
	vram                 string
	vramSet              bool
	allocator            string
	doubleBuffer         bool
	verify               int
	seed                 uint64
	metricsAddr          string // --metrics-addr: serve /metrics here during the job ("": don't)
}

// runReport is what `vram run` reports; --json prints it as one object.
// Bytes are bytes, times seconds.
type runReport struct {
	Device      string `json:"device"`  // e.g. "sim:0 vram simulator"
	Backend     string `json:"backend"` // sim or cuda
	Fallback    string `json:"fallback,omitempty"`
	Kernel      string `json:"kernel"` // go or ptx
	Allocator   string `json:"allocator"`
	DeviceBytes uint64 `json:"device_total_bytes"`
	// LimitBytes is the cap --vram put on a real device (0: none).
	LimitBytes uint64 `json:"limit_bytes,omitempty"`

	Runs            int     `json:"runs"`
	Steps           int     `json:"steps"`
	Samples         int     `json:"samples"`
	Dt              float64 `json:"dt"`
	Chunks          int     `json:"chunks"`
	ChunkLength     int     `json:"chunk_length"`
	LastChunkLength int     `json:"last_chunk_length"`
	Buffers         int     `json:"buffers"`
	DoubleBuffer    bool    `json:"double_buffer"`
	BudgetBytes     uint64  `json:"budget_bytes"`
	BytesPerChunk   uint64  `json:"bytes_per_chunk"`
	FullBytes       uint64  `json:"full_bytes"` // the batch's device arrays unchunked

	BytesToDevice   uint64 `json:"bytes_to_device"`
	BytesFromDevice uint64 `json:"bytes_from_device"`

	Verified     bool   `json:"verified"`
	VerifiedRuns int    `json:"verified_runs"` // runs checked against the reference
	FailedRuns   int    `json:"failed_runs"`   // runs whose status says NaN/Inf, of all runs
	VerifyError  string `json:"verify_error,omitempty"`

	// WallSeconds is the whole job: device, planning, allocation, the
	// batch and verification. BatchSeconds is the chunk loop alone, from
	// the first copy in to the last copy out; RunsPerSecond is over it.
	WallSeconds   float64 `json:"wall_seconds"`
	BatchSeconds  float64 `json:"batch_seconds"`
	RunsPerSecond float64 `json:"runs_per_second"`

	PeakDeviceBytes uint64    `json:"peak_device_bytes"` // the allocator's peak reserved bytes
	PeakLiveBytes   uint64    `json:"peak_live_bytes"`   // the allocator's peak bytes in use
	DeviceUsedBytes uint64    `json:"device_used_bytes"` // total − free with the arrays allocated (context included)
	Stats           statsJSON `json:"allocator_stats"`   // the allocator's counters at the end of the job

	// MetricsURL is where --metrics-addr served /metrics during the job.
	MetricsURL string `json:"metrics_url,omitempty"`
}

// statsJSON is alloc.Stats with JSON names.
type statsJSON struct {
	InUse        uint64 `json:"in_use_bytes"`
	PeakInUse    uint64 `json:"peak_in_use_bytes"`
	Reserved     uint64 `json:"reserved_bytes"`
	PeakReserved uint64 `json:"peak_reserved_bytes"`
	Allocs       uint64 `json:"allocs"`
	Frees        uint64 `json:"frees"`
	CacheHits    uint64 `json:"cache_hits"`
	DeviceAllocs uint64 `json:"device_allocs"`
	DeviceFrees  uint64 `json:"device_frees"`
	Retries      uint64 `json:"retries"`
	OOMs         uint64 `json:"ooms"`
}

func toStatsJSON(s alloc.Stats) statsJSON {
	return statsJSON{s.InUse, s.PeakInUse, s.Reserved, s.PeakReserved, s.Allocs, s.Frees,
		s.CacheHits, s.DeviceAllocs, s.DeviceFrees, s.Retries, s.OOMs}
}

func (a *app) runCommand() *cobra.Command {
	f := runFlags{}
	cmd := &cobra.Command{
		Use:   "run",
		Short: "Run the example batch job: chunked, verified, with a report",
		Long: `Run integrates N damped, driven oscillators
    x'' + 2ζωx' + ω²x = A·cos(Ωt)
with RK4 over --steps steps, saving --samples samples of (x, v) per run,
with random parameters. The inputs and outputs are two clients of vram's
memory manager in one stream group; when the batch does not fit the device
the manager plans it into chunks, and the job copies each chunk's inputs
in, runs the kernel and copies the outputs back on the group's stream.
A sample of runs from every chunk is checked against a float64 host
reference: the command fails (exit 1) if any disagrees.

On the simulator (the default where there is no GPU) the device has
--vram of memory (256 MiB), so the default batch needs several chunks. On
a GPU, --vram caps what the job may use, 256 MiB unless given, so the
default batch is chunked there too; give more (--vram 40GiB) to use more
of the GPU.

--dt must keep RK4 stable: ω·dt ≤ 2.62 for the batch's largest ω (ω < 4,
so any --dt up to 0.655 will do). The host arrays hold the whole batch
(runs × (28 + 8 × samples) bytes); a batch that does not fit the host
memory available is refused before anything is allocated.

Ctrl-C stops the job before its next chunk (exit 1); a second Ctrl-C
ends it at once.

--metrics-addr serves Prometheus metrics on /metrics while the job runs:
device memory, allocator counters, each client's held bytes and cap, and
the chunks done so far.`,
		Example: `  vram run
  vram run --runs 1000000 --double-buffer
  vram run --device sim:bandwidth=8GB --double-buffer   # emulate PCIe copies
  vram run --allocator direct --json
  vram run --metrics-addr :9090                          # Prometheus /metrics while it runs`,
		Args: usageArgs(0, 0, ""),
		RunE: func(cmd *cobra.Command, args []string) error {
			f.vramSet = cmd.Flags().Changed("vram")
			return a.runJob(f)
		},
	}
	fl := cmd.Flags()
	fl.IntVar(&f.runs, "runs", defaultRuns, "number of oscillators (runs) in the batch")
	fl.IntVar(&f.steps, "steps", defaultSteps, "RK4 steps per run")
	fl.IntVar(&f.samples, "samples", 0, "samples saved per run, the initial state included; steps must be a multiple of samples−1 (default: every step)")
	fl.Float64Var(&f.dt, "dt", defaultDt, "time step")
	fl.StringVar(&f.vram, "vram", defaultRunVRAM, "device memory of the simulator, or on a GPU a cap on what the job may use; at least one page of the device (2 MiB unless the spec says)")
	fl.StringVar(&f.allocator, "allocator", defaultAllocator, "device allocator: "+strings.Join(allocatorKinds, ", "))
	fl.BoolVar(&f.doubleBuffer, "double-buffer", false, "two chunk buffers in flight: copies of one chunk overlap the kernel of another")
	fl.IntVar(&f.verify, "verify", defaultVerify, "runs to check against the float64 reference, spread over the batch (plus each chunk's first and last)")
	fl.Uint64Var(&f.seed, "seed", 1, "seed of the random parameters")
	fl.StringVar(&f.metricsAddr, "metrics-addr", "", "serve Prometheus metrics on host:port /metrics while the job runs, e.g. :9090 or 127.0.0.1:9090")
	return cmd
}

// jobShape is the batch's fixed figures, checked.
type jobShape struct {
	runs    int
	steps   uint32
	every   uint32
	samples int
	dt      float32
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
	if !slices.Contains(allocatorKinds, f.allocator) {
		return js, usagef("--allocator %q: want one of %s", f.allocator, strings.Join(allocatorKinds, ", "))
	}
	if f.metricsAddr != "" {
		if err := checkMetricsAddr(f.metricsAddr); err != nil {
			return js, err
		}
	}
	return jobShape{
		runs:    f.runs,
		steps:   uint32(f.steps),
		every:   uint32(f.steps / (samples - 1)),
		samples: samples,
		dt:      float32(f.dt),
	}, nil
}

// checkStable refuses a --dt at which RK4 blows up on some run of the
// batch: ω·dt must stay within rk4Limit for the batch's largest ω (found
// run by run up to stabilityScanRuns runs, else taken as maxOmega).
func checkStable(dt float64, runs int, seed uint64) error {
	if dt*maxOmega <= rk4Limit {
		return nil // stable whatever ω the batch draws
	}
	omega := maxOmega
	if runs <= stabilityScanRuns {
		omega = 0
		for i := range runs {
			omega = max(omega, runAt(seed, i).Omega)
		}
		if dt*omega <= rk4Limit {
			return nil
		}
	}
	// The largest dt allowed, rounded down to 4 significant digits.
	most := rk4Limit / omega
	scale := math.Pow(10, 3-math.Floor(math.Log10(most)))
	most = math.Floor(most*scale) / scale
	return usagef("--dt %v: RK4 is unstable at this step: it needs ω·dt ≤ %v for these oscillators, and the batch's largest ω is %.4g (ω·dt = %.3g); want --dt of at most %v",
		dt, rk4Limit, omega, dt*omega, most)
}

// runDeviceSpec folds --vram into the device spec when the spec may open
// the simulator (sim, or auto falling back to it) and does not size it
// already. src names where spec came from, for messages. It returns the
// cap to put on a real device (cuda, or auto finding a GPU): --vram,
// given or not, so that the default batch is chunked on a GPU too.
func runDeviceSpec(spec, src string, f runFlags) (string, uint64, error) {
	size, err := units.ParseSize(f.vram)
	if err != nil || size == 0 {
		return "", 0, usagef("--vram %q: want a positive size such as 256MiB", f.vram)
	}
	name, opts, _ := strings.Cut(strings.TrimSpace(spec), ":")
	name = strings.ToLower(strings.TrimSpace(name))
	if name != "sim" && name != "auto" {
		return spec, size, nil
	}
	limit := size // if auto finds a GPU
	if name == "sim" {
		limit = 0 // --vram sizes the simulator instead
	}
	cfg, err := sim.ParseSpec(opts)
	if err != nil {
		return "", 0, usageError{fmt.Errorf("%s: %w", src, err)}
	}
	if cfg.TotalBytes != 0 {
		if f.vramSet {
			return "", 0, usagef("%s sizes the simulator and so does --vram %s; give one of them", src, f.vram)
		}
		return spec, limit, nil
	}
	gran := cfg.Granularity
	if gran == 0 {
		gran = sim.DefaultGranularity
	}
	if size < gran {
		return "", 0, usagef("--vram %s: want at least %s, one page of the simulator (its granularity)",
			f.vram, units.Format(gran))
	}
	if strings.TrimSpace(opts) != "" {
		opts += ","
	}
	return name + ":" + opts + "vram=" + f.vram, limit, nil
}

// job holds one batch job's state.
type job struct {
	a      *app
	shape  jobShape
	seed   uint64
	m      *vram.Manager
	dev    device.Device
	kernel oscillator.Kernel
	stats  *jobMetrics // nil unless --metrics-addr
	// fitHint adds to a failure to allocate the device arrays what to
	// change on the command line; nil adds nothing.
	fitHint func(error) error
	in      *vram.Client
	out     *vram.Client
	inR     *vram.ArrayResponse // the inputs' arrays, from its OnAllocated hook
	outR    *vram.ArrayResponse // the outputs' arrays
	plan    vram.ChunkPlan

	hInit, hParams, hOut, hStatus *vram.HostArray // full-length, pinned
}

func (a *app) runJob(f runFlags) (err error) {
	start := time.Now()
	js, err := f.check()
	if err != nil {
		return err
	}
	spec, limit, err := runDeviceSpec(a.device, a.deviceSource(), f)
	if err != nil {
		return err
	}
	flags := a.deviceSource()
	if spec != a.device {
		flags += fmt.Sprintf(" with --vram %s (the spec %q)", f.vram, spec)
	}
	dev, fallback, err := a.openDeviceAs(spec, flags)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, closeErr("device", dev.Close())) }()
	info := dev.Info()
	if info.Backend == "sim" {
		limit = 0 // --vram sized the simulator itself
	}
	if limit > 0 && limit < info.Granularity {
		return usagef("--vram %s: want at least %s, one page of %s", f.vram, units.Format(info.Granularity), info.Name)
	}
	if err := a.checkHostMemory(js, info, f.doubleBuffer); err != nil {
		return err
	}
	kind, _ := vram.ParseAllocatorKind(f.allocator)
	opts := []vram.Option{vram.WithAllocator(kind), vram.WithLogger(a.log)}
	if limit > 0 {
		opts = append(opts, vram.WithCap(limit))
	}
	m, err := vram.New(dev, opts...)
	if err != nil {
		return fmt.Errorf("memory manager on %s: %w", info.Name, err)
	}
	defer func() { err = errors.Join(err, closeErr("memory manager", m.Close())) }()
	kernel, err := oscillator.New(dev)
	if err != nil {
		return fmt.Errorf("load the oscillator kernel: %w", err)
	}
	defer func() { err = errors.Join(err, closeErr("kernel", kernel.Close())) }()

	j := &job{a: a, shape: js, seed: f.seed, m: m, dev: dev, kernel: kernel}
	var ms *metricsServer
	if f.metricsAddr != "" {
		if ms, err = a.serveMetrics(f.metricsAddr, m); err != nil {
			return err
		}
		// Stopped before the manager closes.
		defer func() { err = errors.Join(err, ms.close()) }()
		fmt.Fprintf(a.stderr, "vram: serving metrics on %s while the job runs\n", ms.url)
		j.stats = ms.job
	}
	// Pinned host arrays go back before the manager closes, also when
	// allocate fails part-way.
	defer func() { err = errors.Join(err, j.freeHost()) }()
	j.fitHint = func(err error) error { return allocHint(err, f, info, limit) }
	if err := j.allocate(f.doubleBuffer); err != nil {
		return err
	}
	j.stats.planned(j.plan.Chunks)
	if ms != nil && a.onMetrics != nil {
		a.onMetrics(ms.url)
	}
	free, total, err := dev.MemInfo()
	if err != nil {
		return fmt.Errorf("device memory: %w", err)
	}
	rep := runReport{
		Device:          fmt.Sprintf("%s:%d %s", info.Backend, info.Ordinal, info.Name),
		Backend:         info.Backend,
		Kernel:          kernel.Kind(),
		Allocator:       m.AllocatorKind().String(),
		DeviceBytes:     total,
		LimitBytes:      limit,
		Runs:            js.runs,
		Steps:           int(js.steps),
		Samples:         js.samples,
		Dt:              shortest(js.dt),
		Chunks:          j.plan.Chunks,
		ChunkLength:     j.plan.ChunkLength,
		LastChunkLength: j.plan.LastChunkLength,
		Buffers:         j.plan.Buffers,
		DoubleBuffer:    j.plan.Buffers > 1,
		BudgetBytes:     j.plan.Budget,
		BytesPerChunk:   j.plan.BytesPerChunk,
		FullBytes:       j.plan.FullBytes,
		BytesToDevice:   j.hInit.Bytes() + j.hParams.Bytes(),
		BytesFromDevice: j.hOut.Bytes() + j.hStatus.Bytes(),
		DeviceUsedBytes: total - free,
	}
	if fallback != nil {
		rep.Fallback = fallback.Error()
	}
	if ms != nil {
		rep.MetricsURL = ms.url
	}
	a.log.Debug("plan", "chunks", j.plan.Chunks, "chunk_length", j.plan.ChunkLength, "buffers", j.plan.Buffers,
		"budget", j.plan.Budget, "bytes_per_chunk", j.plan.BytesPerChunk)

	batchStart := time.Now()
	if err := j.pipeline(); err != nil {
		return err
	}
	batch := time.Since(batchStart)
	// An interrupt during the last chunk: the batch is done but not
	// checked, and the user asked to stop.
	if err := a.ctx.Err(); err != nil {
		return fmt.Errorf("interrupted after the last chunk: %d of %d chunks finished, results not verified: %w",
			j.plan.Chunks, j.plan.Chunks, err)
	}
	rep.BatchSeconds = batch.Seconds()
	rep.RunsPerSecond = float64(js.runs) / batch.Seconds()

	checked, verr := j.verify(f.verify)
	rep.VerifiedRuns = checked
	rep.FailedRuns = j.failedRuns()
	rep.Verified = verr == nil && rep.FailedRuns == 0
	if verr == nil && rep.FailedRuns > 0 {
		verr = fmt.Errorf("%d of %d runs report a NaN or infinite state: %w", rep.FailedRuns, js.runs, errVerify)
	}
	if verr != nil {
		rep.VerifyError = verr.Error()
	}
	st := m.Allocator().Stats()
	rep.Stats = toStatsJSON(st)
	rep.PeakDeviceBytes = st.PeakReserved
	rep.PeakLiveBytes = st.PeakInUse
	rep.WallSeconds = time.Since(start).Seconds()

	if a.json {
		err = a.writeJSON(rep)
	} else {
		err = a.printRun(rep)
	}
	return errors.Join(err, verr)
}

// shortest is v as the float64 with the fewest digits that rounds to it
// (0.01, not 0.009999999776482582).
func shortest(v float32) float64 {
	f, _ := strconv.ParseFloat(strconv.FormatFloat(float64(v), 'g', -1, 32), 64)
	return f
}

func closeErr(what string, err error) error {
	if err != nil {
		return fmt.Errorf("close the %s: %w", what, err)
	}
	return nil
}

// allocate registers the two clients, queues their requests, allocates
// them planned together, and makes the full-length pinned host arrays.
func (j *job) allocate(double bool) error {
	n, s := j.shape.runs, j.shape.samples
	const group = "oscillators"
	var err error
	j.in, err = j.m.Register(vram.ClientOptions{Name: "inputs", Group: group,
		OnAllocated: func(r *vram.ArrayResponse) { j.inR = r }})
	if err != nil {
		return fmt.Errorf("register the inputs: %w", err)
	}
	j.out, err = j.m.Register(vram.ClientOptions{Name: "outputs", Group: group,
		OnAllocated: func(r *vram.ArrayResponse) { j.outR = r }})
	if err != nil {
		return fmt.Errorf("register the outputs: %w", err)
	}
	if err := j.m.QueueRequest(j.in, map[string]vram.ArrayRequest{
		"init":   {Shape: []int{2, n}, DType: vram.Float32, ChunkAxis: 1},
		"params": {Shape: []int{4, n}, DType: vram.Float32, ChunkAxis: 1},
	}); err != nil {
		return fmt.Errorf("queue the inputs: %w", err)
	}
	if err := j.m.QueueRequest(j.out, map[string]vram.ArrayRequest{
		"trajectories": {Shape: []int{s, 2, n}, DType: vram.Float32, ChunkAxis: 2},
		"status":       {Shape: []int{n}, DType: vram.Int32, ChunkAxis: 0},
	}); err != nil {
		return fmt.Errorf("queue the outputs: %w", err)
	}
	buffers := 1
	if double {
		buffers = 2
	}
	if _, err := j.m.AllocateQueue(j.out, vram.WithBuffers(buffers)); err != nil {
		err = fmt.Errorf("allocate the batch's device arrays: %w", err)
		if j.fitHint != nil {
			err = j.fitHint(err)
		}
		return err
	}
	if j.inR == nil || j.outR == nil {
		return fmt.Errorf("allocate the batch: the manager delivered no arrays (inputs %v, outputs %v)", j.inR != nil, j.outR != nil)
	}
	j.plan = j.outR.Plan
	if j.plan.TotalRuns == 0 {
		// Nothing was chunkable (one run: a run axis of length 1 is
		// not), so the plan counts no runs; it is one chunk of them all.
		j.plan.TotalRuns, j.plan.ChunkLength, j.plan.LastChunkLength = n, n, n
	}

	// The host arrays hold the whole batch: 24 bytes of inputs and
	// samples × 8 + 4 bytes of outputs a run.
	hostBytes := uint64(n) * hostBytesPerRun(s)
	mk := func(shape []int, dt vram.DType, what string) (*vram.HostArray, error) {
		h, err := j.m.NewHostArray(shape, dt, vram.Pinned, nil)
		if err != nil {
			return nil, fmt.Errorf("pinned host array for the %s (the host arrays take %s in all; lower --runs or --samples): %w",
				what, units.Format(hostBytes), err)
		}
		return h, nil
	}
	if j.hInit, err = mk([]int{2, n}, vram.Float32, "initial states"); err != nil {
		return err
	}
	if j.hParams, err = mk([]int{4, n}, vram.Float32, "parameters"); err != nil {
		return err
	}
	if j.hOut, err = mk([]int{s, 2, n}, vram.Float32, "trajectories"); err != nil {
		return err
	}
	if j.hStatus, err = mk([]int{n}, vram.Int32, "status"); err != nil {
		return err
	}
	init, params := j.hInit.Float32s(), j.hParams.Float32s()
	for i := range n {
		r := runAt(j.seed, i)
		init[i], init[n+i] = float32(r.X0), float32(r.V0)
		params[i], params[n+i], params[2*n+i], params[3*n+i] = float32(r.Omega), float32(r.Zeta), float32(r.A), float32(r.Drive)
	}
	return nil
}

// freeHost returns the pinned host arrays.
func (j *job) freeHost() error {
	var errs []error
	for _, h := range []*vram.HostArray{j.hInit, j.hParams, j.hOut, j.hStatus} {
		if h != nil {
			errs = append(errs, h.Free())
		}
	}
	return errors.Join(errs...)
}

// set returns buffer b's device arrays of r.
func set(r *vram.ArrayResponse, b int) map[string]*vram.DeviceArray {
	if b < len(r.Buffers) {
		return r.Buffers[b].Device
	}
	return r.Arrays
}

// copyIn enqueues chunk i's inputs into buffer b on the group's stream.
func (j *job) copyIn(i, b int) error {
	start, n := j.plan.Chunk(i)
	d := set(j.inR, b)
	if err := j.m.ToDeviceChunk(j.in, d["init"], j.hInit, vram.Span{Axis: 1, Start: start, Len: n}); err != nil {
		return j.chunkErr(i, "copy in the initial states", err)
	}
	if err := j.m.ToDeviceChunk(j.in, d["params"], j.hParams, vram.Span{Axis: 1, Start: start, Len: n}); err != nil {
		return j.chunkErr(i, "copy in the parameters", err)
	}
	return nil
}

// launch enqueues chunk i's kernel over buffer b on s.
func (j *job) launch(i, b int, s device.Stream) error {
	_, n := j.plan.Chunk(i)
	in, out := set(j.inR, b), set(j.outR, b)
	err := j.kernel.Launch(s, oscillator.Args{
		Init: in["init"].Ptr(), Params: in["params"].Ptr(),
		Out: out["trajectories"].Ptr(), Status: out["status"].Ptr(),
		N: uint32(n), LD: uint32(j.plan.ChunkLength),
		Dt: j.shape.dt, Steps: j.shape.steps, Every: j.shape.every,
	})
	if err != nil {
		return j.chunkErr(i, "launch the kernel", err)
	}
	return nil
}

// copyOut enqueues chunk i's outputs from buffer b on the group's stream.
func (j *job) copyOut(i, b int) error {
	start, n := j.plan.Chunk(i)
	d := set(j.outR, b)
	if err := j.m.FromDeviceChunk(j.out, j.hOut, d["trajectories"], vram.Span{Axis: 2, Start: start, Len: n}); err != nil {
		return j.chunkErr(i, "copy out the trajectories", err)
	}
	if err := j.m.FromDeviceChunk(j.out, j.hStatus, d["status"], vram.Span{Axis: 0, Start: start, Len: n}); err != nil {
		return j.chunkErr(i, "copy out the status", err)
	}
	return nil
}

// chunkErr wraps err from doing what to chunk i (0-based), numbering the
// chunk from 1 as every message does: "chunk 2 of 4: launch the kernel:
// ...".
func (j *job) chunkErr(i int, what string, err error) error {
	return fmt.Errorf("chunk %d of %d: %s: %w", i+1, j.plan.Chunks, what, err)
}

// interrupted is the error of a job stopped by an interrupt before chunk
// i (0-based): chunks 0 to i−1 were enqueued, and the pipeline waits for
// them before it returns.
func (j *job) interrupted(i int, err error) error {
	return fmt.Errorf("interrupted before chunk %d of %d: %d of %d chunks finished, results not verified: %w",
		i+1, j.plan.Chunks, i, j.plan.Chunks, err)
}

// pipeline runs every chunk and waits for the last. The host stays at
// most one chunk ahead of the device, so an interrupt stops the job
// within a chunk and the progress bar moves as chunks finish.
func (j *job) pipeline() (err error) {
	s, err := j.m.Stream(j.out)
	if err != nil {
		return err
	}
	// done[i%2] marks the end of chunk i's copies out.
	var done [2]device.Event
	for k := range done {
		if done[k], err = j.dev.NewEvent(); err != nil {
			return fmt.Errorf("make an event: %w", err)
		}
		defer func(e device.Event) { err = errors.Join(err, closeErr("event", e.Close())) }(done[k])
	}
	bar := j.a.progress(j.plan.Chunks, "chunks")
	defer bar.Finish()
	// wait blocks until chunk i has been copied out.
	wait := func(i int) error {
		if i < 0 {
			return nil
		}
		if err := done[i%2].Synchronize(); err != nil {
			return j.chunkErr(i, "wait for the copies out", err)
		}
		start, n := j.plan.Chunk(i)
		j.a.log.Debug("chunk done", "chunk", i+1, "of", j.plan.Chunks, "runs", fmt.Sprintf("%d-%d", start, start+n-1))
		j.stats.chunkDone(n)
		bar.Add(1)
		if j.a.onChunkDone != nil {
			j.a.onChunkDone(i+1, j.plan.Chunks)
		}
		return nil
	}
	// On an error or interrupt, let what was enqueued finish before the
	// arrays are freed.
	defer func() {
		if err != nil {
			_ = s.Synchronize()
		}
	}()

	double := j.plan.Buffers > 1 && j.plan.Chunks > 1
	if !double {
		for i := range j.plan.Chunks {
			if err := j.a.ctx.Err(); err != nil {
				return j.interrupted(i, err)
			}
			if err := j.copyIn(i, 0); err != nil {
				return err
			}
			if err := j.launch(i, 0, s); err != nil {
				return err
			}
			if err := j.copyOut(i, 0); err != nil {
				return err
			}
			if err := done[i%2].Record(s); err != nil {
				return j.chunkErr(i, "record its end", err)
			}
			if err := wait(i - 1); err != nil {
				return err
			}
		}
		if err := wait(j.plan.Chunks - 1); err != nil {
			return err
		}
		if err := s.Synchronize(); err != nil {
			return fmt.Errorf("finish the batch's %d chunks: %w", j.plan.Chunks, err)
		}
		return nil
	}

	// Double buffering: copies on s (the group's stream), kernels on k.
	k, err := j.dev.NewStream()
	if err != nil {
		return fmt.Errorf("make the kernel stream: %w", err)
	}
	defer func() {
		if err != nil {
			_ = k.Synchronize()
		}
		err = errors.Join(err, closeErr("kernel stream", k.Close()))
	}()
	// inReady[b]: buffer b's inputs are on the device. kernDone[b]: the
	// kernel that used buffer b has finished with it.
	var inReady, kernDone [2]device.Event
	for b := range 2 {
		for _, e := range []*device.Event{&inReady[b], &kernDone[b]} {
			if *e, err = j.dev.NewEvent(); err != nil {
				return fmt.Errorf("make an event: %w", err)
			}
			defer func(e device.Event) { err = errors.Join(err, closeErr("event", e.Close())) }(*e)
		}
	}
	// Order on s: in(0), in(1), out(0), in(2), out(1), in(3), … so chunk
	// i+1's inputs go in while chunk i computes and chunk i−1's outputs
	// come out. On k: kernel(0), kernel(1), …
	if err := j.copyIn(0, 0); err != nil {
		return err
	}
	if err := inReady[0].Record(s); err != nil {
		return j.chunkErr(0, "record the copies in", err)
	}
	for i := range j.plan.Chunks {
		if err := j.a.ctx.Err(); err != nil {
			return j.interrupted(i, err)
		}
		b := i % 2
		// The kernel waits for its inputs; its outputs' buffer was last
		// read by chunk i−2's copy out, which s ran before chunk i's
		// copy in, so inReady covers that too.
		if err := inReady[b].Wait(k); err != nil {
			return j.chunkErr(i, "order the kernel after the copies in", err)
		}
		if err := j.launch(i, b, k); err != nil {
			return err
		}
		if err := kernDone[b].Record(k); err != nil {
			return j.chunkErr(i, "record the kernel's end", err)
		}
		if i+1 < j.plan.Chunks {
			// Refill the other buffer. Chunk i−1's kernel, the last to
			// read it, is done: s waited for it before chunk i−1's copy
			// out, which precedes this copy on s.
			nb := (i + 1) % 2
			if err := j.copyIn(i+1, nb); err != nil {
				return err
			}
			if err := inReady[nb].Record(s); err != nil {
				return j.chunkErr(i+1, "record the copies in", err)
			}
		}
		if err := kernDone[b].Wait(s); err != nil {
			return j.chunkErr(i, "order the copies out after the kernel", err)
		}
		if err := j.copyOut(i, b); err != nil {
			return err
		}
		if err := done[i%2].Record(s); err != nil {
			return j.chunkErr(i, "record its end", err)
		}
		if err := wait(i - 1); err != nil {
			return err
		}
	}
	if err := wait(j.plan.Chunks - 1); err != nil {
		return err
	}
	if err := k.Synchronize(); err != nil {
		return fmt.Errorf("finish the batch's %d kernels: %w", j.plan.Chunks, err)
	}
	if err := s.Synchronize(); err != nil {
		return fmt.Errorf("finish the batch's %d chunks: %w", j.plan.Chunks, err)
	}
	return nil
}

// verifyIndices picks up to want runs spread evenly over the batch, plus
// the first and last run of every chunk.
func (j *job) verifyIndices(want int) []int {
	n := j.shape.runs
	want = min(want, n)
	idx := make([]int, 0, want+2*j.plan.Chunks)
	for k := range want {
		if want == 1 {
			idx = append(idx, 0)
			break
		}
		idx = append(idx, int(int64(k)*int64(n-1)/int64(want-1)))
	}
	for i := range j.plan.Chunks {
		start, n := j.plan.Chunk(i)
		idx = append(idx, start, start+n-1)
	}
	slices.Sort(idx)
	return slices.Compact(idx)
}

// verify checks the chosen runs against the float64 reference and returns
// how many it checked.
func (j *job) verify(want int) (int, error) {
	idx := j.verifyIndices(want)
	out, status := j.hOut.Data(), j.hStatus.Data()
	n, sh := j.shape.runs, j.shape
	for _, i := range idx {
		r := runAt(j.seed, i)
		if st := oscillator.Status(status, i); st != 0 {
			return len(idx), fmt.Errorf("run %d (%s, chunk %d of %d): the integration became non-finite (NaN or ±Inf; status %d): %w",
				i, describeRun(r), j.chunkOf(i)+1, j.plan.Chunks, st, errVerify)
		}
		got, err := oscillator.Decode(out, n, sh.samples, i)
		if err != nil {
			return len(idx), err
		}
		want := oscillator.ReferenceRun(r, sh.dt, int(sh.steps), int(sh.every))
		if err := oscillator.Verify(got, want); err != nil {
			return len(idx), fmt.Errorf("run %d (%s, chunk %d of %d): %v: %w", i, describeRun(r), j.chunkOf(i)+1, j.plan.Chunks, err, errVerify)
		}
	}
	return len(idx), nil
}

// chunkOf is the chunk (0-based) that ran run i.
func (j *job) chunkOf(i int) int {
	if j.plan.ChunkLength <= 0 {
		return 0
	}
	return i / j.plan.ChunkLength
}

// failedRuns counts the runs whose status is not 0.
func (j *job) failedRuns() int {
	bad := 0
	for _, st := range j.hStatus.Int32s() {
		if st != 0 {
			bad++
		}
	}
	return bad
}

func describeRun(r oscillator.Run) string {
	return fmt.Sprintf("x0 %.3g, v0 %.3g, ω %.3g, ζ %.3g, A %.3g, Ω %.3g", r.X0, r.V0, r.Omega, r.Zeta, r.A, r.Drive)
}

// runAt is run i's initial state and parameters, a pure function of seed
// and i (so verification needs no copy of them): x0, v0 ∈ [−1, 1),
// ω ∈ [0.5, 4), ζ ∈ [0.02, 0.5), A ∈ [0, 2), Ω ∈ [0.2, maxDrive).
func runAt(seed uint64, i int) oscillator.Run {
	h := seed*0x9e3779b97f4a7c15 ^ uint64(i)*0xbf58476d1ce4e5b9
	u := func(lo, hi float64) float64 {
		h += 0x9e3779b97f4a7c15
		z := h
		z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
		z = (z ^ z>>27) * 0x94d049bb133111eb
		z ^= z >> 31
		return lo + (hi-lo)*float64(z>>11)/(1<<53)
	}
	return oscillator.Run{
		X0: u(-1, 1), V0: u(-1, 1),
		Omega: u(minOmega, maxOmega), Zeta: u(minZeta, maxZeta), A: u(0, 2), Drive: u(0.2, maxDrive),
	}
}

func (a *app) printRun(r runReport) error {
	w := a.stdout
	dev := r.Device
	if r.Fallback != "" {
		dev += " (auto found no GPU; vram info says why)"
	}
	fmt.Fprintf(w, "device       %s, %s total, %s kernel\n", dev, units.Format(r.DeviceBytes), r.Kernel)
	if r.LimitBytes > 0 {
		fmt.Fprintf(w, "limit        %s (--vram)\n", units.Format(r.LimitBytes))
	}
	fmt.Fprintf(w, "batch        %s × %s, %s each (dt %g)\n", plural(r.Runs, "run"), plural(r.Steps, "step"), plural(r.Samples, "sample"), r.Dt)
	plan := fmt.Sprintf("%d chunks × %s", r.Chunks, plural(r.ChunkLength, "run"))
	if r.Chunks == 1 {
		plan = fmt.Sprintf("1 chunk of %s", plural(r.ChunkLength, "run"))
	} else if r.LastChunkLength != r.ChunkLength {
		plan += fmt.Sprintf(" (last %d)", r.LastChunkLength)
	}
	buf := "1 buffer"
	if r.Buffers > 1 {
		buf = fmt.Sprintf("%d buffers, copies overlapping compute", r.Buffers)
	}
	whole := ""
	if r.Chunks > 1 {
		whole = fmt.Sprintf(" (all at once: %s)", units.Format(r.FullBytes))
	}
	fmt.Fprintf(w, "plan         %s, %s; %s of device arrays per chunk of a %s budget%s\n",
		plan, buf, units.Format(r.BytesPerChunk), units.Format(r.BudgetBytes), whole)
	fmt.Fprintf(w, "copied       %s to the device, %s back\n", units.Format(r.BytesToDevice), units.Format(r.BytesFromDevice))
	fmt.Fprintf(w, "time         %.2f s in all, %.2f s for the batch: %s runs/s\n", r.WallSeconds, r.BatchSeconds, rate(r.RunsPerSecond))
	fmt.Fprintf(w, "peak memory  %s reserved from the device, %s live; %s of the device in use with the arrays allocated\n",
		units.Format(r.PeakDeviceBytes), units.Format(r.PeakLiveBytes), units.Format(r.DeviceUsedBytes))
	p := r.Stats
	fmt.Fprintf(w, "allocator    %s: %s, %s, %s, %s, %s, %s, %s\n", r.Allocator,
		plural(p.Allocs, "alloc"), plural(p.Frees, "free"), plural(p.CacheHits, "cache hit"),
		plural(p.DeviceAllocs, "device alloc"), plural(p.DeviceFrees, "device free"), plural(p.Retries, "retry"),
		plural(p.OOMs, "out of memory"))
	if r.MetricsURL != "" {
		fmt.Fprintf(w, "metrics      served on %s during the job\n", r.MetricsURL)
	}
	spread := ""
	if r.Chunks > 1 {
		spread = fmt.Sprintf(", spread over all %d chunks,", r.Chunks)
	}
	if r.Verified {
		verb := "match"
		if r.VerifiedRuns == 1 {
			verb = "matches"
		}
		fmt.Fprintf(w, "verified     %s%s %s the float64 reference (tolerance %g)\n",
			plural(r.VerifiedRuns, "run"), spread, verb, oscillator.Tolerance)
	} else {
		fmt.Fprintf(w, "NOT VERIFIED %s\n", r.VerifyError)
	}
	return nil
}

// plural writes n and a noun, in the plural unless n is 1 ("3 retries",
// "1 cache hit"); nouns that do not change ("out of memory") stay as
// they are.
func plural[N int | uint64](n N, noun string) string {
	if n == 1 {
		return fmt.Sprintf("1 %s", noun)
	}
	switch {
	case noun == "out of memory":
	case strings.HasSuffix(noun, "y"):
		noun = strings.TrimSuffix(noun, "y") + "ies"
	default:
		noun += "s"
	}
	return fmt.Sprintf("%d %s", n, noun)
}

// allocHint adds to a failure to allocate the batch what to change on the
// command line to make it fit.
func allocHint(err error, f runFlags, info device.Info, limit uint64) error {
	if !errors.Is(err, vram.ErrUnchunkable) && !errors.Is(err, vram.ErrRunTooLarge) && !errors.Is(err, vram.ErrOutOfMemory) {
		return err
	}
	var fixes []string
	switch {
	case info.Backend == "sim":
		fixes = append(fixes, fmt.Sprintf("give the simulator more than its %s (--vram)", units.Format(info.TotalBytes)))
	case limit > 0:
		fixes = append(fixes, fmt.Sprintf("raise the cap of --vram %s", f.vram))
	default:
		fixes = append(fixes, "free memory on the GPU")
	}
	fixes = append(fixes, "save fewer samples per run (--samples)")
	if f.doubleBuffer {
		fixes = append(fixes, "drop --double-buffer")
	}
	last := len(fixes) - 1
	return fmt.Errorf("%w\nto make the batch fit: %s or %s", err, strings.Join(fixes[:last], ", "), fixes[last])
}
