package vram

// Setting up a batch run: resolving each host side to its device arrays
// and chunk axis, and making the streams, events and staging buffers the
// run needs (freed by finish, whatever happens).

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/vramkit/vram/device"
)

// batchRun is one RunBatch call's state, used by its goroutine only.
type batchRun struct {
	ctx  context.Context
	m    *Manager
	b    Batch
	plan ChunkPlan
	runs int // the batch's runs (plan.TotalRuns, or b.Runs when it counts none)
	n, k int // chunks (for a part of a multi-device batch: the most it may take), buffers in flight
	lag  int // chunks the host stays ahead of the device

	arrs []*batchArr
	sets []map[*ArrayResponse]map[string]*DeviceArray // per buffer

	s, ks    device.Stream  // the group's stream (copies); the compute stream (s when k = 1)
	ownKS    bool           // ks was made by the run
	inReady  []device.Event // per buffer, k > 1: its copies in are done
	kernDone []device.Event // per buffer, k > 1: its compute is done
	done     []device.Event // per staging slot: its chunk's copies out are done
	tl       *timeline

	// The chunks the run takes, in the order it runs them: from next
	// (its plan's, or a multi-device batch's dealer) as it needs them.
	chunks    []dealtChunk
	next      func() (dealtChunk, bool)
	ended     bool    // next said there are no more
	total     int     // the batch's chunks, for messages
	deal      *dealer // a multi-device batch's; nil for RunBatch
	axes      []int   // deal's chunk axis per array, for arrays allocated full length; nil unless deal
	resolving int     // the array resolve is at
	rep       BatchReport
	moved     [3][]uint64 // [stepIn or stepOut][chunk]: bytes the chunk's copies move
	enqueued  int         // chunks whose three steps are all enqueued
	retired   int         // chunks back on the host
	start     time.Time
}

// batchArr is one host side, resolved.
type batchArr struct {
	BatchArray
	client *Client
	name   string         // "label of client", for messages
	dev    []*DeviceArray // per buffer
	whole  bool           // allocated whole: copied once
	axis   int            // the chunk axis, unless whole
	stage  []*HostArray   // per staging slot, when staged
	run    uint64         // device bytes per run along axis
}

func (a *batchArr) staged() bool { return a.stage != nil }

func batchErr(format string, args ...any) error {
	return fmt.Errorf("vram: batch: "+format+": %w", append(args, ErrBatch)...)
}

// newBatchRun checks b and makes what the run needs; on an error it
// leaves nothing behind.
func newBatchRun(ctx context.Context, c *Client, b Batch, deal *dealer) (*batchRun, error) {
	if c == nil {
		return nil, batchErr("a nil client; pass a client of the batch's group")
	}
	if b.Compute == nil || len(b.Arrays) == 0 {
		return nil, batchErr("a batch needs a Compute step and at least one array (In, Out, InFunc, OutFunc)")
	}
	m := c.m
	s, err := m.stream(c)
	if err != nil {
		return nil, fmt.Errorf("vram: batch: %w", err)
	}
	r := &batchRun{ctx: ctx, m: m, b: b, s: s, ks: s, deal: deal}
	if err := r.resolvePlan(); err != nil {
		return nil, err
	}
	if err := r.dealFrom(deal); err != nil {
		return nil, err
	}
	group, err := m.streamGroup(c)
	if err != nil {
		return nil, fmt.Errorf("vram: batch: %w", err)
	}
	for i, ba := range b.Arrays {
		r.resolving = i
		a, err := r.resolve(i, ba, group)
		if err != nil {
			return nil, err
		}
		r.arrs = append(r.arrs, a)
	}
	r.sets = make([]map[*ArrayResponse]map[string]*DeviceArray, r.k)
	for buf := range r.k {
		r.sets[buf] = map[*ArrayResponse]map[string]*DeviceArray{}
		for _, a := range r.arrs {
			r.sets[buf][a.resp] = deviceSet(a.resp, buf)
		}
	}
	if err := r.makeResources(); err != nil {
		_, _ = r.finish(err)
		return nil, err
	}
	return r, nil
}

