// `vram run`'s progress on stderr: a bar on a terminal; elsewhere (a
// Slurm or Kubernetes log, a file) lines a log can keep.
//
// Every line and the bar name the job as "vram run[PID]" (the PID
// `vram broker status` lists), so that two jobs writing to one terminal
// or log are told apart. The lines: one as each step of the set-up
// begins ("set-up: open the device"), and, while a step lasts, one every progressEvery saying it
// still runs; then one per chunk back on the host, but no more than one
// every progressEvery (the last chunk always has one): one line per
// chunk or every few seconds, whichever is rarer.

package main

import (
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"github.com/vramkit/vram/batch"
	"github.com/vramkit/vram/internal/units"
)

// defaultProgressEvery is how often the progress lines come at most.
const defaultProgressEvery = 5 * time.Second

// runProgress follows the job: the set-up's steps, then the chunks.
// Finish may be called more than once.
type runProgress interface {
	Phase(what string)
	Chunk(p batch.Progress)
	Finish()
}

// runProgress returns the job's progress: a bar on a terminal (none with
// --json), lines elsewhere.
func (a *app) runProgress() runProgress {
	tag := jobTag()
	if isTerminal(a.stderr) {
		if a.json {
			return quietProgress{}
		}
		return &barRunProgress{a: a, tag: tag}
	}
	every := a.progressEvery
	if every <= 0 {
		every = defaultProgressEvery
	}
	return newLineProgress(a.stderr, every, tag)
}

// jobTag names this job in its progress: "vram run[PID]".
func jobTag() string { return fmt.Sprintf("vram run[%d]", os.Getpid()) }

type quietProgress struct{}

func (quietProgress) Phase(string)         {}
func (quietProgress) Chunk(batch.Progress) {}
func (quietProgress) Finish()              {}

// barRunProgress draws a bar of the chunks once the first is done.
type barRunProgress struct {
	a   *app
	tag string
	bar progress
}

func (b *barRunProgress) Phase(string) {}

func (b *barRunProgress) Chunk(p batch.Progress) {
	if b.bar == nil {
		b.bar = b.a.progress(p.Chunks, b.tag+" chunks")
	}
	b.bar.Add(1)
}

func (b *barRunProgress) Finish() {
	if b.bar != nil {
		b.bar.Finish()
	}
}

// lineProgress writes progress lines. Safe for concurrent use (its
// heartbeat goroutine writes too).
type lineProgress struct {
	w     io.Writer
	every time.Duration
	tag   string // the job's, at the start of each line
	start time.Time

	mu       sync.Mutex // protects the fields below
	phase    string     // the set-up step under way ("" once the chunks start or it finished)
	since    time.Time  // when the phase began
	last     time.Time  // when the last line was written
	stop     chan struct{}
	finished bool
	wg       sync.WaitGroup
}

func newLineProgress(w io.Writer, every time.Duration, tag string) *lineProgress {
	p := &lineProgress{w: w, every: every, tag: tag, start: time.Now(), stop: make(chan struct{})}
	p.wg.Add(1)
	go p.heartbeat()
	return p
}

// heartbeat says every p.every that a set-up step still runs.
func (p *lineProgress) heartbeat() {
	defer p.wg.Done()
	t := time.NewTicker(p.every)
	defer t.Stop()
	for {
		select {
		case <-p.stop:
			return
		case now := <-t.C:
			p.mu.Lock()
			if p.phase != "" && now.Sub(p.last) >= p.every {
				p.linef("set-up: still %s (%.0f s)", p.phase, now.Sub(p.since).Seconds())
			}
			p.mu.Unlock()
		}
	}
}

// linef writes a line after the job's tag; p.mu is held.
func (p *lineProgress) linef(format string, args ...any) {
	fmt.Fprintf(p.w, "%s: "+format+"\n", append([]any{p.tag}, args...)...)
	p.last = time.Now()
}

func (p *lineProgress) Phase(what string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.finished {
		return
	}
	p.phase, p.since = what, time.Now()
	if what == "run the batch" || what == "verify the results" {
		p.linef("%s (%.1f s in)", what, time.Since(p.start).Seconds())
		p.phase = ""
		return
	}
	p.linef("set-up: %s", what)
}

func (p *lineProgress) Chunk(c batch.Progress) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.phase = ""
	if p.finished || (c.Chunk < c.Chunks && time.Since(p.last) < p.every) {
		return
	}
	p.linef("chunk %d of %d done (%d%%): %s in, %s out, %.1f s into the batch",
		c.Chunk, c.Chunks, 100*c.Chunk/c.Chunks, units.Format(c.BytesIn), units.Format(c.BytesOut), c.Elapsed.Seconds())
}

func (p *lineProgress) Finish() {
	p.mu.Lock()
	if p.finished {
		p.mu.Unlock()
		return
	}
	p.finished = true
	p.mu.Unlock()
	close(p.stop)
	p.wg.Wait()
}
