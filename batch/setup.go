package batch

// Setting up a batch run: each array's host side checked against its
// request, its chunk axis from the request, and the streams, events,
// writer and staging buffers the run needs (freed by finish, whatever
// happens).

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/vramkit/vram"
	"github.com/vramkit/vram/device"
	"github.com/vramkit/vram/internal/units"
)

// batchRun is one Run's state (or one part's of RunParts), used by its
// goroutine only (the writer has its own).
type batchRun struct {
	ctx      context.Context
	copyCtx  context.Context // ctx without its cancellation: the copies of a step are enqueued whatever it says meanwhile
	b        *Batch
	compute  Compute
	progress func(Progress)
	dev      device.Device
	o        Options
	part     int // its place among RunParts' parts (0 for Run)
	stride   int // the arrays' length along their chunk axes (Chunk.ChunkLength)
	length   int // the runs a chunk is cut at: at most stride, the staging's length and o.MaxChunkLength
	k, lag   int // buffers in flight; chunks the host stays ahead of the device
	outSlots int // staging slots per staged output: lag+1, or one more for the writer to drain behind

	arrs []*batchArr // the arrays copied in or out

	s, ks    device.Stream  // the group's stream (copies); the compute stream (made when more than one buffer may be used)
	ownKS    bool           // ks was made by the run
	inReady  []device.Event // per buffer, k > 1: its copies in are done
	kernDone []device.Event // per buffer, k > 1: its compute is done
	done     []device.Event // per chunk of the host's lead: its chunk's copies out are done
	tl       *timeline
	w        *writer

	// The chunks the run takes, in the order it runs them, from q as it
	// needs them, segment by segment (recut.go).
	q        *runQueue
	chunks   []dealtChunk
	ended    bool // q said there are no more
	el       elastic
	rep      Report
	enqueued int // chunks whose three steps are all enqueued
	retired  int // chunks whose copies out are done (handed to the writer)
	atKind   int // the step under way (stepIn … stepRetire), for a panic's error
	atChunk  int // the chunk it is of
	start    time.Time
}

// batchArr is an input or output of the batch, resolved for a run.
type batchArr struct {
	*Array
	dir        direction         // dirIn, dirOut or dirScratch: an InOut array is resolved as one of each
	whole      bool              // unchunkable: copied once
	axis       int               // the chunk axis, unless whole
	stagedSide bool              // copied through staging slots
	stage      []*vram.HostArray // its staging slots, when staged
	run        uint64            // device bytes per run along axis
}

func batchErr(format string, args ...any) error {
	return fmt.Errorf("batch: "+format+": %w", append(args, ErrBatch)...)
}

// newRun checks b and makes what the run needs, taking its chunks from
// q as its part (nil: a queue of b's own runs) and reporting progress to
// progress; on an error it leaves nothing behind.
func newRun(ctx context.Context, b *Batch, compute Compute, o Options, q *runQueue, part int, progress func(Progress)) (*batchRun, error) {
	switch {
	case b == nil || !b.ok:
		return nil, batchErr("the batch is not allocated; Allocate it first")
	case compute == nil:
		return nil, batchErr("no compute step; give Run a Compute")
	case o.MaxChunkLength < 0:
		return nil, batchErr("MaxChunkLength %d: want 0 (no cap) or more", o.MaxChunkLength)
	case o.Buffers < 0 || o.Buffers > MaxBuffers:
		return nil, batchErr("%d buffers in flight: want 1 to %d, or 0 for as many as buy something", o.Buffers, MaxBuffers)
	}
	s, err := b.arrays[0].client.Stream()
	if err != nil {
		return nil, fmt.Errorf("batch: %w", err)
	}
	r := &batchRun{ctx: ctx, copyCtx: context.WithoutCancel(ctx), b: b, compute: compute, o: o, progress: progress,
		dev: b.arrays[0].client.Manager().Device(), s: s, ks: s, q: q, part: part, start: time.Now()}
	if r.q == nil {
		r.q = newRunQueue(b.runs, 1)
	}
	r.stride = b.stride()
	r.length = r.capped(r.stride)
	for _, a := range b.arrays {
		dirs := []direction{a.dir}
		switch a.dir {
		case dirScratch:
			continue
		case dirInOut:
			dirs = []direction{dirIn, dirOut}
		}
		for _, d := range dirs {
			ra, err := r.resolve(a, d)
			if err != nil {
				return nil, err
			}
			r.arrs = append(r.arrs, ra)
		}
	}
	if err := r.setUp(); err != nil {
		_, _ = r.finish(err)
		return nil, err
	}
	return r, nil
}

// capped is n runs capped by o.MaxChunkLength.
func (r *batchRun) capped(n int) int {
	if r.o.MaxChunkLength > 0 {
		n = min(n, r.o.MaxChunkLength)
	}
	return max(n, 1)
}