// deviceSet is response resp's device arrays of buffer buf.
func deviceSet(resp *ArrayResponse, buf int) map[string]*DeviceArray {
	if buf < len(resp.Buffers) {
		return resp.Buffers[buf].Device
	}
	return resp.Arrays
}

// resolvePlan takes the plan from the first response, checks that every
// response comes from the same allocation, and picks the buffers.
func (r *batchRun) resolvePlan() error {
	avail := MaxBatchBuffers
	for i, ba := range r.b.Arrays {
		if ba.resp == nil {
			return batchErr("array %d (%q) has a nil response; pass the ArrayResponse its client was given (Allocate returns the caller's; every other member's comes to its OnAllocated hook)", i, ba.label)
		}
		if i == 0 {
			r.plan = ba.resp.Plan
		} else if p := ba.resp.Plan; p.Chunks != r.plan.Chunks || p.ChunkLength != r.plan.ChunkLength || p.TotalRuns != r.plan.TotalRuns {
			return batchErr("array %q: its response's plan (%d chunks of %d runs) differs from the first array's (%d of %d); pass responses of one Allocate",
				ba.label, p.Chunks, p.ChunkLength, r.plan.Chunks, r.plan.ChunkLength)
		}
		avail = min(avail, max(len(ba.resp.Buffers), 1))
	}
	r.n, r.runs = max(r.plan.Chunks, 1), r.plan.TotalRuns
	if r.runs == 0 {
		// Nothing was chunkable (a run axis of length 1 is not): one
		// chunk of the batch's runs.
		r.n, r.runs = 1, max(r.b.Runs, 1)
		r.plan.ChunkLength, r.plan.LastChunkLength, r.plan.TotalRuns = r.runs, r.runs, r.runs
	}
	switch k := r.b.Buffers; {
	case k < 0 || k > MaxBatchBuffers:
		return batchErr("%d buffers in flight: want 1 to %d, or 0 for as many as were allocated", k, MaxBatchBuffers)
	case r.n == 1:
		r.k = 1
	case k == 0:
		r.k = avail
	case k > avail:
		return batchErr("%d buffers in flight, but the arrays were allocated with %d; allocate with WithBuffers(%d)", k, avail, k)
	default:
		r.k = k
	}
	r.lag = max(1, r.k-1)
	r.moved[stepIn], r.moved[stepOut] = make([]uint64, r.n), make([]uint64, r.n)
	r.rep = BatchReport{Chunks: r.n, Buffers: r.k, Lag: r.lag}
	return nil
}

// resolve finds array i's device arrays and chunk axis, and whether it is
// staged.
func (r *batchRun) resolve(i int, ba BatchArray, group string) (*batchArr, error) {
	a := &batchArr{BatchArray: ba, client: ba.resp.Client}
	a.name = fmt.Sprintf("%q of %v", ba.label, a.client)
	if g, err := r.m.streamGroup(a.client); err != nil {
		return nil, fmt.Errorf("vram: batch: array %s: %w", a.name, err)
	} else if g != group {
		return nil, batchErr("array %s: its client is in group %q, not the batch's %q; run a batch per group", a.name, g, group)
	}
	for buf := range r.k {
		d := deviceSet(ba.resp, buf)[ba.label]
		if d == nil {
			return nil, batchErr("array %d: %s has no device array %q; its labels are %s%s", i, a.client, ba.label,
				strings.Join(slices.Sorted(maps.Keys(deviceSet(ba.resp, buf))), ", "), r.holderHint(ba.label, group))
		}
		a.dev = append(a.dev, d)
	}
	if ba.out && ba.drain == nil && ba.host == nil || !ba.out && ba.fill == nil && ba.host == nil {
		return nil, batchErr("array %s: no host array and no function; give one", a.name)
	}
	ds := a.dev[0].shape
	var err error
	if ba.host != nil {
		err = r.inferAxis(a, ds)
	} else if a.axis = ba.axis; ba.axis < 0 || ba.axis >= len(ds) || (r.n > 1 && ds[ba.axis] != r.plan.ChunkLength) {
		err = batchErr("array %s: axis %d of its shape %v is not its chunk axis (the one of length %d)", a.name, ba.axis, ds, r.plan.ChunkLength)
	}
	if err != nil {
		return nil, err
	}
	if !a.whole {
		a.run = a.dev[0].Bytes() / uint64(max(ds[a.axis], 1))
	}
	if ba.fill != nil || ba.drain != nil || (ba.host.memory == Pageable && !a.whole) {
		// An input's buffer is refilled k−1 chunks ahead of its compute,
		// so it needs k−1 more than an output's to be free again by then.
		slots := r.lag + 1
		if !ba.out {
			slots = r.lag + r.k
		}
		// No more than the batch has chunks.
		a.stage = make([]*HostArray, min(slots, r.n))
		r.rep.Staged++
	}
	return a, nil
}

