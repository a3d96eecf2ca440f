package batch_test

import (
	"context"
	"fmt"
	"log/slog"
	"testing"

	"github.com/vramkit/vram"
	"github.com/vramkit/vram/batch"
	"github.com/vramkit/vram/device/sim"
	"github.com/vramkit/vram/internal/simtest"
	"github.com/vramkit/vram/kernel"
)

// stagedFixture is a batch of runs float32 inputs x, filled by a
// function, and outputs y = 3x+1, drained by one (both staged through
// the manager's staging pool), under a cap that holds chunkRuns runs of
// both (8 bytes a run on the device) and a host limit; the manager's own
// allocator (expandable on the simulator: device memory off the Go
// heap).
type stagedFixture struct {
	m    *vram.Manager
	dev  *sim.Device
	b    *batch.Batch
	x, y *batch.Array
	k    *kernel.Kernel
	cap  uint64
	bad  int // drained outputs that are wrong (Run's writer)
}

func newStaged(t *testing.T, runs, chunkRuns int, devBytes, hostLimit uint64) *stagedFixture {
	t.Helper()
	dev := simtest.New(t, devBytes, func(c *sim.Config) { c.Granularity = 64 << 10 })
	capBytes := uint64(8 * chunkRuns)
	m, err := vram.New(dev, vram.WithCap(capBytes), vram.WithHostOptions(vram.HostOptions{Limit: hostLimit}),
		vram.WithLogger(slog.New(slog.DiscardHandler)))
	must(t, err)
	t.Cleanup(func() { m.Close() })
	c, err := m.Register(vram.ClientOptions{Name: "staged", Group: "s"})
	must(t, err)
	f := &stagedFixture{m: m, dev: dev, b: batch.New(), cap: capBytes}
	f.x = f.b.In(c, "x", vram.ArrayRequest{Shape: []int{runs}, DType: vram.Float32})
	f.y = f.b.Out(c, "y", vram.ArrayRequest{Shape: []int{runs}, DType: vram.Float32})
	must(t, f.b.Allocate(context.Background()))
	t.Cleanup(func() { f.b.Close() })
	must(t, f.x.Use(batch.Fill(func(sp vram.Span, st *vram.HostArray) error {
		x := st.Float32s()
		for i := range sp.Len {
			x[i] = float32((sp.Start+i)%8191) * 0.5
		}
		return nil
	})))
	must(t, f.y.Use(batch.Drain(func(sp vram.Span, st *vram.HostArray) error {
		y := st.Float32s()
		for i := range sp.Len {
			if y[i] != 3*float32((sp.Start+i)%8191)*0.5+1 {
				f.bad++
			}
		}
		return nil
	})))
	f.k = affineKernel(t)
	return f
}

func (f *stagedFixture) compute(at func(ch *batch.Chunk)) batch.Compute {
	return func(_ context.Context, ch *batch.Chunk) error {
		if at != nil {
			at(ch)
		}
		return ch.Launch(f.k, f.x, f.y)
	}
}

// The probe chunk runs with one staging buffer per staged array: the
// slots the shape it picks wants beyond them are pinned after it. (The
// shape it starts from wants 2 buffers for the input, 3 slots for the
// output: 5, pinned whatever the probe picked.)
func TestRunStagingLazyProbe(t *testing.T) {
	const runs, chunkRuns = 64 * 1024, 8 * 1024
	f := newStaged(t, runs, chunkRuns, 16<<20, 0)
	var atProbe vram.StagingStats
	rep, err := f.b.Run(context.Background(), batch.Options{Progress: func(p batch.Progress) {
		if p.Chunk == 1 {
			atProbe = f.m.Host().Staging().Stats()
		}
	}}, f.compute(nil))
	must(t, err)
	if f.bad != 0 || rep.Runs != runs {
		t.Fatalf("%d wrong results, %d runs of %d", f.bad, rep.Runs, runs)
	}
	if atProbe.Buffers != 2 {
		t.Errorf("while the probe chunk ran the pool held %d buffers (%d bytes); want 2, one per staged array", atProbe.Buffers, atProbe.Bytes)
	}
	if rep.PinnedBytes != f.m.Host().Staging().Stats().Made || rep.PinnedBytes == 0 {
		t.Errorf("the report says %d bytes pinned, the pool made %d", rep.PinnedBytes, f.m.Host().Staging().Stats().Made)
	}
}

// Staging is pinned once and reused: a second batch on the manager takes
// the first one's buffers again, and a re-cut to shorter chunks (the cap
// halved) takes its old buffers for its slots; with no limit, no buffer
// the pool made is ever given up (Trims 0, all it made still held).
// Before, a re-cut trimmed the pool and pinned its slots again.
func TestRunStagingReused(t *testing.T) {
	const runs, chunkRuns = 256 * 1024, 16 * 1024
	for _, buffers := range []int{1, 2} {
		t.Run(fmt.Sprintf("%d buffers", buffers), func(t *testing.T) {
			f := newStaged(t, runs, chunkRuns, 16<<20, 0)
			first, err := f.b.Run(context.Background(), batch.Options{Buffers: buffers}, f.compute(nil))
			must(t, err)
			reused := f.m.Host().Staging().Stats().Reuses
			halved := false
			rep, err := f.b.Run(context.Background(), batch.Options{Buffers: buffers}, f.compute(func(ch *batch.Chunk) {
				if ch.Index == 6 && !halved {
					halved = true
					must(t, f.m.Account().SetCap(f.cap/2))
				}
			}))
			must(t, err)
			shorter := false
			for _, c := range rep.Recuts {
				shorter = shorter || c.To < c.From
			}
			if f.bad != 0 || !shorter || first.PinnedBytes == 0 {
				t.Fatalf("%d wrong results; %d bytes pinned first; re-cuts %+v: want one to shorter chunks", f.bad, first.PinnedBytes, rep.Recuts)
			}
			st := f.m.Host().Staging().Stats()
			if st.Trims != 0 || st.Made != st.Bytes || st.Reuses <= reused {
				t.Errorf("staging pool %+v: want nothing given up, all it made still held, the second batch reusing the first's", st)
			}
		})
	}
}

// A budget change during the last chunk re-cuts nothing: no runs are
// left to cut. It used to re-allocate the arrays and take the staging
// again (pinning a run's worth) after the last chunk.
func TestRunNoRecutAtTheEnd(t *testing.T) {
	const runs, chunkRuns = 64 * 1024, 8 * 1024
	f := newStaged(t, runs, chunkRuns, 16<<20, 0)
	rep, err := f.b.Run(context.Background(), batch.Options{Buffers: 1}, f.compute(func(ch *batch.Chunk) {
		if ch.Start+ch.Len == runs {
			must(t, f.m.Account().SetCap(f.cap/2))
		}
	}))
	must(t, err)
	if f.bad != 0 || rep.Runs != runs {
		t.Fatalf("%d wrong results, %d runs of %d", f.bad, rep.Runs, runs)
	}
	for _, c := range rep.Recuts {
		if c.Chunk >= rep.Chunks {
			t.Errorf("a re-cut after the last chunk (chunk %d of %d): %+v", c.Chunk+1, rep.Chunks, c)
		}
	}
}
