// `vram run --devices LIST`: one batch on several devices of one process.
//
// Each device gets its own memory manager, kernel and clients, on its own
// goroutine locked to its OS thread (a CUDA context is current per
// thread). A device first plans the whole batch on itself, which gives
// the chunk length that fits it; then it takes units of that many runs
// from one queue shared by all devices, runs each unit through the
// library's pipeline (vram.RunBatch, filling the inputs and draining the
// outputs through the staging pool) and writes the unit's results at
// their place in the result, until the queue is empty. A faster or larger
// device therefore takes more units. A run's result depends on nothing
// but its own parameters (runAt(seed, r)), so the result is the same
// however the units were dealt: byte for byte what one device writes.
//
// A unit is the device's chunk length, at most an eighth of an equal
// share of the batch (so a batch that fits one device is still spread).
// A unit shorter than that (the batch's tail) is padded with copies of
// its last run, computed and dropped.

package main

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/vramkit/vram"
	"github.com/vramkit/vram/alloc"
	"github.com/vramkit/vram/device"
	"github.com/vramkit/vram/internal/oscillator"
	"github.com/vramkit/vram/internal/units"
	"github.com/vramkit/vram/kernel"
)

// unitsPerDevice is how many units an equal share of the batch is cut
// into at least.
const unitsPerDevice = 8

// maxAllDevices bounds how many CUDA ordinals --devices all tries.
const maxAllDevices = 64

// deviceSpecs expands --devices: "all" (every CUDA device), or specs
// separated by ";", where a sim spec's count=N stands for N simulators
// (ordinals 0 … N−1 unless it names one).
func deviceSpecs(v string) ([]string, error) {
	v = strings.TrimSpace(v)
	if strings.EqualFold(v, "all") {
		var specs []string
		for i := range maxAllDevices {
			dev, err := device.Open(fmt.Sprintf("cuda:%d", i))
			if err != nil {
				if i == 0 {
					return nil, fmt.Errorf("--devices all: no CUDA device (%v); on the simulator give --devices sim:count=N", err)
				}
				break
			}
			specs = append(specs, fmt.Sprintf("cuda:%d", i))
			if err := dev.Close(); err != nil {
				return nil, fmt.Errorf("--devices all: close cuda:%d: %w", i, err)
			}
		}
		return specs, nil
	}
	var specs []string
	for _, s := range strings.Split(v, ";") {
		s = strings.TrimSpace(s)
		if s == "" {
			continue
		}
		more, err := expandCount(s)
		if err != nil {
			return nil, usagef("--devices %q: %w", v, err)
		}
		specs = append(specs, more...)
	}
	if len(specs) == 0 {
		return nil, usagef("--devices %q: want all, or device specs separated by ';' (sim:count=4, or cuda:0;cuda:1)", v)
	}
	// Simulators told apart: each its place in the list as its ordinal,
	// unless its spec names one.
	for i, s := range specs {
		name, opts, _ := strings.Cut(s, ":")
		if strings.EqualFold(strings.TrimSpace(name), "sim") && !strings.Contains(strings.ToLower(opts), "ordinal=") {
			specs[i] = name + ":" + strings.TrimPrefix(opts+",ordinal="+strconv.Itoa(i), ",")
		}
	}
	return specs, nil
}

