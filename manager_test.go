package vram

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vramkit/vram/account"
	"github.com/vramkit/vram/alloc"
	"github.com/vramkit/vram/device"
	"github.com/vramkit/vram/streams"
)

const eps = 1e-9

func near(a, b float64) bool { return math.Abs(a-b) < eps }

func TestSharesAndCaps(t *testing.T) {
	const total = 100 * MiB
	m, _, _ := newManager(t, total)
	a := register(t, m, ClientOptions{Name: "a"})
	b := register(t, m, ClientOptions{Name: "b"})
	check := func(step string, want map[*Client]float64, manual, auto float64) {
		t.Helper()
		for c, p := range want {
			if got := c.Proportion(); !near(got, p) {
				t.Errorf("%s: %v proportion %v, want %v", step, c, got, p)
			}
			if got, want := c.Cap(), uint64(p*float64(total)); got != want {
				t.Errorf("%s: %v cap %d, want %d", step, c, got, want)
			}
		}
		if got := m.Shares().Manual; !near(got, manual) {
			t.Errorf("%s: manual pool %v, want %v", step, got, manual)
		}
		if got := m.Shares().Auto; !near(got, auto) {
			t.Errorf("%s: auto pool %v, want %v", step, got, auto)
		}
	}
	check("two auto", map[*Client]float64{a: 0.5, b: 0.5}, 0, 1)
	c := register(t, m, ClientOptions{Name: "c", Proportion: 0.3})
	check("one manual", map[*Client]float64{a: 0.35, b: 0.35, c: 0.3}, 0.3, 0.7)
	d := register(t, m, ClientOptions{Name: "d"})
	check("three auto", map[*Client]float64{a: 0.7 / 3, b: 0.7 / 3, d: 0.7 / 3, c: 0.3}, 0.3, 0.7)
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	check("manual closed", map[*Client]float64{a: 1.0 / 3, b: 1.0 / 3, d: 1.0 / 3}, 0, 1)
	if err := a.SetManualProportion(0.4); err != nil {
		t.Fatal(err)
	}
	check("a to manual", map[*Client]float64{a: 0.4, b: 0.3, d: 0.3}, 0.4, 0.6)
	if err := a.SetManualProportion(0.1); err != nil {
		t.Fatal(err)
	}
	check("a changed", map[*Client]float64{a: 0.1, b: 0.45, d: 0.45}, 0.1, 0.9)
	if err := a.SetAutoLimitMode(); err != nil {
		t.Fatal(err)
	}
	check("a back to auto", map[*Client]float64{a: 1.0 / 3, b: 1.0 / 3, d: 1.0 / 3}, 0, 1)
	if err := b.SetManualLimitMode(0.25); err != nil {
		t.Fatal(err)
	}
	check("b to manual", map[*Client]float64{a: 0.375, b: 0.25, d: 0.375}, 0.25, 0.75)
	_ = a.Close()
	_ = d.Close()
	check("no auto clients", map[*Client]float64{b: 0.25}, 0.25, 0)
	if p := a.Proportion(); p != 0 || a.Cap() != 0 {
		t.Errorf("a closed client reports proportion %v, cap %d", p, a.Cap())
	}
}

