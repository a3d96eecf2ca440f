// `vram run --devices LIST`: one batch on several devices of one process.
//
// Each device gets its own memory manager, kernel and clients, set up on
// a goroutine of its own, and plans the whole batch on itself, which
// gives the chunk length that fits it. The library's batch.RunParts then
// deals the batch from one queue to whichever device has a buffer free,
// each device's chunks at its own length (and at most its share of half
// the runs left by its measured rate, so that a batch one device holds
// whole is still spread and the devices finish together), each device's
// pipeline on its own goroutine locked to its OS thread (a CUDA context
// is current per thread): a larger device cuts longer chunks, a faster
// one takes more of them, and longer ones. Each chunk's inputs are drawn for its runs (fill
// functions) and its outputs written at its runs (drain functions). A
// run's result depends on nothing but its own parameters (runAt(seed,
// r)), so the result is the same however the chunks were dealt: byte for
// byte what one device writes.

package main

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"time"

	"github.com/vramkit/vram"
	"github.com/vramkit/vram/batch"
	"github.com/vramkit/vram/device"
	"github.com/vramkit/vram/internal/oscillator"
	"github.com/vramkit/vram/kernel"
)

// deviceSpecs reads --devices with device.ReadSpecs: "all" (every CUDA
// device), or specs separated by ";", where a sim spec's count=N stands
// for N simulators (ordinals 0 … N−1 unless it names one), each checked
// by its backend. A malformed list is a usage error.
func deviceSpecs(v string) ([]device.Spec, error) {
	specs, err := device.ReadSpecs(v)
	switch {
	case errors.Is(err, device.ErrBadSpec):
		return nil, usageError{fmt.Errorf("--devices %q: %w", v, err)}
	case err != nil:
		return nil, err
	}
	return specs, nil
}

// deviceShare is one device's share of a run on several devices.
type deviceShare struct {
	Device    string `json:"device"`
	Kernel    string `json:"kernel"` // go or ptx
	Allocator string `json:"allocator"`
	// PlanChunkLength is the chunk length the device's plan of the whole
	// batch gave (what its memory holds), with its budget and device
	// arrays per chunk (BudgetBytes, BytesPerChunk); ChunkLength the runs
	// of its longest chunk since its last re-cut (its plan's length, or
	// less: its share of the runs left, a re-cut).
	PlanChunkLength int     `json:"plan_chunk_length"`
	BudgetBytes     uint64  `json:"budget_bytes"`
	BytesPerChunk   uint64  `json:"bytes_per_chunk"`
	ChunkLength     int     `json:"chunk_length"`
	Chunks          int     `json:"chunks"` // chunks of the batch it ran
	Runs            int     `json:"runs"`
	Buffers         int     `json:"buffers"`      // in flight at the end
	BusySeconds     float64 `json:"busy_seconds"` // in its pipeline
	// RunsPerSecond is its rate as the dealing measured it (the runs of
	// its chunks done over the time from its first chunk taken to its
	// last done), by which its share of the runs left was cut.
	RunsPerSecond float64 `json:"runs_per_second"`
	// What its pipeline ran with and its allocator did, as in the
	// one-device report (runReport's fields of the same names).
	CopySeconds        float64   `json:"copy_seconds"`
	ComputeSeconds     float64   `json:"compute_seconds"`
	ExposedCopySeconds float64   `json:"exposed_copy_seconds"`
	PeakDeviceBytes    uint64    `json:"peak_device_bytes"`
	PeakLiveBytes      uint64    `json:"peak_live_bytes"`
	Stats              statsJSON `json:"allocator_stats"`
	StagingBytes       uint64    `json:"staging_bytes"`
	// PinSeconds and PinnedBytes: its staging taken, and pinned anew
	// (batch.Report.Pin, PinnedBytes).
	PinSeconds      float64 `json:"pin_seconds"`
	PinnedBytes     uint64  `json:"pinned_bytes"`
	BuffersInFlight int     `json:"buffers_in_flight"`
	Lag             int     `json:"lag"`
	// Lease is the device's lease from the node broker (--socket), if any.
	Lease *leaseJSON `json:"lease,omitempty"`
}

