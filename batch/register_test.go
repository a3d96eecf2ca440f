package batch_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/vramkit/vram"
	"github.com/vramkit/vram/batch"
	"github.com/vramkit/vram/internal/simtest"
	"github.com/vramkit/vram/kernel"
)

// TestRegister: clients the batch registers share a group, run a batch
// and are closed by Close (the manager has no clients left); a refused
// registration, or one of no manager, is Allocate's error, and the
// clients registered before it are closed all the same.
func TestRegister(t *testing.T) {
	req := vram.ArrayRequest{Shape: []int{1000}, DType: vram.Float32}
	tests := map[string]struct {
		second  vram.ClientOptions
		noMgr   bool
		want    error  // Allocate's error; nil: the batch runs
		wantMsg string // in Allocate's error
	}{
		"two clients":           {second: vram.ClientOptions{Name: "writer", Proportion: 0.25}},
		"a refused proportion":  {second: vram.ClientOptions{Name: "writer", Proportion: 2}, want: vram.ErrProportion, wantMsg: `"writer"`},
		"no manager":            {second: vram.ClientOptions{Name: "writer"}, noMgr: true, want: batch.ErrBatch, wantMsg: `register "writer": a nil manager`},
		"another group refused": {second: vram.ClientOptions{Name: "writer", Group: "other"}, want: batch.ErrBatch, wantMsg: "share one group"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			m, err := vram.New(simtest.New(t, 8<<20))
			must(t, err)
			defer m.Close()
			b := batch.New()
			solver := b.Register(m, vram.ClientOptions{Name: "solver", Proportion: 0.5})
			mgr := m
			if tc.noMgr {
				mgr = nil
			}
			writer := b.Register(mgr, tc.second)
			x := b.In(solver, "x", req)
			y := b.Out(writer, "y", req)
			err = b.Allocate(context.Background())
			switch {
			case tc.want != nil && (!errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.wantMsg)):
				t.Errorf("Allocate: %v; want an error wrapping %v that says %q", err, tc.want, tc.wantMsg)
			case tc.want == nil && err != nil:
				t.Fatalf("Allocate: %v", err)
			case tc.want == nil:
				runAffine(t, b, x, y)
			}
			if err := b.Close(); err != nil {
				t.Errorf("Close: %v", err)
			}
			if cs := m.Clients(); len(cs) != 0 {
				t.Errorf("after Close the manager has clients %v; want none", cs)
			}
			if !solver.Closed() {
				t.Errorf("the solver is open after Close")
			}
			if err := b.Close(); err != nil {
				t.Errorf("second Close: %v", err)
			}
		})
	}
}

// runAffine runs y = 2x+1 over b's runs and checks every result.
func runAffine(t *testing.T, b *batch.Batch, x, y *batch.Array) {
	t.Helper()
	must(t, b.MakeHosts())
	k, err := kernel.New("affine", "", func(a kernel.Args, lo, hi int) error {
		x, y := a.Float32s(0), a.Float32s(1)
		for i := lo; i < hi; i++ {
			y[i] = 2*x[i] + 1
		}
		return nil
	}, 0)
	must(t, err)
	defer k.Close()
	xs := x.Host().Float32s()
	for i := range xs {
		xs[i] = float32(i)
	}
	_, err = b.Run(context.Background(), batch.Options{}, func(_ context.Context, ch *batch.Chunk) error {
		return ch.Launch(k, x, y, uint32(ch.Len))
	})
	must(t, err)
	for i, v := range y.Host().Float32s() {
		if v != 2*xs[i]+1 {
			t.Fatalf("y[%d] = %v, want %v", i, v, 2*xs[i]+1)
		}
	}
}
