package batch_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/vramkit/vram"
	"github.com/vramkit/vram/account"
	"github.com/vramkit/vram/batch"
	"github.com/vramkit/vram/device/sim"
	"github.com/vramkit/vram/kernel"
)

// benchBatch is a batch of one float32 input and one float32 output per
// run on a simulator of total bytes (4 KiB pages) with an emulated copy
// bandwidth (0: host memory speed), allocated with buffers buffers.
type benchBatch struct {
	m       *vram.Manager
	c       *vram.Client
	b       *batch.Batch
	x, y    *batch.Array // "in" and "out"
	in, out *vram.HostArray
}

// runRecut runs the batch on one buffer, growing, from a cap of capBytes;
// with every > 0 the cap changes at every every-th chunk, halved and
// restored in turn, so that the batch re-cuts its chunks.
func (bb *benchBatch) runRecut(b *testing.B, k *kernel.Kernel, capBytes uint64, every int) batch.Report {
	b.Helper()
	if err := bb.m.Account().SetCap(capBytes); err != nil {
		b.Fatal(err)
	}
	rep, err := bb.b.Run(context.Background(), batch.Options{Buffers: 1, Grow: true}, func(_ context.Context, ch *batch.Chunk) error {
		if every > 0 && ch.Index%every == every-1 {
			c := capBytes
			if ch.Index%(2*every) == every-1 {
				c /= 2
			}
			if err := bb.m.Account().SetCap(c); err != nil {
				return err
			}
		}
		return ch.Launch(k, bb.x, bb.y)
	})
	if err != nil {
		b.Fatal(err)
	}
	return rep
}

func newBenchBatch(b *testing.B, total uint64, runs, buffers int, bandwidth uint64, opts ...vram.Option) *benchBatch {
	b.Helper()
	dev, err := sim.New(sim.Config{TotalBytes: total, Granularity: 4 << 10, NoContext: true, CopyBandwidth: bandwidth})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { dev.Close() })
	m, err := vram.New(dev, append([]vram.Option{vram.WithAllocatorChoice(account.Choice{Kind: vram.Pool})}, opts...)...)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { m.Close() })
	bb := &benchBatch{m: m}
	bb.c, err = m.Register(vram.ClientOptions{Name: "bench", Group: "bench"})
	if err != nil {
		b.Fatal(err)
	}
	bb.b = batch.New()
	bb.x = bb.b.In(bb.c, "in", vram.ArrayRequest{Shape: []int{runs}, DType: vram.Float32})
	bb.y = bb.b.Out(bb.c, "out", vram.ArrayRequest{Shape: []int{runs}, DType: vram.Float32})
	if err := bb.b.Allocate(context.Background(), vram.WithBuffers(buffers)); err != nil {
		b.Fatal(err)
	}
	if bb.in, err = m.NewHostArray([]int{runs}, vram.Float32, vram.Pinned, nil); err != nil {
		b.Fatal(err)
	}
	if bb.out, err = m.NewHostArray([]int{runs}, vram.Float32, vram.Pinned, nil); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { bb.in.Free(); bb.out.Free() })
	bb.use(b)
	return bb
}

// run runs the batch once with buffers buffers, k launched over each
// chunk's in and out.
func (bb *benchBatch) run(b *testing.B, k *kernel.Kernel, buffers int) batch.Report {
	rep, err := bb.b.Run(context.Background(), batch.Options{Buffers: buffers}, func(_ context.Context, ch *batch.Chunk) error {
		return ch.Launch(k, bb.x, bb.y)
	})
	if err != nil {
		b.Fatal(err)
	}
	return rep
}

