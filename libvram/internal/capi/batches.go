package capi

// Batches: the batch package's pipeline driven from C, chunk by chunk, so
// that the program's own thread launches each chunk's kernels (a Python
// loop, Numba). Start declares the arrays, allocates them with one
// allocation of their group and starts batch.Run on a goroutine of its
// own; its compute step hands each chunk to Next, on the program's thread,
// and returns once the program calls Next again (the chunk's kernels are
// enqueued) or the batch is cancelled. Everything else is the pipeline's:
// buffers in flight, copies of one chunk beside another's kernels on a
// stream of the batch's own, the events between them, outputs copied back
// behind the kernels, staging, re-cuts when the budget changes (the
// arrays are then allocated again: each chunk describes its own), the
// work marks, cancellation and the report.
//
// Kernels on the host. When the program's kernels run on the host at their
// launch (Numba's CUDA simulator over the simulated memory), Next hands a
// chunk over only once its compute stream has done the work before it:
// its copies in. A kernel that ran at its launch is done when Next is
// called again, so the copies out, ordered after it, read what it wrote.
//
// Locking: a batch's mu serializes Next, Cancel and Close; Clients.mu
// protects the map of batches, and is not held while one waits.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"unsafe"

	"github.com/vramkit/vram"
	"github.com/vramkit/vram/batch"
	"github.com/vramkit/vram/device"
)

// BatchDir is what the pipeline does with an array (vram.h's enum
// vram_batch_dir).
type BatchDir int32

// The directions.
const (
	BatchIn      BatchDir = iota // copied in before each chunk's kernels
	BatchOut                     // copied out after them
	BatchInOut                   // both, at the same runs of one host array
	BatchScratch                 // neither: the kernels' own
)

// BatchArray declares one array of a batch (vram.h's struct
// vram_batch_array): client's array label of request req, and its
// full-length host side, either memory of C's (Host: pageable, staged
// through the manager's staging pool) or a host array of HostArray
// (HostHandle: pinned ones are copied from directly). A scratch array has
// neither.
type BatchArray struct {
	Client     int64
	Label      string
	Dir        BatchDir
	Request    vram.ArrayRequest
	Host       HostDesc // Data nil: none
	HostHandle int64    // 0: none
}

// BatchOptions tune a batch (vram.h's struct vram_batch_options): those
// of batch.Options, and whether kernels run on the host at their launch.
type BatchOptions struct {
	Buffers        int // 1 to 3; 0: the run chooses after its first chunk
	MaxChunkLength int
	Grow           bool
	HostKernels    bool
}

// BatchChunk is one chunk handed to the program: its place in the batch,
// its buffer and stream, and the batch's arrays in that buffer, in the
// order they were declared (SimHost: each one's simulated bytes, with
// HostKernels on a device that has them; else 0).
type BatchChunk struct {
	Index, Chunks, Start, Len, ChunkLength, Buffer int
	Stream                                         uintptr
	Arrays                                         []ArrayInfo
	SimHost                                        []uintptr
}

// batchEntry is a started batch.
type batchEntry struct {
	m      *Manager
	b      *batch.Batch
	arrays []*batch.Array
	labels [][]byte          // each array's label, NUL-terminated, pinned
	hosts  []*vram.HostArray // the host arrays wrapped over C's memory, freed at the end
	host   bool              // kernels run on the host
	cancel context.CancelFunc

	chunks   chan *batch.Chunk // the compute step → Next
	launched chan struct{}     // Next → the compute step: the chunk's kernels are enqueued
	done     chan struct{}     // closed once Run has returned
	rep      batch.Report      // Run's, once done
	err      error             // Run's, once done

	planMu sync.Mutex     // protects plan
	plan   vram.ChunkPlan // b's plan, read where Run is not changing it: at the start, in compute, at the end

	mu      sync.Mutex       // serializes Next, Cancel and Close; protects the fields below
	pending bool             // a chunk was handed over and not yet released
	pins    runtime.Pinner   // labels, and the simulated bytes handed over
	pinned  map[uintptr]bool // the simulated bytes already pinned, by address
}

