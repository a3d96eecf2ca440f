package vram

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/vramkit/vram/account"
	"github.com/vramkit/vram/alloc"
)

func TestReportClientsAndGroups(t *testing.T) {
	for name, kind := range map[string]AllocatorKind{"pool": Pool, "direct": Direct} {
		t.Run(name, func(t *testing.T) {
			m, _, _ := newManager(t, 64*MiB, WithAllocatorChoice(account.Choice{Kind: kind}), WithCap(48*MiB))
			a := register(t, m, ClientOptions{Name: "a", Proportion: 0.25, Group: "g1"})
			b := register(t, m, ClientOptions{Name: "b"})
			c := register(t, m, ClientOptions{Name: "c", Group: "g1"})
			if err := a.Queue(map[string]ArrayRequest{"x": fixed(Uint8, 8*int(MiB)), "y": fixed(Uint8, 2*int(MiB))}); err != nil {
				t.Fatal(err)
			}
			if _, err := a.Allocate(context.Background()); err != nil {
				t.Fatal(err)
			}
			r := Report(m)
			if r.Allocator != kind || r.TotalMemory != 64*MiB || r.Memory.InUse != 10*MiB || r.Memory.Cap != 48*MiB || r.Memory.CapUsed != 10*MiB {
				t.Errorf("report: %s allocator, total %d, in use %d, cap %d charged %d: want %s, 64 MiB, 10 MiB, 48 MiB and 10 MiB",
					r.Allocator, r.TotalMemory, r.Memory.InUse, r.Memory.Cap, r.Memory.CapUsed, kind)
			}
			auto := uint64(0.375 * float64(64*MiB))
			wantClients := []ClientReport{
				{ID: a.ID(), Name: a.String(), Group: "g1", Manual: true, Proportion: 0.25, Cap: 16 * MiB, Held: 10 * MiB, Arrays: 2},
				{ID: b.ID(), Name: b.String(), Group: "default", Proportion: 0.375, Cap: auto},
				{ID: c.ID(), Name: c.String(), Group: "g1", Proportion: 0.375, Cap: auto},
			}
			if len(r.Clients) != len(wantClients) {
				t.Fatalf("clients %+v, want %+v", r.Clients, wantClients)
			}
			for i, w := range wantClients {
				if r.Clients[i] != w {
					t.Errorf("client %d: %+v, want %+v", i, r.Clients[i], w)
				}
			}
			wantGroups := []GroupReport{{Name: "default", Clients: 1, Cap: auto}, {Name: "g1", Clients: 2, Cap: 16*MiB + auto, Held: 10 * MiB}}
			if len(r.Groups) != 2 || r.Groups[0] != wantGroups[0] || r.Groups[1] != wantGroups[1] {
				t.Errorf("groups %+v, want %+v", r.Groups, wantGroups)
			}
			s := r.String()
			for _, want := range []string{"largest free block", "a#", "g1", "10 MiB"} {
				if !strings.Contains(s, want) {
					t.Errorf("String() does not show %q:\n%s", want, s)
				}
			}
		})
	}
}

// TestOOMObserver: the manager's observer sees each of its allocator's
// out-of-memory failures once, with the clients as they were.
func TestOOMObserver(t *testing.T) {
	var mu sync.Mutex
	var seen []ManagerReport
	var errs []*alloc.OutOfMemoryError
	m, dev, _ := newManager(t, 64*MiB, WithAllocatorChoice(account.Choice{Kind: Pool}), WithOOMObserver(func(e *alloc.OutOfMemoryError, r ManagerReport) {
		mu.Lock()
		defer mu.Unlock()
		seen = append(seen, r)
		errs = append(errs, e)
	}))
	c := register(t, m, ClientOptions{Name: "c"})
	if err := c.Queue(map[string]ArrayRequest{"x": fixed(Uint8, 4*int(MiB))}); err != nil {
		t.Fatal(err)
	}
	dev.Faults().OOMAbove(MiB)
	_, err := c.Allocate(context.Background())
	dev.Faults().Clear()
	var oe *alloc.OutOfMemoryError
	if !errors.Is(err, ErrOutOfMemory) || !errors.As(err, &oe) {
		t.Fatalf("Allocate on a device refusing more than 1 MiB: err = %v, want ErrOutOfMemory and an *alloc.OutOfMemoryError", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(seen) == 0 || errs[len(errs)-1] != oe {
		t.Fatalf("observer saw %d failures, want the last to be Allocate's error", len(seen))
	}
	stats := m.Account().Allocator().Stats()
	if uint64(len(seen)) != stats.OOMs {
		t.Errorf("observer called %d times for %d out-of-memory failures", len(seen), stats.OOMs)
	}
	r := seen[len(seen)-1]
	if r.Memory != oe.Report() || r.Allocator != Pool || len(r.Clients) != 1 || r.Clients[0].ID != c.ID() {
		t.Errorf("observer's report %+v: want the error's report and client c", r)
	}
}

func TestOOMObserverPinned(t *testing.T) {
	calls := 0
	var got ManagerReport
	m, dev, _ := newManager(t, 64*MiB, WithOOMObserver(func(_ *alloc.OutOfMemoryError, r ManagerReport) {
		calls++
		got = r
	}))
	dev.Faults().OOMAbove(MiB)
	_, err := m.NewHostArray([]int{4 * int(MiB)}, Uint8, Pinned, nil)
	dev.Faults().Clear()
	var oe *alloc.OutOfMemoryError
	if !errors.As(err, &oe) {
		t.Fatalf("pinned allocation past the fault: err = %v, want an *alloc.OutOfMemoryError", err)
	}
	if calls != 1 || got.Pinned.Allocator != "pinned" || got.Pinned.OOMs != 1 {
		t.Errorf("observer calls %d, pinned report %+v: want one call with the pinned pool's report", calls, got.Pinned)
	}
}
