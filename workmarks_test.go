package vram

import (
	"errors"
	"testing"
)

// TestWorkMarks: a client is idle only with no mark open and the GPU
// done with the work enqueued before each End; events are closed (newSim
// fails the test on a leaked event) whether the client, or the manager,
// closes with them pending.
func TestWorkMarks(t *testing.T) {
	for name, closeBy := range map[string]string{"client closes": "client", "manager closes": "manager", "seen done": ""} {
		t.Run(name, func(t *testing.T) {
			m, dev, _ := newManager(t, 64*MiB)
			c := register(t, m, ClientOptions{Name: "c", Group: "g"})
			idle := func(want bool, when string) {
				t.Helper()
				if got, err := c.Idle(); err != nil || got != want {
					t.Fatalf("%s: idle %v, %v; want %v", when, got, err, want)
				}
			}
			idle(true, "registered")
			w1, err := c.BeginWork()
			if err != nil {
				t.Fatal(err)
			}
			w2, err := c.BeginWork()
			if err != nil {
				t.Fatal(err)
			}
			idle(false, "two marks open")
			s, err := c.Stream()
			if err != nil {
				t.Fatal(err)
			}
			open := gateStream(t, dev, s)
			if err := errors.Join(w1.End(), w1.End()); err != nil { // a second End does nothing
				t.Fatal(err)
			}
			idle(false, "one mark open")
			if err := w2.End(); err != nil {
				t.Fatal(err)
			}
			idle(false, "marks ended, the GPU still at work")
			// Two Ends on one stream keep one event.
			if n := len(c.work.pending); n != 1 {
				t.Errorf("%d events pending, want 1", n)
			}
			switch closeBy {
			case "client":
				open()
				if err := c.Close(); err != nil {
					t.Fatal(err)
				}
				return
			case "manager":
				open()
				if err := m.Close(); err != nil {
					t.Fatal(err)
				}
				return
			}
			open()
			if err := s.Synchronize(); err != nil {
				t.Fatal(err)
			}
			idle(true, "the GPU done")
			if n := len(c.work.pending); n != 0 {
				t.Errorf("%d events pending once seen done, want 0", n)
			}
		})
	}
}

// TestWorkMarkOfClosedClient: ending a mark after its client closed is
// fine, and BeginWork on a closed client says so.
func TestWorkMarkOfClosedClient(t *testing.T) {
	m, _, _ := newManager(t, 64*MiB)
	c := register(t, m, ClientOptions{Name: "c"})
	w, err := c.BeginWork()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if err := w.End(); err != nil {
		t.Errorf("End after Close: %v", err)
	}
	if _, err := c.BeginWork(); !errors.Is(err, ErrClosed) {
		t.Errorf("BeginWork after Close: %v, want ErrClosed", err)
	}
}
