package batch_test

import (
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/vramkit/vram"
	"github.com/vramkit/vram/batch"
	"github.com/vramkit/vram/kernel"
)

// BenchmarkBatchStagedRecut runs a batch staged through the manager's
// staging pool (its input filled and its output drained by functions:
// 32 MiB each way, 16 chunks of 2 MiB slots), again and again on one
// manager, with its cap left alone and halved and restored every four
// chunks (a re-cut each); it reports the wall time, the staging buffers
// the pool made (pinned) a batch and those it gave up: pinned once and
// reused, a batch after the first makes none, re-cut or not.
func BenchmarkBatchStagedRecut(b *testing.B) {
	const runs, chunkRuns = 8 << 20, 512 << 10
	k, err := kernel.New("copy", "", func(a kernel.Args, lo, hi int) error {
		copy(a.Float32s(1)[lo:hi], a.Float32s(0)[lo:hi])
		return nil
	}, 0)
	if err != nil {
		b.Fatal(err)
	}
	fill := batch.Fill(func(sp vram.Span, st *vram.HostArray) error {
		x := st.Float32s()
		for i := range sp.Len {
			x[i] = float32(sp.Start + i)
		}
		return nil
	})
	drain := batch.Drain(func(vram.Span, *vram.HostArray) error { return nil })
	for _, recuts := range []bool{false, true} {
		b.Run(fmt.Sprintf("recuts=%v", recuts), func(b *testing.B) {
			const capBytes = 8 * chunkRuns
			bb := newBenchBatch(b, 64<<20, runs, 1, 0, vram.WithCap(capBytes), vram.WithLogger(slog.New(slog.DiscardHandler)))
			if err := bb.x.Use(fill); err != nil {
				b.Fatal(err)
			}
			if err := bb.y.Use(drain); err != nil {
				b.Fatal(err)
			}
			var wall time.Duration
			st0 := bb.m.Host().Staging().Stats()
			for b.Loop() {
				every := 0
				if recuts {
					every = 4
				}
				rep := bb.runRecut(b, k, capBytes, every)
				wall += rep.Wall
			}
			st := bb.m.Host().Staging().Stats()
			b.ReportMetric(wall.Seconds()/float64(b.N)*1e3, "wall-ms")
			b.ReportMetric(float64(st.Grows-st0.Grows)/float64(b.N), "pinned/op")
			b.ReportMetric(float64(st.Trims-st0.Trims)/float64(b.N), "unpinned/op")
		})
	}
}
