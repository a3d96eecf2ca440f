package batch_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/vramkit/vram"
	"github.com/vramkit/vram/batch"
	"github.com/vramkit/vram/device"
)

// TestRunCopyFails makes the nth copy from the start of a batch fail on
// the device (as a transfer error: the copy is accepted, its stream
// reports the failure later) and checks that Run returns an error that
// wraps device.ErrCopyFailed, never nil with results missing, and that
// what it enqueued has finished and been freed.
func TestRunCopyFails(t *testing.T) {
	for _, buffers := range []int{1, 2} {
		for _, side := range []string{"pinned", "pageable"} {
			for _, n := range []int{1, 2, 5, 9} {
				t.Run(fmt.Sprintf("%d buffers, %s, copy %d", buffers, side, n), func(t *testing.T) {
					f := newBatchFixture(t, 200_000, buffers)
					mem := vram.Pinned
					if side == "pageable" {
						mem = vram.Pageable
					}
					f.hosts(t, mem)
					before := f.leaks(t)
					f.dev.Faults().FailCopyAt(n)
					defer f.dev.Faults().Clear()
					rep, err := f.b.Run(context.Background(), batch.Options{Buffers: buffers}, f.compute)
					if !errors.Is(err, device.ErrCopyFailed) {
						t.Fatalf("Run: %v (report %d of %d chunks done); want an error wrapping device.ErrCopyFailed", err, rep.ChunksDone, rep.Chunks)
					}
					if rep.ChunksDone >= rep.Chunks {
						t.Errorf("%d of %d chunks reported done with a copy failed", rep.ChunksDone, rep.Chunks)
					}
					f.dev.Faults().Clear()
					if after := f.leaks(t); after != before {
						t.Errorf("device before: %v; after: %v", before, after)
					}
				})
			}
		}
	}
}
