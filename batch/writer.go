package batch

// Write-behind: a run's chunks back on the host are drained (each staged
// output's Drain function called, or its staging copied into its host
// array: a file-backed one writes the file) by a writer goroutine of the
// run's own, in chunk order, while the run goes on enqueueing the next
// chunks. The writer also reports progress. What bounds it is the
// outputs' staging slots: chunk j's copies out go into slot j mod n,
// so before enqueueing them the run waits until the writer has drained
// chunk j−n, and no more than n chunks' outputs are ever on the host
// waiting for it. With one slot and no lead the run drains each chunk in
// turn, before it enqueues the next.

import (
	"fmt"
	"sync"
	"time"

	"github.com/vramkit/vram"
)

// drainItem is one chunk for the writer: everything it needs, by value,
// so that it shares nothing with the run's goroutine.
type drainItem struct {
	i      int // the chunk's place in the run's order
	ch     dealtChunk
	stages []*vram.HostArray // per output of the run's outs: its staging slot, nil when not staged
	chunks int               // the batch's chunks as now cut, for progress
}

// writer drains a run's chunks in order on its own goroutine.
type writer struct {
	r     *batchRun
	outs  []*batchArr // the run's outputs
	work  chan drainItem
	ended sync.WaitGroup

	mu      sync.Mutex // protects the fields below
	drained int        // chunks drained (every chunk before it, in order)
	err     error      // the first drain's or progress's error; the writer drains nothing after it
	busy    time.Duration
	in, out uint64    // bytes of the chunks drained
	lastAt  time.Time // when the last chunk was drained
	moved   chan struct{}
}

// newWriter starts r's writer; stop ends it.
func newWriter(r *batchRun) *writer {
	w := &writer{r: r, work: make(chan drainItem, MaxBuffers+2), moved: make(chan struct{})}
	for _, a := range r.arrs {
		if a.dir == dirOut {
			w.outs = append(w.outs, a)
		}
	}
	w.ended.Add(1)
	go w.loop()
	return w
}

// push hands chunk i to the writer (blocking while it has MaxBuffers+2
// waiting: the staging slots bound them first).
func (w *writer) push(it drainItem) { w.work <- it }

// wait returns once chunks 0 … upTo−1 are drained, or with the writer's
// error; it adds the time waited to the report's WriteWait.
func (w *writer) wait(upTo int) error {
	start := time.Now()
	defer func() { w.r.rep.WriteWait += time.Since(start) }()
	for {
		w.mu.Lock()
		done, err, moved := w.drained, w.err, w.moved
		w.mu.Unlock()
		if err != nil {
			return err
		}
		if done >= upTo {
			return nil
		}
		<-moved
	}
}

// failed is the writer's error, if any.
func (w *writer) failed() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.err
}

// writerState is what a writer has done so far.
type writerState struct {
	drained int           // chunks drained
	busy    time.Duration // its time draining them
	lastAt  time.Time     // when the last was drained
}

// snapshot is what the writer has done so far.
func (w *writer) snapshot() writerState {
	w.mu.Lock()
	defer w.mu.Unlock()
	return writerState{drained: w.drained, busy: w.busy, lastAt: w.lastAt}
}

// stop ends the writer once it has drained what it was given, and
// returns what it did.
func (w *writer) stop() (drained int, busy time.Duration, in, out uint64) {
	close(w.work)
	w.ended.Wait()
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.drained, w.busy, w.in, w.out
}

func (w *writer) loop() {
	defer w.ended.Done()
	for it := range w.work {
		if w.failed() != nil {
			continue // drain nothing more; let the run see the error
		}
		start := time.Now()
		err := w.drain(it)
		w.mu.Lock()
		w.busy += time.Since(start)
		if err != nil {
			w.err = err
		} else {
			w.drained++
			w.in, w.out, w.lastAt = w.in+it.ch.in, w.out+it.ch.out, time.Now()
		}
		close(w.moved)
		w.moved = make(chan struct{})
		w.mu.Unlock()
		if err == nil {
			err = w.report(it)
			if err != nil {
				w.mu.Lock()
				w.err = err
				close(w.moved)
				w.moved = make(chan struct{})
				w.mu.Unlock()
			}
		}
	}
}

// drain drains chunk it's staged outputs; a panic in a Drain function is
// its error.
func (w *writer) drain(it drainItem) (err error) {
	defer w.recover(it, &err)
	for j, a := range w.outs {
		st := it.stages[j]
		if st == nil {
			continue
		}
		sp := vram.Span{Axis: a.axis, Start: it.ch.start, Len: it.ch.len}
		if a.side.drain != nil {
			err = a.side.drain(sp, st)
		} else {
			err = st.CopyChunkTo(a.side.host, sp)
		}
		if err != nil {
			return fmt.Errorf("batch: chunk %d of %d: drain %s: %w", it.ch.index+1, it.chunks, a, err)
		}
	}
	return nil
}

// report calls the run's Progress for chunk it, now drained.
func (w *writer) report(it drainItem) (err error) {
	r := w.r
	if r.progress == nil {
		return nil
	}
	defer w.recover(it, &err)
	w.mu.Lock()
	p := Progress{Chunk: w.drained, Chunks: it.chunks, Start: it.ch.start, Len: it.ch.len,
		BytesIn: w.in, BytesOut: w.out, Elapsed: time.Since(r.start)}
	w.mu.Unlock()
	r.progress(p)
	return nil
}

// recover turns a panic in one of the batch's functions on the writer's
// goroutine into its error.
func (w *writer) recover(it drainItem, err *error) {
	if p := recover(); p != nil {
		*err = fmt.Errorf("batch: chunk %d of %d: %s: %w", it.ch.index+1, it.chunks, stepNames[stepRetire], newPanicError(p))
	}
}
