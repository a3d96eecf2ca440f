package batch

// The batch run's loop and its steps; the order they keep is described
// at the top of run.go, the segments and re-cuts in elastic.go.

import (
	"fmt"
	"math"
	"time"

	"github.com/vramkit/vram"
	"github.com/vramkit/vram/device"
)

// step kinds, as the timeline records them; stepRetire (a chunk back on
// the host: drained, reported) only names where a panic was.
const (
	stepIn = iota
	stepCompute
	stepOut
	stepRetire
)

var stepNames = [...]string{"copy in", "compute", "copy out", "back on the host"}

// run runs the batch segment by segment; on an error or cancellation it
// retires and drains what finished and returns the error. A panic in
// one of the batch's functions on the run's goroutine (Compute, fill) is
// recovered here and returned as an error wrapping a *PanicError (the
// writer recovers its own: drain, Progress); the caller then cleans up
// as after any error.
func (r *batchRun) run() (err error) {
	defer func() {
		if p := recover(); p != nil {
			where := "before the first chunk"
			if r.atChunk < len(r.chunks) {
				where = fmt.Sprintf("chunk %d of %d: %s", r.chunks[r.atChunk].index+1, r.estimate(), stepNames[r.atKind])
			}
			err = fmt.Errorf("batch: %s: %w", where, newPanicError(p))
		}
	}()
	err = r.loop()
	if err == nil {
		return nil
	}
	if cerr := r.ctx.Err(); cerr != nil && err == cerr {
		// Stopped between steps: what was enqueued finishes and counts.
		if rerr := r.retireUpTo(r.enqueued); rerr != nil {
			return rerr
		}
		if werr := r.w.wait(r.enqueued); werr != nil {
			return werr
		}
		return fmt.Errorf("batch: stopped before chunk %d of %d: %d of %d chunks finished: %w",
			r.enqueued+1, r.estimate(), r.enqueued, r.estimate(), err)
	}
	return err
}

// loop runs segments, re-cutting between them, until the queue is empty;
// it returns ctx.Err() itself when cancelled.
func (r *batchRun) loop() error {
	r.el.probing = r.el.probe
	for {
		if err := r.segment(); err != nil {
			return err
		}
		if r.ended {
			return nil
		}
		if err := r.recut(); err != nil {
			return err
		}
	}
}

// segment enqueues chunks at the run's shape from the next one on until
// the queue is empty or a re-cut is due, and returns once they are all
// drained.
func (r *batchRun) segment() error {
	i0 := len(r.chunks)
	r.el.seg0, r.el.segT = i0, time.Now()
	for p := i0; p < i0+r.k-1 && r.take(p); p++ {
		if err := r.step(stepIn, p); err != nil {
			return err
		}
	}
	for i := i0; r.take(i); i++ {
		if err := r.step(stepCompute, i); err != nil {
			return err
		}
		if r.k > 1 && r.take(i+r.k-1) {
			if err := r.step(stepIn, i+r.k-1); err != nil {
				return err
			}
		}
		if err := r.step(stepOut, i); err != nil {
			return err
		}
		r.enqueued = i + 1
		if err := r.retireUpTo(i + 1 - r.lag); err != nil {
			return err
		}
	}
	if err := r.retireUpTo(len(r.chunks)); err != nil {
		return err
	}
	if err := r.w.wait(len(r.chunks)); err != nil {
		return err
	}
	if r.el.probing && len(r.chunks) > i0 {
		r.el.fig.write, r.el.fig.wall = r.w.snapshot().busy, time.Since(r.el.segT)
		ov, ok := r.dev.(device.Overlapper)
		r.el.fig.overlap = !ok || ov.CopiesOverlapKernels()
		r.el.fig.runs = r.chunks[i0].len
	}
	return nil
}