// expandCount makes a spec with count=N into N specs without it.
func expandCount(spec string) ([]string, error) {
	name, opts, _ := strings.Cut(spec, ":")
	var keep []string
	count, ordinal := 1, false
	for _, kv := range strings.Split(opts, ",") {
		k, val, _ := strings.Cut(strings.TrimSpace(kv), "=")
		switch strings.ToLower(strings.TrimSpace(k)) {
		case "":
			continue
		case "count":
			n, err := strconv.Atoi(strings.TrimSpace(val))
			if err != nil || n < 1 || n > maxAllDevices {
				return nil, fmt.Errorf("count=%q: want 1 to %d devices", val, maxAllDevices)
			}
			count = n
			continue
		case "ordinal":
			ordinal = true
		}
		keep = append(keep, strings.TrimSpace(kv))
	}
	if count > 1 && !strings.EqualFold(strings.TrimSpace(name), "sim") {
		return nil, fmt.Errorf("count= is for the simulator; list real devices one by one (cuda:0;cuda:1) or give all")
	}
	specs := make([]string, count)
	for i := range specs {
		o := slices.Clone(keep)
		if count > 1 && ordinal {
			return nil, fmt.Errorf("count= with ordinal=: the devices would share one ordinal; give one of them")
		}
		specs[i] = name
		if len(o) > 0 {
			specs[i] += ":" + strings.Join(o, ",")
		}
	}
	return specs, nil
}

// unitQueue deals the batch's runs [0, end) in units, in order. Safe
// for concurrent use.
type unitQueue struct {
	mu        sync.Mutex
	next, end int
	edges     []int // the first and last run of every unit dealt
}

// take deals the next unit of at most n runs; ok is false when none are
// left.
func (q *unitQueue) take(n int) (start, length int, ok bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.next >= q.end {
		return 0, 0, false
	}
	start, length = q.next, min(n, q.end-q.next)
	q.next += length
	q.edges = append(q.edges, start, start+length-1)
	return start, length, true
}

// deviceShare is one device's share of a run on several devices.
type deviceShare struct {
	Device      string  `json:"device"`
	ChunkLength int     `json:"chunk_length"` // the runs of each unit it took (its plan's chunk length)
	Chunks      int     `json:"chunks"`       // units it took
	Runs        int     `json:"runs"`
	BusySeconds float64 `json:"busy_seconds"` // in its units' pipelines
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
	Out           string        `json:"out,omitempty"`
	Shard         string        `json:"shard,omitempty"`
	ShardFrom     string        `json:"shard_from,omitempty"`
	FirstRun      int           `json:"first_run,omitempty"`
	TotalRuns     int           `json:"total_runs,omitempty"`
}

// multiJob is a batch on several devices: the shared queue and results.
type multiJob struct {
	a     *app
	f     runFlags
	shape jobShape
	q     *unitQueue
	// unitCap bounds a unit: an eighth of an equal share of the batch,
	// so that every device has work and a faster one can take more.
	unitCap int
	traj    *trajFile // --out; nil: the results stay in out and status
	out     []byte    // [samples, 2, runs] float32, without --out
	// status is every run's status (int32); a failed run is not 0.
	status []byte
}

func (a *app) runDevices(f runFlags, js jobShape, start time.Time) (err error) {
	if f.metricsAddr != "" {
		return usagef("--metrics-addr serves one device's manager; give it without --devices")
	}
	specs, err := deviceSpecs(f.devices)
	if err != nil {
		return err
	}
	hostCap, _ := units.ParseSize(f.hostMem)
	if err := a.checkHostMemory(js, device.Info{Backend: "multi"}, f.doubleBuffer, f.out != "", hostCap); err != nil {
		return err
	}
	mj := &multiJob{a: a, f: f, shape: js, q: &unitQueue{end: js.runs}, status: make([]byte, 4*js.runs),
		unitCap: max(1, (js.runs+unitsPerDevice*len(specs)-1)/(unitsPerDevice*len(specs)))}
	if f.out != "" {
		j := &job{a: a, shape: js, seed: f.seed}
		if err := j.openOut(f.out); err != nil {
			return err
		}
		mj.traj = j.traj
		defer func() { err = errors.Join(err, j.closeOut(f.out, err != nil)) }()
	} else {
		mj.out = make([]byte, js.samples*2*js.runs*4)
	}
	ctx, cancel := context.WithCancel(a.ctx)
	defer cancel()
	reps := make([]deviceShare, len(specs))
	errs := make([]error, len(specs))
	batchStart := time.Now()
	var wg sync.WaitGroup
	for i, spec := range specs {
		wg.Go(func() {
			reps[i], errs[i] = mj.device(ctx, spec)
			if errs[i] != nil {
				errs[i] = fmt.Errorf("device %d (%s): %w", i, spec, errs[i])
				cancel()
			}
		})
	}
	wg.Wait()
	batch := time.Since(batchStart)
	if err := errors.Join(errs...); err != nil {
		return err
	}
	if err := a.ctx.Err(); err != nil {
		return fmt.Errorf("interrupted: %w", err)
	}
	rep := mj.report(reps, batch)
	verr := mj.verify(&rep)
	rep.WallSeconds = time.Since(start).Seconds()
	if a.json {
		err = a.writeJSON(rep)
	} else {
		err = a.printMulti(rep)
	}
	if err != nil {
		err = fmt.Errorf("write the report: %w", err)
	}
	return errors.Join(err, verr)
}

