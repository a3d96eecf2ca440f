package main

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/vramkit/vram/device"
	"github.com/vramkit/vram/device/sim"
	"github.com/vramkit/vram/internal/units"
)

// The pipeline's order, seen from the device: a simulator whose copies
// and kernels are each bracketed on their stream by two one-index marker
// kernels recording when the stream ran them, so every operation's
// interval is exactly when it ran, wherever it was enqueued from.

type opKind int

const (
	opIn opKind = iota
	opKernel
	opOut
)

// span is when a stream ran one operation.
type span struct {
	kind       opKind
	start, end time.Time
}

// timedDev is a simulator that records when each copy and kernel ran and
// stretches every kernel by kernelDelay, so that kernels outlast copies
// as they do on a GPU. Safe for concurrent use.
type timedDev struct {
	*sim.Device
	kernelDelay time.Duration

	mu  sync.Mutex
	ops []*span // in the order enqueued
}

func (d *timedDev) stamp(at *time.Time) func(device.View, int, int) error {
	return func(device.View, int, int) error {
		now := time.Now()
		d.mu.Lock()
		*at = now
		d.mu.Unlock()
		return nil
	}
}

// bracket enqueues enq's operation on s between two markers.
func (d *timedDev) bracket(kind opKind, s device.Stream, enq func() error) error {
	sp := &span{kind: kind}
	d.mu.Lock()
	d.ops = append(d.ops, sp)
	d.mu.Unlock()
	if err := d.Device.LaunchFunc(s, 1, d.stamp(&sp.start)); err != nil {
		return err
	}
	if err := enq(); err != nil {
		return err
	}
	return d.Device.LaunchFunc(s, 1, d.stamp(&sp.end))
}

func (d *timedDev) CopyHtoD(dst device.Ptr, src []byte, s device.Stream) error {
	return d.bracket(opIn, s, func() error { return d.Device.CopyHtoD(dst, src, s) })
}

func (d *timedDev) CopyDtoH(dst []byte, src device.Ptr, s device.Stream) error {
	return d.bracket(opOut, s, func() error { return d.Device.CopyDtoH(dst, src, s) })
}

func (d *timedDev) CopyHtoD2D(dst device.Ptr, dp uint64, src []byte, sp, w, h uint64, s device.Stream) error {
	return d.bracket(opIn, s, func() error { return d.Device.CopyHtoD2D(dst, dp, src, sp, w, h, s) })
}

func (d *timedDev) CopyDtoH2D(dst []byte, dp uint64, src device.Ptr, sp, w, h uint64, s device.Stream) error {
	return d.bracket(opOut, s, func() error { return d.Device.CopyDtoH2D(dst, dp, src, sp, w, h, s) })
}

func (d *timedDev) LaunchFunc(s device.Stream, n int, fn func(device.View, int, int) error) error {
	return d.bracket(opKernel, s, func() error {
		return d.Device.LaunchFunc(s, n, func(v device.View, lo, hi int) error {
			if lo == 0 {
				time.Sleep(d.kernelDelay)
			}
			return fn(v, lo, hi)
		})
	})
}

// chunkSpans is each chunk's copy in (its two copies), kernel and copy
// out (its two copies).
type chunkSpans struct{ in, kernel, out span }

// chunks groups the recorded operations by chunk: each kind in the order
// enqueued, which is chunk order.
func (d *timedDev) chunks(t *testing.T, n int) []chunkSpans {
	t.Helper()
	d.mu.Lock()
	defer d.mu.Unlock()
	byKind := map[opKind][]span{}
	for _, sp := range d.ops {
		if sp.start.IsZero() || sp.end.IsZero() {
			t.Fatalf("an operation of kind %d never ran", sp.kind)
		}
		byKind[sp.kind] = append(byKind[sp.kind], *sp)
	}
	if len(byKind[opIn]) != 2*n || len(byKind[opKernel]) != n || len(byKind[opOut]) != 2*n {
		t.Fatalf("%d copies in, %d kernels, %d copies out for %d chunks: want 2, 1 and 2 a chunk",
			len(byKind[opIn]), len(byKind[opKernel]), len(byKind[opOut]), n)
	}
	pair := func(a, b span) span { return span{kind: a.kind, start: a.start, end: b.end} }
	cs := make([]chunkSpans, n)
	for i := range cs {
		cs[i] = chunkSpans{
			in:     pair(byKind[opIn][2*i], byKind[opIn][2*i+1]),
			kernel: byKind[opKernel][i],
			out:    pair(byKind[opOut][2*i], byKind[opOut][2*i+1]),
		}
	}
	return cs
}

