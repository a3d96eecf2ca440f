//go:build linux

package vram_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/vramkit/vram"
	"github.com/vramkit/vram/batch"
	"github.com/vramkit/vram/broker"
)

// restartForgetting stops w's broker and serves a new one at its socket
// whose key is new: it takes no lease back.
func (w *leaseWorld) restartForgetting(t *testing.T) {
	t.Helper()
	w.srv.Stop()
	probe := w.device(t)
	srv, err := broker.NewServer(broker.Config{Devices: []broker.Device{{Name: "shared", ID: probe.Info().ID, Total: w.total}},
		Logger: quietLog})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := broker.Listen(w.socket, 0o600, -1)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	t.Cleanup(func() {
		srv.Stop()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	w.srv = srv
}

// A lease the broker does not take back after a restart ends the
// manager's budget: BudgetChange.Ended wraps ErrLease, a running batch
// stops at its next chunk boundary with it, and an Allocate fails. (A
// vram run whose lease was not taken back once kept its arrays and
// finished, while the broker granted that memory to another job.)
func TestLeaseEndedStopsTheBatch(t *testing.T) {
	w := newLeaseWorld(t, 64*leaseMiB, time.Second)
	m := w.manager(t, "job")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := m.Register(vram.ClientOptions{Name: "job", Group: "job"})
	if err != nil {
		t.Fatal(err)
	}
	b := batch.New()
	defer b.Close()
	// 512 MiB of runs on 64 MiB (scratch: the device holds no bytes).
	b.Scratch(c, "x", vram.ArrayRequest{Shape: []int{128 << 20}, DType: vram.Float32})
	if err := b.Allocate(ctx, vram.WithBuffers(1)); err != nil {
		t.Fatal(err)
	}
	var ended error
	rep, err := b.Run(ctx, batch.Options{Buffers: 1}, func(_ context.Context, ch *batch.Chunk) error {
		if ch.Index != 1 {
			return nil
		}
		w.restartForgetting(t)
		for seq := uint64(0); ended == nil; {
			bc, err := m.WaitBudgetChange(ctx, seq)
			if err != nil {
				return err
			}
			seq, ended = bc.Seq, bc.Ended
		}
		return nil
	})
	if !errors.Is(ended, vram.ErrLease) {
		t.Fatalf("BudgetChange.Ended = %v, want ErrLease (the batch: %+v, %v)", ended, rep, err)
	}
	if !errors.Is(err, vram.ErrLease) || rep.RunsLeft == 0 {
		t.Fatalf("the batch: %d runs left, %v; want it stopped with ErrLease", rep.RunsLeft, err)
	}
	t.Logf("the batch: %v", err)
	if _, err := holdArray(ctx, m, "after", leaseMiB); !errors.Is(err, vram.ErrLease) {
		t.Errorf("an Allocate after the lease ended: %v, want ErrLease", err)
	}
}