// StartBatch declares the arrays on m's clients, allocates them (one
// allocation of their group, o.Buffers buffers in flight) and starts the
// pipeline; the program takes each chunk with NextChunk. A bad declaration
// or a failed allocation starts nothing.
func (cs *Clients) StartBatch(m *Manager, arrays []BatchArray, o BatchOptions) (int64, error) {
	done, err := m.use("start a batch")
	if err != nil {
		return 0, err
	}
	defer done()
	be := &batchEntry{m: m, b: batch.New(), host: o.HostKernels, chunks: make(chan *batch.Chunk),
		launched: make(chan struct{}, 1), done: make(chan struct{}), pinned: map[uintptr]bool{}}
	if err := cs.declare(be, arrays); err != nil {
		be.free()
		return 0, err
	}
	var opts []vram.AllocateOption
	if o.Buffers > 1 {
		opts = append(opts, vram.WithBuffers(o.Buffers))
	}
	cs.queued(arrays) // before the hooks' events are made
	if err := be.b.Allocate(context.Background(), opts...); err != nil {
		be.free()
		return 0, fmt.Errorf("vram: start a batch: %w", err)
	}
	be.notePlan()
	ctx, cancel := context.WithCancel(context.Background())
	be.cancel = cancel
	go be.run(ctx, batch.Options{Buffers: o.Buffers, MaxChunkLength: o.MaxChunkLength, Grow: o.Grow})
	cs.mu.Lock()
	defer cs.mu.Unlock()
	cs.initLocked()
	h := cs.nextLocked()
	cs.batches[h] = be
	return h, nil
}

// declare declares arrays on be's batch, with their host sides.
func (cs *Clients) declare(be *batchEntry, arrays []BatchArray) error {
	for i, a := range arrays {
		cs.mu.Lock()
		ce, he := cs.clients[a.Client], cs.hosts[a.HostHandle]
		cs.mu.Unlock()
		if ce == nil || ce.m != be.m {
			return fmt.Errorf("vram: batch array %d (%q): client %d: not a client of manager %d: %w", i, a.Label, a.Client, be.m.handle, device.ErrInvalidValue)
		}
		sides, err := be.side(a, he)
		if err != nil {
			return fmt.Errorf("vram: batch array %d (%q of %v): %w", i, a.Label, ce.c, err)
		}
		var arr *batch.Array
		switch a.Dir {
		case BatchIn:
			arr = be.b.In(ce.c, a.Label, a.Request, sides...)
		case BatchOut:
			arr = be.b.Out(ce.c, a.Label, a.Request, sides...)
		case BatchInOut:
			arr = be.b.InOut(ce.c, a.Label, a.Request, sides...)
		case BatchScratch:
			arr = be.b.Scratch(ce.c, a.Label, a.Request)
		default:
			return fmt.Errorf("vram: batch array %d (%q): direction %d: want 0 (in), 1 (out), 2 (in and out) or 3 (scratch): %w", i, a.Label, a.Dir, device.ErrInvalidValue)
		}
		label := append([]byte(a.Label), 0)
		be.pins.Pin(&label[0])
		be.arrays, be.labels = append(be.arrays, arr), append(be.labels, label)
	}
	return nil
}

// queued records each client's requests as queued, as the batch's
// Allocate queued them, so that the responses its hooks get say their
// arrays' chunk axes (addResponse).
func (cs *Clients) queued(arrays []BatchArray) {
	by := map[int64]map[string]vram.ArrayRequest{}
	for _, a := range arrays {
		if by[a.Client] == nil {
			by[a.Client] = map[string]vram.ArrayRequest{}
		}
		by[a.Client][a.Label] = a.Request
	}
	cs.mu.Lock()
	defer cs.mu.Unlock()
	for h, reqs := range by {
		if ce := cs.clients[h]; ce != nil {
			ce.queued = reqs
		}
	}
}