// multiReport is what `vram run --devices` reports; --json prints it.
type multiReport struct {
	Devices       []deviceShare `json:"devices"`
	Runs          int           `json:"runs"`
	Steps         int           `json:"steps"`
	Samples       int           `json:"samples"`
	Dt            float64       `json:"dt"`
	Chunks        int           `json:"chunks"`
	Verified      bool          `json:"verified"`
	VerifiedRuns  int           `json:"verified_runs"`
	FailedRuns    int           `json:"failed_runs"`
	VerifyError   string        `json:"verify_error,omitempty"`
	WallSeconds   float64       `json:"wall_seconds"`
	BatchSeconds  float64       `json:"batch_seconds"`
	RunsPerSecond float64       `json:"runs_per_second"`
	// CommitSeconds is putting --out's file in place once verified
	// (flushed to the disk, renamed over the path), before the report.
	CommitSeconds float64 `json:"commit_seconds,omitempty"`
	// BytesToDevice and BytesFromDevice are every device's copies; the
	// seconds are their pipelines' summed (multiReport.Devices has each).
	BytesToDevice      uint64  `json:"bytes_to_device"`
	BytesFromDevice    uint64  `json:"bytes_from_device"`
	CopySeconds        float64 `json:"copy_seconds"`
	ComputeSeconds     float64 `json:"compute_seconds"`
	ExposedCopySeconds float64 `json:"exposed_copy_seconds"`
	HostLimitBytes     uint64  `json:"host_limit_bytes,omitempty"`
	Out                string  `json:"out,omitempty"`
	Shard              string  `json:"shard,omitempty"`
	ShardFrom          string  `json:"shard_from,omitempty"`
	FirstRun           int     `json:"first_run,omitempty"`
	TotalRuns          int     `json:"total_runs,omitempty"`
}

// multiJob is a batch on several devices: the devices and the results.
type multiJob struct {
	a        *app
	f        runFlags
	shape    jobShape
	traj     *trajFile // --out; nil: the results stay in out and status
	outOwner *job      // --out's file's owner (commitOut, closeOut)
	prog     runProgress
	// bytesIn and bytesOut are the batch's copies, every device's.
	bytesIn, bytesOut uint64
	out               []byte // [samples, 2, runs] float32, without --out
	// status is every run's status (int32); a failed run is not 0.
	status []byte
	// chunks is the batch's chunks, once run; spans their runs, as the
	// devices computed them (for the verification).
	chunks int
	mu     sync.Mutex // protects spans
	spans  []vram.Span
}

// devicePart is one device of the batch: its manager, kernel and
// clients, allocated for the whole batch.
type devicePart struct {
	share deviceShare
	dev   device.Device
	m     *vram.Manager
	kern  *kernel.Kernel
	j     *job
	runs  int // runs of the chunks it computed (its goroutine's until RunParts returns)
}

// close closes what setup made.
func (p *devicePart) close() error {
	var errs []error
	if p.kern != nil {
		errs = append(errs, closeErr("kernel", p.kern.Close()))
	}
	if p.m != nil {
		errs = append(errs, closeErr("memory manager", p.m.Close()))
	}
	if p.dev != nil {
		errs = append(errs, closeErr("device", p.dev.Close()))
	}
	return errors.Join(errs...)
}