// holderHint names another member of group that holds device arrays
// under label, for the error of a label asked of the wrong response.
func (r *batchRun) holderHint(label, group string) string {
	for _, c := range r.m.GroupMembers(group) {
		if c.Arrays()[label] != nil {
			return fmt.Sprintf("; %q is %v's: pass %v's ArrayResponse, which its OnAllocated hook receives", label, c, c)
		}
	}
	return ""
}

// inferAxis finds the chunk axis of a host side given as a full-length
// host array: the one axis where the host array has the batch's runs and
// the device array the chunk length; equal shapes mean the array was
// allocated whole.
func (r *batchRun) inferAxis(a *batchArr, ds []int) error {
	h := a.host
	if h.Freed() {
		return batchErr("array %s: host array %v was freed", a.name, h)
	}
	if h.dtype != a.dev[0].dtype || len(h.shape) != len(ds) {
		return batchErr("array %s: host array %v does not match device array %v; give it the device array's dtype and rank", a.name, h, a.dev[0])
	}
	var diff []int
	for ax := range ds {
		if h.shape[ax] != ds[ax] {
			diff = append(diff, ax)
		}
	}
	switch {
	case len(diff) == 0 && r.deal != nil && r.axes != nil && r.axes[r.resolving] >= 0:
		// A part allocated full length in a batch dealt in chunks.
		a.axis = r.axes[r.resolving]
	case len(diff) == 0 && r.deal != nil && r.axes == nil && r.deal.total > 1 && slices.Contains(h.shape, r.runs):
		return batchErr("array %s: host array %v has the shape of its device array, so its chunk axis cannot be told, and the batch is dealt in %d chunks; give it with InFunc or OutFunc",
			a.name, h, r.deal.total)
	case len(diff) == 0:
		a.whole = true
	case len(diff) == 1 && h.shape[diff[0]] == r.runs && ds[diff[0]] == r.plan.ChunkLength:
		a.axis = diff[0]
	default:
		return batchErr("array %s: host array %v and device array %v: want the same shape but for the chunk axis, of %d runs on the host and %d on the device",
			a.name, h, a.dev[0], r.runs, r.plan.ChunkLength)
	}
	return nil
}

// makeResources takes the staging buffers (which may lower k and lag),
// makes the compute stream and the events, and starts the timeline.
func (r *batchRun) makeResources() error {
	dev := r.m.dev
	if err := r.acquireStaging(); err != nil {
		return err
	}
	ev := func() (device.Event, error) {
		e, err := dev.NewEvent()
		if err != nil {
			return nil, fmt.Errorf("vram: batch: make an event: %w", err)
		}
		return e, nil
	}
	if r.k > 1 {
		ks, err := dev.NewStream()
		if err != nil {
			return fmt.Errorf("vram: batch: make the compute stream: %w", err)
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
	tl, err := newTimeline(dev, r.s, r.ks, r.n, 2*(r.lag+2))
	if err != nil {
		return fmt.Errorf("vram: batch: %w", err)
	}
	r.tl = tl
	return nil
}

// finish waits for what was enqueued when err is set, frees what the run
// made, and completes the report.
func (r *batchRun) finish(err error) (BatchReport, error) {
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
	if r.deal != nil {
		r.rep.Chunks = len(r.chunks)
	}
	if cerr := errors.Join(errs...); cerr != nil {
		err = errors.Join(err, fmt.Errorf("vram: batch: clean up: %w", cerr))
	}
	return r.rep, err
}