// use gives the batch bb.in and bb.out.
func (bb *benchBatch) use(b *testing.B) {
	if err := errors.Join(bb.x.Use(batch.Host(bb.in)), bb.y.Use(batch.Host(bb.out))); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkBatchOverlap runs 32 MiB in and 32 MiB out over an emulated
// 1 GB/s link (about 67 ms of copies) in 8 (one buffer) to 25 chunks, with a kernel
// that takes 8 ms a chunk (a sleep: the device's time, not the host's
// CPU), and reports the share of the copy time no kernel hid.
func BenchmarkBatchOverlap(b *testing.B) {
	const runs = 8 << 20
	for _, buffers := range []int{1, 2, 3} {
		b.Run(fmt.Sprintf("buffers=%d", buffers), func(b *testing.B) {
			bb := newBenchBatch(b, 8<<20, runs, buffers, 1e9)
			k, err := kernel.New("wait", "", func(a kernel.Args, lo, hi int) error {
				if lo == 0 {
					time.Sleep(8 * time.Millisecond)
				}
				in, out := a.Float32s(0), a.Float32s(1)
				copy(out[lo:hi], in[lo:hi])
				return nil
			}, 0)
			if err != nil {
				b.Fatal(err)
			}
			var copyT, exposed, compute time.Duration
			chunks := 0
			for b.Loop() {
				rep := bb.run(b, k, buffers)
				copyT, exposed, compute, chunks = copyT+rep.Copy, exposed+rep.ExposedCopy, compute+rep.Compute, rep.Chunks
			}
			b.ReportMetric(float64(chunks), "chunks")
			b.ReportMetric(100*exposed.Seconds()/copyT.Seconds(), "exposed-%")
			b.ReportMetric(copyT.Seconds()/float64(b.N)*1e3, "copy-ms")
			b.ReportMetric(compute.Seconds()/float64(b.N)*1e3, "compute-ms")
		})
	}
}

// BenchmarkBatchOverhead measures what Run costs a chunk beyond the
// device work: small chunks (16 KiB in, 16 KiB out, a one-line kernel)
// through Run with 1 and 2 buffers, against the same copies and
// kernels enqueued by hand on one stream, all at once, and waited for at
// the end ("bare": the device work and the least host work that can
// enqueue it). The difference of their ns/chunk is the pipeline's
// overhead: its events, waits, timeline and checks.
func BenchmarkBatchOverhead(b *testing.B) {
	const runs = 1 << 20 // 8 MiB of arrays on a 256 KiB device: 1 chunk per ~16 KiB
	k, err := kernel.New("copy", "", func(a kernel.Args, lo, hi int) error {
		copy(a.Float32s(1)[lo:hi], a.Float32s(0)[lo:hi])
		return nil
	}, 0)
	if err != nil {
		b.Fatal(err)
	}
	for _, buffers := range []int{1, 2} {
		b.Run(fmt.Sprintf("bare/buffers=%d", buffers), func(b *testing.B) {
			bb := newBenchBatch(b, 256<<10, runs, buffers, 0)
			s, err := bb.c.Stream()
			if err != nil {
				b.Fatal(err)
			}
			p := bb.b.Plan()
			for b.Loop() {
				for i := range p.Chunks {
					sp, err := p.Span(i, 0)
					if err != nil {
						b.Fatal(err)
					}
					if err := bb.c.ToDeviceChunk(context.Background(), bb.x.Device(0), bb.in, sp); err != nil {
						b.Fatal(err)
					}
					if err := k.Launch(bb.m.Device(), s, sp.Len, bb.x.Device(0), bb.y.Device(0)); err != nil {
						b.Fatal(err)
					}
					if err := bb.c.FromDeviceChunk(context.Background(), bb.out, bb.y.Device(0), sp); err != nil {
						b.Fatal(err)
					}
				}
				if err := s.Synchronize(); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*p.Chunks), "ns/chunk")
			b.ReportMetric(float64(p.Chunks), "chunks")
		})
	}
	for _, buffers := range []int{1, 2} {
		b.Run(fmt.Sprintf("Run/buffers=%d", buffers), func(b *testing.B) {
			bb := newBenchBatch(b, 256<<10, runs, buffers, 0)
			chunks := 0
			for b.Loop() {
				rep := bb.run(b, k, buffers)
				chunks = rep.Chunks
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*chunks), "ns/chunk")
			b.ReportMetric(float64(chunks), "chunks")
		})
	}
}