// TestProportionRules checks every rule of the pools; a refusal must
// change nothing.
func TestProportionRules(t *testing.T) {
	type client struct {
		p    float64
		auto bool
	}
	for name, tc := range map[string]struct {
		have []client                             // registered first, in order
		do   func(m *Manager, cs []*Client) error // the step under test
		want error
		warn bool
		noop bool // accepted, changing nothing
	}{
		"manual leaving exactly 5% with auto clients": {
			have: []client{{auto: true}},
			do:   func(m *Manager, _ []*Client) error { _, err := m.Register(ClientOptions{Proportion: 0.95}); return err },
		},
		"manual leaving under 5% with auto clients": {
			have: []client{{auto: true}, {p: 0.5}},
			do:   func(m *Manager, _ []*Client) error { _, err := m.Register(ClientOptions{Proportion: 0.46}); return err },
			want: ErrProportion,
		},
		"manual leaving under 5% with no auto clients: allowed, warned": {
			have: []client{{p: 0.5}},
			do:   func(m *Manager, _ []*Client) error { _, err := m.Register(ClientOptions{Proportion: 0.48}); return err },
			warn: true,
		},
		"manual total of exactly 1 with no auto clients": {
			have: []client{{p: 0.5}},
			do:   func(m *Manager, _ []*Client) error { _, err := m.Register(ClientOptions{Proportion: 0.5}); return err },
			warn: true,
		},
		"manual total over 1": {
			have: []client{{p: 0.7}},
			do:   func(m *Manager, _ []*Client) error { _, err := m.Register(ClientOptions{Proportion: 0.31}); return err },
			want: ErrProportion,
		},
		"auto client when under 5% is left": {
			have: []client{{p: 0.96}},
			do:   func(m *Manager, _ []*Client) error { _, err := m.Register(ClientOptions{}); return err },
			want: ErrProportion,
		},
		"auto client when exactly 5% is left": {
			have: []client{{p: 0.95}},
			do:   func(m *Manager, _ []*Client) error { _, err := m.Register(ClientOptions{}); return err },
		},
		"negative proportion": {
			do:   func(m *Manager, _ []*Client) error { _, err := m.Register(ClientOptions{Proportion: -0.1}); return err },
			want: ErrProportion,
		},
		"proportion over 1": {
			do:   func(m *Manager, _ []*Client) error { _, err := m.Register(ClientOptions{Proportion: 1.01}); return err },
			want: ErrProportion,
		},
		"NaN proportion": {
			do: func(m *Manager, _ []*Client) error {
				_, err := m.Register(ClientOptions{Proportion: math.NaN()})
				return err
			},
			want: ErrProportion,
		},
		"set manual proportion that would starve the auto pool": {
			have: []client{{auto: true}, {p: 0.2}},
			do:   func(m *Manager, cs []*Client) error { return cs[1].SetManualProportion(0.96) },
			want: ErrProportion,
		},
		"set manual proportion of zero": {
			have: []client{{p: 0.2}},
			do:   func(m *Manager, cs []*Client) error { return cs[0].SetManualProportion(0) },
			want: ErrProportion,
		},
		"last auto client goes manual and takes nearly all": {
			have: []client{{auto: true}, {p: 0.2}},
			do:   func(m *Manager, cs []*Client) error { return cs[0].SetManualLimitMode(0.78) },
			warn: true,
		},
		"manual client to auto when the rest leave under 5%": {
			have: []client{{p: 0.96}, {p: 0.04}},
			do:   func(m *Manager, cs []*Client) error { return cs[1].SetAutoLimitMode() },
			want: ErrProportion,
		},
		"auto client to auto: nothing to do": {
			have: []client{{auto: true}},
			do:   func(m *Manager, cs []*Client) error { return cs[0].SetAutoLimitMode() },
			noop: true,
		},
		"manual client to manual mode: nothing to do": {
			have: []client{{p: 0.1}},
			do:   func(m *Manager, cs []*Client) error { return cs[0].SetManualLimitMode(0.2) },
			noop: true,
		},
	} {
		t.Run(name, func(t *testing.T) {
			m, _, log := newManager(t, 64*MiB)
			var cs []*Client
			for _, h := range tc.have {
				cs = append(cs, register(t, m, ClientOptions{Proportion: h.p}))
			}
			beforeLog := log.String()
			props := make([]float64, len(cs))
			for i, c := range cs {
				props[i] = c.Proportion()
			}
			manual, auto := m.Shares().Manual, m.Shares().Auto
			nClients := len(m.Clients())
			err := tc.do(m, cs)
			if !errors.Is(err, tc.want) || (tc.want == nil && err != nil) {
				t.Fatalf("got %v, want %v", err, tc.want)
			}
			warned := strings.Contains(strings.TrimPrefix(log.String(), beforeLog), "auto clients will be refused")
			if warned != tc.warn {
				t.Errorf("warning logged: %v, want %v (log %q)", warned, tc.warn, log.String())
			}
			if err == nil && !tc.noop {
				return
			}
			// Refused, or nothing to do: nothing changed.
			for i, c := range cs {
				if !near(c.Proportion(), props[i]) {
					t.Errorf("client %d proportion %v, was %v", i, c.Proportion(), props[i])
				}
			}
			if !near(m.Shares().Manual, manual) || !near(m.Shares().Auto, auto) || len(m.Clients()) != nClients {
				t.Errorf("pools changed by a refusal: manual %v→%v auto %v→%v clients %d→%d",
					manual, m.Shares().Manual, auto, m.Shares().Auto, nClients, len(m.Clients()))
			}
		})
	}
}

func TestProportionErrorsSayWhatToChange(t *testing.T) {
	m, _, _ := newManager(t, 64*MiB)
	register(t, m, ClientOptions{})
	register(t, m, ClientOptions{Proportion: 0.5})
	_, err := m.Register(ClientOptions{Name: "big", Proportion: 0.48})
	for _, s := range []string{"total 98%", "leaving 2%", "minimum 5%", "at most 0.45 (45%)", "big#"} {
		if err == nil || !strings.Contains(err.Error(), s) {
			t.Errorf("error %v does not mention %q", err, s)
		}
	}
}

func TestNoDriftAfterManyClients(t *testing.T) {
	m, _, _ := newManager(t, 64*MiB)
	var cs []*Client
	for i := range 3000 {
		p := 0.0
		if i%3 == 0 {
			p = 0.0001 * float64(1+i%7)
		}
		cs = append(cs, register(t, m, ClientOptions{Proportion: p}))
	}
	for _, c := range cs {
		_ = c.Close()
	}
	if got := m.Shares().Manual; got != 0 {
		t.Errorf("manual pool after closing everyone: %v, want exactly 0", got)
	}
	if _, err := m.Register(ClientOptions{Proportion: 1}); err != nil {
		t.Errorf("the whole device after closing everyone: %v", err)
	}
}