// device runs units from the queue on the device spec opens until the
// queue is empty, ctx is cancelled or a unit fails.
func (mj *multiJob) device(ctx context.Context, spec string) (rep deviceShare, err error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	f, a := mj.f, mj.a
	spec, limit, err := runDeviceSpec(spec, "--devices", f)
	if err != nil {
		return rep, err
	}
	dev, _, err := a.openDeviceAs(spec, fmt.Sprintf("--devices (the spec %q)", spec))
	if err != nil {
		return rep, err
	}
	defer func() { err = errors.Join(err, closeErr("device", dev.Close())) }()
	info := dev.Info()
	if info.Backend == "sim" {
		limit = 0
	}
	rep.Device = fmt.Sprintf("%s:%d %s", info.Backend, info.Ordinal, info.Name)
	kind, _ := vram.ParseAllocatorKind(f.allocator)
	hostCap, _ := units.ParseSize(f.hostMem)
	opts := []vram.Option{vram.WithAllocator(kind), vram.WithLogger(a.log), vram.WithHostOptions(vram.HostOptions{Limit: hostCap})}
	if limit > 0 {
		opts = append(opts, vram.WithWrap(func(up alloc.Allocator) alloc.Allocator { return alloc.NewLimit(up, limit) }))
	}
	m, err := vram.New(dev, opts...)
	if err != nil {
		return rep, fmt.Errorf("memory manager: %w", err)
	}
	defer func() { err = errors.Join(err, closeErr("memory manager", m.Close())) }()
	kern := oscillator.NewPortable()
	defer func() { err = errors.Join(err, closeErr("kernel", kern.Close())) }()
	if err := kern.Load(dev); err != nil {
		return rep, fmt.Errorf("load the oscillator kernel: %w", err)
	}
	// The chunk length that fits this device, from a plan of the whole
	// batch; then arrays for one unit of that length.
	probe := &job{a: a, shape: mj.shape, m: m}
	if err := probe.register(f.doubleBuffer); err != nil {
		return rep, allocHint(err, f, info, limit)
	}
	rep.ChunkLength = min(probe.plan.ChunkLength, mj.unitCap)
	if err := errors.Join(probe.in.Close(), probe.out.Close()); err != nil {
		return rep, err
	}
	u := &job{a: a, shape: mj.shape, m: m}
	u.shape.runs = rep.ChunkLength
	if err := u.register(f.doubleBuffer); err != nil {
		return rep, allocHint(err, f, info, limit)
	}
	for ctx.Err() == nil {
		start, n, ok := mj.q.take(rep.ChunkLength)
		if !ok {
			break
		}
		br, err := mj.unit(ctx, u, kern, start, n)
		if err != nil {
			return rep, fmt.Errorf("runs %d-%d: %w", start, start+n-1, err)
		}
		rep.Chunks++
		rep.Runs += n
		rep.BusySeconds += br.Wall.Seconds()
		a.log.Debug("unit done", "device", rep.Device, "runs", fmt.Sprintf("%d-%d", start, start+n-1))
	}
	return rep, nil
}

