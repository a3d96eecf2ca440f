// `vram run`'s report: what --json prints, and the text form.

package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"github.com/vramkit/vram"
	"github.com/vramkit/vram/alloc"
	"github.com/vramkit/vram/batch"
	"github.com/vramkit/vram/device"
	"github.com/vramkit/vram/internal/oscillator"
	"github.com/vramkit/vram/internal/units"
)

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
	// CopySeconds is the time the batch's copies ran, ComputeSeconds its
	// kernels', ExposedCopySeconds the part of the copying no kernel ran
	// beside (batch.Report: measured on the host as each step's work
	// finished).
	CopySeconds        float64 `json:"copy_seconds"`
	ComputeSeconds     float64 `json:"compute_seconds"`
	ExposedCopySeconds float64 `json:"exposed_copy_seconds"`
	// WriteSeconds is the time the batch's writer spent draining the
	// outputs it stages (--out's file written behind the device),
	// WriteWaitSeconds what of it the pipeline waited for, FillSeconds
	// the time spent filling staged inputs. SetupSeconds is the job from
	// its start to the batch's (device, allocation, host arrays, inputs),
	// of which HostArraysSeconds making the host arrays (pinning them, on
	// the pinned rung), VerifySeconds the check after it, CommitSeconds
	// putting --out's file in place (flushed to the disk, renamed over the
	// path) once verified: SetupSeconds, BatchSeconds, VerifySeconds and
	// CommitSeconds account for WallSeconds.
	WriteSeconds      float64 `json:"write_seconds"`
	HostArraysSeconds float64 `json:"host_arrays_seconds"`
	// PinSeconds is the part of BatchSeconds the batch spent taking its
	// staging buffers (pinning new ones, at its start and its re-cuts),
	// PinnedBytes the bytes it pinned anew (batch.Report.Pin,
	// PinnedBytes).
	PinSeconds  float64 `json:"pin_seconds"`
	PinnedBytes uint64  `json:"pinned_bytes"`
	// PinnedPeakBytes is the most host memory the job had pinned at once
	// (host arrays and staging: what it asked for), where the device
	// counts it (pinnedCounter: the simulator); 0 where it does not.
	PinnedPeakBytes uint64 `json:"pinned_peak_bytes,omitempty"`
	// DeviceIdleSeconds is the batch's time with the device neither
	// copying nor computing (batch.Report.DeviceIdle).
	DeviceIdleSeconds float64 `json:"device_idle_seconds"`
	WriteWaitSeconds  float64 `json:"write_wait_seconds"`
	FillSeconds       float64 `json:"fill_seconds"`
	SetupSeconds      float64 `json:"setup_seconds"`
	VerifySeconds     float64 `json:"verify_seconds"`
	CommitSeconds     float64 `json:"commit_seconds,omitempty"`
	// ChunksRun and RunChunkLength are the chunks the batch ran and the
	// length it cut them at last, which differ from the plan's when it
	// re-planned between chunks (Recuts, each change) or chose its
	// buffers (BufferChoice, why).
	ChunksRun      int         `json:"chunks_run"`
	RunChunkLength int         `json:"run_chunk_length"`
	Recuts         []recutJSON `json:"recuts,omitempty"`
	BufferChoice   string      `json:"buffer_choice,omitempty"`

	PeakDeviceBytes uint64    `json:"peak_device_bytes"` // the allocator's peak reserved bytes
	PeakLiveBytes   uint64    `json:"peak_live_bytes"`   // the allocator's peak bytes in use
	DeviceUsedBytes uint64    `json:"device_used_bytes"` // total − free with the arrays allocated (context included)
	Stats           statsJSON `json:"allocator_stats"`   // the allocator's counters at the end of the job

	// MetricsURL is where --metrics-addr served /metrics during the job.
	MetricsURL string `json:"metrics_url,omitempty"`

	// Out is the --out file; OutShape its array's shape (samples, 2, runs).
	Out      string `json:"out,omitempty"`
	OutShape []int  `json:"out_shape,omitempty"`
	// Shard is "i/N" when the job ran shard i of N of the batch (--shard
	// or the scheduler's environment; ShardFrom says which): runs
	// FirstRun … FirstRun+Runs−1 of TotalRuns.
	Shard     string `json:"shard,omitempty"`
	ShardFrom string `json:"shard_from,omitempty"`
	FirstRun  int    `json:"first_run,omitempty"`
	TotalRuns int    `json:"total_runs,omitempty"`
	// HostLimitBytes is --host-mem (0: none); HostRungs the host ladder's
	// rung for each host array ("pinned", "pageable", "file");
	// StagingBytes the pinned staging buffers held at the end;
	// BuffersInFlight and Lag what the pipeline ran with (fewer than
	// planned when staging buffers were short).
	HostLimitBytes  uint64            `json:"host_limit_bytes,omitempty"`
	HostRungs       map[string]string `json:"host_rungs"`
	StagingBytes    uint64            `json:"staging_bytes"`
	BuffersInFlight int               `json:"buffers_in_flight"`
	Lag             int               `json:"lag"`
	// Lease is the job's lease from the node broker (--socket), if any.
	Lease *leaseJSON `json:"lease,omitempty"`
}