func TestClientHandles(t *testing.T) {
	m, _, _ := newManager(t, 64*MiB)
	a := register(t, m, ClientOptions{Name: "solver", Group: "g"})
	b := register(t, m, ClientOptions{})
	if a.ID() == b.ID() || a.String() != "solver#"+itoa(a.ID()) || b.String() != "client#"+itoa(b.ID()) {
		t.Errorf("ids/names: %v %v", a, b)
	}
	if a.Manager() != m || a.Name() != "solver" || a.Group() != "g" || b.Group() != streams.Default {
		t.Errorf("accessors: %v %v %q %q", a.Manager(), a.Name(), a.Group(), b.Group())
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if err := a.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if !a.Closed() || a.Group() != "" {
		t.Errorf("closed client: Closed %v, Group %q", a.Closed(), a.Group())
	}
	// A new client never gets a closed one's id.
	c := register(t, m, ClientOptions{})
	if c.ID() == a.ID() {
		t.Error("id reused")
	}
	for name, do := range map[string]func() error{
		"queue for closed":     func() error { return a.Queue(nil) },
		"allocate for closed":  func() error { _, err := a.Allocate(context.Background()); return err },
		"stream of closed":     func() error { _, err := a.Stream(); return err },
		"set share of closed":  func() error { return a.SetManualProportion(0.1) },
		"change group, closed": func() error { return a.ChangeStreamGroup("x") },
		"free of closed":       func() error { return a.Free("x") },
	} {
		t.Run(name, func(t *testing.T) {
			if err := do(); !errors.Is(err, ErrClosed) {
				t.Errorf("got %v, want ErrClosed", err)
			}
		})
	}
}

func itoa(n uint64) string {
	if n == 0 {
		return "0"
	}
	var b []byte
	for ; n > 0; n /= 10 {
		b = append([]byte{byte('0' + n%10)}, b...)
	}
	return string(b)
}

func TestStreamGroupsThroughTheManager(t *testing.T) {
	m, _, _ := newManager(t, 64*MiB)
	a := register(t, m, ClientOptions{Group: "g"})
	b := register(t, m, ClientOptions{Group: "g"})
	c := register(t, m, ClientOptions{})
	d := register(t, m, ClientOptions{})
	sa, _ := a.Stream()
	sb, _ := b.Stream()
	sc, _ := c.Stream()
	if sa != sb || sa == sc {
		t.Errorf("streams: a %v b %v c %v", sa, sb, sc)
	}
	for name, tc := range map[*Client]bool{a: true, b: true, c: false, d: false} {
		if got := name.IsGrouped(); got != tc {
			t.Errorf("IsGrouped(%v) = %v; want %v", name, got, tc)
		}
	}
	if got := m.GroupMembers("g"); len(got) != 2 || got[0] != a || got[1] != b {
		t.Errorf("GroupMembers(g) = %v", got)
	}
	// Moving takes queued requests along.
	if err := b.Queue(map[string]ArrayRequest{"x": req(Float32, 0, 10)}); err != nil {
		t.Fatal(err)
	}
	if err := b.ChangeStreamGroup("h"); err != nil {
		t.Fatal(err)
	}
	if g := b.Group(); g != "h" {
		t.Errorf("b in %q after the move", g)
	}
	if q := b.Queued(); len(q) != 1 {
		t.Errorf("b's queue after the move: %v", q)
	}
	if resp, err := a.Allocate(context.Background()); !errors.Is(err, ErrNothingQueued) || resp != nil {
		t.Errorf("a's group has nothing queued now: %v, %v; want ErrNothingQueued", resp, err)
	}
	if resp, err := b.Allocate(context.Background()); err != nil || resp == nil || resp.Arrays()["x"] == nil {
		t.Errorf("b's request in its new group: %v, %v", resp, err)
	}
	if g := a.IsGrouped(); g {
		t.Error("a is alone in g but reported grouped")
	}
	if err := b.ChangeStreamGroup(""); err != nil {
		t.Fatal(err)
	}
	if g := b.Group(); g != "default" {
		t.Errorf("ChangeStreamGroup(\"\") put b in %q", g)
	}
	// ReinitStreams gives fresh streams and keeps memberships.
	if err := m.ReinitStreams(); err != nil {
		t.Fatal(err)
	}
	if s, _ := a.Stream(); s == sa {
		t.Error("ReinitStreams kept a's stream")
	}
	if g := a.Group(); g != "g" {
		t.Errorf("a in %q after ReinitStreams", g)
	}
}

func TestLimitModes(t *testing.T) {
	for name, tc := range map[string]struct {
		s    string
		want LimitMode
		err  bool
	}{
		"passive": {"passive", Passive, false}, "active": {"Active", Active, false},
		"empty": {"", Passive, false}, "bad": {"strict", 0, true},
	} {
		t.Run(name, func(t *testing.T) {
			got, err := ParseLimitMode(tc.s)
			if (err != nil) != tc.err || got != tc.want {
				t.Errorf("ParseLimitMode(%q) = %v, %v", tc.s, got, err)
			}
			if err == nil && got.String() != strings.ToLower(tc.s) && tc.s != "" {
				t.Errorf("String() = %q", got.String())
			}
		})
	}
	m, _, _ := newManager(t, 64*MiB)
	if m.LimitMode() != Passive {
		t.Errorf("default mode %v", m.LimitMode())
	}
	if err := m.SetLimitMode(Active); err != nil || m.LimitMode() != Active {
		t.Errorf("SetLimitMode(Active): %v, now %v", err, m.LimitMode())
	}
	if err := m.SetLimitMode(LimitMode(9)); !errors.Is(err, device.ErrInvalidValue) || m.LimitMode() != Active {
		t.Errorf("SetLimitMode(9): %v, now %v", err, m.LimitMode())
	}
}

func TestAllocatorKinds(t *testing.T) {
	for name, tc := range map[string]struct {
		s    string
		want AllocatorKind
	}{
		"pool": {"pool", Pool}, "direct": {"DIRECT", Direct}, "async": {"async", AsyncPool}, "async-pool": {"async-pool", AsyncPool},
		"cubie's cupy": {"cupy", Pool}, "cubie's cupy_async": {"cupy_async", AsyncPool}, "cubie's default": {"default", Direct},
	} {
		t.Run(name, func(t *testing.T) {
			if got, err := ParseAllocatorKind(tc.s); err != nil || got != tc.want {
				t.Errorf("ParseAllocatorKind(%q) = %v, %v", tc.s, got, err)
			}
		})
	}
	if _, err := ParseAllocatorKind("slab"); !errors.Is(err, device.ErrInvalidValue) {
		t.Errorf("bad kind: %v", err)
	}
	dev := newSim(t, 64*MiB)
	m, err := New(dev)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if allocatorKind(m) != Pool {
		t.Errorf("default allocator %v, want pool", allocatorKind(m))
	}
	// The simulator manages virtual memory: the Pool kind is Expandable.
	if _, ok := m.Account().Allocator().(*alloc.Expandable); !ok {
		t.Errorf("default allocator is a %T; want *alloc.Expandable on a device with virtual memory", m.Account().Allocator())
	}
	if granularityOf(m.Account().Allocator()) != alloc.PoolGranularity {
		t.Errorf("granularity %d", granularityOf(m.Account().Allocator()))
	}
	if _, err := New(dev, WithAllocator(AllocatorKind(7))); !errors.Is(err, device.ErrInvalidValue) {
		t.Errorf("New with a bad kind: %v", err)
	}
	if _, err := New(dev, WithLimitMode(LimitMode(9))); !errors.Is(err, device.ErrInvalidValue) {
		t.Errorf("New with a bad limit mode: %v", err)
	}
	if _, err := New(nil); !errors.Is(err, device.ErrInvalidValue) {
		t.Errorf("New(nil): %v", err)
	}
}

func TestWrapAndLimitBoundTheBudget(t *testing.T) {
	var lim *alloc.Limit
	m, _, _ := newManager(t, 64*MiB, WithAllocatorChoice(account.Choice{Kind: Pool}), WithWrap(func(a alloc.Allocator) alloc.Allocator {
		lim = alloc.NewLimit(a, 8*MiB)
		return lim
	}))
	c := register(t, m, ClientOptions{})
	if err := c.Queue(map[string]ArrayRequest{"x": req(Float64, 0, 2*1024*1024)}); err != nil {
		t.Fatal(err)
	}
	resp, err := c.Allocate(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	// 16 MiB of runs under an 8 MiB limit: two chunks of 8 MiB.
	if resp.Plan.Chunks != 2 || resp.Plan.Budget != 8*MiB || lim.Used() != 8*MiB {
		t.Errorf("chunks %d budget %d used %d; want 2, 8 MiB, 8 MiB", resp.Plan.Chunks, resp.Plan.Budget, lim.Used())
	}
	if m.Account().Allocator() != lim {
		t.Errorf("Allocator() = %T, want the wrapper", m.Account().Allocator())
	}
	if err := m.SetAllocator(Direct); err != nil {
		t.Fatal(err)
	}
	if _, ok := m.Account().Allocator().(*alloc.Limit); !ok || lim.Upstream() == nil {
		t.Errorf("SetAllocator did not wrap the new allocator: %T", m.Account().Allocator())
	}
	if _, ok := lim.Upstream().(*alloc.Direct); !ok {
		t.Errorf("new upstream is a %T", lim.Upstream())
	}
}

func TestDefault(t *testing.T) {
	var wg sync.WaitGroup
	got := make([]*Manager, 16)
	for i := range got {
		wg.Go(func() {
			m, err := Default()
			if err != nil {
				t.Error(err)
			}
			got[i] = m
		})
	}
	wg.Wait()
	for _, m := range got {
		if m == nil || m != got[0] {
			t.Fatalf("Default returned different managers: %p vs %p", m, got[0])
		}
	}
	if b := got[0].Device().Info().Backend; b != "sim" && b != "cuda" {
		t.Errorf("default backend %q", b)
	}
	c := register(t, got[0], ClientOptions{Name: "default-test"})
	if err := c.Close(); err != nil {
		t.Error(err)
	}
}

// TestOpen: Open makes a manager that owns its device (Close closes it,
// a second Close does nothing), with $VRAM_ALLOC_CONF's options first and
// the caller's after them, and refuses a bad spec or configuration
// before it opens anything.
func TestOpen(t *testing.T) {
	const spec = "sim:vram=64MiB,context=0,backed=false"
	for name, tc := range map[string]struct {
		conf     string
		spec     string
		opts     []Option
		wantKind AllocatorKind
		wantErr  error
	}{
		"defaults":                {spec: spec, wantKind: Pool},
		"the environment's kind":  {conf: "kind:direct", spec: spec, wantKind: Direct},
		"an option wins":          {conf: "kind:direct", spec: spec, opts: []Option{WithAllocator(AsyncPool)}, wantKind: AsyncPool},
		"a bad configuration":     {conf: "kind:nope", spec: spec, wantErr: ErrAllocConf},
		"a bad spec":              {spec: "gpu:0", wantErr: device.ErrBadSpec},
		"a bad option, no device": {spec: spec, opts: []Option{WithLimitMode(LimitMode(9))}, wantErr: device.ErrInvalidValue},
	} {
		t.Run(name, func(t *testing.T) {
			t.Setenv(AllocConfEnv, tc.conf)
			t.Setenv(BrokerEnv, "")
			m, err := Open(tc.spec, tc.opts...)
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) || m != nil {
					t.Fatalf("Open = %v, %v; want nil and an error wrapping %v", m, err, tc.wantErr)
				}
				return // goleak (TestMain) finds a device left open: its streams' goroutines
			}
			if err != nil {
				t.Fatal(err)
			}
			if kind, _ := m.Account().Stats(); kind != tc.wantKind {
				t.Errorf("allocator kind %v, want %v", kind, tc.wantKind)
			}
			dev := m.Device()
			if err := m.Close(); err != nil {
				t.Fatal(err)
			}
			if _, _, err := dev.MemInfo(); !errors.Is(err, device.ErrClosed) {
				t.Errorf("the device after the manager's Close: MemInfo = %v, want ErrClosed", err)
			}
			if err := m.Close(); err != nil {
				t.Errorf("second Close: %v", err)
			}
		})
	}
}

