// `vram run`: the example batch job.
//
// N damped, driven oscillators are integrated with RK4 over T steps,
// saving S samples each (package internal/oscillator owns the kernel, in
// Go for the simulator and PTX for CUDA, and the float64 reference). The
// job is written the way a batch GPU program uses vram:
//
//  1. Two clients, "inputs" (initial states [2, N] and parameters [4, N])
//     and "outputs" (trajectories [S, 2, N] float32 and status [N] int32),
//     register in one stream group; their four arrays are declared once
//     in a batch.Batch, whose Allocate plans the group together, so when the batch does not
//     fit the device it is cut into chunks along the run axis, and each
//     client gets chunk-length arrays (two sets with --buffers 2).
//  2. The host arrays are full-length and pinned. Batch.Run, the
//     library's chunk pipeline, copies each chunk's inputs in, launches the
//     kernel (oscillator.NewPortable: PTX on CUDA, Go on the simulator)
//     over the chunk's runs and copies its outputs back into place on the
//     group's stream; the job holds no streams or events of its own.
//  3. Batch.Run picks the buffers in flight from what its first chunk
//     cost (--buffers N chooses), and re-plans between chunks: at a
//     shorter length when the staging (--host-mem) or write-behind need
//     it, or the budget changes. With two buffers chunk i+1's inputs go
//     in while chunk i's kernel runs on a second stream and chunk i−1's
//     outputs come out; --out's file is written behind the device.
//  4. A sample of runs spread over every chunk — and the first and last
//     run of each chunk, where an off-by-one would show — is checked
//     against the float64 host reference; the job fails if any disagrees.

package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/vramkit/vram"
	"github.com/vramkit/vram/batch"
	"github.com/vramkit/vram/device"
	"github.com/vramkit/vram/internal/oscillator"
	"github.com/vramkit/vram/kernel"
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

// runLong is `vram run --help`.
const runLong = `Run integrates N damped, driven oscillators
    x'' + 2ζωx' + ω²x = A·cos(Ωt)
with RK4 over --steps steps, saving --samples samples of (x, v) per run,
with random parameters. The inputs and outputs are two clients of vram's
memory manager in one stream group; when the batch does not fit the device
the manager plans it into chunks, and the library's chunk pipeline
(package batch) copies each chunk's inputs in, runs the portable kernel
and copies the outputs back (with two buffers in flight, the kernel on a
second stream while the next chunk's copies go on the group's). The
pipeline picks 1, 2 or 3 buffers from what its first chunk cost (copy and
kernel times, and the chunk length a second buffer costs) and says why;
--buffers N (or --double-buffer, for 2) chooses instead. Between chunks
it re-plans: to shorter chunks when the staging of --host-mem cannot
hold them, or to keep writing --out behind the device; to the length a
changed budget allows. The report lists each change. A sample of runs
from every chunk is checked against a float64 host reference: the command
fails (exit 1) if any disagrees. The report says how long the copies and
kernels took and how much copying no kernel hid, and where the host
arrays went; -v also prints the manager's memory report.

--allocator picks the manager's allocator by name, as in replay (pool the
segment alloc.Pool, expandable alloc.Expandable); without it,
$VRAM_ALLOC_CONF's, else the manager's choice: expandable where the device
manages virtual memory, as the simulator does, else pool. The report, -v
and the metrics name the allocator that serves.

On the simulator (the default where there is no GPU) the device has
--vram of memory (256 MiB), so the default batch needs several chunks. On
a GPU, --vram caps what the job may use, 256 MiB unless given, so the
default batch is chunked there too; give more (--vram 40GiB) to use more
of the GPU.

--dt must keep RK4 stable: ω·dt ≤ 2.62 for the batch's largest ω (ω < 4,
so any --dt up to 0.655 will do). The host arrays hold the whole batch
(runs × (28 + 8 × samples) bytes); a batch that does not fit the host
memory available is refused before anything is allocated, unless --out
or --host-mem is given.

--out FILE.npy writes the trajectories to FILE.npy as each chunk comes
back, never holding more than a chunk: one float32 array in C order of
shape (samples, 2, runs), [k, 0, i] run i's x at sample k and [k, 1, i]
its v (numpy.load reads it), verified from the file, which is written
beside FILE.npy and renamed to it only once the job succeeds. --host-mem
SIZE caps the host RAM of the job's host arrays and staging buffers;
arrays past it spill to memory-mapped files in $VRAM_SPILL_DIR (default
the temporary directory), and chunks are staged through fewer buffers.

` + shardHelp + devicesHelp + `Ctrl-C stops the job before its next chunk (exit 1); a second Ctrl-C
ends it at once.

--metrics-addr serves Prometheus metrics on /metrics while the job runs:
device memory, allocator counters, each client's held bytes and cap, and
the chunks done so far. A host-less address such as :9090 listens on
every interface of the machine; give 127.0.0.1:9090 to keep the metrics
to this machine. A metrics server that does not stop cleanly at the end
(a client that stopped reading) is a warning, not the job's failure.

On a terminal a bar shows the chunks. Elsewhere (a batch system's log)
the job writes a line as each step of its set-up begins, and then one
per chunk or one every 5 seconds, whichever is rarer.`

