// `vram run --devices LIST`: the example batch on several devices in one
// process. Each device gets its own memory manager, kernel and pair of
// clients, planned for its memory; the host arrays (or the --out file)
// are one, made on the first device's manager. vram.RunBatches deals one
// chunking of the runs (the shortest of the devices' chunk lengths) to
// the devices as each has a buffer free, so a faster device takes more
// chunks; every chunk lands at its runs, so the results (and an --out
// file) are the same whatever the dealing, and the same as one device's.

package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/vramkit/vram"
	"github.com/vramkit/vram/device"
	"github.com/vramkit/vram/internal/oscillator"
	"github.com/vramkit/vram/internal/units"
)

// deviceRun is one device's share of a --devices run in the report.
type deviceRun struct {
	Device      string `json:"device"`
	Chunks      int    `json:"chunks"` // chunks of the batch the device ran
	ChunkLength int    `json:"plan_chunk_length"`
	BudgetBytes uint64 `json:"budget_bytes"`
}

func addDevicesFlag(fl *pflag.FlagSet, f *runFlags) {
	fl.StringVar(&f.devices, "devices", "", "run on several devices in one process: all (every CUDA device), sim:count=4, or specs separated by ; (e.g. 'sim:vram=256MiB;sim:vram=128MiB'); the chunks are dealt to whichever device is free")
}

// openRunDevices opens the devices of --devices, each sized or capped by
// --vram as --device is.
func (a *app) openRunDevices(f runFlags) ([]device.Device, []uint64, error) {
	specs, err := device.ParseSpecs(f.devices)
	if err != nil {
		if errors.Is(err, device.ErrBadSpec) {
			return nil, nil, usageError{fmt.Errorf("--devices: %w", err)}
		}
		return nil, nil, err
	}
	var devs []device.Device
	var limits []uint64
	fail := func(err error) ([]device.Device, []uint64, error) {
		return nil, nil, errors.Join(append([]error{err}, closeDevices(devs))...)
	}
	for i, s := range specs {
		spec, limit, err := runDeviceSpec(s, fmt.Sprintf("--devices %q (device %d)", f.devices, i), f)
		if err != nil {
			return fail(err)
		}
		dev, _, err := a.openDeviceAs(spec, fmt.Sprintf("--devices (device %d, %q)", i, spec))
		if err != nil {
			return fail(err)
		}
		devs = append(devs, dev)
		if dev.Info().Backend == "sim" {
			limit = 0
		}
		limits = append(limits, limit)
	}
	return devs, limits, nil
}

func closeDevices(devs []device.Device) error {
	var errs []error
	for _, d := range devs {
		errs = append(errs, closeErr("device", d.Close()))
	}
	return errors.Join(errs...)
}

// deviceJob makes device i's manager, kernel and clients, allocated for
// the batch; close undoes it.
func (a *app) deviceJob(f runFlags, js jobShape, dev device.Device, limit, hostCap uint64) (j *job, closeJob func() error, err error) {
	kind, _ := vram.ParseAllocatorKind(f.allocator)
	opts := []vram.Option{vram.WithAllocator(kind), vram.WithLogger(a.log), vram.WithHostOptions(vram.HostOptions{Limit: hostCap})}
	if limit > 0 {
		opts = append(opts, vram.WithCap(limit))
	}
	info := dev.Info()
	m, err := vram.New(dev, opts...)
	if err != nil {
		return nil, nil, fmt.Errorf("memory manager on %s:%d: %w", info.Backend, info.Ordinal, err)
	}
	kern := oscillator.NewPortable()
	closeJob = func() error {
		return errors.Join(closeErr("kernel", kern.Close()), closeErr("memory manager", m.Close()))
	}
	if err := kern.Load(dev); err != nil {
		return nil, nil, errors.Join(fmt.Errorf("load the oscillator kernel on %s:%d: %w", info.Backend, info.Ordinal, err), closeJob())
	}
	j = &job{a: a, shape: js, seed: f.seed, m: m, dev: dev, kernel: kern, rungs: map[string]string{}}
	j.fitHint = func(err error) error { return allocHint(err, f, info, limit) }
	if err := j.allocateDevice(f.doubleBuffer); err != nil {
		return nil, nil, errors.Join(fmt.Errorf("%s:%d: %w", info.Backend, info.Ordinal, err), closeJob())
	}
	return j, closeJob, nil
}

