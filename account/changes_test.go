package account

import (
	"context"
	"errors"
	"testing"

	"github.com/vramkit/vram/internal/simtest"
)

// TestWaitChange: a wait after a change already made returns at once;
// one for the next returns at the next Note; a done context ends it.
func TestWaitChange(t *testing.T) {
	a, err := New(simtest.New(t, 64*MiB), Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close(nil)
	if c := a.LastChange(); c.Seq != 0 {
		t.Fatalf("a new account's last change: %+v; want none", c)
	}
	a.Note("first")
	if c, err := a.WaitChange(context.Background(), 0); err != nil || c.Seq != 1 || c.Why != "first" {
		t.Errorf("WaitChange(0) after one change = %+v, %v; want it at once", c, err)
	}
	done := make(chan Change, 1)
	go func() {
		c, _ := a.WaitChange(context.Background(), 1)
		done <- c
	}()
	a.Note("second")
	if c := <-done; c.Seq != 2 || c.Why != "second" {
		t.Errorf("the wait for the next change got %+v", c)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if c, err := a.WaitChange(ctx, 2); !errors.Is(err, context.Canceled) || c.Seq != 2 {
		t.Errorf("a cancelled wait = %+v, %v; want the latest and context.Canceled", c, err)
	}
}