func (a *app) runCommand() *cobra.Command {
	f := runFlags{vram: *newSizeFlag(defaultRunVRAM, "256MiB"), hostMem: *newSizeFlag("", "512MiB")}
	cmd := &cobra.Command{
		Use:   "run",
		Short: "Run the example batch job: chunked, verified, with a report",
		Long:  runLong,
		Example: `  vram run
  vram run --runs 1000000 --buffers 2
  vram run --device sim:bandwidth=8GB                    # emulate PCIe copies: two buffers pay
  vram run --allocator direct --json
  vram run --metrics-addr :9090                          # Prometheus /metrics while it runs
  vram run --runs 4000000 --host-mem 512MiB --out r.npy  # results larger than RAM, kept
  vram run --runs 4000000 --out r.npy --shard 2/4        # one quarter of it; vram merge r.npy gathers`,
		Args: usageArgs(0, 0, ""),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.runJob(f)
		},
	}
	fl := cmd.Flags()
	fl.IntVar(&f.runs, "runs", defaultRuns, "number of oscillators (runs) in the batch")
	fl.IntVar(&f.steps, "steps", defaultSteps, "RK4 steps per run")
	fl.IntVar(&f.samples, "samples", 0, "samples saved per run, the initial state included; steps must be a multiple of samples−1 (default: every step)")
	fl.Float64Var(&f.dt, "dt", defaultDt, "time step")
	fl.Var(&f.vram, "vram", "device memory of the simulator, or on a GPU a cap on what the job may use; at least one page of the device (2 MiB unless the spec says)")
	fl.StringVar(&f.allocator, "allocator", "", "device allocator: "+allocatorHelp()+"; default: $VRAM_ALLOC_CONF's, else the pool kind's: expandable where the device manages virtual memory, else pool")
	fl.BoolVar(&f.doubleBuffer, "double-buffer", false, "two chunk buffers in flight (--buffers 2): copies of one chunk overlap the kernel of another")
	fl.IntVar(&f.buffers, "buffers", 0, "chunk buffers in flight, 1 to 3 (default: chosen from the first chunk's copy and kernel times)")
	fl.IntVar(&f.verify, "verify", defaultVerify, "runs to check against the float64 reference, spread over the batch (plus each chunk's first and last)")
	fl.Uint64Var(&f.seed, "seed", 1, "seed of the random parameters")
	fl.StringVar(&f.out, "out", "", "write the trajectories to this .npy file as chunks come back: float32, C order, shape (samples, 2, runs)")
	fl.Var(&f.hostMem, "host-mem", "cap on the host RAM the job's host arrays and staging buffers take (e.g. 512MiB); past it host arrays spill to files in $VRAM_SPILL_DIR")
	fl.StringVar(&f.shard, "shard", "", "run shard i of N of the batch, runs [⌊i·runs/N⌋, ⌊(i+1)·runs/N⌋), and write --out's part OUT.shard-i-of-N.npy for vram merge (default: a Slurm array's or Kubernetes Indexed Job's index, else the whole batch; 0/1 is the whole batch)")
	fl.StringVar(&f.broker, "socket", defaultBroker(), "the node broker's Unix socket (vram broker): take the job's device memory from a lease of the broker there; its chunks follow the lease, and shrink when another job claims its share (default $"+vram.BrokerEnv+"; none when unset)")
	fl.Float64Var(&f.proportion, "proportion", 0, "with --socket: the lease's guaranteed share of the device, 0 < P ≤ 1 (default: a place in the broker's auto pool); deploy/slurm/vram-shared-array.sbatch gives each task the share of its Slurm shards")
	// --broker was this flag's first name; vram lease and vram broker
	// name the broker's socket --socket.
	fl.StringVar(&f.broker, "broker", defaultBroker(), "")
	_ = fl.MarkDeprecated("broker", "use --socket, the broker's socket as vram lease and vram broker name it")
	fl.SetOutput(a.stderr) // where a deprecated flag says so
	fl.StringVar(&f.devices, "devices", "", "run on several devices of this process, chunks dealt from one queue: all (every CUDA device), or specs separated by ';' (cuda:0;cuda:1, sim:count=4, sim;sim:bandwidth=1GB)")
	fl.DurationVar(&f.kernelDelay, "kernel-delay", 0, "with --devices: after each kernel wait this long per run, emulating a slower kernel (to measure scaling on the simulator)")
	fl.StringVar(&f.metricsAddr, "metrics-addr", "", "serve Prometheus metrics on host:port /metrics while the job runs: :9090 listens on every interface (anyone who can reach this machine can read them), 127.0.0.1:9090 on this machine only")
	return cmd
}