// runTimedJob runs a small batch (10,000 runs of 40 steps, 21 samples, on
// a 1 MiB simulator: several chunks) in-process on a timedDev.
func runTimedJob(t *testing.T, double bool, bandwidth uint64, kernelDelay time.Duration) (*job, *timedDev) {
	t.Helper()
	sd, err := sim.New(sim.Config{TotalBytes: units.MiB, Granularity: 64 << 10, NoContext: true, CopyBandwidth: bandwidth})
	if err != nil {
		t.Fatal(err)
	}
	dev := &timedDev{Device: sd, kernelDelay: kernelDelay}
	t.Cleanup(func() { dev.Close() })
	j := runTestJob(t, dev, 10000, double)
	if n, err := j.verify(64); err != nil || j.failedRuns() != 0 {
		t.Fatalf("verify checked %d runs: %v; %d failed runs", n, err, j.failedRuns())
	}
	return j, dev
}

// TestDoubleBufferOrder checks the double-buffered pipeline from the
// device's side: every hazard is ordered (a kernel after its inputs, a
// copy out after its kernel, a buffer refilled only after the kernel that
// read it and rewritten only after its outputs were copied out), and
// nothing else is: chunk i+1's inputs go in while kernel i runs, and
// chunk i's outputs come out while kernel i+1 runs. Kernels take 150 ms
// more than their work and a chunk's copy out about 40 ms; the host, which
// stays a chunk ahead, enqueues kernel i+1 once chunk i−1's copy out is
// done, so the overlaps have 100 ms of room for a loaded machine.
func TestDoubleBufferOrder(t *testing.T) {
	const (
		kernelDelay = 150 * time.Millisecond
		outCopy     = 40 * time.Millisecond
	)
	// A chunk's outputs: its runs × (21 samples × 8 + 4) bytes.
	probe, _ := runTimedJob(t, true, 0, 0)
	outBytes := float64(probe.plan.ChunkLength * (21*8 + 4))
	bw := uint64(outBytes / outCopy.Seconds())

	j, dev := runTimedJob(t, true, bw, kernelDelay)
	n := j.plan.Chunks
	if j.plan.Buffers != 2 || n < 4 {
		t.Fatalf("plan of %d chunks, %d buffers: want at least 4 chunks, double-buffered", n, j.plan.Buffers)
	}
	cs := dev.chunks(t, n)
	before := func(what string, a, b time.Time) {
		t.Helper()
		if b.Before(a) {
			t.Errorf("%s: %v too early", what, a.Sub(b))
		}
	}
	overlaps := func(what string, a, b span) {
		t.Helper()
		if !a.start.Before(b.end) || !b.start.Before(a.end) {
			t.Errorf("%s: they do not overlap (%v–%v and %v–%v from the first copy)", what,
				a.start.Sub(cs[0].in.start), a.end.Sub(cs[0].in.start), b.start.Sub(cs[0].in.start), b.end.Sub(cs[0].in.start))
		}
	}
	for i, c := range cs {
		before(fmt.Sprintf("kernel %d after its copy in", i), c.in.end, c.kernel.start)
		before(fmt.Sprintf("copy out %d after its kernel", i), c.kernel.end, c.out.start)
		if i+2 < n {
			before(fmt.Sprintf("copy in %d after kernel %d, which read that buffer", i+2, i), c.kernel.end, cs[i+2].in.start)
			before(fmt.Sprintf("kernel %d after copy out %d, which read that buffer", i+2, i), c.out.end, cs[i+2].kernel.start)
		}
		if i+1 < n {
			overlaps(fmt.Sprintf("copy in %d with kernel %d", i+1, i), cs[i+1].in, c.kernel)
			overlaps(fmt.Sprintf("copy out %d with kernel %d", i, i+1), c.out, cs[i+1].kernel)
		}
	}
	var kernels time.Duration
	for _, c := range cs {
		kernels += c.kernel.end.Sub(c.kernel.start)
	}
	t.Logf("%d chunks: kernels %v in all, batch %v (first copy in to last copy out)", n, kernels, cs[n-1].out.end.Sub(cs[0].in.start))
}

// TestSingleBufferOrder checks that with one buffer each chunk's copy in,
// kernel and copy out run one after another, and the next chunk's copy in
// after them.
func TestSingleBufferOrder(t *testing.T) {
	j, dev := runTimedJob(t, false, 50e6, 5*time.Millisecond)
	n := j.plan.Chunks
	if j.plan.Buffers != 1 || n < 2 {
		t.Fatalf("plan of %d chunks, %d buffers: want several chunks, one buffer", n, j.plan.Buffers)
	}
	cs := dev.chunks(t, n)
	for i, c := range cs {
		seq := []span{c.in, c.kernel, c.out}
		if i+1 < n {
			seq = append(seq, cs[i+1].in)
		}
		for k := 1; k < len(seq); k++ {
			if seq[k].start.Before(seq[k-1].end) {
				t.Errorf("chunk %d: step %d started before step %d ended", i, k, k-1)
			}
		}
	}
}
