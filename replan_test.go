package vram

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vramkit/vram/account"
	"github.com/vramkit/vram/alloc"
	"github.com/vramkit/vram/device"
	"github.com/vramkit/vram/internal/units"
)

// TestSetCap: a cap set while the manager runs reaches the plan as that
// value (PlanNow and Allocate agree), counts the arrays already held
// when the manager had none, is one BudgetChange each, frees nothing
// when lowered below what is held, and WaitWithinCap returns once a
// re-plan gives the memory back.
func TestSetCap(t *testing.T) {
	for name, opts := range map[string][]Option{
		"made with a cap":    {WithAllocatorChoice(account.Choice{Kind: Pool}), WithCap(64 * MiB)},
		"made without a cap": {WithAllocatorChoice(account.Choice{Kind: Pool})},
	} {
		t.Run(name, func(t *testing.T) {
			m, _, _ := newManager(t, 256*MiB, opts...)
			c := register(t, m, ClientOptions{Group: "g"})
			reqs := map[string]ArrayRequest{"x": req(Float32, 0, 16<<20)} // 64 MiB
			must(t, c.Queue(reqs))
			if _, err := c.Allocate(context.Background()); err != nil {
				t.Fatal(err)
			}
			held := c.Held()
			seq := m.Account().LastChange().Seq
			must(t, m.Account().SetCap(32*MiB)) // below what is held
			if bc := m.Account().LastChange(); bc.Seq != seq+1 || !strings.Contains(bc.Why, "32 MiB") {
				t.Errorf("budget change %+v after SetCap(32 MiB); want seq %d saying the new cap", bc, seq+1)
			}
			if capBytes, used := m.Account().Cap(); capBytes != 32*MiB || used != held || c.Held() != held {
				t.Fatalf("Cap() = %s, %s used; client holds %s; want 32 MiB and the %s held (nothing freed)",
					units.Format(capBytes), units.Format(used), units.Format(c.Held()), units.Format(held))
			}
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
			err := m.Account().WaitWithinCap(ctx)
			cancel()
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("WaitWithinCap over the cap: %v, want a deadline error", err)
			}
			plan, err := c.PlanNow(context.Background(), map[*Client]map[string]ArrayRequest{c: reqs})
			if err != nil {
				t.Fatal(err)
			}
			if plan.BytesPerChunk > 32*MiB || plan.Chunks < 2 {
				t.Fatalf("PlanNow under a 32 MiB cap: %d chunks of %s; want several within the cap", plan.Chunks, units.Format(plan.BytesPerChunk))
			}
			if q := c.Queued(); len(q) != 0 {
				t.Errorf("PlanNow queued %v", q)
			}
			done := make(chan error, 1)
			go func() { done <- m.Account().WaitWithinCap(context.Background()) }()
			must(t, c.Queue(reqs))
			resp, err := c.Allocate(context.Background()) // the re-plan: the old arrays set aside first
			if err != nil {
				t.Fatal(err)
			}
			if resp.Plan.ChunkLength != plan.ChunkLength {
				t.Errorf("Allocate's chunk length %d, PlanNow's %d: want the same plan", resp.Plan.ChunkLength, plan.ChunkLength)
			}
			select {
			case err := <-done:
				must(t, err)
			case <-time.After(10 * time.Second):
				t.Fatal("WaitWithinCap did not return after the arrays came within the cap")
			}
			must(t, m.Account().SetCap(0))
			if capBytes, _ := m.Account().Cap(); capBytes != 0 {
				t.Errorf("Cap() after SetCap(0) = %s, want none", units.Format(capBytes))
			}
			if _, ok := m.Account().Allocator().(*alloc.Limit); !ok {
				t.Errorf("the allocator is a %T; want the cap's Limit kept (with no cap) until SetAllocator", m.Account().Allocator())
			}
			must(t, c.Free("x"))
			if _, used := m.Account().Cap(); used != 0 {
				t.Errorf("%s charged once every array is freed", units.Format(used))
			}
		})
	}
}