func (a *app) runDevices(f runFlags, js jobShape, start time.Time) (err error) {
	if f.metricsAddr != "" {
		return usagef("--metrics-addr serves one device's manager; give it without --devices")
	}
	specs, err := deviceSpecs(f.devices)
	if err != nil {
		return err
	}
	if err := a.checkHostMemory(js, device.Info{Backend: "multi"}, f.bufferCount() > 1, f.out != "", f.hostMem.bytes); err != nil {
		return err
	}
	mj := &multiJob{a: a, f: f, shape: js, status: make([]byte, 4*js.runs), prog: a.runProgress()}
	defer mj.prog.Finish()
	if f.out != "" {
		j := &job{a: a, shape: js, seed: f.seed, verifyRuns: f.verify}
		if err := j.openOut(f.out); err != nil {
			return err
		}
		mj.traj, mj.outOwner = j.traj, j
		defer func() { err = errors.Join(err, j.closeOut(f.out, err != nil)) }()
	} else {
		mj.out = make([]byte, js.samples*2*js.runs*4)
	}
	mj.prog.Phase(fmt.Sprintf("open the %d devices and plan the batch on each", len(specs)))
	parts, err := mj.setupAll(specs)
	defer func() {
		for _, p := range parts {
			err = errors.Join(err, p.close())
		}
	}()
	if err != nil {
		return err
	}
	mj.prog.Phase("run the batch")
	batchStart := time.Now()
	if err := mj.run(parts); err != nil {
		if ctxErr := a.ctx.Err(); ctxErr != nil {
			return fmt.Errorf("interrupted: %w", errors.Join(err, ctxErr))
		}
		return err
	}
	rep := mj.report(parts, time.Since(batchStart))
	mj.prog.Phase("verify the results")
	verr := mj.verify(&rep)
	if verr == nil && mj.outOwner != nil {
		if rep.CommitSeconds, err = mj.outOwner.commitOut(f.out); err != nil {
			return err
		}
	}
	rep.WallSeconds = time.Since(start).Seconds()
	mj.prog.Finish()
	return a.finishReport(rep, func() error { return a.printMulti(rep) }, verr)
}

// setupAll sets every device up, at once; the parts it returns (those
// set up, also on an error) are the caller's to close.
func (mj *multiJob) setupAll(specs []device.Spec) ([]*devicePart, error) {
	parts := make([]*devicePart, len(specs))
	errs := make([]error, len(specs))
	var wg sync.WaitGroup
	for i, spec := range specs {
		wg.Go(func() {
			parts[i] = &devicePart{}
			if err := mj.setup(parts[i], spec); err != nil {
				errs[i] = fmt.Errorf("device %d (%s): %w", i, spec, err)
			}
		})
	}
	wg.Wait()
	return parts, errors.Join(errs...)
}

// setup opens the device spec names, with its manager and kernel, and
// allocates the batch on it, planned for its memory.
func (mj *multiJob) setup(p *devicePart, spec device.Spec) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	f, a := mj.f, mj.a
	rd, err := a.openRunDevice(spec, "--devices (the spec "+device.QuoteSpec(spec.String())+")", f.vram)
	if err != nil {
		return err
	}
	p.dev = rd.dev
	p.share.Device = fmt.Sprintf("%s:%d %s", rd.info.Backend, rd.info.Ordinal, rd.info.Name)
	if p.m, err = a.newRunManager(f, rd); err != nil {
		return fmt.Errorf("%s: %w", p.share.Device, err)
	}
	p.kern = oscillator.NewPortable()
	if err := p.kern.Load(p.dev); err != nil {
		return fmt.Errorf("load the oscillator kernel: %w", err)
	}
	p.j = &job{a: a, shape: mj.shape, m: p.m}
	if err := p.j.register(f.bufferCount()); err != nil {
		return allocHint(err, f, rd.info, rd.limit)
	}
	p.share.PlanChunkLength, p.share.BudgetBytes, p.share.BytesPerChunk = p.j.plan.ChunkLength, p.j.plan.Budget, p.j.plan.BytesPerChunk
	p.share.Kernel = p.kern.Form(p.dev)
	return nil
}

