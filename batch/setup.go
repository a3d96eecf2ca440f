package batch

// Setting up a batch run: each array's host side checked against its
// request, its chunk axis from the request, and the streams, events and
// staging buffers the run needs (freed by finish, whatever happens).

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/vramkit/vram"
	"github.com/vramkit/vram/device"
)

// batchRun is one Run's state (or one part's of RunParts), used by its
// goroutine only.
type batchRun struct {
	ctx      context.Context
	copyCtx  context.Context // ctx without its cancellation: the copies of a step are enqueued whatever it says meanwhile
	b        *Batch
	compute  Compute
	progress func(Progress)
	dev      device.Device
	stride   int // the arrays' length along their chunk axes (Chunk.ChunkLength)
	length   int // the runs a chunk is cut at: at most stride
	total    int // the batch's chunks (every part's), for messages and progress
	k, lag   int // buffers in flight; chunks the host stays ahead of the device

	arrs []*batchArr // the arrays copied in or out

	s, ks    device.Stream  // the group's stream (copies); the compute stream (s when k = 1)
	ownKS    bool           // ks was made by the run
	inReady  []device.Event // per buffer, k > 1: its copies in are done
	kernDone []device.Event // per buffer, k > 1: its compute is done
	done     []device.Event // per staging slot: its chunk's copies out are done
	tl       *timeline

	// The chunks the run takes, in the order it runs them, from q as it
	// needs them.
	q        *runQueue
	chunks   []dealtChunk
	ended    bool // q said there are no more
	rep      Report
	enqueued int // chunks whose three steps are all enqueued
	retired  int // chunks back on the host
	atKind   int // the step under way (stepIn … stepRetire), for a panic's error
	atChunk  int // the chunk it is of
	start    time.Time
}

// batchArr is an input or output of the batch, resolved for a run.
type batchArr struct {
	*Array
	whole bool              // unchunkable: copied once
	axis  int               // the chunk axis, unless whole
	stage []*vram.HostArray // per staging slot, when staged
	run   uint64            // device bytes per run along axis
}

func (a *batchArr) staged() bool { return a.stage != nil }

func batchErr(format string, args ...any) error {
	return fmt.Errorf("batch: "+format+": %w", append(args, ErrBatch)...)
}

// newRun checks b and makes what the run needs, taking its chunks from
// q (nil: a queue of b's own runs); on an error it leaves nothing behind.
func newRun(ctx context.Context, b *Batch, compute Compute, o Options, q *runQueue) (*batchRun, error) {
	switch {
	case b == nil || !b.ok:
		return nil, batchErr("the batch is not allocated; Allocate it first")
	case compute == nil:
		return nil, batchErr("no compute step; give Run a Compute")
	case o.MaxChunkLength < 0:
		return nil, batchErr("MaxChunkLength %d: want 0 (no cap) or more", o.MaxChunkLength)
	}
	s, err := b.arrays[0].client.Stream()
	if err != nil {
		return nil, fmt.Errorf("batch: %w", err)
	}
	r := &batchRun{ctx: ctx, copyCtx: context.WithoutCancel(ctx), b: b, compute: compute,
		dev: b.arrays[0].client.Manager().Device(), stride: chunkLength(b, Options{}), length: chunkLength(b, o), s: s, ks: s, q: q}
	if r.q == nil {
		r.q = newRunQueue(b.runs, r.length)
	}
	r.total = r.q.total
	if err := r.pickBuffers(o.Buffers); err != nil {
		return nil, err
	}
	for _, a := range b.arrays {
		if a.dir == dirScratch {
			continue
		}
		ra, err := r.resolve(a)
		if err != nil {
			return nil, err
		}
		r.arrs = append(r.arrs, ra)
	}
	if err := r.makeResources(); err != nil {
		_, _ = r.finish(err)
		return nil, err
	}
	return r, nil
}

// chunkLength is the runs b's chunks are cut at: its arrays' chunk
// length (all its runs when nothing was chunkable), capped by o.
func chunkLength(b *Batch, o Options) int {
	n := b.runs
	if b.plan.TotalRuns > 0 {
		n = b.plan.ChunkLength
	}
	if o.MaxChunkLength > 0 {
		n = min(n, o.MaxChunkLength)
	}
	return max(n, 1)
}

