package batch_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/vramkit/vram"
	"github.com/vramkit/vram/batch"
)

// TestRunPanic makes a batch's Compute, fill, drain and Progress panic
// in its third chunk: the panic becomes the batch's error (wrapping
// ErrPanic, with the value clipped and where it was raised), and the
// batch leaves nothing behind: its clients idle again, its staging
// buffers back, the device as before.
func TestRunPanic(t *testing.T) {
	huge := strings.Repeat("x", 1<<20)
	tests := map[string]struct {
		where string // compute, fill, drain, progress
		step  string // what the error names
	}{
		"compute":  {"compute", "compute"},
		"fill":     {"fill", "copy in"},
		"drain":    {"drain", "back on the host"},
		"progress": {"progress", "back on the host"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			f := newBatchFixture(t, 200_000, 2)
			in, table, out := f.hosts(t, vram.Pageable) // staged: buffers to leak
			before := f.leaks(t)
			boom := func(sp vram.Span) {
				if sp.Start/f.plan().ChunkLength == 2 {
					panic(huge)
				}
			}
			must(t, f.in.Use(batch.Fill(func(sp vram.Span, st *vram.HostArray) error {
				if tc.where == "fill" {
					boom(sp)
				}
				return st.CopyChunkFrom(in, sp)
			})))
			must(t, f.table.Use(batch.Host(table)))
			must(t, f.out.Use(batch.Drain(func(sp vram.Span, st *vram.HostArray) error {
				if tc.where == "drain" {
					boom(sp)
				}
				return st.CopyChunkTo(out, sp)
			})))
			compute := func(ctx context.Context, ch *batch.Chunk) error {
				if tc.where == "compute" {
					boom(vram.Span{Start: ch.Start})
				}
				return f.compute(ctx, ch)
			}
			progress := func(p batch.Progress) {
				if tc.where == "progress" {
					boom(vram.Span{Start: p.Start})
				}
			}
			var err error
			func() {
				defer func() {
					if p := recover(); p != nil {
						err = errors.New("the panic came out of Run")
					}
				}()
				_, err = f.b.Run(context.Background(), batch.Options{Buffers: 2, Progress: progress}, compute)
			}()
			var pe *batch.PanicError
			if !errors.Is(err, batch.ErrPanic) || !errors.As(err, &pe) {
				t.Fatalf("error %v, want a *PanicError wrapping ErrPanic", err)
			}
			msg := err.Error()
			if len(msg) > 2000 || !strings.Contains(msg, "xxxx") || !strings.Contains(msg, "string") ||
				!strings.Contains(msg, "panic_test.go") || !strings.Contains(msg, tc.step) || !strings.Contains(msg, "chunk 3 of") {
				t.Errorf("error (%d bytes) %.600q: want the clipped value, its type, where it was raised, the step (%s) and chunk 3", len(msg), msg, tc.step)
			}
			if len(pe.Stack) == 0 {
				t.Error("no stack in the PanicError")
			}
			checkReleased(t, f, before)
		})
	}
}

// checkReleased checks that the fixture's clients are idle (within a
// bounded wait: the marks' events complete on the device), its staging
// pool has every buffer back and the device is as it was.
func checkReleased(t *testing.T, f *batchFixture, before string) {
	t.Helper()
	for _, c := range []*vram.Client{f.solver, f.writer} {
		deadline := time.Now().Add(5 * time.Second)
		idle, err := c.Idle()
		for err == nil && !idle && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond)
			idle, err = c.Idle()
		}
		if err != nil || !idle {
			t.Errorf("%v after the batch: idle %v, %v; want idle", c, idle, err)
		}
	}
	if st := f.m.Host().Staging().Stats(); st.InUse != 0 {
		t.Errorf("staging pool %+v: want no buffer in use", st)
	}
	if after := f.leaks(t); after != before {
		t.Errorf("device before the batch: %v; after: %v", before, after)
	}
}

// TestRunPartsPanic: a Compute that panics on one device's goroutine
// does not end the process; it becomes the batch's error, naming the
// device, and every device is left clean.
func TestRunPartsPanic(t *testing.T) {
	fs, parts, _ := multiParts(t, 200_000, size(1<<20), size(1<<20))
	before := []string{fs[0].leaks(t), fs[1].leaks(t)}
	parts[1].Compute = func(context.Context, *batch.Chunk) error { panic(errors.New("kernel table missing")) }
	_, err := batch.RunParts(context.Background(), parts, batch.Options{})
	if !errors.Is(err, batch.ErrPanic) || !strings.Contains(err.Error(), "device 1") || !strings.Contains(err.Error(), "kernel table missing") {
		t.Fatalf("error %v, want ErrPanic from device 1 with its value", err)
	}
	for i, f := range fs {
		checkReleased(t, f, before[i])
	}
}