// TestPlanNowRefusesAnotherGroup: the requests planned must be of one
// group.
func TestPlanNowRefusesAnotherGroup(t *testing.T) {
	m, _, _ := newManager(t, 64*MiB)
	a := register(t, m, ClientOptions{Group: "a"})
	b := register(t, m, ClientOptions{Group: "b"})
	_, err := a.PlanNow(context.Background(), map[*Client]map[string]ArrayRequest{b: {"x": req(Float32, 0, 10)}})
	if !errors.Is(err, ErrInvalidRequest) || !strings.Contains(err.Error(), `"b"`) {
		t.Fatalf("PlanNow of another group's requests: %v, want ErrInvalidRequest naming the group", err)
	}
}

// TestClaimFromBusyGroup: a group that cannot allocate for want of
// memory a busy group holds claims it back (its error says so); the busy
// group plans with the claim kept back; once the busy group has re-planned
// smaller, the claimant allocates and its claim is met.
func TestClaimFromBusyGroup(t *testing.T) {
	m, busy, bigReqs := busyGroup(t)
	other := register(t, m, ClientOptions{Group: "other"})
	otherReqs := map[string]ArrayRequest{"y": {Shape: []int{8 << 20}, DType: Float32, Unchunkable: true}} // 32 MiB, whole
	must(t, other.Queue(otherReqs))
	seq := m.Account().LastChange().Seq
	_, err := other.Allocate(context.Background())
	if err == nil || !strings.Contains(err.Error(), "claims") || !strings.Contains(err.Error(), `group "batch"`) {
		t.Fatalf("Allocate beside a busy group: %v; want a failure that claims memory back from it", err)
	}
	bc := m.Account().LastChange()
	if bc.Seq != seq+1 || !strings.Contains(bc.Why, `"other" claims`) {
		t.Fatalf("budget change %+v; want the claim", bc)
	}
	plan, err := busy.PlanNow(context.Background(), map[*Client]map[string]ArrayRequest{busy: bigReqs})
	if err != nil {
		t.Fatal(err)
	}
	if plan.DeviceBytes+32*MiB > 64*MiB {
		t.Fatalf("the busy group's plan now takes %s; want room left for the 32 MiB claimed", units.Format(plan.DeviceBytes))
	}
	must(t, busy.Queue(bigReqs))
	if _, err := busy.Allocate(context.Background()); err != nil { // its batch re-plans between chunks
		t.Fatal(err)
	}
	if bc := m.Account().LastChange(); !strings.Contains(bc.Why, `"batch" gave`) {
		t.Errorf("budget change %+v after the busy group re-planned; want it to say memory was given back", bc)
	}
	if _, err := other.Allocate(context.Background()); err != nil { // its queue was restored
		t.Fatalf("the claimant's second Allocate: %v", err)
	}
	if bc := m.Account().LastChange(); !strings.Contains(bc.Why, "met") {
		t.Errorf("budget change %+v; want the claim met", bc)
	}
	m.mu.Lock()
	n := m.claimedLocked("")
	m.mu.Unlock()
	if n != 0 {
		t.Errorf("%s still claimed", units.Format(n))
	}
}

// TestClaimWithdrawnWhenGroupEmpties: a claim lives with its group's
// record: when the claimant's last member leaves (Close, or a move to
// another group), the claim is withdrawn, said so, and no group plans
// with it kept back any more.
func TestClaimWithdrawnWhenGroupEmpties(t *testing.T) {
	for name, leave := range map[string]func(t *testing.T, c *Client){
		"close": func(t *testing.T, c *Client) { must(t, c.Close()) },
		"move":  func(t *testing.T, c *Client) { must(t, c.ChangeStreamGroup("elsewhere")) },
	} {
		t.Run(name, func(t *testing.T) {
			m, _, _ := busyGroup(t)
			other := register(t, m, ClientOptions{Group: "other"})
			must(t, other.Queue(map[string]ArrayRequest{"y": {Shape: []int{8 << 20}, DType: Float32, Unchunkable: true}}))
			if _, err := other.Allocate(context.Background()); err == nil || !strings.Contains(err.Error(), "claims") {
				t.Fatalf("Allocate beside a busy group: %v; want a claim", err)
			}
			m.mu.Lock()
			claimed := m.claimedLocked("batch")
			m.mu.Unlock()
			if claimed == 0 {
				t.Fatal("no claim kept back from the busy group")
			}
			leave(t, other)
			if bc := m.Account().LastChange(); !strings.Contains(bc.Why, `"other"'s claim`) || !strings.Contains(bc.Why, "withdrawn") {
				t.Errorf("budget change %+v; want the claim withdrawn", bc)
			}
			m.mu.Lock()
			claimed = m.claimedLocked("batch")
			m.mu.Unlock()
			if claimed != 0 {
				t.Errorf("%s still claimed after the claimant's group emptied", units.Format(claimed))
			}
		})
	}
}