// side is a's host side: a host array of the client API's, or one
// wrapped over C's memory (freed with the batch).
func (be *batchEntry) side(a BatchArray, he *hostEntry) ([]batch.Side, error) {
	switch {
	case a.Dir == BatchScratch && (a.Host.Data != nil || a.HostHandle != 0):
		return nil, fmt.Errorf("a scratch array with a host side; declare it in or out: %w", device.ErrInvalidValue)
	case a.Dir == BatchScratch:
		return nil, nil
	case a.HostHandle != 0 && (he == nil || he.m != be.m):
		return nil, fmt.Errorf("host array %d: none of this manager's (vram_host_array): %w", a.HostHandle, device.ErrInvalidValue)
	case a.HostHandle != 0:
		return []batch.Side{batch.Host(he.h)}, sameShape(he.h, a.Request)
	case a.Host.Data == nil:
		return nil, fmt.Errorf("no host side: give its full-length host array: %w", device.ErrInvalidValue)
	}
	h, err := a.Host.wrap()
	if err != nil {
		return nil, err
	}
	be.hosts = append(be.hosts, h)
	return []batch.Side{batch.Host(h)}, sameShape(h, a.Request)
}

// sameShape refuses a host side that is not shaped as its request.
func sameShape(h *vram.HostArray, r vram.ArrayRequest) error {
	if h.DType() != r.DType || !slices.Equal(h.Shape(), r.Shape) {
		return fmt.Errorf("the host array is %v%v, its request %v%v: give the full-length host array of the request's shape and dtype: %w",
			h.DType(), h.Shape(), r.DType, r.Shape, device.ErrInvalidValue)
	}
	return nil
}

// run runs the batch and records its end.
func (be *batchEntry) run(ctx context.Context, o batch.Options) {
	defer close(be.done)
	be.rep, be.err = be.b.Run(ctx, o, be.compute)
	be.notePlan()
}

// notePlan records b's plan; called on Run's goroutine, or before it
// starts.
func (be *batchEntry) notePlan() {
	p := be.b.Plan()
	be.planMu.Lock()
	be.plan = p
	be.planMu.Unlock()
}