// unit runs the batch's runs start … start+n−1 through u's arrays (whose
// length, the device's chunk length, may exceed n: the rest is padding).
func (mj *multiJob) unit(ctx context.Context, u *job, kern *kernel.Kernel, start, n int) (vram.BatchReport, error) {
	sh := mj.shape
	seed, first := mj.f.seed, sh.first
	// run is the batch run at unit position i (padding repeats the last).
	run := func(i int) oscillator.Run { return runAt(seed, first+start+min(i, n-1)) }
	fillInit := func(sp vram.Span, st *vram.HostArray) error {
		v, ld := st.Float32s(), st.Dim(1)
		for i := range sp.Len {
			r := run(sp.Start + i)
			v[i], v[ld+i] = float32(r.X0), float32(r.V0)
		}
		return nil
	}
	fillParams := func(sp vram.Span, st *vram.HostArray) error {
		v, ld := st.Float32s(), st.Dim(1)
		for i := range sp.Len {
			r := run(sp.Start + i)
			v[i], v[ld+i], v[2*ld+i], v[3*ld+i] = float32(r.Omega), float32(r.Zeta), float32(r.A), float32(r.Drive)
		}
		return nil
	}
	// valid is how many of chunk sp's runs are the unit's, not padding.
	valid := func(sp vram.Span) int { return max(0, min(sp.Len, n-sp.Start)) }
	drainTraj := func(sp vram.Span, st *vram.HostArray) error {
		ld, data, k := st.Dim(2), st.Data(), valid(sp)
		for row := range 2 * sh.samples {
			src := data[row*ld*4:][:k*4]
			off := int64(row*sh.runs+start+sp.Start) * 4
			if mj.traj != nil {
				if _, err := mj.traj.f.WriteAt(src, off); err != nil {
					return fmt.Errorf("write to %s: %w", mj.traj.path, err)
				}
				continue
			}
			copy(mj.out[off:], src)
		}
		return nil
	}
	drainStatus := func(sp vram.Span, st *vram.HostArray) error {
		copy(mj.status[(start+sp.Start)*4:], st.Data()[:valid(sp)*4])
		return nil
	}
	return vram.RunBatch(ctx, u.out, vram.Batch{
		Arrays: []vram.BatchArray{
			vram.InFunc(u.inR, "init", 1, fillInit), vram.InFunc(u.inR, "params", 1, fillParams),
			vram.OutFunc(u.outR, "trajectories", 2, drainTraj), vram.OutFunc(u.outR, "status", 0, drainStatus),
		},
		Runs: u.shape.runs,
		Compute: func(_ context.Context, ch *vram.Chunk) error {
			err := ch.Launch(kern, ch.Array(u.inR, "init"), ch.Array(u.inR, "params"),
				ch.Array(u.outR, "trajectories"), ch.Array(u.outR, "status"),
				uint32(ch.Len), uint32(ch.ChunkLength), sh.dt, sh.steps, sh.every)
			if err != nil {
				return fmt.Errorf("launch the kernel: %w", err)
			}
			emulateKernel(mj.f.kernelDelay, valid(vram.Span{Start: ch.Start, Len: ch.Len}))
			return nil
		},
	})
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
func (mj *multiJob) report(reps []deviceShare, batch time.Duration) multiReport {
	sh := mj.shape
	rep := multiReport{Devices: reps, Runs: sh.runs, Steps: int(sh.steps), Samples: sh.samples, Dt: shortest(sh.dt),
		BatchSeconds: batch.Seconds(), RunsPerSecond: float64(sh.runs) / batch.Seconds()}
	for _, d := range reps {
		rep.Chunks += d.Chunks
	}
	if mj.traj != nil {
		rep.Out = mj.traj.path
	}
	if s := sh.shard; !s.Whole() {
		rep.Shard, rep.ShardFrom, rep.FirstRun, rep.TotalRuns = s.String(), s.From, sh.first, sh.total
	}
	return rep
}

// verify checks runs spread over the batch, and the first and last run
// of every unit dealt, against the float64 reference, and counts the
// runs whose status is not 0.
func (mj *multiJob) verify(rep *multiReport) error {
	sh := mj.shape
	want := min(mj.f.verify, sh.runs)
	// The first and last run of every unit, or of want units spread
	// over the batch when there are more.
	var idx []int
	units := len(mj.q.edges) / 2
	for k := range min(units, want) {
		u := k
		if units > want {
			u = int(int64(k) * int64(units-1) / int64(max(want-1, 1)))
		}
		idx = append(idx, mj.q.edges[2*u], mj.q.edges[2*u+1])
	}
	for k := range want {
		if want == 1 {
			idx = append(idx, 0)
			break
		}
		idx = append(idx, int(int64(k)*int64(sh.runs-1)/int64(want-1)))
	}
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
	for _, i := range idx {
		r := runAt(mj.f.seed, sh.first+i)
		if st := oscillator.Status(mj.status, i); st != 0 {
			return fmt.Errorf("run %d (%s): the integration became non-finite (status %d): %w", sh.first+i, describeRun(r), st, errVerify)
		}
		var got []oscillator.Sample
		var err error
		if mj.traj != nil {
			got, err = mj.traj.run(i)
		} else {
			got, err = oscillator.Decode(mj.out, sh.runs, sh.samples, i)
		}
		if err != nil {
			return err
		}
		want := oscillator.ReferenceRun(r, sh.dt, int(sh.steps), int(sh.every))
		if err := oscillator.Verify(got, want); err != nil {
			return fmt.Errorf("run %d (%s): %v: %w", sh.first+i, describeRun(r), err, errVerify)
		}
	}
	return nil
}

func (a *app) printMulti(r multiReport) error {
	w := &errWriter{w: a.stdout}
	fmt.Fprintf(w, "batch        %s × %s, %s each (dt %g)\n", plural(r.Runs, "run"), plural(r.Steps, "step"), plural(r.Samples, "sample"), r.Dt)
	if r.Shard != "" {
		fmt.Fprintf(w, "shard        %s (from %s): runs %d-%d of %d\n", r.Shard, r.ShardFrom, r.FirstRun, r.FirstRun+r.Runs-1, r.TotalRuns)
	}
	fmt.Fprintf(w, "devices      %d, dealt %s from one queue\n", len(r.Devices), plural(r.Chunks, "chunk"))
	for i, d := range r.Devices {
		fmt.Fprintf(w, "  %-3d        %s: %s of %d runs (%s), %.2f s busy\n", i, d.Device, plural(d.Chunks, "chunk"), d.ChunkLength, plural(d.Runs, "run"), d.BusySeconds)
	}
	fmt.Fprintf(w, "time         %.2f s in all, %.2f s for the batch: %s runs/s\n", r.WallSeconds, r.BatchSeconds, rate(r.RunsPerSecond))
	if r.Out != "" {
		fmt.Fprintf(w, "out          %s: float32 (%d, 2, %d), C order\n", r.Out, r.Samples, r.Runs)
	}
	if r.Verified {
		fmt.Fprintf(w, "verified     %s, with the first and last of the chunks, match the float64 reference (tolerance %g)\n",
			plural(r.VerifiedRuns, "run"), oscillator.Tolerance)
	} else {
		fmt.Fprintf(w, "NOT VERIFIED %s\n", r.VerifyError)
	}
	return w.err
}

// devicesHelp is the part of `vram run --help` about --devices.
const devicesHelp = `--devices runs the batch on several devices of this process: all (every
CUDA device), or specs separated by ';' (cuda:0;cuda:1, sim:count=4).
Each device has its own memory manager; the batch is cut into units of
each device's chunk length (at most an eighth of an equal share) dealt
from one queue, so a faster device takes more. The results, and --out,
are the same as on one device. --kernel-delay D makes each kernel take
D per run longer (on the simulator, to see the scaling on a small CPU).

`