// step enqueues step kind of chunk i after checking the context and the
// writer. With one buffer a compute step enqueues its chunk's copy in
// first. In the probe chunk each step is waited for, and timed.
func (r *batchRun) step(kind, i int) error {
	if r.k == 1 && kind == stepCompute {
		if err := r.step(stepIn, i); err != nil {
			return err
		}
	}
	if err := r.ctx.Err(); err != nil {
		return err
	}
	if err := r.w.failed(); err != nil {
		return err
	}
	r.atKind, r.atChunk = kind, i
	enq := time.Now()
	var err error
	switch kind {
	case stepIn:
		err = r.copyIn(i)
	case stepCompute:
		err = r.computeStep(i)
	case stepOut:
		err = r.copyOut(i)
	}
	if err != nil {
		return fmt.Errorf("batch: chunk %d of %d: %w", r.chunks[i].index+1, r.estimate(), err)
	}
	st := r.s
	if kind == stepCompute {
		st = r.computeStream()
	}
	if err := r.tl.mark(kind, i, enq, st); err != nil {
		return fmt.Errorf("batch: chunk %d of %d: time the %s: %w", r.chunks[i].index+1, r.estimate(), stepNames[kind], err)
	}
	if r.el.probing {
		return r.timeProbe(kind, i, st, enq)
	}
	return nil
}

// timeProbe waits for the probe chunk's step kind on st and adds its time
// to the probe's figures.
func (r *batchRun) timeProbe(kind, i int, st device.Stream, enq time.Time) error {
	if err := st.Synchronize(); err != nil {
		return fmt.Errorf("batch: chunk %d of %d: %s: %w", r.chunks[i].index+1, r.estimate(), stepNames[kind], err)
	}
	d := time.Since(enq)
	if kind == stepCompute {
		r.el.fig.compute += d
	} else {
		r.el.fig.copy += d
	}
	return nil
}

// computeStream is where chunks compute: the run's own stream with more
// than one buffer, else the group's.
func (r *batchRun) computeStream() device.Stream {
	if r.k > 1 {
		return r.ks
	}
	return r.s
}

// span is chunk i's runs along a's axis.
func (r *batchRun) span(a *batchArr, i int) vram.Span {
	return vram.Span{Axis: a.axis, Start: r.chunks[i].start, Len: r.chunks[i].len}
}

// copyIn fills chunk i's staging buffers and enqueues its copies in on s.
func (r *batchRun) copyIn(i int) error {
	buf := i % r.k
	for _, a := range r.arrs {
		if a.dir == dirOut || (a.whole && i > 0) {
			continue
		}
		d := a.dev[min(buf, len(a.dev)-1)]
		if a.whole {
			if err := a.client.ToDevice(r.copyCtx, d, a.side.host); err != nil {
				return fmt.Errorf("copy in %s: %w", a, err)
			}
			r.chunks[i].in += d.Bytes()
			continue
		}
		sp := r.span(a, i)
		src := a.side.host
		if a.stagedSide {
			src = a.stage[i%len(a.stage)]
			if err := r.fill(a, src, sp); err != nil {
				return err
			}
			sp.Start = 0
		}
		if err := a.client.ToDeviceChunk(r.copyCtx, d, src, sp); err != nil {
			return fmt.Errorf("copy in %s: %w", a, err)
		}
		r.chunks[i].in += uint64(sp.Len) * a.run
	}
	if r.k > 1 {
		if err := r.inReady[buf].Record(r.s); err != nil {
			return fmt.Errorf("record the copies in: %w", err)
		}
	}
	return nil
}

// fill writes chunk sp's runs into the staging buffer h, and counts the
// time it took.
func (r *batchRun) fill(a *batchArr, h *vram.HostArray, sp vram.Span) error {
	start := time.Now()
	defer func() {
		d := time.Since(start)
		r.rep.Fill += d
		if r.el.probing {
			r.el.fig.fill += d
			r.el.fig.copy -= d // counted in the copy step's time too
		}
	}()
	if a.side.fill != nil {
		if err := a.side.fill(sp, h); err != nil {
			return fmt.Errorf("fill %s: %w", a, err)
		}
		return nil
	}
	return h.CopyChunkFrom(a.side.host, sp)
}

// compute enqueues chunk i's compute step on its stream, after its
// copies in.
func (r *batchRun) computeStep(i int) error {
	buf := i % r.k
	ks := r.computeStream()
	if r.k > 1 {
		if err := r.inReady[buf].Wait(ks); err != nil {
			return fmt.Errorf("order the compute after the copies in: %w", err)
		}
	}
	dc := r.chunks[i]
	ch := &Chunk{Index: dc.index, Chunks: r.estimate(), Start: dc.start, Len: dc.len, ChunkLength: r.stride,
		Buffer: buf, Stream: ks, Device: r.dev, b: r.b}
	if err := r.compute(r.ctx, ch); err != nil {
		return err
	}
	if r.k > 1 {
		if err := r.kernDone[buf].Record(ks); err != nil {
			return fmt.Errorf("record the compute's end: %w", err)
		}
	}
	return nil
}