// compute hands ch to the program and waits until it has enqueued the
// chunk's kernels (its next NextChunk) or the batch is cancelled.
func (be *batchEntry) compute(ctx context.Context, ch *batch.Chunk) error {
	be.notePlan() // a re-cut may have changed it
	if be.host {
		if err := ch.Stream.Synchronize(); err != nil { // the chunk's copies in, before kernels that run at once
			return fmt.Errorf("wait for the copies in: %w", err)
		}
	}
	select {
	case be.chunks <- ch:
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case <-be.launched:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// batch finds batch h.
func (cs *Clients) batch(h int64) (*batchEntry, error) {
	cs.mu.Lock()
	be := cs.batches[h]
	cs.mu.Unlock()
	if be == nil {
		return nil, fmt.Errorf("vram: batch %d: never started, closed, or its manager closed: %w", h, ErrNoManager)
	}
	return be, nil
}

// NextChunk tells batch h that the kernels of the chunk it last handed
// over are enqueued, and waits for the next chunk. It returns done (and
// the run's error, nil when every chunk is back on the host) once the
// batch has ended.
func (cs *Clients) NextChunk(h int64) (ch BatchChunk, done bool, err error) {
	be, err := cs.batch(h)
	if err != nil {
		return BatchChunk{}, false, err
	}
	be.mu.Lock()
	defer be.mu.Unlock()
	if be.pending {
		be.pending = false
		be.launched <- struct{}{} // room for one; the compute step waits for it
	}
	select {
	case c := <-be.chunks:
		be.pending = true
		return be.describe(c), false, nil
	case <-be.done:
		if be.err != nil {
			return BatchChunk{}, true, fmt.Errorf("vram: %w", be.err)
		}
		return BatchChunk{}, true, nil
	}
}

// describe is c as the program sees it. be.mu must be held.
func (be *batchEntry) describe(c *batch.Chunk) BatchChunk {
	out := BatchChunk{Index: c.Index, Chunks: c.Chunks, Start: c.Start, Len: c.Len, ChunkLength: c.ChunkLength,
		Buffer: c.Buffer, Stream: c.Stream.Handle()}
	hv, _ := c.Device.(hostViewer)
	for i, a := range be.arrays {
		d := c.Array(a)
		axis := -1
		if a.Request().Chunkable() {
			axis = a.Request().ChunkAxis
		}
		out.Arrays = append(out.Arrays, ArrayInfo{Label: a.Label(), LabelC: uintptr(unsafePointer(be.labels[i])), DType: d.DType(),
			Memory: d.Memory(), Shape: d.Shape(), Strides: d.Strides(), ChunkAxis: axis, DevicePtr: uint64(d.Ptr()), Bytes: d.Bytes()})
		var sh uintptr
		if be.host && hv != nil {
			if bs, err := hv.HostBytes(d.Ptr(), d.Bytes()); err == nil && len(bs) > 0 {
				sh = pinOnce(&be.pins, be.pinned, bs)
			}
		}
		out.SimHost = append(out.SimHost, sh)
	}
	return out
}

// unsafePointer is the address of b's first byte.
func unsafePointer(b []byte) unsafe.Pointer { return unsafe.Pointer(&b[0]) }

// endBatches ends m's batches (CloseManager, before the rest).
func (cs *Clients) endBatches(m *Manager) error {
	cs.mu.Lock()
	var ends []*batchEntry
	for h, be := range cs.batches {
		if be.m == m {
			ends = append(ends, be)
			delete(cs.batches, h)
		}
	}
	cs.mu.Unlock()
	var errs []error
	for _, be := range ends {
		errs = append(errs, be.end())
	}
	return errors.Join(errs...)
}

// pinOnce pins b (once per address) and returns its address.
func pinOnce(p *runtime.Pinner, seen map[uintptr]bool, b []byte) uintptr {
	addr := uintptr(unsafePointer(b))
	if !seen[addr] {
		seen[addr] = true
		p.Pin(&b[0])
	}
	return addr
}

// BatchPlan is the plan of batch h's latest allocation.
func (cs *Clients) BatchPlan(h int64) (PlanInfo, error) {
	be, err := cs.batch(h)
	if err != nil {
		return PlanInfo{}, err
	}
	be.planMu.Lock()
	p := be.plan
	be.planMu.Unlock()
	first := be.arrays[0].Client()
	n := 0
	for _, a := range be.arrays {
		if a.Client() == first {
			n++
		}
	}
	return PlanInfo{Client: int64(first.ID()), Plan: p, Arrays: n, Sets: max(p.Buffers, 1)}, nil
}

// CancelBatch stops batch h between two steps: the chunks enqueued
// finish, and NextChunk then says it ended, with an error wrapping
// context.Canceled.
func (cs *Clients) CancelBatch(h int64) error {
	be, err := cs.batch(h)
	if err != nil {
		return err
	}
	be.cancel()
	return nil
}

// reportJSON is vram_batch_report_json's object: batch.Report's fields,
// times in seconds.
type reportJSON struct {
	Chunks       int         `json:"chunks"`
	ChunksDone   int         `json:"chunks_done"`
	Runs         int         `json:"runs"`
	RunsLeft     int         `json:"runs_left"`
	ChunkLength  int         `json:"chunk_length"`
	Buffers      int         `json:"buffers"`
	Lag          int         `json:"lag"`
	Staged       int         `json:"staged"`
	BytesIn      uint64      `json:"bytes_in"`
	BytesOut     uint64      `json:"bytes_out"`
	Wall         float64     `json:"wall"`
	Copy         float64     `json:"copy"`
	Compute      float64     `json:"compute"`
	ExposedCopy  float64     `json:"exposed_copy"`
	DeviceIdle   float64     `json:"device_idle"`
	Fill         float64     `json:"fill"`
	Write        float64     `json:"write"`
	WriteWait    float64     `json:"write_wait"`
	Recuts       []recutJSON `json:"recuts"`
	BufferChoice string      `json:"buffer_choice"`
}

// recutJSON is one batch.Recut, its time in seconds.
type recutJSON struct {
	At         float64 `json:"at"`
	Chunk      int     `json:"chunk"`
	From       int     `json:"from"`
	To         int     `json:"to"`
	ArraysFrom int     `json:"arrays_from"`
	ArraysTo   int     `json:"arrays_to"`
	Buffers    int     `json:"buffers"`
	Why        string  `json:"why"`
}

// BatchReportJSON is batch h's report as one JSON object, once it has
// ended.
func (cs *Clients) BatchReportJSON(h int64) (string, error) {
	rep, err := cs.BatchReport(h)
	if err != nil {
		return "", err
	}
	out := reportJSON{Chunks: rep.Chunks, ChunksDone: rep.ChunksDone, Runs: rep.Runs, RunsLeft: rep.RunsLeft,
		ChunkLength: rep.ChunkLength, Buffers: rep.Buffers, Lag: rep.Lag, Staged: rep.Staged, BytesIn: rep.BytesIn,
		BytesOut: rep.BytesOut, Wall: rep.Wall.Seconds(), Copy: rep.Copy.Seconds(), Compute: rep.Compute.Seconds(),
		ExposedCopy: rep.ExposedCopy.Seconds(), DeviceIdle: rep.DeviceIdle.Seconds(), Fill: rep.Fill.Seconds(),
		Write: rep.Write.Seconds(), WriteWait: rep.WriteWait.Seconds(), Recuts: []recutJSON{}, BufferChoice: rep.BufferChoice}
	for _, r := range rep.Recuts {
		out.Recuts = append(out.Recuts, recutJSON{At: r.At.Seconds(), Chunk: r.Chunk, From: r.From, To: r.To,
			ArraysFrom: r.ArraysFrom, ArraysTo: r.ArraysTo, Buffers: r.Buffers, Why: r.Why})
	}
	js, err := json.Marshal(out)
	if err != nil {
		return "", fmt.Errorf("vram: the report of batch %d as JSON: %w", h, err)
	}
	return string(js), nil
}

// BatchReport is batch h's report, once it has ended.
func (cs *Clients) BatchReport(h int64) (batch.Report, error) {
	be, err := cs.batch(h)
	if err != nil {
		return batch.Report{}, err
	}
	select {
	case <-be.done:
		return be.rep, nil
	default:
		return batch.Report{}, fmt.Errorf("vram: the report of batch %d: it is still running; take its chunks to the end (or cancel it) first: %w", h, device.ErrInvalidValue)
	}
}

// CloseBatch cancels batch h if it still runs, waits for it, and frees its
// arrays (device and wrapped host ones) and its handle.
func (cs *Clients) CloseBatch(h int64) error {
	cs.mu.Lock()
	be := cs.batches[h]
	delete(cs.batches, h)
	cs.mu.Unlock()
	if be == nil {
		return fmt.Errorf("vram: close batch %d: never started, or closed: %w", h, ErrNoManager)
	}
	return be.end()
}

// end stops the run, waits for it and frees what the batch holds.
func (be *batchEntry) end() error {
	be.cancel()
	<-be.done
	be.mu.Lock()
	defer be.mu.Unlock()
	done, err := be.m.use("close a batch")
	if err != nil {
		return err
	}
	defer done()
	return be.free()
}

// free frees the batch's arrays and wrapped host arrays and unpins.
func (be *batchEntry) free() error {
	errs := []error{be.b.Close()}
	for _, h := range be.hosts {
		errs = append(errs, h.Free())
	}
	be.hosts = nil
	be.pins.Unpin()
	clear(be.pinned)
	return errors.Join(errs...)
}