// busyGroup is a manager of 64 MiB whose group "batch" holds 48 MiB (its
// requests bigReqs) with a batch running on it (a work mark open until
// the test ends): never evicted.
func busyGroup(t *testing.T) (m *Manager, busy *Client, bigReqs map[string]ArrayRequest) {
	t.Helper()
	m, _, _ = newManager(t, 64*MiB, WithAllocatorChoice(account.Choice{Kind: Pool}))
	busy = register(t, m, ClientOptions{Group: "batch"})
	bigReqs = map[string]ArrayRequest{"x": req(Float32, 0, 12<<20)} // 48 MiB
	must(t, busy.Queue(bigReqs))
	if _, err := busy.Allocate(context.Background()); err != nil {
		t.Fatal(err)
	}
	w, err := busy.BeginWork()
	must(t, err)
	t.Cleanup(func() { w.End() })
	return m, busy, bigReqs
}

// capLowering is an allocator (its costs stated, as the one it wraps
// states them) that calls lower once, as its first array is made.
type capLowering struct {
	costedAllocator
	once  sync.Once
	lower func()
}

type costedAllocator interface {
	alloc.Allocator
	alloc.Coster
}

func (a *capLowering) Alloc(n uint64, s device.Stream) (device.Ptr, error) {
	a.once.Do(a.lower)
	return a.costedAllocator.Alloc(n, s)
}

func (a *capLowering) AllocExact(n uint64, s device.Stream) (device.Ptr, error) {
	a.once.Do(a.lower)
	return alloc.AllocExact(a.costedAllocator, n, s)
}

// TestAllocateUnderACapLoweredMidway: SetCap lowering the cap while an
// Allocate is between its plan and its arrays (here as the first of two
// is made) makes the Allocate plan again under the new cap, instead of
// failing at the cap with the arrays it replaced freed.
func TestAllocateUnderACapLoweredMidway(t *testing.T) {
	var m *Manager
	wrap := func(a alloc.Allocator) alloc.Allocator {
		ca, ok := a.(costedAllocator)
		if !ok {
			t.Fatalf("%T states no costs", a)
		}
		return &capLowering{costedAllocator: ca, lower: func() {
			if err := m.Account().SetCap(4 * MiB); err != nil {
				t.Errorf("SetCap: %v", err)
			}
		}}
	}
	m, _, _ = newManager(t, 64*MiB, WithAllocatorChoice(account.Choice{Kind: Pool}), WithCap(8*MiB), WithWrap(wrap))
	c := register(t, m, ClientOptions{Group: "g"})
	must(t, c.Queue(map[string]ArrayRequest{"x": req(Float32, 0, 4<<20), "y": req(Float32, 0, 4<<20)})) // 16 MiB each
	resp, err := c.Allocate(context.Background())
	if err != nil {
		t.Fatalf("Allocate with the cap lowered midway: %v", err)
	}
	if capBytes, used := m.Account().Cap(); capBytes != 4*MiB || used > 4*MiB || resp.Plan.BytesPerChunk > 4*MiB {
		t.Errorf("cap %s, %s used, plan %+v: want the arrays planned within the 4 MiB cap set midway",
			units.Format(capBytes), units.Format(used), resp.Plan)
	}
}