// allocateDevice registers the job's two clients on its manager, queues
// their requests and allocates them planned together.
func (j *job) allocateDevice(double bool) error {
	n, s := j.shape.runs, j.shape.samples
	const group = "oscillators"
	var err error
	if j.in, err = j.m.Register(vram.ClientOptions{Name: "inputs", Group: group, OnAllocated: func(r *vram.ArrayResponse) { j.inR = r }}); err != nil {
		return fmt.Errorf("register the inputs: %w", err)
	}
	if j.out, err = j.m.Register(vram.ClientOptions{Name: "outputs", Group: group, OnAllocated: func(r *vram.ArrayResponse) { j.outR = r }}); err != nil {
		return fmt.Errorf("register the outputs: %w", err)
	}
	if err := j.in.Queue(map[string]vram.ArrayRequest{
		"init":   {Shape: []int{2, n}, DType: vram.Float32, ChunkAxis: 1},
		"params": {Shape: []int{4, n}, DType: vram.Float32, ChunkAxis: 1},
	}); err != nil {
		return fmt.Errorf("queue the inputs: %w", err)
	}
	if err := j.out.Queue(map[string]vram.ArrayRequest{
		"trajectories": {Shape: []int{s, 2, n}, DType: vram.Float32, ChunkAxis: 2},
		"status":       {Shape: []int{n}, DType: vram.Int32, ChunkAxis: 0},
	}); err != nil {
		return fmt.Errorf("queue the outputs: %w", err)
	}
	buffers := 1
	if double {
		buffers = 2
	}
	if _, err := j.out.Allocate(j.a.ctx, vram.WithBuffers(buffers)); err != nil {
		return j.fitHint(fmt.Errorf("allocate the batch's device arrays: %w", err))
	}
	if j.inR == nil || j.outR == nil {
		return fmt.Errorf("allocate the batch: the manager delivered no arrays")
	}
	j.plan = j.outR.Plan
	return nil
}

// batchOn is device job d's part of the batch whose host sides host
// holds.
func (host *job) batchOn(d *job) vram.BatchPart {
	sh := host.shape
	traj := vram.Out(d.outR, "trajectories", host.hOut)
	if host.traj != nil {
		traj = vram.OutFunc(d.outR, "trajectories", 2, host.traj.drain)
	}
	return vram.BatchPart{Client: d.out, Batch: vram.Batch{
		Arrays: []vram.BatchArray{
			vram.In(d.inR, "init", host.hInit), vram.In(d.inR, "params", host.hParams),
			traj, vram.Out(d.outR, "status", host.hStatus),
		},
		Runs: sh.runs,
		Compute: func(_ context.Context, ch *vram.Chunk) error {
			err := ch.Launch(d.kernel, ch.Array(d.inR, "init"), ch.Array(d.inR, "params"),
				ch.Array(d.outR, "trajectories"), ch.Array(d.outR, "status"),
				uint32(ch.Len), uint32(ch.ChunkLength), sh.dt, sh.steps, sh.every)
			if err != nil {
				return fmt.Errorf("launch the kernel: %w", err)
			}
			return nil
		},
	}}
}

// fillInputs draws every run's initial state and parameters.
func (j *job) fillInputs() {
	n := j.shape.runs
	init, params := j.hInit.Float32s(), j.hParams.Float32s()
	for i := range n {
		r := runAt(j.seed, i)
		init[i], init[n+i] = float32(r.X0), float32(r.V0)
		params[i], params[n+i], params[2*n+i], params[3*n+i] = float32(r.Omega), float32(r.Zeta), float32(r.A), float32(r.Drive)
	}
}