// pickBuffers sets the buffers in flight from what was asked and what
// was allocated.
func (r *batchRun) pickBuffers(asked int) error {
	avail := min(len(r.b.arrays[0].dev), MaxBuffers)
	switch k := asked; {
	case k < 0 || k > MaxBuffers:
		return batchErr("%d buffers in flight: want 1 to %d, or 0 for as many as were allocated", k, MaxBuffers)
	case r.total == 1:
		r.k = 1
	case k == 0:
		r.k = avail
	case k > avail:
		return batchErr("%d buffers in flight, but the arrays were allocated with %d; allocate with vram.WithBuffers(%d)", k, avail, k)
	default:
		r.k = k
	}
	r.lag = max(1, r.k-1)
	r.rep = Report{Chunks: r.total, Buffers: r.k, Lag: r.lag}
	return nil
}

// resolve checks a's host side against its request and finds its chunk
// axis, and whether it is staged.
func (r *batchRun) resolve(a *Array) (*batchArr, error) {
	ra := &batchArr{Array: a, whole: !a.req.Chunkable(), axis: a.req.ChunkAxis}
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
		if d.Dim(ra.axis) < r.length {
			return nil, batchErr("%v %v: device array %v is shorter along its chunk axis %d than the chunks of %d runs; allocate every array for the same batch",
				a.dir, a, d, ra.axis, r.length)
		}
		ra.run = d.Bytes() / uint64(d.Dim(ra.axis))
	}
	if a.side.fill != nil || a.side.drain != nil || (a.side.host.Memory() == vram.Pageable && !ra.whole) {
		// An input's buffer is refilled k−1 chunks ahead of its compute,
		// so it needs k−1 more than an output's to be free again by then;
		// and none needs more than the batch has chunks.
		ra.stage = make([]*vram.HostArray, min(r.slots(ra), r.total))
		r.rep.Staged++
	}
	return ra, nil
}

// makeResources takes the staging buffers (which may lower k and lag),
// makes the compute stream and the events, and starts the timeline.
func (r *batchRun) makeResources() error {
	if err := r.acquireStaging(); err != nil {
		return err
	}
	ev := func() (device.Event, error) {
		e, err := r.dev.NewEvent()
		if err != nil {
			return nil, fmt.Errorf("batch: make an event: %w", err)
		}
		return e, nil
	}
	if r.k > 1 {
		ks, err := r.dev.NewStream()
		if err != nil {
			return fmt.Errorf("batch: make the compute stream: %w", err)
		}
		r.ks, r.ownKS = ks, true
		for range r.k {
			for _, list := range []*[]device.Event{&r.inReady, &r.kernDone} {
				e, err := ev()
				if err != nil {
					return err
				}
				*list = append(*list, e)
			}
		}
	}
	for range r.lag + 1 {
		e, err := ev()
		if err != nil {
			return err
		}
		r.done = append(r.done, e)
	}
	tl, err := newTimeline(r.dev, r.s, r.ks, 2*(r.lag+2))
	if err != nil {
		return fmt.Errorf("batch: %w", err)
	}
	r.tl = tl
	return nil
}

// finish waits for what was enqueued when err is set, frees what the run
// made, and completes the report.
func (r *batchRun) finish(err error) (Report, error) {
	if err != nil {
		_ = r.s.Synchronize()
		if r.ks != r.s {
			_ = r.ks.Synchronize()
		}
	}
	var errs []error
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
	for _, a := range r.arrs {
		for _, h := range a.stage {
			if h != nil {
				errs = append(errs, h.Free())
			}
		}
	}
	if !r.start.IsZero() {
		r.rep.Wall = time.Since(r.start)
	}
	r.rep.ChunksDone = r.retired
	if r.q.shared {
		r.rep.Chunks = len(r.chunks)
	}
	if cerr := errors.Join(errs...); cerr != nil {
		err = errors.Join(err, fmt.Errorf("batch: clean up: %w", cerr))
	}
	return r.rep, err
}
