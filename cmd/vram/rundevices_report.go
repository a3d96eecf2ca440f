// The report of `vram run --devices`: what the one-device report says
// (plan, copies, overlap, peak memory, allocator, host), per device and
// for the batch.

package main

import (
	"fmt"
	"io"
	"strings"

	"github.com/vramkit/vram/batch"
	"github.com/vramkit/vram/internal/oscillator"
	"github.com/vramkit/vram/internal/units"
)

// ran adds to p's share what its pipeline ran with (br) and what its
// allocator and staging hold now.
func (p *devicePart) ran(br batch.Report) {
	s := &p.share
	s.CopySeconds, s.ComputeSeconds, s.ExposedCopySeconds = br.Copy.Seconds(), br.Compute.Seconds(), br.ExposedCopy.Seconds()
	s.BuffersInFlight, s.Lag = br.Buffers, br.Lag
	s.PinSeconds, s.PinnedBytes = br.Pin.Seconds(), br.PinnedBytes
	kind, ar := p.m.Account().Report()
	s.Allocator = kind.String()
	if ar.Allocator != "" {
		s.Allocator = ar.Allocator
	}
	_, st := p.m.Account().Stats()
	s.Stats = toStatsJSON(st)
	s.PeakDeviceBytes, s.PeakLiveBytes = st.PeakReserved, st.PeakInUse
	s.StagingBytes = p.m.Host().Stats().Staging
	s.Lease = leaseOf(p.m)
}

// totals adds up the devices' figures into rep.
func (mj *multiJob) totals(rep *multiReport) {
	rep.BytesToDevice, rep.BytesFromDevice = mj.bytesIn, mj.bytesOut
	rep.HostLimitBytes = mj.f.hostMem.bytes
	for _, d := range rep.Devices {
		rep.CopySeconds += d.CopySeconds
		rep.ComputeSeconds += d.ComputeSeconds
		rep.ExposedCopySeconds += d.ExposedCopySeconds
	}
}

func (a *app) printMulti(r multiReport) error {
	w := &errWriter{w: a.stdout}
	fmt.Fprintf(w, "batch        %s × %s, %s each (dt %g)\n", plural(r.Runs, "run"), plural(r.Steps, "step"), plural(r.Samples, "sample"), r.Dt)
	if r.Shard != "" {
		fmt.Fprintf(w, "shard        %s (from %s): runs %d-%d of %d\n", r.Shard, r.ShardFrom, r.FirstRun, r.FirstRun+r.Runs-1, r.TotalRuns)
	}
	fmt.Fprintf(w, "devices      %d, dealt %s from one queue\n", len(r.Devices), plural(r.Chunks, "chunk"))
	for i, d := range r.Devices {
		fmt.Fprintf(w, "  %-3d        %s, %s kernel: %s (%s), up to %s a chunk, %s, %.2f s busy, %s runs/s\n", i, d.Device, d.Kernel,
			plural(d.Chunks, "chunk"), plural(d.Runs, "run"), plural(d.ChunkLength, "run"), plural(d.Buffers, "buffer"), d.BusySeconds, rate(d.RunsPerSecond))
	}
	printMultiLines(w, r)
	fmt.Fprintf(w, "time         %.2f s in all, %.2f s for the batch: %s runs/s%s\n", r.WallSeconds, r.BatchSeconds, rate(r.RunsPerSecond), commitText(r.CommitSeconds))
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

// printMultiLines writes the lines the one-device report has, each with
// every device's figure (devices by their index).
func printMultiLines(w io.Writer, r multiReport) {
	// each writes f's figure of every device, once when they all agree.
	each := func(f func(d deviceShare) string) string {
		var figs []string
		same := true
		for i, d := range r.Devices {
			figs = append(figs, f(d))
			same = same && figs[i] == figs[0]
		}
		if same && len(figs) > 0 {
			return "each device " + figs[0]
		}
		for i := range figs {
			figs[i] = fmt.Sprintf("%d: %s", i, figs[i])
		}
		return strings.Join(figs, "; ")
	}
	fmt.Fprintf(w, "plan         of the whole batch, %s\n", each(func(d deviceShare) string {
		return fmt.Sprintf("%s a chunk, %s of device arrays of a %s budget", plural(d.PlanChunkLength, "run"), units.Format(d.BytesPerChunk), units.Format(d.BudgetBytes))
	}))
	fmt.Fprintf(w, "copied       %s to the devices, %s back\n", units.Format(r.BytesToDevice), units.Format(r.BytesFromDevice))
	fmt.Fprintf(w, "overlap      %.2f s of copies, %.2f s of kernels, the devices' together; %.2f s of copying not hidden by a kernel\n",
		r.CopySeconds, r.ComputeSeconds, r.ExposedCopySeconds)
	fmt.Fprintf(w, "peak memory  %s\n", each(func(d deviceShare) string {
		return fmt.Sprintf("%s reserved, %s live", units.Format(d.PeakDeviceBytes), units.Format(d.PeakLiveBytes))
	}))
	fmt.Fprintf(w, "allocator    %s\n", each(func(d deviceShare) string {
		p := d.Stats
		return fmt.Sprintf("%s, %s, %s, %s, %s", d.Allocator, plural(p.Allocs, "alloc"), plural(p.CacheHits, "cache hit"),
			plural(p.DeviceAllocs, "device alloc"), plural(p.OOMs, "out of memory"))
	}))
	limit := ""
	if r.HostLimitBytes > 0 {
		limit = fmt.Sprintf(" under --host-mem %s", units.Format(r.HostLimitBytes))
	}
	fmt.Fprintf(w, "host         staged through pinned buffers%s: %s\n", limit, each(func(d deviceShare) string {
		return fmt.Sprintf("%s of staging (%s pinned in %.2f s), %s in flight, the host %s ahead", units.Format(d.StagingBytes),
			units.Format(d.PinnedBytes), d.PinSeconds, plural(d.BuffersInFlight, "buffer"), plural(d.Lag, "chunk"))
	}))
	for i, d := range r.Devices {
		if d.Lease != nil {
			fmt.Fprintf(w, "lease %-3d    ", i)
			printLeaseFigures(w, d.Lease)
		}
	}
}