// job holds one batch job's state.
type job struct {
	a      *app
	shape  jobShape
	seed   uint64
	m      *vram.Manager
	dev    device.Device
	kernel *kernel.Kernel // the oscillator, portable
	stats  *jobMetrics    // nil unless --metrics-addr
	prog   runProgress    // set-up and chunk progress on stderr; nil: none
	// fitHint adds to a failure to allocate the device arrays what to
	// change on the command line; nil adds nothing.
	fitHint func(error) error
	in      *vram.Client
	out     *vram.Client
	b       *batch.Batch // the four arrays, declared once
	init    *batch.Array // the inputs' initial states
	params  *batch.Array // the inputs' parameters
	trajA   *batch.Array // the outputs' trajectories
	status  *batch.Array // the outputs' status
	plan    vram.ChunkPlan
	spans   []vram.Span // the chunks as the batch cut them, in order (for the verification)

	hInit, hParams, hOut, hStatus *vram.HostArray // full-length, on the host ladder; hOut nil with --out
	outPath                       string          // --out ("": none)
	verifyRuns                    int             // --verify: runs checked, spread over the batch, besides each chunk's first and last
	hostArraysTime                time.Duration   // making the host arrays (set-up)
	traj                          *trajFile       // --out, once made; nil without
	rungs                         map[string]string
}

// phase says on the progress log that a step of the set-up begins.
func (j *job) phase(what string) {
	if j.prog != nil {
		j.prog.Phase(what)
	}
}

func (a *app) runJob(f runFlags) error {
	start := time.Now()
	js, err := f.check()
	if err != nil {
		return err
	}
	if js, err = a.shardJob(js, f); err != nil {
		return err
	}
	if f.devices != "" {
		return a.runDevices(f, js, start)
	}
	if f.kernelDelay != 0 {
		return usagef("--kernel-delay %v: only with --devices", f.kernelDelay)
	}
	return a.runOneDevice(f, js, start)
}

// runOneDevice runs the job on the device of --device and --vram.
func (a *app) runOneDevice(f runFlags, js jobShape, start time.Time) (err error) {
	prog := a.runProgress()
	defer prog.Finish()
	prog.Phase("open the device")
	rd, err := a.openRunDevice(a.spec, a.deviceSource(), f.vram)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, closeErr("device", rd.dev.Close())) }()
	if err := a.checkHostMemory(js, rd.info, f.bufferCount() > 1, f.out != "", f.hostMem.bytes); err != nil {
		return err
	}
	m, err := a.newRunManager(f, rd)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, closeErr("memory manager", m.Close())) }()
	prog.Phase("load the oscillator kernel")
	kern := oscillator.NewPortable()
	defer func() { err = errors.Join(err, closeErr("kernel", kern.Close())) }()
	if err := kern.Load(rd.dev); err != nil {
		return fmt.Errorf("load the oscillator kernel: %w", err)
	}
	j := &job{a: a, shape: js, seed: f.seed, m: m, dev: rd.dev, kernel: kern, prog: prog, rungs: map[string]string{},
		outPath: f.out, verifyRuns: f.verify}
	// The --out file, made once the plan is known (allocate).
	defer func() { err = errors.Join(err, j.closeOut(f.out, err != nil)) }()
	ms, err := a.startMetrics(f, m)
	if err != nil {
		return err
	}
	if ms != nil {
		// Stopped before the manager closes; failing to stop it is a
		// warning, not the job's failure.
		defer ms.stop(a)
		j.stats = ms.job
	}
	// Host arrays go back before the manager closes, also when allocate
	// fails part-way.
	defer func() { err = errors.Join(err, j.freeHost()) }()
	j.fitHint = func(err error) error { return allocHint(err, f, rd.info, rd.limit) }
	if err := j.allocate(f.bufferCount()); err != nil {
		return err
	}
	j.stats.planned(j.plan.Chunks)
	if ms != nil && a.onMetrics != nil {
		a.onMetrics(ms.url)
	}
	return j.finish(f, rd, ms, start)
}

