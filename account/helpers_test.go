package account

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/vramkit/vram/alloc"
	"github.com/vramkit/vram/device/sim"
	"github.com/vramkit/vram/internal/simtest"
)

// fakeLease is a Lease of a broker in the test: it grants every claim up
// to grantMax (0: no bound), refuses every claim with refuse, and records
// what it was told.
type fakeLease struct {
	mu       sync.Mutex
	b        LeaseBudget
	grantMax uint64
	refuse   error
	claims   []uint64 // the claims made, in order
	reports  []uint64 // the reports made, in order
	changed  chan struct{}
}

func newFakeLease(guaranteed uint64) *fakeLease {
	return &fakeLease{b: LeaseBudget{Guaranteed: guaranteed}, changed: make(chan struct{})}
}

func (l *fakeLease) Budget() LeaseBudget {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b
}

func (l *fakeLease) Changed() <-chan struct{} {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.changed
}

func (l *fakeLease) Claim(_ context.Context, bytes uint64) (LeaseBudget, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.claims = append(l.claims, bytes)
	if l.refuse != nil {
		return l.b, l.refuse
	}
	if l.grantMax > 0 {
		bytes = min(bytes, l.grantMax)
	}
	l.b.Bytes = bytes
	return l.b, nil
}

func (l *fakeLease) Report(_ context.Context, bytes uint64) (LeaseBudget, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.reports = append(l.reports, bytes)
	return l.b, nil
}

// set changes the budget as the broker would, and says so.
func (l *fakeLease) set(b LeaseBudget) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.b = b
	close(l.changed)
	l.changed = make(chan struct{})
}

func (l *fakeLease) Err() error { return nil }

func (l *fakeLease) String() string { return "lease fake" }

func (l *fakeLease) Close() error { return nil }

// withFakeBroker makes l the lease every account of the test with a
// Broker gets, and puts the dialer back when the test ends.
func withFakeBroker(t *testing.T, l *fakeLease) {
	t.Helper()
	before := brokerDialer()
	RegisterBroker(func(context.Context, LeaseRequest) (Lease, error) {
		if l == nil {
			return nil, errors.New("no broker in this test")
		}
		return l, nil
	})
	t.Cleanup(func() { RegisterBroker(before) })
}

// newLeased makes an account of a fresh 2 GiB simulator (addresses
// only), served by Direct (each allocation a device allocation of its
// own, no cache), with l as its broker's lease, closed when the test
// ends; the device is checked for leaks then.
func newLeased(t *testing.T, l *fakeLease) *Account {
	t.Helper()
	withFakeBroker(t, l)
	dev := simtest.New(t, 2048*MiB, func(c *sim.Config) { c.AddressOnly = true })
	a, err := New(dev, Config{Allocator: Choice{Kind: alloc.KindDirect}, Socket: "fake"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := a.Close(nil); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	return a
}

// holdsTaken is the count of holds taken so far, as settle reads it.
func (f *follower) holdsTaken() uint64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.holds
}

// newDirect makes an account of a fresh 64 MiB simulator, served by
// Direct, with cfg's other settings, closed when the test ends.
func newDirect(t *testing.T, cfg Config) (*Account, *sim.Device) {
	t.Helper()
	dev := simtest.New(t, 64*MiB)
	cfg.Allocator = Choice{Kind: alloc.KindDirect}
	a, err := New(dev, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close(nil) })
	return a, dev
}