// setUp picks the first shape (elastic.go), allocates again when an
// explicit count of buffers asks for more than were, takes the staging,
// and makes the streams, events and writer.
func (r *batchRun) setUp() error {
	if err := r.firstShape(); err != nil {
		return err
	}
	// No chunk longer than the queue will cut, and no staging for chunks
	// longer than it cuts next (a device sharing it with others gets its
	// share of them a chunk, its probe first).
	r.length = min(r.length, r.q.most())
	want := min(r.length, r.q.longest(r.part))
	n, err := r.acquireStaging(want)
	if err != nil {
		return err
	}
	if n < want {
		r.rep.Recuts = append(r.rep.Recuts, Recut{Chunk: 0, From: want, To: n, ArraysFrom: r.stride, ArraysTo: r.stride, Buffers: r.k,
			Why: fmt.Sprintf("the staging pool had room for %s of staging, not a chunk of %s", units.Format(r.stagingHeld()), plural(want, "run"))})
	}
	if len(r.staged()) > 0 {
		r.length = n // a chunk fits its staging
	}
	ev := func() (device.Event, error) {
		e, err := r.dev.NewEvent()
		if err != nil {
			return nil, fmt.Errorf("batch: make an event: %w", err)
		}
		return e, nil
	}
	if r.mayOverlap() {
		ks, err := r.dev.NewStream()
		if err != nil {
			return fmt.Errorf("batch: make the compute stream: %w", err)
		}
		r.ks, r.ownKS = ks, true
	}
	for range MaxBuffers {
		for _, list := range []*[]device.Event{&r.inReady, &r.kernDone, &r.done} {
			e, err := ev()
			if err != nil {
				return err
			}
			*list = append(*list, e)
		}
	}
	tl, err := newTimeline(r.dev, r.s, r.ks, 2*(MaxBuffers+2))
	if err != nil {
		return fmt.Errorf("batch: %w", err)
	}
	r.tl = tl
	r.w = newWriter(r)
	r.q.setLength(r.part, r.length)
	r.rep.Buffers, r.rep.Lag = r.k, r.lag
	return nil
}

// resolve checks a's host side against its request and finds its chunk
// axis, and whether it is staged.
func (r *batchRun) resolve(a *Array, dir direction) (*batchArr, error) {
	ra := &batchArr{Array: a, dir: dir, whole: !a.req.Chunkable(), axis: a.req.ChunkAxis}
	if a.side.none() {
		return nil, batchErr("%v %v has no host side; give one (In, Out or Use: Host, Fill, Drain) or make one (MakeHosts)", a.dir, a)
	}
	if ra.whole && a.side.host == nil {
		return nil, batchErr("%v %v is unchunkable, so it is copied once, whole: give it a Host side, not a function", a.dir, a)
	}
	d := a.dev[0]
	if h := a.side.host; h != nil {
		switch {
		case h.Freed():
			return nil, batchErr("%v %v: host array %v was freed", a.dir, a, h)
		case h.DType() != a.req.DType || !slices.Equal(h.Shape(), a.req.Shape):
			return nil, batchErr("%v %v: host array %v does not match its request %v%v; make it with the request's shape and dtype (MakeHosts does)",
				a.dir, a, h, a.req.DType, a.req.Shape)
		}
	}
	if !ra.whole {
		if d.Dim(ra.axis) < r.stride {
			return nil, batchErr("%v %v: device array %v is shorter along its chunk axis %d than the chunks of %d runs; allocate every array for the same batch",
				a.dir, a, d, ra.axis, r.stride)
		}
		ra.run = d.Bytes() / uint64(d.Dim(ra.axis))
	}
	if a.side.fill != nil || a.side.drain != nil || (a.side.host.Memory() == vram.Pageable && !ra.whole) {
		ra.stagedSide = true
		if a.dir != dirInOut || dir == dirIn { // an array, not a direction
			r.rep.Staged++
		}
	}
	return ra, nil
}

// finish waits for what was enqueued when err is set, stops the writer,
// frees what the run made, and completes the report.
func (r *batchRun) finish(err error) (Report, error) {
	if err != nil {
		_ = r.s.Synchronize()
		if r.ks != r.s {
			_ = r.ks.Synchronize()
		}
	}
	r.q.ended(r.part)
	var errs []error
	if r.w != nil {
		var busy time.Duration
		r.rep.ChunksDone, busy, r.rep.BytesIn, r.rep.BytesOut = r.w.stop()
		r.rep.Write += busy
		if werr := r.w.failed(); werr != nil && err == nil {
			err = werr
		}
	}
	if r.tl != nil {
		copyT, computeT, exposed, terr := r.tl.stop()
		r.rep.Copy, r.rep.Compute, r.rep.ExposedCopy = copyT, computeT, exposed
		errs = append(errs, terr)
	}
	for _, list := range [][]device.Event{r.inReady, r.kernDone, r.done} {
		for _, e := range list {
			errs = append(errs, e.Close())
		}
	}
	if r.ownKS {
		errs = append(errs, r.ks.Close())
	}
	errs = append(errs, r.releaseStaging())
	if !r.start.IsZero() {
		r.rep.Wall = time.Since(r.start)
		r.rep.DeviceIdle = max(0, r.rep.Wall-r.rep.Compute-r.rep.ExposedCopy)
	}
	r.rep.Chunks, r.rep.RunsLeft = len(r.chunks), r.q.runsLeft()
	for _, c := range r.chunks[:min(r.rep.ChunksDone, len(r.chunks))] {
		r.rep.Runs += c.len
	}
	if cerr := errors.Join(errs...); cerr != nil {
		err = errors.Join(err, fmt.Errorf("batch: clean up: %w", cerr))
	}
	return r.rep, err
}
