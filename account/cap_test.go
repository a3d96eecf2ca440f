package account

import (
	"context"
	"errors"
	"math"
	"testing"

	"github.com/vramkit/vram/alloc"
	"github.com/vramkit/vram/device"
)

// liveOwner is an Owner that holds the allocations in live.
type liveOwner struct{ live map[device.Ptr]uint64 }

func (o *liveOwner) Reclaim(context.Context, uint64) int { return 0 }
func (o *liveOwner) Live(yield func(device.Ptr, uint64)) {
	for p, n := range o.live {
		yield(p, n)
	}
}

// TestSetCapOnAnAccountWithout: the first cap wraps the allocator in a
// Limit that counts what the owner holds already, so an allocation past
// it is refused; removing it lets it through; each change is a Change.
func TestSetCapOnAnAccountWithout(t *testing.T) {
	o := &liveOwner{live: map[device.Ptr]uint64{}}
	a, dev := newDirect(t, Config{Owner: o})
	s := dev.DefaultStream()
	p, err := a.AllocExact(4*MiB, s)
	if err != nil {
		t.Fatal(err)
	}
	o.live[p] = 4 * MiB
	if c, used := a.Cap(); c != 0 || used != 0 {
		t.Errorf("Cap before any = %d, %d; want none", c, used)
	}
	seq := a.LastChange().Seq
	must(t, a.SetCap(6*MiB))
	if c, used := a.Cap(); c != 6*MiB || used != 4*MiB {
		t.Errorf("Cap = %d MiB, %d MiB used; want 6 MiB with the owner's 4 MiB counted", c/MiB, used/MiB)
	}
	if _, err := a.AllocExact(4*MiB, s); !errors.Is(err, ErrOutOfMemory) {
		t.Errorf("4 MiB more under a cap of 6 with 4 held: %v; want ErrOutOfMemory", err)
	}
	must(t, a.SetCap(0))
	q, err := a.AllocExact(4*MiB, s)
	if err != nil {
		t.Errorf("4 MiB more with the cap removed: %v", err)
	}
	if c := a.LastChange(); c.Seq != seq+2 {
		t.Errorf("changes %d after two caps; want %d", c.Seq, seq+2)
	}
	must(t, a.Free(q, s))
	must(t, a.Free(p, s))
}

// TestWaitWithinCap: under a cap lowered below what is held the wait
// ends when a free brings it back, or with its context's error naming
// both figures.
func TestWaitWithinCap(t *testing.T) {
	a, dev := newDirect(t, Config{Cap: 16 * MiB})
	s := dev.DefaultStream()
	p, err := a.AllocExact(8*MiB, s)
	if err != nil {
		t.Fatal(err)
	}
	must(t, a.SetCap(4*MiB))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := a.WaitWithinCap(ctx); !errors.Is(err, context.Canceled) {
		t.Errorf("WaitWithinCap over the cap, cancelled: %v; want context.Canceled", err)
	}
	done := make(chan error, 1)
	go func() { done <- a.WaitWithinCap(context.Background()) }()
	must(t, a.Free(p, s))
	if err := <-done; err != nil {
		t.Errorf("WaitWithinCap once freed: %v", err)
	}
}

// TestRoom: each bound as Room states it.
func TestRoom(t *testing.T) {
	a, dev := newDirect(t, Config{Cap: 16 * MiB})
	s := dev.DefaultStream()
	p, err := a.AllocExact(8*MiB, s)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Free(p, s)
	for _, step := range []struct {
		name              string
		cap               uint64
		capRoom, over, at uint64
	}{
		{"under the cap", 16 * MiB, 8 * MiB, 0, 16 * MiB},
		{"the cap lowered below what is held", 4 * MiB, 0, 4 * MiB, 4 * MiB},
		{"no cap", 0, math.MaxUint64, 0, alloc.NoCap},
	} {
		t.Run(step.name, func(t *testing.T) {
			must(t, a.SetCap(step.cap))
			r, err := a.Room()
			if err != nil {
				t.Fatal(err)
			}
			if r.Cap != step.at || r.CapRoom != step.capRoom || r.Over != step.over || r.Held != 8*MiB || r.Free != 56*MiB ||
				r.Kind != alloc.KindDirect || r.Coster == nil || r.Leased {
				t.Errorf("Room = %+v; want cap %d, room %d, over %d, 8 MiB held, 56 MiB free", r, step.at, step.capRoom, step.over)
			}
		})
	}
}
