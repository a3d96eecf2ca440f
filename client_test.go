package vram

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/vramkit/vram/account"
	"github.com/vramkit/vram/alloc"
	"github.com/vramkit/vram/device/sim"
	"github.com/vramkit/vram/internal/units"
)

// TestConcurrentClients runs many goroutines that register, queue,
// allocate, copy, move and close clients at once, while others switch
// allocators and invalidate everything. Run under -race. Afterwards the
// pools must be empty and the device's free memory back where it
// started.
func TestConcurrentClients(t *testing.T) {
	for _, kind := range []AllocatorKind{Pool, Direct, AsyncPool} {
		t.Run(kind.String(), func(t *testing.T) {
			const total = 256 * MiB
			dev := newSim(t, total)
			free0, _, _ := dev.MemInfo()
			// A limit of 24 MiB in use makes group g3's batch (2 × 3M
			// float32 = 24 MiB) chunk, and lets the groups compete.
			m, err := New(dev, WithAllocatorChoice(account.Choice{Kind: kind}), WithWrap(func(a alloc.Allocator) alloc.Allocator {
				return alloc.NewLimit(a, 24*MiB)
			}))
			if err != nil {
				t.Fatal(err)
			}
			workers, iters := 12, 25
			if testing.Short() {
				workers, iters = 6, 10
			}
			var wg sync.WaitGroup
			var mu sync.Mutex
			counts := map[string]int{}
			count := func(k string) { mu.Lock(); counts[k]++; mu.Unlock() }
			for w := range workers {
				wg.Go(func() {
					rng := rand.New(rand.NewPCG(uint64(w), 7))
					for i := range iters {
						if err := clientLife(m, rng, w, i, count); err != nil {
							t.Error(err)
							return
						}
					}
				})
			}
			stop := make(chan struct{})
			var side sync.WaitGroup
			side.Go(func() {
				kinds := []AllocatorKind{Direct, Pool, AsyncPool}
				for i := 0; ; i++ {
					select {
					case <-stop:
						return
					default:
					}
					var err error
					if i%2 == 0 {
						err = m.SetAllocator(kinds[i%3])
					} else {
						err = m.InvalidateAll()
					}
					if err != nil {
						t.Error(err)
					}
					time.Sleep(500 * time.Microsecond) // let lives finish between resets
				}
			})
			wg.Wait()
			close(stop)
			side.Wait()
			if n := len(m.Clients()); n != 0 {
				t.Errorf("%d clients left", n)
			}
			if p := m.Shares().Manual; p != 0 {
				t.Errorf("manual pool %v after every client closed", p)
			}
			if err := m.Account().Allocator().Trim(); err != nil {
				t.Fatal(err)
			}
			if st := m.Account().Allocator().Stats(); st.InUse != 0 {
				t.Errorf("allocator has %d bytes in use", st.InUse)
			}
			if err := m.Close(); err != nil {
				t.Fatal(err)
			}
			if f, _, _ := dev.MemInfo(); f != free0 {
				t.Errorf("device free %d, was %d; on the device: %v", f, free0, dev.Leaks())
			}
			if counts["allocated"] == 0 || counts["chunked"] == 0 {
				t.Errorf("the test did too little: %v", counts)
			}
			t.Logf("%v", counts)
		})
	}
}

// groupRuns is the run count of each group's batch: every member of a
// group queues the same, as a batch program's components do.
var groupRuns = []int{1000, 4000, 50000, 3 << 20}

