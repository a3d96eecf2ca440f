package vram

import (
	"bytes"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/vramkit/vram/account"
	"github.com/vramkit/vram/alloc"
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