// finish runs the allocated batch, verifies it and writes the report.
func (j *job) finish(f runFlags, rd runDevice, ms *metricsServer, start time.Time) error {
	rep, err := j.report(rd.info, rd.fallback, rd.limit, ms)
	if err != nil {
		return err
	}
	j.shardReport(&rep)
	if err := j.runBatch(&rep, f.bufferCount(), start); err != nil {
		return err
	}
	verr := j.check(f.verify, &rep)
	if verr == nil {
		var err error
		if rep.CommitSeconds, err = j.commitOut(f.out); err != nil {
			return err
		}
	}
	j.a.printMemoryReport(j.m)
	rep.WallSeconds = time.Since(start).Seconds()
	j.prog.Finish()
	return j.a.finishReport(rep, func() error { return j.a.printRun(rep) }, verr)
}

// runBatch runs the batch through the library's pipeline and adds its
// figures to rep, and the set-up's time since the job's start. An
// interrupt is an error saying how far the job got.
func (j *job) runBatch(rep *runReport, buffers int, start time.Time) error {
	rep.SetupSeconds = time.Since(start).Seconds() // the job until now
	rep.HostArraysSeconds = j.hostArraysTime.Seconds()
	j.phase("run the batch")
	br, err := j.pipeline(buffers)
	ctxErr := j.a.ctx.Err()
	// The batch's chunks as cut when it stopped: those it took, and what
	// the runs it never took make at its last length.
	chunks := br.Chunks + (br.RunsLeft+max(br.ChunkLength, 1)-1)/max(br.ChunkLength, 1)
	switch {
	case err != nil && ctxErr != nil && errors.Is(err, ctxErr):
		return fmt.Errorf("interrupted before chunk %d of %d: %d of %d chunks finished, results not verified: %w",
			br.ChunksDone+1, chunks, br.ChunksDone, chunks, ctxErr)
	case err != nil && errors.Is(err, vram.ErrOutOfMemory) && j.m.Host().Stats().Limit > 0:
		return fmt.Errorf("%w\nto make the staging fit: raise --host-mem", err)
	case err != nil:
		return err
	case ctxErr != nil:
		// An interrupt during the last chunk: the batch is done but not
		// checked, and the user asked to stop.
		return fmt.Errorf("interrupted after the last chunk: %d of %d chunks finished, results not verified: %w",
			br.ChunksDone, br.Chunks, ctxErr)
	}
	rep.BatchSeconds = br.Wall.Seconds()
	rep.RunsPerSecond = float64(j.shape.runs) / br.Wall.Seconds()
	rep.CopySeconds = br.Copy.Seconds()
	rep.ComputeSeconds = br.Compute.Seconds()
	rep.ExposedCopySeconds = br.ExposedCopy.Seconds()
	j.hostReport(rep, br)
	rep.pipelineReport(br)
	rep.Lease = leaseOf(j.m)
	return nil
}

// pipeline runs every chunk through Batch.Run: the inputs copied in,
// the oscillator kernel over the chunk's runs, the outputs copied back,
// with buffers in flight (0: the batch chooses), growing the chunks when
// the budget grows.
func (j *job) pipeline(buffers int) (batch.Report, error) {
	sh := j.shape
	traj := batch.Host(j.hOut)
	if j.traj != nil {
		traj = batch.Drain(j.traj.drain)
	}
	if err := errors.Join(j.init.Use(batch.Host(j.hInit)), j.params.Use(batch.Host(j.hParams)),
		j.trajA.Use(traj), j.status.Use(batch.Host(j.hStatus))); err != nil {
		return batch.Report{}, err
	}
	return j.b.Run(j.a.ctx, batch.Options{Buffers: buffers, Grow: true, Progress: j.chunkDone}, func(_ context.Context, ch *batch.Chunk) error {
		err := ch.Launch(j.kernel, j.init, j.params, j.trajA, j.status,
			uint32(ch.Len), uint32(ch.ChunkLength), sh.dt, sh.steps, sh.every)
		if err != nil {
			return fmt.Errorf("launch the kernel: %w", err)
		}
		j.spans = append(j.spans, vram.Span{Start: ch.Start, Len: ch.Len})
		return nil
	})
}

// chunkDone reports a chunk back on the host: the log, the metrics, the
// progress on stderr.
func (j *job) chunkDone(p batch.Progress) {
	j.a.log.Debug("chunk done", "chunk", p.Chunk, "of", p.Chunks, "runs", fmt.Sprintf("%d-%d", p.Start, p.Start+p.Len-1))
	j.stats.chunkDone(p.Len)
	if j.prog != nil {
		j.prog.Chunk(p)
	}
	if j.a.onChunkDone != nil {
		j.a.onChunkDone(p.Chunk, p.Chunks)
	}
}