// BenchmarkBatchStaging runs BenchmarkBatchOverlap's two-buffer batch
// (32 MiB each way over an emulated 1 GB/s link, a kernel of 8 ms a
// chunk) with its host arrays pinned (copied directly), pageable and
// file-backed (both staged through the staging pool), and reports the
// batch's wall time: staging's cost is the difference from pinned.
func BenchmarkBatchStaging(b *testing.B) {
	const runs = 8 << 20
	for _, rung := range []vram.HostRung{vram.RungPinned, vram.RungPageable, vram.RungFile} {
		b.Run(rung.String(), func(b *testing.B) {
			bb := newBenchBatch(b, 8<<20, runs, 2, 1e9, vram.WithHostOptions(vram.HostOptions{SpillDir: b.TempDir()}))
			var err error
			for _, h := range []**vram.HostArray{&bb.in, &bb.out} {
				if *h, err = bb.m.Host().Alloc([]int{runs}, vram.Float32, vram.HostArrayOptions{Rung: rung}); err != nil {
					b.Fatal(err)
				}
				defer (*h).Free()
			}
			bb.use(b)
			k, err := kernel.New("wait", "", func(a kernel.Args, lo, hi int) error {
				if lo == 0 {
					time.Sleep(8 * time.Millisecond)
				}
				copy(a.Float32s(1)[lo:hi], a.Float32s(0)[lo:hi])
				return nil
			}, 0)
			if err != nil {
				b.Fatal(err)
			}
			var wall time.Duration
			staged := 0
			for b.Loop() {
				rep := bb.run(b, k, 2)
				wall += rep.Wall
				staged = rep.Staged
			}
			b.ReportMetric(wall.Seconds()/float64(b.N)*1e3, "wall-ms")
			b.ReportMetric(float64(staged), "staged")
		})
	}
}

// BenchmarkBatchBuffersChosen runs BenchmarkBatchOverlap's batch (32 MiB
// each way) with one buffer, two, and as many as the run chooses after
// its first chunk, on a link of 1 GB/s (copies as long as the kernels:
// a second buffer hides them) and at host memory speed (copies next to
// nothing beside 8 ms kernels: it hides nothing and halves the chunks),
// and reports the wall time and the buffers used: the chosen count
// should run as fast as the better of the two.
func BenchmarkBatchBuffersChosen(b *testing.B) {
	const runs = 8 << 20
	k, err := kernel.New("wait", "", func(a kernel.Args, lo, hi int) error {
		if lo == 0 {
			time.Sleep(8 * time.Millisecond)
		}
		copy(a.Float32s(1)[lo:hi], a.Float32s(0)[lo:hi])
		return nil
	}, 0)
	if err != nil {
		b.Fatal(err)
	}
	for _, link := range []uint64{1e9, 0} {
		for _, buffers := range []int{1, 2, 0} {
			b.Run(fmt.Sprintf("link=%.0fGB/buffers=%d", float64(link)/1e9, buffers), func(b *testing.B) {
				bb := newBenchBatch(b, 8<<20, runs, max(buffers, 1), link)
				var wall time.Duration
				used := 0
				for b.Loop() {
					rep := bb.run(b, k, buffers)
					wall, used = wall+rep.Wall, rep.Buffers
				}
				b.ReportMetric(wall.Seconds()/float64(b.N)*1e3, "wall-ms")
				b.ReportMetric(float64(used), "buffers")
			})
		}
	}
}

// BenchmarkBatchRecut measures what a re-cut costs: a batch of 256
// chunks whose cap is halved and restored every 16 chunks (a re-cut
// each: the chunks in flight finished, the arrays allocated again), and
// the same batch with its cap left alone; the difference of their wall
// times over the re-cuts is the time one takes, which bounds how fast a
// batch gives memory back.
func BenchmarkBatchRecut(b *testing.B) {
	const runs = 256 << 12 // 256 chunks of 4096 runs under a cap of 32 KiB
	k, err := kernel.New("copy", "", func(a kernel.Args, lo, hi int) error {
		copy(a.Float32s(1)[lo:hi], a.Float32s(0)[lo:hi])
		return nil
	}, 0)
	if err != nil {
		b.Fatal(err)
	}
	for _, toggle := range []bool{false, true} {
		b.Run(fmt.Sprintf("recuts=%v", toggle), func(b *testing.B) {
			const capBytes = 8 << 12
			bb := newBenchBatch(b, 8<<20, runs, 1, 0, vram.WithCap(capBytes), vram.WithLogger(slog.New(slog.DiscardHandler)))
			var wall time.Duration
			recuts := 0
			for b.Loop() {
				every := 0
				if toggle {
					every = 16
				}
				rep := bb.runRecut(b, k, capBytes, every)
				wall, recuts = wall+rep.Wall, len(rep.Recuts)
			}
			b.ReportMetric(wall.Seconds()/float64(b.N)*1e3, "wall-ms")
			b.ReportMetric(float64(recuts), "recuts")
		})
	}
}