// clientLife is one client's life: register, queue, allocate, copy,
// maybe move, close. Outcomes caused by the concurrent clients (a limit
// reached by another group, arrays freed by SetAllocator or InvalidateAll)
// are expected and counted. Running out of memory is not: allocations
// are planned in turn, each against what the others left.
func clientLife(m *Manager, rng *rand.Rand, w, i int, count func(string)) error {
	p := 0.0
	if rng.IntN(3) == 0 {
		p = 0.001 * float64(1+rng.IntN(5))
	}
	g := rng.IntN(len(groupRuns))
	c, err := m.Register(ClientOptions{Name: fmt.Sprintf("w%d-%d", w, i), Proportion: p, Group: fmt.Sprintf("g%d", g)})
	if errors.Is(err, ErrProportion) {
		count("refused")
		return nil
	}
	if err != nil {
		return err
	}
	defer c.Close()
	reqs := map[string]ArrayRequest{
		"x": {Shape: []int{2, groupRuns[g]}, DType: Float32, ChunkAxis: 1},
		"k": {Shape: []int{1 + rng.IntN(64)}, DType: Float64, Unchunkable: true},
	}
	if err := c.Queue(reqs); err != nil {
		return err
	}
	resp, err := c.Allocate(context.Background(), WithBuffers(1+rng.IntN(2)))
	switch {
	case errors.Is(err, ErrRunTooLarge) || errors.Is(err, ErrUnchunkable):
		// Other groups hold the memory (or the limit) meanwhile.
		count("no room")
		return nil
	case errors.Is(err, ErrNothingQueued):
		// Another member of the group allocated our queue; the hook
		// was not set, so just go on.
		count("by another")
		return nil
	case err != nil:
		return err
	}
	count("allocated")
	if resp.Plan.Chunks > 1 {
		count("chunked")
	}
	x := resp.Arrays()["x"]
	if x == nil {
		count("notary")
		return nil
	}
	host, err := m.NewHostArray([]int{2, resp.Plan.TotalRuns}, Float32, Pinned, nil)
	if err != nil {
		return err
	}
	defer host.Free()
	for ch := range resp.Plan.Chunks {
		sp, err := resp.Span(ch, 1)
		if err != nil {
			return err
		}
		if err := c.ToDeviceChunk(context.Background(), x, host, sp); err != nil {
			if errors.Is(err, ErrFreed) {
				count("freed under us")
				return nil
			}
			return err
		}
	}
	if err := c.Sync(context.Background()); err != nil {
		return err
	}
	if rng.IntN(5) == 0 {
		if err := c.ChangeStreamGroup(fmt.Sprintf("spare%d", rng.IntN(3))); err != nil {
			return err
		}
	}
	if rng.IntN(3) == 0 {
		if err := c.Free("x"); err != nil {
			return err
		}
	}
	return nil
}