// run deals the batch's chunks to the devices through batch.RunParts.
func (mj *multiJob) run(parts []*devicePart) error {
	bps := make([]batch.Part, len(parts))
	for i, p := range parts {
		var err error
		if bps[i], err = mj.part(p); err != nil {
			return err
		}
	}
	mr, err := batch.RunParts(mj.a.ctx, bps, batch.Options{Buffers: mj.f.bufferCount(), Grow: true,
		Progress: func(pr batch.Progress) {
			mj.a.log.Debug("chunk done", "chunk", pr.Chunk, "of", pr.Chunks, "runs", fmt.Sprintf("%d-%d", pr.Start, pr.Start+pr.Len-1))
			mj.prog.Chunk(pr)
		}})
	mj.chunks = mr.Chunks
	mj.bytesIn, mj.bytesOut = mr.BytesIn, mr.BytesOut
	for i, p := range parts {
		if i < len(mr.Parts) {
			pr := mr.Parts[i]
			p.share.Chunks, p.share.Runs, p.share.ChunkLength, p.share.Buffers = pr.Chunks, p.runs, pr.ChunkLength, pr.Buffers
			p.share.BusySeconds = pr.Wall.Seconds()
			if i < len(mr.Rates) {
				p.share.RunsPerSecond = mr.Rates[i]
			}
			p.ran(pr)
		}
	}
	return err
}

// part is device p's part of the batch: the inputs drawn for each chunk's
// runs, the outputs written at their runs of the result.
func (mj *multiJob) part(p *devicePart) (batch.Part, error) {
	sh, u := mj.shape, p.j
	seed, first := mj.f.seed, sh.first
	fillInit := func(sp vram.Span, st *vram.HostArray) error {
		v, ld := st.Float32s(), st.Dim(1)
		for i := range sp.Len {
			r := runAt(seed, first+sp.Start+i)
			v[i], v[ld+i] = float32(r.X0), float32(r.V0)
		}
		return nil
	}
	fillParams := func(sp vram.Span, st *vram.HostArray) error {
		v, ld := st.Float32s(), st.Dim(1)
		for i := range sp.Len {
			r := runAt(seed, first+sp.Start+i)
			v[i], v[ld+i], v[2*ld+i], v[3*ld+i] = float32(r.Omega), float32(r.Zeta), float32(r.A), float32(r.Drive)
		}
		return nil
	}
	drainTraj := func(sp vram.Span, st *vram.HostArray) error {
		if mj.traj != nil {
			return mj.traj.drain(sp, st)
		}
		ld, data := st.Dim(2), st.Data()
		for row := range 2 * sh.samples {
			copy(mj.out[(row*sh.runs+sp.Start)*4:], data[row*ld*4:][:sp.Len*4])
		}
		return nil
	}
	drainStatus := func(sp vram.Span, st *vram.HostArray) error {
		copy(mj.status[sp.Start*4:], st.Data()[:sp.Len*4])
		return nil
	}
	err := errors.Join(u.init.Use(batch.Fill(fillInit)), u.params.Use(batch.Fill(fillParams)),
		u.trajA.Use(batch.Drain(drainTraj)), u.status.Use(batch.Drain(drainStatus)))
	return batch.Part{Batch: u.b, Compute: func(_ context.Context, ch *batch.Chunk) error {
		err := ch.Launch(p.kern, u.init, u.params, u.trajA, u.status,
			uint32(ch.Len), uint32(ch.ChunkLength), sh.dt, sh.steps, sh.every)
		if err != nil {
			return fmt.Errorf("launch the kernel: %w", err)
		}
		p.runs += ch.Len
		mj.mu.Lock()
		mj.spans = append(mj.spans, vram.Span{Start: ch.Start, Len: ch.Len})
		mj.mu.Unlock()
		emulateKernel(mj.f.kernelDelay, ch.Len)
		return nil
	}}, err
}

// emulateKernel waits per × runs: with --kernel-delay, a kernel that
// takes that long per run, as a GPU's would, while the simulator's is
// quick and the CPU is small. It sleeps rather than spins, so devices
// of one process overlap their waits as GPUs overlap their kernels.
func emulateKernel(per time.Duration, runs int) {
	if per > 0 && runs > 0 {
		time.Sleep(per * time.Duration(runs))
	}
}

