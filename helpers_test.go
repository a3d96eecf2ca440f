package vram

import (
	"bytes"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vramkit/vram/account"
	"github.com/vramkit/vram/alloc"
	"github.com/vramkit/vram/device"
	"github.com/vramkit/vram/device/sim"
	"github.com/vramkit/vram/internal/simtest"
	"github.com/vramkit/vram/internal/units"
)

// newSim is simtest.New: a simulated device checked for leaks when the
// test ends.
func newSim(t testing.TB, total uint64, mod ...func(*sim.Config)) *sim.Device {
	t.Helper()
	return simtest.New(t, total, mod...)
}

// newManager makes a manager on a fresh simulated device of total bytes
// (Direct allocator unless opts say otherwise, logs to a buffer) and
// closes it when the test ends.
func newManager(t testing.TB, total uint64, opts ...Option) (*Manager, *sim.Device, *logBuf) {
	t.Helper()
	dev := newSim(t, total)
	m, lb := managerOn(t, dev, opts...)
	return m, dev, lb
}

// managerOn is newManager on dev.
func managerOn(t testing.TB, dev *sim.Device, opts ...Option) (*Manager, *logBuf) {
	t.Helper()
	lb := &logBuf{}
	all := append([]Option{WithAllocatorChoice(account.Choice{Kind: Direct}), WithLogger(slog.New(slog.NewTextHandler(lb, nil)))}, opts...)
	m, err := New(dev, all...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := m.Close(); err != nil {
			t.Errorf("close manager: %v", err)
		}
	})
	return m, lb
}

// logBuf is a concurrency-safe log sink.
type logBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuf) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func register(t testing.TB, m *Manager, o ClientOptions) *Client {
	t.Helper()
	c, err := m.Register(o)
	if err != nil {
		t.Fatalf("register %+v: %v", o, err)
	}
	return c
}

func free(t testing.TB, m *Manager) uint64 {
	t.Helper()
	f, _, err := m.MemInfo()
	if err != nil {
		t.Fatal(err)
	}
	return f
}

const MiB = units.MiB

// allocatorKind is m's allocator kind.
func allocatorKind(m *Manager) AllocatorKind {
	k, _ := m.Account().Stats()
	return k
}

// granularityOf is the rounding unit the planner counts bytes in for a:
// its granularity, or DefaultGranularity (as the budget reads it from
// the account's Room).
func granularityOf(a alloc.Allocator) uint64 {
	if g, ok := a.(alloc.Granular); ok && g.Granularity() > 0 {
		return g.Granularity()
	}
	return DefaultGranularity
}

// cachedOf is the bytes m's allocator holds from the device and has not
// in use.
func cachedOf(m *Manager) uint64 {
	_, st := m.Account().Stats()
	return st.Cached()
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// byClient keys reqs (by "name#id", as Plan's callers give them) by
// clients of those names and ids, made for the planner alone, as the
// manager's own plan path keys them; names without "#id" get ids by
// order.
func byClient(reqs map[string]map[string]ArrayRequest) map[*Client]map[string]ArrayRequest {
	out := make(map[*Client]map[string]ArrayRequest, len(reqs))
	for _, key := range slices.Sorted(maps.Keys(reqs)) {
		name, id, _ := strings.Cut(key, "#")
		n, err := strconv.ParseUint(id, 10, 64)
		if err != nil {
			n = uint64(len(out) + 1)
		}
		out[&Client{name: name, id: n}] = reqs[key]
	}
	return out
}

// within runs f and fails the test if it has not returned after 30 s (it
// is then waiting for work that only the test can end: release ends it).
func within(t *testing.T, what string, release func(), f func() error) error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- f() }()
	select {
	case err := <-done:
		return err
	case <-time.After(30 * time.Second):
		release()
		<-done
		t.Fatalf("%s waited for a kernel that only the test ends", what)
		return nil
	}
}

// blockStream enqueues on c's stream a kernel that waits until the
// returned function is called.
func blockStream(t *testing.T, m *Manager, c *Client) (release func()) {
	t.Helper()
	s, err := c.Stream()
	if err != nil {
		t.Fatal(err)
	}
	l, ok := m.Device().(device.FuncLauncher)
	if !ok {
		t.Skip("the device runs no Go kernels")
	}
	gate := make(chan struct{})
	if err := l.LaunchFunc(s, 1, func(device.View, int, int) error { <-gate; return nil }); err != nil {
		t.Fatal(err)
	}
	var once atomic.Bool
	release = func() {
		if once.CompareAndSwap(false, true) {
			close(gate)
		}
	}
	t.Cleanup(release)
	return release
}

// holdBytes gives c one unchunkable device array of n bytes.
func holdBytes(t *testing.T, c *Client, n int) *ArrayResponse {
	t.Helper()
	resp, err := queueAndAllocate(t, c, map[string]ArrayRequest{"x": fixed(Uint8, n)})
	if err != nil {
		t.Fatalf("allocate %d bytes for %v: %v", n, c, err)
	}
	return resp
}

// gateStream blocks s with a kernel until the returned func is called.
func gateStream(t *testing.T, dev *sim.Device, s device.Stream) (open func()) {
	t.Helper()
	gate := make(chan struct{})
	if err := dev.LaunchFunc(s, 1, func(device.View, int, int) error { <-gate; return nil }); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	open = func() { once.Do(func() { close(gate) }) }
	t.Cleanup(open)
	return open
}

// longKernel launches on c's stream a kernel that runs until release is
// closed: another group's long work.
func longKernel(t *testing.T, dev *sim.Device, c *Client) (release func()) {
	t.Helper()
	s, err := c.Stream()
	if err != nil {
		t.Fatal(err)
	}
	ch := make(chan struct{})
	if err := dev.LaunchFunc(s, 1, func(device.View, int, int) error { <-ch; return nil }); err != nil {
		t.Fatal(err)
	}
	var done bool
	release = func() {
		if !done {
			done = true
			close(ch)
		}
	}
	t.Cleanup(release)
	return release
}

// holdStream runs a kernel on s that waits until the returned release is
// called (or 10 s pass, so that a failing test cannot hang), holding back
// everything enqueued on s after it.
func holdStream(t *testing.T, dev *sim.Device, s device.Stream) (release func()) {
	t.Helper()
	ch := make(chan struct{})
	err := dev.LaunchFunc(s, 1, func(device.View, int, int) error {
		select {
		case <-ch:
		case <-time.After(10 * time.Second):
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	var once bool
	return func() {
		if !once {
			once = true
			close(ch)
		}
	}
}