// TestConcurrentActiveMode is TestConcurrentClients' client life under
// the Active limit mode, where caps shrink as clients join.
func TestConcurrentActiveMode(t *testing.T) {
	m, dev, _ := newManager(t, 64*MiB, WithAllocatorChoice(account.Choice{Kind: Pool}), WithLimitMode(Active))
	free0, _, _ := dev.MemInfo()
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 9))
			for i := range 15 {
				if err := clientLife(m, rng, w, i, func(string) {}); err != nil {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	_ = m.Account().Allocator().Trim()
	if f, _, _ := dev.MemInfo(); f != free0 {
		t.Errorf("device free %d, was %d", f, free0)
	}
}

// TestCloseWhileRegistering: clients registering, queueing and allocating
// while the manager closes either succeed or get ErrClosed, and the
// device is left with nothing.
func TestCloseWhileRegistering(t *testing.T) {
	dev := newSim(t, 64*MiB)
	m, err := New(dev)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for w := range 6 {
		wg.Go(func() {
			for i := 0; ; i++ {
				c, err := m.Register(ClientOptions{Group: fmt.Sprintf("g%d", (w+i)%3)})
				if err == nil {
					err = c.Queue(map[string]ArrayRequest{"x": req(Float32, 0, 100)})
				}
				if err == nil {
					_, err = c.Allocate(context.Background())
				}
				if errors.Is(err, ErrClosed) {
					return
				}
				if err != nil && !errors.Is(err, ErrNothingQueued) { // a group member took our queue
					t.Error(err)
					return
				}
			}
		})
	}
	time.Sleep(20 * time.Millisecond)
	if err := m.Close(); err != nil {
		t.Error(err)
	}
	wg.Wait()
}

// BenchmarkRegisterClose measures one Register and one Close with n
// clients already registered (a third of them manual, in 8 groups).
// Everything is O(1) in n: the cost should stay flat from 10 to 100,000.
func BenchmarkRegisterClose(b *testing.B) {
	for _, n := range []int{10, 100, 1000, 10_000, 100_000} {
		b.Run(fmt.Sprintf("clients=%d", n), func(b *testing.B) {
			dev := newSim(b, units.GiB, func(c *sim.Config) { c.AddressOnly = true })
			m, err := New(dev, WithAllocatorChoice(account.Choice{Kind: Direct}))
			if err != nil {
				b.Fatal(err)
			}
			defer m.Close()
			for i := range n {
				p := 0.0
				if i%3 == 0 {
					p = 1e-7
				}
				if _, err := m.Register(ClientOptions{Proportion: p, Group: fmt.Sprintf("g%d", i%8)}); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				p := 0.0
				if i%3 == 0 {
					p = 1e-7
				}
				c, err := m.Register(ClientOptions{Proportion: p, Group: "g3"})
				if err != nil {
					b.Fatal(err)
				}
				if err := c.Close(); err != nil {
					b.Fatal(err)
				}
				i++
			}
		})
	}
}

func TestSyncCancelled(t *testing.T) {
	tests := map[string]struct {
		ctx  func() (context.Context, context.CancelFunc)
		want error
	}{
		"cancelled": {func() (context.Context, context.CancelFunc) {
			ctx, cancel := context.WithCancel(context.Background())
			time.AfterFunc(10*time.Millisecond, cancel)
			return ctx, cancel
		}, context.Canceled},
		"deadline": {func() (context.Context, context.CancelFunc) {
			return context.WithTimeout(context.Background(), 10*time.Millisecond)
		}, context.DeadlineExceeded},
		"done before the call": {func() (context.Context, context.CancelFunc) {
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			return ctx, cancel
		}, context.Canceled},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			m, _, _ := newManager(t, 64*MiB)
			c := register(t, m, ClientOptions{})
			release := blockStream(t, m, c)
			ctx, cancel := tc.ctx()
			defer cancel()
			done := make(chan error, 1)
			go func() { done <- c.Sync(ctx) }()
			select {
			case err := <-done:
				if !errors.Is(err, tc.want) {
					t.Errorf("Sync = %v; want an error wrapping %v", err, tc.want)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("Sync waited for a stream that never finishes despite its context")
			}
			release()
			if err := c.Sync(context.Background()); err != nil {
				t.Errorf("Sync once the stream is free: %v", err)
			}
		})
	}
}

// TestFreeWaitsUnderDirect backs the package doc's word on frees: under
// Direct, a client's Free waits for the work of another group's stream
// (as cuMemFree waits for the device); under the pools it does not.
func TestFreeWaitsUnderDirect(t *testing.T) {
	for kind, waits := range map[AllocatorKind]bool{Direct: true, Pool: false, AsyncPool: false} {
		t.Run(kind.String(), func(t *testing.T) {
			m, dev, _ := newManager(t, 64*MiB, WithAllocatorChoice(account.Choice{Kind: kind}))
			a := register(t, m, ClientOptions{Name: "a", Group: "a"})
			b := register(t, m, ClientOptions{Name: "b", Group: "b"})
			holdBytes(t, a, int(MiB))
			s, err := b.Stream()
			must(t, err)
			open := gateStream(t, dev, s) // b's stream busy until open
			done := make(chan error, 1)
			go func() { done <- a.Free("x") }()
			wait := 100 * time.Millisecond // a Free that waits must not return in this
			if !waits {
				wait = 10 * time.Second // a Free that does not wait returns in this, however loaded the machine
			}
			select {
			case err := <-done:
				open()
				must(t, err)
				if waits {
					t.Fatal("Free returned while another group's stream was still at work")
				}
			case <-time.After(wait):
				open()
				if !waits {
					t.Fatal("Free waited for another group's stream")
				}
				must(t, <-done)
			}
			must(t, b.Sync(context.Background()))
		})
	}
}