// pinnedCounter is a device that counts the pinned host memory it hands
// out (sim.Device.PinnedBytes): the bytes live now and the most at once.
type pinnedCounter interface {
	PinnedBytes() (live, peak uint64)
}

// recutJSON is one batch.Recut.
type recutJSON struct {
	AtSeconds float64 `json:"at_seconds"`
	Chunk     int     `json:"chunk"`
	From      int     `json:"from"`
	To        int     `json:"to"`
	// ArraysFrom, ArraysTo: the device arrays' chunk length before and
	// after.
	ArraysFrom int    `json:"arrays_from"`
	ArraysTo   int    `json:"arrays_to"`
	Buffers    int    `json:"buffers"`
	Why        string `json:"why"`
}

// pipelineReport adds what the batch's pipeline did beyond its times:
// its writes, its chunks and each change of their length.
func (r *runReport) pipelineReport(br batch.Report) {
	r.WriteSeconds, r.WriteWaitSeconds, r.FillSeconds = br.Write.Seconds(), br.WriteWait.Seconds(), br.Fill.Seconds()
	r.PinSeconds, r.PinnedBytes = br.Pin.Seconds(), br.PinnedBytes
	r.DeviceIdleSeconds = br.DeviceIdle.Seconds()
	r.ChunksRun, r.RunChunkLength, r.BufferChoice = br.Chunks, br.ChunkLength, br.BufferChoice
	for _, c := range br.Recuts {
		r.Recuts = append(r.Recuts, recutJSON{AtSeconds: c.At.Seconds(), Chunk: c.Chunk, From: c.From, To: c.To,
			ArraysFrom: c.ArraysFrom, ArraysTo: c.ArraysTo, Buffers: c.Buffers, Why: c.Why})
	}
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

func (a *app) printRun(r runReport) error {
	w := &errWriter{w: a.stdout}
	dev := r.Device
	if r.Fallback != "" {
		dev += " (auto found no GPU; vram info says why)"
	}
	fmt.Fprintf(w, "device       %s, %s total, %s kernel\n", dev, units.Format(r.DeviceBytes), r.Kernel)
	if r.LimitBytes > 0 {
		fmt.Fprintf(w, "limit        %s (--vram)\n", units.Format(r.LimitBytes))
	}
	fmt.Fprintf(w, "batch        %s × %s, %s each (dt %g)\n", plural(r.Runs, "run"), plural(r.Steps, "step"), plural(r.Samples, "sample"), r.Dt)
	if r.Shard != "" {
		fmt.Fprintf(w, "shard        %s (from %s): runs %d-%d of %d\n", r.Shard, r.ShardFrom, r.FirstRun, r.FirstRun+r.Runs-1, r.TotalRuns)
	}
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
	printPipeline(w, r)
	fmt.Fprintf(w, "peak memory  %s reserved from the device, %s live; %s of the device in use with the arrays allocated\n",
		units.Format(r.PeakDeviceBytes), units.Format(r.PeakLiveBytes), units.Format(r.DeviceUsedBytes))
	p := r.Stats
	fmt.Fprintf(w, "allocator    %s: %s, %s, %s, %s, %s, %s, %s\n", r.Allocator,
		plural(p.Allocs, "alloc"), plural(p.Frees, "free"), plural(p.CacheHits, "cache hit"),
		plural(p.DeviceAllocs, "device alloc"), plural(p.DeviceFrees, "device free"), plural(p.Retries, "retry"),
		plural(p.OOMs, "out of memory"))
	printHost(w, r)
	printLease(w, r.Lease)
	if r.MetricsURL != "" {
		fmt.Fprintf(w, "metrics      served on %s during the job\n", r.MetricsURL)
	}
	spread := ""
	if n := max(r.ChunksRun, r.Chunks); n > 1 {
		spread = fmt.Sprintf(", spread over all %d chunks,", n)
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
	return w.err
}

// printPipeline writes the batch's chunks as run, each re-cut, and its
// times.
func printPipeline(w io.Writer, r runReport) {
	if r.ChunksRun != r.Chunks || r.RunChunkLength != r.ChunkLength || len(r.Recuts) > 0 {
		fmt.Fprintf(w, "chunks       %s, the last at %s a chunk\n", plural(r.ChunksRun, "chunk"), plural(r.RunChunkLength, "run"))
	}
	for _, c := range r.Recuts {
		fmt.Fprintf(w, "re-cut       at %.2f s, from chunk %d: %s → %s, %s: %s\n",
			c.AtSeconds, c.Chunk+1, plural(c.From, "run"), plural(c.To, "run"), plural(c.Buffers, "buffer"), c.Why)
	}
	if r.BufferChoice != "" {
		fmt.Fprintf(w, "buffers      %s\n", r.BufferChoice)
	}
	fmt.Fprintf(w, "time         %.2f s in all: %.2f s of set-up (%.2f s making the host arrays), %.2f s for the batch (%s runs/s; %.2f s pinning %s of staging), %.2f s to verify%s\n",
		r.WallSeconds, r.SetupSeconds, r.HostArraysSeconds, r.BatchSeconds, rate(r.RunsPerSecond), r.PinSeconds, units.Format(r.PinnedBytes), r.VerifySeconds, commitText(r.CommitSeconds))
	fmt.Fprintf(w, "overlap      %.2f s of copies, %.2f s of kernels, %.2f s of writes, %.2f s filling; %.2f s of copying not hidden by a kernel, the device idle %.2f s\n",
		r.CopySeconds, r.ComputeSeconds, r.WriteSeconds, r.FillSeconds, r.ExposedCopySeconds, r.DeviceIdleSeconds)
}

// commitText is the time line's end for --out's file put in place.
func commitText(seconds float64) string {
	if seconds == 0 {
		return ""
	}
	return fmt.Sprintf(", %.2f s putting the --out file in place", seconds)
}

// printHost writes the host side: the arrays' rungs, the staging, the
// --out file.
func printHost(w io.Writer, r runReport) {
	var rungs []string
	for _, what := range []string{"initial states", "parameters", "trajectories", "status"} {
		if rung, ok := r.HostRungs[what]; ok {
			rungs = append(rungs, what+" "+rung)
		}
	}
	limit := ""
	if r.HostLimitBytes > 0 {
		limit = fmt.Sprintf(" under --host-mem %s", units.Format(r.HostLimitBytes))
	}
	fmt.Fprintf(w, "host         arrays %s; %s of pinned staging, %s in flight, the host %s ahead%s\n",
		strings.Join(rungs, ", "), units.Format(r.StagingBytes), plural(r.BuffersInFlight, "buffer"), plural(r.Lag, "chunk"), limit)
	if r.Out != "" {
		dims := make([]string, len(r.OutShape))
		for i, d := range r.OutShape {
			dims[i] = strconv.Itoa(d)
		}
		fmt.Fprintf(w, "out          %s: float32 (%s), C order ([k, 0, i] run i's x at sample k, [k, 1, i] its v)\n",
			r.Out, strings.Join(dims, ", "))
	}
}

// errWriter keeps the first error of its writes and drops the writes
// after it, so that a report printed line by line fails as a whole.
type errWriter struct {
	w   io.Writer
	err error
}

func (e *errWriter) Write(p []byte) (int, error) {
	if e.err != nil {
		return 0, e.err
	}
	n, err := e.w.Write(p)
	e.err = err
	return n, err
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

// clipEnv quotes an environment variable's value for a message, at most
// 40 bytes of it.
func clipEnv(v string) string {
	if len(v) > 40 {
		return fmt.Sprintf("%q…", v[:40])
	}
	return fmt.Sprintf("%q", v)
}

// allocHint adds to a failure to allocate the batch what to change on the
// command line to make it fit.
func allocHint(err error, f runFlags, info device.Info, limit uint64) error {
	if !errors.Is(err, vram.ErrUnchunkable) && !errors.Is(err, vram.ErrRunTooLarge) && !errors.Is(err, vram.ErrOutOfMemory) {
		return err
	}
	var fixes []string
	var be *vram.BudgetError
	capped := errors.As(err, &be) && be.Bound == vram.BoundCap
	switch {
	case capped && limit == 0:
		// The cap is not --vram's: the only other the command has is
		// $VRAM_ALLOC_CONF's limit.
		fixes = append(fixes, fmt.Sprintf("raise the limit in $%s (%s)", vram.AllocConfEnv, clipEnv(os.Getenv(vram.AllocConfEnv))))
	case capped:
		fixes = append(fixes, fmt.Sprintf("raise the cap of --vram %s (or the limit in $%s, if it is lower)", f.vram.text, vram.AllocConfEnv))
	case info.Backend == "sim":
		fixes = append(fixes, fmt.Sprintf("give the simulator more than its %s (--vram)", units.Format(info.TotalBytes)))
	case limit > 0:
		fixes = append(fixes, fmt.Sprintf("raise the cap of --vram %s", f.vram.text))
	default:
		fixes = append(fixes, "free memory on the GPU")
	}
	fixes = append(fixes, "save fewer samples per run (--samples)")
	if f.bufferCount() > 1 {
		fixes = append(fixes, "use fewer buffers in flight (--buffers)")
	}
	last := len(fixes) - 1
	return fmt.Errorf("%w\nto make the batch fit: %s or %s", err, strings.Join(fixes[:last], ", "), fixes[last])
}

// report is the job's report as far as the plan goes.
func (j *job) report(info device.Info, fallback error, limit uint64, ms *metricsServer) (runReport, error) {
	free, total, err := j.dev.MemInfo()
	if err != nil {
		return runReport{}, fmt.Errorf("device memory: %w", err)
	}
	js := j.shape
	// The allocator that serves the manager's kind, by its registry name:
	// the Pool kind is Expandable or the segment Pool.
	_, ar := j.m.Account().Report()
	rep := runReport{
		Device:          fmt.Sprintf("%s:%d %s", info.Backend, info.Ordinal, info.Name),
		Backend:         info.Backend,
		Kernel:          j.kernel.Form(j.dev),
		Allocator:       ar.Allocator,
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
		BytesFromDevice: uint64(js.runs) * (uint64(js.samples)*8 + 4),
		DeviceUsedBytes: total - free,
	}
	if fallback != nil {
		rep.Fallback = fallback.Error()
	}
	if ms != nil {
		rep.MetricsURL = ms.url
	}
	j.a.log.Debug("plan", "chunks", j.plan.Chunks, "chunk_length", j.plan.ChunkLength, "buffers", j.plan.Buffers,
		"budget", j.plan.Budget, "bytes_per_chunk", j.plan.BytesPerChunk)
	return rep, nil
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

// finishReport writes a job's report, as JSON or as text by print, and
// joins a failed write with verr, the verification's error: a report
// that cannot be written fails the command like a wrong result.
func (a *app) finishReport(rep any, print func() error, verr error) error {
	var err error
	if a.json {
		err = a.writeJSON(rep)
	} else {
		err = print()
	}
	if err != nil {
		err = fmt.Errorf("write the report: %w", err)
	}
	return errors.Join(err, verr)
}