func TestClosedManager(t *testing.T) {
	dev := newSim(t, 64*MiB)
	m, err := New(dev, WithAllocatorChoice(account.Choice{Kind: Direct}))
	if err != nil {
		t.Fatal(err)
	}
	c := register(t, m, ClientOptions{Group: "g"})
	if err := c.Queue(map[string]ArrayRequest{"x": req(Float32, 0, 1000)}); err != nil {
		t.Fatal(err)
	}
	resp, err := c.Allocate(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	h, _ := m.NewHostArray([]int{4}, Float32, Pinned, nil)
	_ = h.Free()
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	if !resp.Arrays()["x"].Freed() || !c.Closed() {
		t.Errorf("after Close: array freed %v, client closed %v", resp.Arrays()["x"].Freed(), c.Closed())
	}
	if r := dev.Leaks(); !r.Empty() {
		t.Errorf("Close left %s", r)
	}
	if err := m.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if err := c.Close(); err != nil {
		t.Errorf("client Close after manager Close: %v", err)
	}
	for name, do := range map[string]func() error{
		"register":       func() error { _, err := m.Register(ClientOptions{}); return err },
		"set allocator":  func() error { return m.SetAllocator(Direct) },
		"set limit mode": func() error { return m.SetLimitMode(Active) },
		"free":           func() error { return m.Free("x") },
		"free all":       func() error { return m.FreeAll() },
		"invalidate all": func() error { return m.InvalidateAll() },
		"reinit":         func() error { return m.ReinitStreams() },
		"host array":     func() error { _, err := m.NewHostArray([]int{1}, Float32, Pageable, nil); return err },
	} {
		t.Run(name, func(t *testing.T) {
			if err := do(); !errors.Is(err, ErrClosed) {
				t.Errorf("got %v, want ErrClosed", err)
			}
		})
	}
}

// The proportion a refusal suggests must be accepted, and be the most
// that is (to 0.0001): it is rounded down, never to a figure that is
// refused in turn, with non-round shares on both sides.
func TestProportionHintIsAccepted(t *testing.T) {
	hint := regexp.MustCompile(`at most ([0-9.]+) \(([0-9.]+)%\)`)
	for name, tc := range map[string]struct {
		manual []float64 // the other manual clients
		auto   int       // auto clients
		move   bool      // ask with SetManualProportion of a client at 0.01, not Register
		ask    float64
		want   string // the suggestion, "" for none
	}{
		"over 100% with an auto client":       {manual: []float64{0.3333}, auto: 1, ask: 0.7, want: "0.6167"},
		"over 100%, non-round shares":         {manual: []float64{0.123456789, 0.2}, auto: 2, ask: 0.9, want: "0.6265"},
		"auto pool under its minimum":         {manual: []float64{0.41234567}, auto: 1, ask: 0.55, want: "0.5376"},
		"over 100% with no auto client":       {manual: []float64{0.3333333}, ask: 0.7, want: "0.6666"},
		"room below 0.0001":                   {manual: []float64{0.94995}, auto: 1, ask: 0.01, want: "0.00005"},
		"SetManualProportion":                 {manual: []float64{0.3333}, auto: 1, move: true, ask: 0.7, want: "0.6167"},
		"no room at all":                      {manual: []float64{0.95}, auto: 1, ask: 0.1},
		"over 100% at the auto pool's border": {manual: []float64{0.45}, auto: 3, ask: 0.6, want: "0.5"},
	} {
		t.Run(name, func(t *testing.T) {
			m, _, _ := newManager(t, 1<<30)
			for _, p := range tc.manual {
				register(t, m, ClientOptions{Proportion: p})
			}
			for range tc.auto {
				register(t, m, ClientOptions{})
			}
			var mover *Client
			if tc.move {
				// The mover's own share is given back first: the hint
				// counts it as free.
				mover = register(t, m, ClientOptions{Proportion: 0.01})
			}
			ask := func(p float64) error {
				if tc.move {
					return mover.SetManualProportion(p)
				}
				c, err := m.Register(ClientOptions{Name: "b", Proportion: p})
				if err == nil {
					_ = c.Close()
				}
				return err
			}
			err := ask(tc.ask)
			if !errors.Is(err, ErrProportion) {
				t.Fatalf("asking for %v: %v, want ErrProportion", tc.ask, err)
			}
			got := hint.FindStringSubmatch(err.Error())
			if tc.want == "" {
				if got != nil || !strings.Contains(err.Error(), "no manual proportion fits") {
					t.Fatalf("error %q suggests a proportion; there is none", err)
				}
				return
			}
			if got == nil || got[1] != tc.want {
				t.Fatalf("error %q: want it to suggest at most %s", err, tc.want)
			}
			p, _ := strconv.ParseFloat(got[1], 64)
			pc, _ := strconv.ParseFloat(got[2], 64)
			if math.Abs(pc-100*p) > 1e-9 {
				t.Errorf("suggestion %s and its percentage %s%% differ", got[1], got[2])
			}
			if err := ask(p); err != nil {
				t.Fatalf("the suggested %v is refused: %v", p, err)
			}
			if tc.move {
				if err := mover.SetManualProportion(0.01); err != nil {
					t.Fatal(err)
				}
			}
			if err := ask(p + 0.0001); !errors.Is(err, ErrProportion) {
				t.Errorf("%v, above the suggestion, got %v: the suggestion is not the most there is", p+0.0001, err)
			}
		})
	}
}

// TestRefusalsMakeNoGroup: a refused Register or ChangeStreamGroup
// leaves the stream groups (and their device streams) as they were.
func TestRefusalsMakeNoGroup(t *testing.T) {
	m, dev, _ := newManager(t, 64*MiB)
	register(t, m, ClientOptions{})
	closed := register(t, m, ClientOptions{Group: "g"})
	_ = closed.Close()
	m.groups.WaitClosing() // g's stream closes in the background
	names := m.groups.Names()
	streams0 := dev.Leaks().Streams
	for name, try := range map[string]func(group string) error{
		"Register over 100%": func(g string) error {
			_, err := m.Register(ClientOptions{Proportion: 0.99, Group: g})
			return err
		},
		"Register of a bad proportion": func(g string) error {
			_, err := m.Register(ClientOptions{Proportion: 1.5, Group: g})
			return err
		},
		"ChangeStreamGroup of a closed client": func(g string) error {
			return closed.ChangeStreamGroup(g)
		},
	} {
		t.Run(name, func(t *testing.T) {
			for i := range 3 {
				if err := try(fmt.Sprint("new", i)); err == nil {
					t.Fatal("not refused")
				}
			}
			if got := m.groups.Names(); !slices.Equal(got, names) {
				t.Errorf("groups %v after refusals, were %v", got, names)
			}
			if s := dev.Leaks().Streams; s != streams0 {
				t.Errorf("%d streams on the device after refusals, were %d", s, streams0)
			}
		})
	}
	// The share a refused Register asked for is not kept either.
	if p := m.Shares().Manual; p != 0 {
		t.Errorf("manual pool %v after refusals", p)
	}
}

// TestFreeOfAnUnheldLabelWarns: Client.Free of a label the client holds
// no array under frees nothing and logs a warning (as cubie's
// InstanceMemorySettings.free warns); Manager.Free of a label nobody
// holds stays silent (as cubie's MemoryManager.free).
func TestFreeOfAnUnheldLabelWarns(t *testing.T) {
	m, _, lb := newManager(t, 64*MiB)
	c := register(t, m, ClientOptions{Name: "c"})
	holdBytes(t, c, 1024)
	if err := c.Free("y"); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(lb.String(), "Free of a label the client holds no array under") || !strings.Contains(lb.String(), "label=y") {
		t.Errorf("log %q; want a warning naming label y", lb.String())
	}
	if c.Held() == 0 {
		t.Error("Free of another label freed x")
	}
	n := len(lb.String())
	if err := errors.Join(c.Free("x"), m.Free("z")); err != nil {
		t.Fatal(err)
	}
	if got := lb.String()[n:]; got != "" || c.Held() != 0 {
		t.Errorf("freeing a held label and Manager.Free logged %q, held %d; want nothing logged, nothing held", got, c.Held())
	}
}

func TestFreeFreeAllInvalidateAll(t *testing.T) {
	m, _, _ := newManager(t, 64*MiB)
	h := newHookLog()
	a := register(t, m, h.opts("a", ""))
	b := register(t, m, h.opts("b", "other"))
	alloc := func() (*ArrayResponse, *ArrayResponse) {
		_ = a.Queue(map[string]ArrayRequest{"x": req(Float32, 0, 10), "y": req(Float32, 0, 10)})
		_ = b.Queue(map[string]ArrayRequest{"x": req(Float32, 0, 10)})
		ra, err := a.Allocate(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		rb, err := b.Allocate(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		return ra, rb
	}
	free0 := free(t, m)
	ra, rb := alloc()
	if err := m.Free("x"); err != nil {
		t.Fatal(err)
	}
	if !ra.Arrays()["x"].Freed() || !rb.Arrays()["x"].Freed() || ra.Arrays()["y"].Freed() {
		t.Error("Free(x) must free x of every client and nothing else")
	}
	if err := m.Free("nothing"); err != nil {
		t.Errorf("Free of an unknown label: %v", err)
	}
	if err := m.FreeAll(); err != nil {
		t.Fatal(err)
	}
	if !ra.Arrays()["y"].Freed() || free(t, m) != free0 || a.Held() != 0 {
		t.Error("FreeAll left arrays")
	}
	if len(h.inval) != 0 {
		t.Errorf("FreeAll called OnInvalidate: %v", h.inval)
	}
	ra, _ = alloc()
	if err := m.InvalidateAll(); err != nil {
		t.Fatal(err)
	}
	if !ra.Arrays()["y"].Freed() || h.inval["a"] != 1 || h.inval["b"] != 1 {
		t.Errorf("InvalidateAll: freed %v, hooks %v", ra.Arrays()["y"].Freed(), h.inval)
	}
}

func TestSetAllocator(t *testing.T) {
	for _, kind := range []AllocatorKind{Direct, Pool, AsyncPool} {
		t.Run(kind.String(), func(t *testing.T) {
			m, _, _ := newManager(t, 64*MiB)
			h := newHookLog()
			a := register(t, m, h.opts("a", "g"))
			b := register(t, m, h.opts("b", ""))
			_ = a.Queue(map[string]ArrayRequest{"x": req(Float32, 0, 1000), "p": {Shape: []int{4}, DType: Int32, Memory: Pinned, Unchunkable: true}})
			resp, err := a.Allocate(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			_ = b.Queue(map[string]ArrayRequest{"later": req(Float32, 0, 10)})
			sa, _ := a.Stream()
			sb, _ := b.Stream()
			free0 := free(t, m)
			if err := m.SetAllocator(kind); err != nil {
				t.Fatal(err)
			}
			if allocatorKind(m) != kind {
				t.Errorf("kind %v", allocatorKind(m))
			}
			if k, st := m.Account().Stats(); k != kind || st.Allocs != 0 || st.InUse != 0 {
				t.Errorf("AllocatorStats = %v, %+v; want the new %v with nothing allocated", k, st, kind)
			}
			if !resp.Arrays()["x"].Freed() || !resp.Host()["p"].Freed() || a.Held() != 0 {
				t.Error("arrays survived SetAllocator")
			}
			if f := free(t, m); f < free0+4096 {
				t.Errorf("device free %d after SetAllocator, was %d with an array live", f, free0)
			}
			if h.inval["a"] != 1 || h.inval["b"] != 1 {
				t.Errorf("OnInvalidate calls: %v", h.inval)
			}
			if s, _ := a.Stream(); s == sa {
				t.Error("group g kept its stream")
			}
			if s, _ := b.Stream(); s == sb {
				t.Error("the default group kept its stream")
			}
			if len(b.Queued()) != 1 {
				t.Error("SetAllocator dropped queued requests")
			}
			// The new allocator serves.
			if resp, err := b.Allocate(context.Background()); err != nil || resp.Arrays()["later"].Freed() {
				t.Errorf("allocate after SetAllocator: %v", err)
			}
		})
	}
}

// noAsync hides the simulator's stream-ordered pool.
type noAsync struct{ device.Device }

func TestSetAllocatorRefusedChangesNothing(t *testing.T) {
	dev := newSim(t, 64*MiB)
	m, err := New(noAsync{dev}, WithAllocatorChoice(account.Choice{Kind: Direct}))
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	h := newHookLog()
	c := register(t, m, h.opts("c", ""))
	_ = c.Queue(map[string]ArrayRequest{"x": req(Float32, 0, 10)})
	resp, _ := c.Allocate(context.Background())
	s0, _ := c.Stream()
	err = m.SetAllocator(AsyncPool)
	if !errors.Is(err, ErrNotSupported) {
		t.Fatalf("AsyncPool on a device without one: %v", err)
	}
	if s, _ := c.Stream(); s != s0 || resp.Arrays()["x"].Freed() || len(h.inval) != 0 || allocatorKind(m) != Direct {
		t.Error("a refused SetAllocator changed something")
	}
	if _, err := New(noAsync{dev}, WithAllocatorChoice(account.Choice{Kind: AsyncPool})); !errors.Is(err, ErrNotSupported) {
		t.Errorf("New with AsyncPool on a device without one: %v", err)
	}
	if _, err := m.NewHostArray([]int{3}, Float32, Pinned, nil); !errors.Is(err, ErrNotSupported) {
		t.Errorf("pinned array on a device without host allocation: %v", err)
	}
}

// A device array is freed ordered after the stream it was last used on,
// not only its client's current one: a copy queued on the old group's
// stream before a group move once wrote into the block the pool had
// handed, at once, to another client on the new stream.
func TestFreeAfterGroupMoveWaitsForTheOldStream(t *testing.T) {
	const n = 64 << 10 // small: x shares its segment with z, so a trim cannot free it
	m, dev, _ := newManager(t, 64*MiB, WithAllocatorChoice(account.Choice{Kind: Pool}))
	a := register(t, m, ClientOptions{Name: "a", Group: "A"})
	register(t, m, ClientOptions{Name: "keeper", Group: "A"}) // A stays when a leaves
	b := register(t, m, ClientOptions{Name: "b", Group: "B"})
	if err := a.Queue(map[string]ArrayRequest{"x": req(Uint8, 0, n), "z": req(Uint8, 0, n)}); err != nil {
		t.Fatal(err)
	}
	ra, err := a.Allocate(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	x := ra.Arrays()["x"]
	xPtr := x.Ptr()
	sA, _ := a.Stream()
	release := holdStream(t, dev, sA)
	defer release()
	old, _ := m.NewHostArray([]int{n}, Uint8, Pinned, bytes.Repeat([]byte{0xaa}, n))
	defer old.Free()
	if err := a.ToDevice(context.Background(), x, old); err != nil { // queued on A behind the kernel
		t.Fatal(err)
	}
	if err := a.ChangeStreamGroup("B"); err != nil {
		t.Fatal(err)
	}
	if err := a.Free("x"); err != nil {
		t.Fatal(err)
	}
	if err := b.Queue(map[string]ArrayRequest{"y": req(Uint8, 0, n)}); err != nil {
		t.Fatal(err)
	}
	// Ordered after A, Allocate may wait for A's work (its trim waits for
	// the free of x): the kernel on A is let go after a second.
	release = sync.OnceFunc(release)
	timer := time.AfterFunc(time.Second, release)
	defer timer.Stop()
	rb, err := b.Allocate(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	y := rb.Arrays()["y"]
	t.Logf("x at %v, y at %v", xPtr, y.Ptr())
	mine, _ := m.NewHostArray([]int{n}, Uint8, Pinned, bytes.Repeat([]byte{0x55}, n))
	defer mine.Free()
	if err := b.ToDevice(context.Background(), y, mine); err != nil {
		t.Fatal(err)
	}
	// Unordered, B's copy runs at once: let it finish before A's old copy
	// can run, else that copy may come first and the defect not show (B's
	// stream starts its goroutine only with its first work).
	sB, _ := b.Stream()
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		if done, err := sB.Query(); err != nil || done {
			break
		}
	}
	release()
	if err := b.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := sA.Synchronize(); err != nil {
		t.Fatal(err)
	}
	back, _ := m.NewHostArray([]int{n}, Uint8, Pageable, nil)
	if err := b.FromDevice(context.Background(), back, y); err != nil {
		t.Fatal(err)
	}
	if err := b.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	if i := bytes.IndexFunc(back.Data(), func(r rune) bool { return r != 0x55 }); i >= 0 {
		t.Fatalf("y holds %#x at %d, want 0x55 everywhere: the old copy to x on the first stream overwrote it", back.Data()[i], i)
	}
}