// report gathers the devices' shares.
func (mj *multiJob) report(parts []*devicePart, batch time.Duration) multiReport {
	sh := mj.shape
	rep := multiReport{Runs: sh.runs, Steps: int(sh.steps), Samples: sh.samples, Dt: shortest(sh.dt),
		Chunks:       mj.chunks,
		BatchSeconds: batch.Seconds(), RunsPerSecond: float64(sh.runs) / batch.Seconds()}
	for _, p := range parts {
		rep.Devices = append(rep.Devices, p.share)
	}
	mj.totals(&rep)
	if mj.traj != nil {
		rep.Out = mj.traj.path
	}
	if s := sh.shard; sh.parted() {
		rep.Shard, rep.ShardFrom, rep.FirstRun, rep.TotalRuns = s.String(), s.From, sh.first, sh.total
	}
	return rep
}

// verify checks runs spread over the batch, and the first and last run
// of every chunk dealt, against the float64 reference, and counts the
// runs whose status is not 0.
func (mj *multiJob) verify(rep *multiReport) error {
	sh := mj.shape
	want := min(mj.f.verify, sh.runs)
	// The first and last run of every chunk, or of want chunks spread
	// over the batch when there are more.
	var idx []int
	spans := slices.SortedFunc(slices.Values(mj.spans), func(a, b vram.Span) int { return a.Start - b.Start })
	for k := range min(len(spans), want) {
		u := k
		if len(spans) > want {
			u = int(int64(k) * int64(len(spans)-1) / int64(max(want-1, 1)))
		}
		idx = append(idx, spans[u].Start, spans[u].Start+spans[u].Len-1)
	}
	idx = append(idx, spreadRuns(sh.runs, want)...)
	slices.Sort(idx)
	idx = slices.Compact(idx)
	rep.VerifiedRuns = len(idx)
	for i := range sh.runs {
		if oscillator.Status(mj.status, i) != 0 {
			rep.FailedRuns++
		}
	}
	err := mj.verifyRuns(idx)
	if err == nil && rep.FailedRuns > 0 {
		err = fmt.Errorf("%d of %d runs report a NaN or infinite state: %w", rep.FailedRuns, sh.runs, errVerify)
	}
	rep.Verified = err == nil
	if err != nil {
		rep.VerifyError = err.Error()
	}
	return err
}

func (mj *multiJob) verifyRuns(idx []int) error {
	sh := mj.shape
	got, err := mj.samplesOf(idx)
	if err != nil {
		return err
	}
	for k, i := range idx {
		r := runAt(mj.f.seed, sh.first+i)
		if st := oscillator.Status(mj.status, i); st != 0 {
			return fmt.Errorf("run %d (%s): the integration became non-finite (status %d): %w", sh.first+i, describeRun(r), st, errVerify)
		}
		want := oscillator.ReferenceRun(r, sh.dt, int(sh.steps), int(sh.every))
		if err := oscillator.Verify(got[k], want); err != nil {
			return fmt.Errorf("run %d (%s): %v: %w", sh.first+i, describeRun(r), err, errVerify)
		}
	}
	return nil
}

// samplesOf is the trajectories of the runs idx (sorted, without
// repeats): from the --out file, or the results in memory.
func (mj *multiJob) samplesOf(idx []int) ([][]oscillator.Sample, error) {
	if mj.traj != nil {
		return mj.traj.samplesOf(idx)
	}
	out := make([][]oscillator.Sample, len(idx))
	for k, i := range idx {
		var err error
		if out[k], err = oscillator.Decode(mj.out, mj.shape.runs, mj.shape.samples, i); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// devicesHelp is the part of `vram run --help` about --devices.
const devicesHelp = `--devices runs the batch on several devices of this process: all (every
CUDA device), or specs separated by ';' (cuda:0;cuda:1, sim:count=4).
Each device has its own memory manager and cuts chunks of its own plan's
length, dealt from one queue to whichever device is free: a small probe
chunk first, then at most its share of half the runs left by the rate it
was measured at (weighted factoring), and no chunk for a device that
would end it after the others finish everything, so that the devices
finish together: a larger device cuts longer chunks, a faster one takes
more. The results, and --out, are the same as on one device. --kernel-delay D makes each kernel take
D per run longer (on the simulator, to see the scaling on a small CPU).

`