// copyOut enqueues chunk i's copies out on s, after its compute, once
// the writer has drained the chunk that last used its staging slot.
func (r *batchRun) copyOut(i int) error {
	buf := i % r.k
	if r.k > 1 {
		if err := r.kernDone[buf].Wait(r.s); err != nil {
			return fmt.Errorf("order the copies out after the compute: %w", err)
		}
	}
	if n := r.outStage(); n < math.MaxInt {
		if err := r.w.wait(i - n + 1); err != nil {
			return err
		}
	}
	last := r.chunks[i].start+r.chunks[i].len == r.b.runs
	for _, a := range r.arrs {
		if a.dir != dirOut || (a.whole && !last) {
			continue
		}
		d := a.dev[min(buf, len(a.dev)-1)]
		if a.whole {
			if err := a.client.FromDevice(r.copyCtx, a.side.host, d); err != nil {
				return fmt.Errorf("copy out %s: %w", a, err)
			}
			r.chunks[i].out += d.Bytes()
			continue
		}
		sp := r.span(a, i)
		dst := a.side.host
		if a.stagedSide {
			dst, sp.Start = a.stage[i%len(a.stage)], 0
		}
		if err := a.client.FromDeviceChunk(r.copyCtx, dst, d, sp); err != nil {
			return fmt.Errorf("copy out %s: %w", a, err)
		}
		r.chunks[i].out += uint64(sp.Len) * a.run
	}
	if err := r.done[i%(r.lag+1)].Record(r.s); err != nil {
		return fmt.Errorf("record the copies out: %w", err)
	}
	return nil
}

// retireUpTo retires the chunks before upTo that are not yet: waits for
// their copies out and hands them to the writer.
func (r *batchRun) retireUpTo(upTo int) error {
	for ; r.retired < upTo; r.retired++ {
		i := r.retired
		r.atKind, r.atChunk = stepRetire, i
		if err := r.done[i%(r.lag+1)].Synchronize(); err != nil {
			return fmt.Errorf("batch: chunk %d of %d: wait for the copies out: %w", r.chunks[i].index+1, r.estimate(), err)
		}
		if err := r.streamsFailed(); err != nil {
			return fmt.Errorf("batch: chunk %d of %d: %w", r.chunks[i].index+1, r.estimate(), err)
		}
		r.q.done(r.part, r.chunks[i].len) // the device's part of it is done: its rate
		it := drainItem{i: i, ch: r.chunks[i], chunks: r.estimate()}
		for _, a := range r.w.outs {
			var st *vram.HostArray
			if a.stagedSide {
				st = a.stage[i%len(a.stage)]
			}
			it.stages = append(it.stages, st)
		}
		r.w.push(it)
		if r.inTurn() {
			if err := r.w.wait(i + 1); err != nil {
				return err
			}
		}
	}
	return nil
}

// streamsFailed is the first error the run's streams report of work
// already run. A copy or a kernel can be accepted when enqueued and fail
// on the device (a transfer error): the stream reports it (CUDA's sticky
// error, the simulator's stream error), the events the run waits on do
// not, so a chunk is checked before it is handed to the writer, and a
// batch with a failed copy never returns nil.
func (r *batchRun) streamsFailed() error {
	streams := []device.Stream{r.s}
	if r.ks != r.s {
		streams = append(streams, r.ks)
	}
	for _, st := range streams {
		if _, err := st.Query(); err != nil {
			return fmt.Errorf("its stream reports a failure: %w", err)
		}
	}
	return nil
}

// inTurn reports whether the run drains each chunk before it enqueues
// the next: with no lead and one staging slot an output has nothing to
// drain behind with (the shape choose models as every step in turn,
// and the one a look goes back to when writing behind the device
// bought nothing).
func (r *batchRun) inTurn() bool { return r.lag == 0 && r.outStage() == 1 }
