package batch

// A batch on several devices: RunParts deals the chunks of one global
// chunking to one part per device (a client of that device's manager and
// the Batch with that device's arrays), each part taking the next chunk
// when it has a buffer free, so a faster device takes more chunks.
//
// One chunking. The batch's R runs are cut into G chunks of one length
// L, the shortest chunk length of the parts' plans (each part planned
// its device's memory; a part whose plan is longer runs each chunk in the
// first L runs of its arrays). Chunk g is runs [g·L, min((g+1)·L, R)),
// whichever device runs it, and its outputs land at those runs of the
// host arrays (or in the drain function's span), so the results do not
// depend on how the chunks were dealt, provided the kernel's result for a
// run depends on that run's inputs alone.
//
// Threads. Each part runs on its own goroutine, locked to its OS thread
// for the whole batch: a backend whose context is per thread (CUDA) then
// keeps one context current on that thread, and the parts' driver calls
// run in parallel.
//
// Failure. The first part to fail stops the dealing and cancels the
// others, which finish what they enqueued; RunParts returns that
// part's error, naming the device.

import (
	"context"
	"errors"
	"fmt"
	"github.com/vramkit/vram"
	"runtime"
	"sync"
	"time"
)

// Part is one device's part of a batch run by RunParts: a client
// of the group whose responses Batch's arrays name, and the Batch. Every
// part's Batch lists the same host sides in the same order (the same
// host arrays or fill and drain functions) with its own device's
// responses, and a Compute for its device; Progress is ignored (give it
// to RunParts). A plain value.
type Part struct {
	Client *vram.Client
	Batch  Batch
}

// PartsReport is what a multi-device batch did. A plain value.
type PartsReport struct {
	Chunks      int // the batch's chunks
	ChunkLength int // runs per chunk (the last may have fewer)
	ChunksDone  int // chunks back on the host, every part together
	// Parts is each part's report, in the order of the parts: Chunks is
	// the chunks the part took, ChunksDone those back on the host.
	Parts    []Report
	BytesIn  uint64
	BytesOut uint64
	Wall     time.Duration
}

// PartsOptions tune RunParts. The zero value deals chunks of the
// parts' shortest chunk length and reports no progress. A plain value.
type PartsOptions struct {
	// MaxChunkLength, when positive, caps the batch's chunk length, so
	// that a batch that fits every device whole is still spread over
	// them (at least ceil(runs / MaxChunkLength) chunks).
	MaxChunkLength int
	// Progress, when set, is called as each chunk is back on the host,
	// one call at a time, with Chunk counting the batch's chunks done.
	Progress func(Progress)
}

// dealtChunk is one chunk of a batch: index of the batch's chunks, and
// its runs.
type dealtChunk struct{ index, start, len int }

// dealer hands out the chunks of one chunking, in order, to whichever
// part asks next. Safe for concurrent use.
type dealer struct {
	runs, length, total int
	axes                []int // chunk axis per array (-1: allocated whole), from a part chunked like the batch; nil if none is

	mu       sync.Mutex // protects the fields below
	next     int
	stopped  bool
	done     int
	in, out  []uint64 // per part: bytes moved, as its last progress said
	progress func(Progress)
	start    time.Time
}

// take deals the next chunk, or says there is none.
func (d *dealer) take() (dealtChunk, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.stopped || d.next >= d.total {
		return dealtChunk{}, false
	}
	g := d.next
	d.next++
	start := g * d.length
	return dealtChunk{index: g, start: start, len: min(d.length, d.runs-start)}, true
}

func (d *dealer) stop() {
	d.mu.Lock()
	d.stopped = true
	d.mu.Unlock()
}

// progressOf is part's Progress callback: it counts the batch's chunks
// and bytes and calls d.progress, one call at a time.
func (d *dealer) progressOf(part int) func(Progress) {
	return func(p Progress) {
		d.mu.Lock()
		defer d.mu.Unlock()
		d.done++
		d.in[part], d.out[part] = p.BytesIn, p.BytesOut
		if d.progress == nil {
			return
		}
		var in, out uint64
		for i := range d.in {
			in, out = in+d.in[i], out+d.out[i]
		}
		d.progress(Progress{Chunk: d.done, Chunks: d.total, Start: p.Start, Len: p.Len,
			BytesIn: in, BytesOut: out, Elapsed: time.Since(d.start)})
	}
}

// partShape is a part's runs and chunk length, from its first array's
// plan.
func partShape(p Part, i int) (runs, length int, err error) {
	if p.Client == nil || len(p.Batch.Arrays) == 0 || p.Batch.Arrays[0].resp == nil {
		return 0, 0, batchErr("part %d: give a client and arrays with their responses", i)
	}
	plan := p.Batch.Arrays[0].resp.Plan
	if plan.TotalRuns == 0 {
		n := max(p.Batch.Runs, 1)
		return n, n, nil
	}
	return plan.TotalRuns, plan.ChunkLength, nil
}

// newDealer checks that the parts have the same runs and makes the
// chunking of the shortest chunk length.
func newDealer(parts []Part, o PartsOptions) (*dealer, error) {
	if len(parts) == 0 {
		return nil, batchErr("no parts; give one per device")
	}
	if o.MaxChunkLength < 0 {
		return nil, batchErr("MaxChunkLength %d: want 0 (no cap) or more", o.MaxChunkLength)
	}
	d := &dealer{in: make([]uint64, len(parts)), out: make([]uint64, len(parts)), progress: o.Progress}
	for i, p := range parts {
		runs, length, err := partShape(p, i)
		if err != nil {
			return nil, err
		}
		if len(p.Batch.Arrays) != len(parts[0].Batch.Arrays) {
			return nil, batchErr("part %d has %d arrays and part 0 %d; give every part the same host sides", i, len(p.Batch.Arrays), len(parts[0].Batch.Arrays))
		}
		if i > 0 && runs != d.runs {
			return nil, batchErr("part %d has %d runs and part 0 %d; allocate every part for the same batch", i, runs, d.runs)
		}
		d.runs = runs
		if i == 0 || length < d.length {
			d.length = length
		}
	}
	if o.MaxChunkLength > 0 {
		d.length = min(d.length, o.MaxChunkLength)
	}
	d.total = (d.runs + d.length - 1) / d.length
	return d, nil
}

