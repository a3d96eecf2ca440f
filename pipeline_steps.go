package vram

// The batch run's loop and its steps; the order they keep is described
// at the top of pipeline.go.

import (
	"fmt"
	"time"

	"github.com/vramkit/vram/internal/safecopy"
)

// step kinds, as the timeline records them.
const (
	stepIn = iota
	stepCompute
	stepOut
)

var stepNames = [...]string{"copy in", "compute", "copy out"}

// run enqueues every chunk and retires each lag chunks later; on an error
// or cancellation it retires what finished and returns the error.
func (r *batchRun) run() error {
	r.start = time.Now()
	err := r.loop()
	if err == nil {
		return r.retireUpTo(len(r.chunks))
	}
	if cerr := r.ctx.Err(); cerr != nil && err == cerr {
		// Stopped between steps: what was enqueued finishes and counts.
		if rerr := r.retireUpTo(r.enqueued); rerr != nil {
			return rerr
		}
		return fmt.Errorf("vram: batch stopped before chunk %d of %d: %d of %d chunks finished: %w",
			r.enqueued+1, r.total, r.retired, r.total, err)
	}
	return err
}

// loop enqueues the chunks; it returns ctx.Err() itself when cancelled.
func (r *batchRun) loop() error {
	for p := 0; p < r.k-1 && r.take(p); p++ {
		if err := r.step(stepIn, p); err != nil {
			return err
		}
	}
	for i := 0; r.take(i); i++ {
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
	return nil
}

// step enqueues step kind of chunk i after checking the context. With
// one buffer a compute step enqueues its chunk's copy in first.
func (r *batchRun) step(kind, i int) error {
	if r.k == 1 && kind == stepCompute {
		if err := r.step(stepIn, i); err != nil {
			return err
		}
	}
	if err := r.ctx.Err(); err != nil {
		return err
	}
	enq := time.Now()
	var err error
	switch kind {
	case stepIn:
		err = r.copyIn(i)
	case stepCompute:
		err = r.compute(i)
	case stepOut:
		err = r.copyOut(i)
	}
	if err != nil {
		return fmt.Errorf("vram: batch: chunk %d of %d: %w", r.chunks[i].index+1, r.total, err)
	}
	if err := r.tl.mark(kind, i, enq); err != nil {
		return fmt.Errorf("vram: batch: chunk %d of %d: time the %s: %w", r.chunks[i].index+1, r.total, stepNames[kind], err)
	}
	return nil
}

// span is chunk i's runs along a's axis.
func (r *batchRun) span(a *batchArr, i int) Span {
	return Span{Axis: a.axis, Start: r.chunks[i].start, Len: r.chunks[i].len}
}

// copyIn fills chunk i's staging buffers and enqueues its copies in on s.
func (r *batchRun) copyIn(i int) error {
	buf := i % r.k
	for _, a := range r.arrs {
		if a.out || (a.whole && i > 0) {
			continue
		}
		d := a.dev[buf]
		if a.whole {
			if err := r.m.toDevice(a.client, d, a.host); err != nil {
				return fmt.Errorf("copy in %s: %w", a.name, err)
			}
			r.moved[stepIn][i] += d.Bytes()
			continue
		}
		sp := r.span(a, i)
		src := a.host
		if a.staged() {
			src = a.stage[i%len(a.stage)]
			if err := r.fill(a, src, sp); err != nil {
				return err
			}
			sp.Start = 0
		}
		if err := r.m.toDeviceChunk(a.client, d, src, sp); err != nil {
			return fmt.Errorf("copy in %s: %w", a.name, err)
		}
		r.moved[stepIn][i] += uint64(sp.Len) * a.run
	}
	if r.k > 1 {
		if err := r.inReady[buf].Record(r.s); err != nil {
			return fmt.Errorf("record the copies in: %w", err)
		}
	}
	return nil
}

// fill writes chunk sp's runs into the staging buffer h.
func (r *batchRun) fill(a *batchArr, h *HostArray, sp Span) error {
	if a.fill != nil {
		if err := a.fill(sp, h); err != nil {
			return fmt.Errorf("fill %s: %w", a.name, err)
		}
		return nil
	}
	return hostChunkCopy(h, a.host, sp, true)
}

// hostChunkCopy copies runs sp of the full-length host array full into
// the first sp.Len runs of the chunk-shaped stage (toStage), or back.
func hostChunkCopy(stage, full *HostArray, sp Span, toStage bool) error {
	cc, err := planChunkCopy(full.shape, stage.shape, full.dtype.Size(), sp)
	if err != nil {
		return fmt.Errorf("stage %v: %w", full, err)
	}
	// A file-backed array whose file shrank (or whose disk filled)
	// faults: an error, not the end of the process.
	return safecopy.Do(func() {
		for row := range cc.rows {
			st := stage.data[row*cc.devPitch:][:cc.width]
			fu := full.data[cc.hostOff+row*cc.hostPitch:][:cc.width]
			if toStage {
				copy(st, fu)
			} else {
				copy(fu, st)
			}
		}
	})
}

// compute enqueues chunk i's compute step on ks, after its copies in.
func (r *batchRun) compute(i int) error {
	buf := i % r.k
	if r.k > 1 {
		if err := r.inReady[buf].Wait(r.ks); err != nil {
			return fmt.Errorf("order the compute after the copies in: %w", err)
		}
	}
	dc := r.chunks[i]
	ch := &Chunk{Index: dc.index, Chunks: r.total, Start: dc.start, Len: dc.len, ChunkLength: r.plan.ChunkLength,
		Buffer: buf, Stream: r.ks, dev: r.m.dev, sets: r.sets[buf]}
	if err := r.b.Compute(r.ctx, ch); err != nil {
		return err
	}
	if r.k > 1 {
		if err := r.kernDone[buf].Record(r.ks); err != nil {
			return fmt.Errorf("record the compute's end: %w", err)
		}
	}
	return nil
}

// copyOut enqueues chunk i's copies out on s, after its compute.
func (r *batchRun) copyOut(i int) error {
	buf, slot := i%r.k, i%(r.lag+1)
	if r.k > 1 {
		if err := r.kernDone[buf].Wait(r.s); err != nil {
			return fmt.Errorf("order the copies out after the compute: %w", err)
		}
	}
	for _, a := range r.arrs {
		if !a.out || (a.whole && i < r.n-1) {
			continue
		}
		d := a.dev[buf]
		if a.whole {
			if err := r.m.fromDevice(a.client, a.host, d); err != nil {
				return fmt.Errorf("copy out %s: %w", a.name, err)
			}
			r.moved[stepOut][i] += d.Bytes()
			continue
		}
		sp := r.span(a, i)
		dst := a.host
		if a.staged() {
			dst, sp.Start = a.stage[i%len(a.stage)], 0
		}
		if err := r.m.fromDeviceChunk(a.client, dst, d, sp); err != nil {
			return fmt.Errorf("copy out %s: %w", a.name, err)
		}
		r.moved[stepOut][i] += uint64(sp.Len) * a.run
	}
	if err := r.done[slot].Record(r.s); err != nil {
		return fmt.Errorf("record the copies out: %w", err)
	}
	return nil
}

// retireUpTo retires the chunks before upTo that are not yet: waits for
// their copies out, drains their staged outputs, reports progress.
func (r *batchRun) retireUpTo(upTo int) error {
	for ; r.retired < upTo; r.retired++ {
		i := r.retired
		slot := i % (r.lag + 1)
		if err := r.done[slot].Synchronize(); err != nil {
			return fmt.Errorf("vram: batch: chunk %d of %d: wait for the copies out: %w", r.chunks[i].index+1, r.total, err)
		}
		for _, a := range r.arrs {
			if !a.out || !a.staged() {
				continue
			}
			sp := r.span(a, i)
			var err error
			if a.drain != nil {
				err = a.drain(sp, a.stage[i%len(a.stage)])
			} else {
				err = hostChunkCopy(a.stage[i%len(a.stage)], a.host, sp, false)
			}
			if err != nil {
				return fmt.Errorf("vram: batch: chunk %d of %d: drain %s: %w", r.chunks[i].index+1, r.total, a.name, err)
			}
		}
		r.rep.BytesIn += r.moved[stepIn][i]
		r.rep.BytesOut += r.moved[stepOut][i]
		if r.b.Progress != nil {
			start, n := r.chunks[i].start, r.chunks[i].len
			r.b.Progress(Progress{Chunk: i + 1, Chunks: r.total, Start: start, Len: n,
				BytesIn: r.rep.BytesIn, BytesOut: r.rep.BytesOut, Elapsed: time.Since(r.start)})
		}
	}
	return nil
}