// check verifies the results and the runs' status into rep; the error
// is the verification's.
func (j *job) check(want int, rep *runReport) error {
	start := time.Now()
	defer func() { rep.VerifySeconds = time.Since(start).Seconds() }()
	j.phase("verify the results")
	checked, verr := j.verify(want)
	rep.VerifiedRuns = checked
	rep.FailedRuns = j.failedRuns()
	rep.Verified = verr == nil && rep.FailedRuns == 0
	if verr == nil && rep.FailedRuns > 0 {
		verr = fmt.Errorf("%d of %d runs report a NaN or infinite state: %w", rep.FailedRuns, j.shape.runs, errVerify)
	}
	if verr != nil {
		rep.VerifyError = verr.Error()
	}
	_, st := j.m.Account().Stats()
	rep.Stats = toStatsJSON(st)
	rep.PeakDeviceBytes = st.PeakReserved
	rep.PeakLiveBytes = st.PeakInUse
	if pc, ok := j.dev.(pinnedCounter); ok {
		_, rep.PinnedPeakBytes = pc.PinnedBytes()
	}
	return verr
}

// allocate registers the two clients, queues their requests, allocates
// them planned together, and makes the --out file and the full-length
// host arrays (a --host-mem that cannot stage a chunk shortens the
// chunks as the batch runs).
func (j *job) allocate(buffers int) error {
	if err := j.register(buffers); err != nil {
		return err
	}
	if j.outPath != "" {
		if err := j.openOut(j.outPath); err != nil {
			return err
		}
	}
	made := time.Now()
	if err := j.makeHostArrays(); err != nil {
		return err
	}
	j.hostArraysTime = time.Since(made)
	j.phase("fill the inputs")
	n := j.shape.runs
	init, params := j.hInit.Float32s(), j.hParams.Float32s()
	for i := range n {
		r := runAt(j.seed, j.shape.first+i)
		init[i], init[n+i] = float32(r.X0), float32(r.V0)
		params[i], params[n+i], params[2*n+i], params[3*n+i] = float32(r.Omega), float32(r.Zeta), float32(r.A), float32(r.Drive)
	}
	return nil
}

// register registers the two clients, declares their arrays in j.b and
// allocates them, planned together with buffers in flight (0: one, for
// the batch's first chunk; it chooses after), into j.plan.
func (j *job) register(buffers int) error {
	n, s := j.shape.runs, j.shape.samples
	const group = "oscillators"
	var err error
	j.in, err = j.m.Register(vram.ClientOptions{Name: "inputs", Group: group})
	if err != nil {
		return fmt.Errorf("register the inputs: %w", err)
	}
	j.out, err = j.m.Register(vram.ClientOptions{Name: "outputs", Group: group})
	if err != nil {
		return fmt.Errorf("register the outputs: %w", err)
	}
	j.b = batch.New()
	j.init = j.b.In(j.in, "init", vram.ArrayRequest{Shape: []int{2, n}, DType: vram.Float32, ChunkAxis: 1})
	j.params = j.b.In(j.in, "params", vram.ArrayRequest{Shape: []int{4, n}, DType: vram.Float32, ChunkAxis: 1})
	j.trajA = j.b.Out(j.out, "trajectories", vram.ArrayRequest{Shape: []int{s, 2, n}, DType: vram.Float32, ChunkAxis: 2})
	j.status = j.b.Out(j.out, "status", vram.ArrayRequest{Shape: []int{n}, DType: vram.Int32, ChunkAxis: 0})
	j.phase("plan and allocate the device arrays")
	if err := j.b.Allocate(j.a.ctx, vram.WithBuffers(max(buffers, 1))); err != nil {
		if ctxErr := j.a.ctx.Err(); ctxErr != nil && errors.Is(err, ctxErr) {
			return fmt.Errorf("interrupted while allocating the device arrays, before chunk 1: no chunk run: %w", ctxErr)
		}
		err = fmt.Errorf("allocate the batch's device arrays: %w", err)
		if j.fitHint != nil {
			err = j.fitHint(err)
		}
		return err
	}
	j.plan = j.b.Plan()
	if j.plan.TotalRuns == 0 {
		// Nothing was chunkable (one run: a run axis of length 1 is
		// not), so the plan counts no runs; it is one chunk of them all.
		j.plan.TotalRuns, j.plan.ChunkLength, j.plan.LastChunkLength = n, n, n
	}
	return nil
}