// dealFrom sets where r takes its chunks: its own plan in order (deal
// nil), or deal.
func (r *batchRun) dealFrom(deal *dealer) error {
	if deal == nil {
		r.total = r.n
		r.next = func() (dealtChunk, bool) {
			i := len(r.chunks)
			if i >= r.n {
				return dealtChunk{}, false
			}
			start := i * r.plan.ChunkLength
			return dealtChunk{index: i, start: start, len: min(r.plan.ChunkLength, r.runs-start)}, true
		}
		return nil
	}
	r.n, r.total, r.next, r.axes = deal.total, deal.total, deal.take, deal.axes
	r.moved[stepIn], r.moved[stepOut] = make([]uint64, r.n), make([]uint64, r.n)
	return nil
}

// take makes sure the run has its chunk i (0-based, in its own order),
// taking the next one if i is the next; false when there is none.
func (r *batchRun) take(i int) bool {
	if i < len(r.chunks) {
		return true
	}
	if r.ended || i > len(r.chunks) {
		return false
	}
	ch, ok := r.next()
	if !ok {
		r.ended = true
		return false
	}
	r.chunks = append(r.chunks, ch)
	return true
}

// RunParts runs one batch on several devices: parts holds one part per
// device (see Part), each allocated for the batch's runs on its
// device's manager. The batch's chunks (one chunking, of the parts' plans'
// shortest chunk length or o.MaxChunkLength; see the overview at the top
// of the file) are dealt to the parts as each has a buffer free; each
// part runs its chunks as Run does, on its own goroutine locked to
// its OS thread.
//
// A part whose device holds the batch whole has arrays of the batch's
// full length, and an In or Out host array of that shape looks like an
// array allocated whole: its chunk axis is taken from a part chunked like
// the batch, and with none it is an error (give the arrays with InFunc
// and OutFunc, whose axes are explicit).
//
// It returns when every chunk is back, or when a part fails or ctx is
// done, after every part's enqueued work has finished. An output
// allocated whole (not chunked) cannot be gathered from several devices:
// a batch of more than one chunk with one is refused. Safe to call from
// several goroutines for batches of different groups.
func RunParts(ctx context.Context, parts []Part, o PartsOptions) (PartsReport, error) {
	deal, err := newDealer(parts, o)
	if err != nil {
		return PartsReport{}, err
	}
	rep := PartsReport{Chunks: deal.total, ChunkLength: deal.length, Parts: make([]Report, len(parts))}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	runs, err := prepareParts(ctx, parts, deal)
	if err != nil {
		return rep, err
	}
	errs := make([]error, len(parts))
	var wg sync.WaitGroup
	deal.start = time.Now()
	for i, r := range runs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			var err error
			if end, merr := markBatch(parts[i].Client, r.b); merr != nil {
				rep.Parts[i], err = r.finish(merr)
			} else {
				rep.Parts[i], err = r.finish(r.run())
				err = errors.Join(err, end())
			}
			if err != nil {
				errs[i] = fmt.Errorf("device %d (%s): %w", i, r.m.Device().Info().Name, err)
				deal.stop()
				cancel(errs[i])
			}
		}()
	}
	wg.Wait()
	rep.Wall = time.Since(deal.start)
	for _, p := range rep.Parts {
		rep.ChunksDone += p.ChunksDone
		rep.BytesIn += p.BytesIn
		rep.BytesOut += p.BytesOut
	}
	return rep, firstCause(ctx, errs)
}

// prepareParts makes each part's run: the parts chunked like the
// dealing first, so that the arrays of a part allocated full length can
// be cut along the axes the others' arrays are. On an error it finishes
// the runs it made.
func prepareParts(ctx context.Context, parts []Part, deal *dealer) ([]*batchRun, error) {
	runs := make([]*batchRun, len(parts))
	fail := func(err error) ([]*batchRun, error) {
		for _, r := range runs {
			if r != nil {
				_, _ = r.finish(nil)
			}
		}
		return nil, err
	}
	for _, full := range []bool{false, true} {
		for i, p := range parts {
			if _, length, _ := partShape(p, i); (length >= deal.runs) != full {
				continue
			}
			b := p.Batch
			b.Progress = deal.progressOf(i)
			r, err := newBatchRun(ctx, p.Client, b, deal)
			if err != nil {
				return fail(fmt.Errorf("device %d: %w", i, err))
			}
			runs[i] = r
			if !full && deal.axes == nil {
				deal.axes = make([]int, len(r.arrs))
				for j, a := range r.arrs {
					deal.axes[j] = a.axis
					if a.whole {
						deal.axes[j] = -1
					}
				}
			}
			for _, a := range r.arrs {
				if a.whole && a.out && deal.total > 1 {
					return fail(batchErr("device %d: output %s is allocated whole, and a batch of %d chunks on several devices cannot gather it; make it chunkable", i, a.name, deal.total))
				}
			}
		}
	}
	return runs, nil
}

// firstCause is the error that stopped the batch: the failure of the
// part that cancelled the others, or, when ctx was done, the first
// part's error.
func firstCause(ctx context.Context, errs []error) error {
	cause := context.Cause(ctx)
	for _, err := range errs {
		if err != nil && err == cause {
			return err
		}
	}
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}