// runJobDevices is `vram run --devices`: runJob's steps with a job per
// device and the batch dealt by vram.RunBatches.
func (a *app) runJobDevices(f runFlags, js jobShape) (err error) {
	start := time.Now()
	if f.metricsAddr != "" {
		return usagef("--metrics-addr serves one device's metrics; give --device, not --devices, with it")
	}
	prog := a.runProgress()
	defer prog.Finish()
	prog.Phase("open the devices")
	devs, limits, err := a.openRunDevices(f)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, closeDevices(devs)) }()
	hostCap, _ := units.ParseSize(f.hostMem)
	if err := a.checkHostMemory(js, devs[0].Info(), f.doubleBuffer, f.out != "", hostCap); err != nil {
		return err
	}
	prog.Phase("plan and allocate the device arrays")
	var jobs []*job
	for i, dev := range devs {
		j, closeJob, err := a.deviceJob(f, js, dev, limits[i], hostCap)
		if err != nil {
			return err
		}
		defer func() { err = errors.Join(err, closeJob()) }()
		jobs = append(jobs, j)
	}
	host := jobs[0]
	host.prog = prog
	if f.out != "" {
		if host.traj, err = createTrajFile(f.out, js.runs, js.samples); err != nil {
			return err
		}
		defer func() { err = errors.Join(err, host.traj.close(err != nil)) }()
	}
	defer func() { err = errors.Join(err, host.freeHost()) }()
	if err := host.makeHostArrays(); err != nil {
		return err
	}
	host.phase("fill the inputs")
	host.fillInputs()
	rep, err := host.report(devs[0].Info(), nil, limits[0], nil)
	if err != nil {
		return err
	}
	if err := host.runDevices(jobs, &rep); err != nil {
		return err
	}
	verr := host.check(f.verify, &rep)
	rep.WallSeconds = time.Since(start).Seconds()
	prog.Finish()
	if a.json {
		err = a.writeJSON(rep)
	} else {
		err = a.printRun(rep)
	}
	if err != nil {
		err = fmt.Errorf("write the report: %w", err)
	}
	return errors.Join(err, verr)
}

// runDevices runs the batch on every job's device and puts the
// chunking and each device's share into rep.
func (host *job) runDevices(jobs []*job, rep *runReport) error {
	host.phase("run the batch")
	var parts []vram.BatchPart
	for _, d := range jobs {
		parts = append(parts, host.batchOn(d))
	}
	mr, err := vram.RunBatches(host.a.ctx, parts, host.chunkDone)
	if ctxErr := host.a.ctx.Err(); ctxErr != nil {
		return fmt.Errorf("interrupted: %d of %d chunks finished, results not verified: %w", mr.ChunksDone, mr.Chunks, errors.Join(err, ctxErr))
	}
	if err != nil {
		return err
	}
	// The report and the verification speak of the batch's chunking.
	host.plan.Chunks, host.plan.ChunkLength, host.plan.TotalRuns = mr.Chunks, mr.ChunkLength, host.shape.runs
	host.plan.LastChunkLength = host.shape.runs - (mr.Chunks-1)*mr.ChunkLength
	rep.Chunks, rep.ChunkLength, rep.LastChunkLength = mr.Chunks, mr.ChunkLength, host.plan.LastChunkLength
	rep.BatchSeconds = mr.Wall.Seconds()
	rep.RunsPerSecond = float64(host.shape.runs) / mr.Wall.Seconds()
	rep.BytesToDevice, rep.BytesFromDevice = mr.BytesIn, mr.BytesOut
	for i, d := range jobs {
		info := d.dev.Info()
		rep.Devices = append(rep.Devices, deviceRun{Device: fmt.Sprintf("%s:%d %s", info.Backend, info.Ordinal, info.Name),
			Chunks: mr.Parts[i].Chunks, ChunkLength: d.plan.ChunkLength, BudgetBytes: d.plan.Budget})
		rep.CopySeconds += mr.Parts[i].Copy.Seconds()
		rep.ComputeSeconds += mr.Parts[i].Compute.Seconds()
		rep.ExposedCopySeconds += mr.Parts[i].ExposedCopy.Seconds()
	}
	host.hostReport(rep, mr.Parts[0])
	return nil
}

// devicesText is the report's lines for --devices: each device's chunks.
func devicesText(ds []deviceRun) string {
	var b strings.Builder
	for _, d := range ds {
		fmt.Fprintf(&b, "  %-32s %d chunks (its plan: %d runs a chunk, budget %s)\n", d.Device, d.Chunks, d.ChunkLength, units.Format(d.BudgetBytes))
	}
	return b.String()
}
