package account

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/vramkit/vram/alloc"
	"github.com/vramkit/vram/internal/simtest"
)

// TestChoice: what serves the kind a choice names, at New and after a
// swap to another kind: the entry serves its own kind only.
func TestChoice(t *testing.T) {
	pool, err := alloc.Lookup(alloc.NamePool)
	if err != nil {
		t.Fatal(err)
	}
	tests := map[string]struct {
		choice      Choice
		serves      string // at New
		swapTo      alloc.Kind
		servesAfter string
	}{
		"the zero choice: the Pool kind as the registry chooses": {Choice{}, alloc.NameExpandable, alloc.KindDirect, alloc.NameDirect},
		"a kind":                                 {Choice{Kind: alloc.KindDirect}, alloc.NameDirect, alloc.KindPool, alloc.NameExpandable},
		"an entry":                               {ChoiceOf(pool), alloc.NamePool, alloc.KindDirect, alloc.NameDirect},
		"an entry of another kind, then its own": {Choice{Kind: alloc.KindDirect, Entry: pool}, alloc.NameDirect, alloc.KindPool, alloc.NamePool},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			a, err := New(simtest.New(t, 64*MiB), Config{Allocator: tc.choice})
			if err != nil {
				t.Fatal(err)
			}
			defer a.Close(nil)
			if _, r := a.Report(); r.Allocator != tc.serves {
				t.Errorf("at New: served by %q; want %q", r.Allocator, tc.serves)
			}
			p, err := a.Prepare(tc.swapTo)
			if err != nil {
				t.Fatal(err)
			}
			must(t, a.Swap(p))
			if k, r := a.Report(); k != tc.swapTo || r.Allocator != tc.servesAfter {
				t.Errorf("after a swap to %v: %v served by %q; want %q", tc.swapTo, k, r.Allocator, tc.servesAfter)
			}
		})
	}
	if _, err := New(simtest.New(t, 64*MiB), Config{Allocator: ChoiceOf(alloc.Entry{Name: "mine"})}); err == nil {
		t.Error("an entry not from the registry was served")
	}
}

// TestClosedAccount: Close twice returns nil the second time; every
// call after it is an error wrapping ErrClosed and changes nothing.
func TestClosedAccount(t *testing.T) {
	dev := simtest.New(t, 64*MiB)
	a, err := New(dev, Config{})
	if err != nil {
		t.Fatal(err)
	}
	ran := false
	must(t, a.Close(func() error { ran = true; return nil }))
	if !ran {
		t.Error("Close did not call its owner's then")
	}
	must(t, a.Close(nil))
	s := dev.DefaultStream()
	_, allocErr := a.Alloc(context.Background(), MiB, s)
	_, roomErr := a.Room()
	_, reserveErr := a.Reserve(context.Background(), MiB)
	for name, err := range map[string]error{
		"Alloc": allocErr, "Room": roomErr, "SetCap": a.SetCap(MiB), "Trim": a.Trim(context.Background()), "Free": a.Free(1, s),
	} {
		if !errors.Is(err, ErrClosed) {
			t.Errorf("%s after Close: %v; want ErrClosed", name, err)
		}
	}
	if reserveErr != nil {
		t.Errorf("Reserve after Close, without a lease: %v; want nothing to do", reserveErr)
	}
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// TestAllocBesideSwapUnderALease: an allocation through the account
// under a broker's lease (the C library's hooks: claim what the lease
// lacks, then allocate) reads the allocator and its cap under the lock
// that Swap takes to replace them. (It read them with no lock when the
// claim was the manager's ClaimLease: run with -race, this test's
// interleaving was a data race there.) Every allocation lands in an
// allocator that a swap or the account's Close frees: the device is left
// with nothing.
func TestAllocBesideSwapUnderALease(t *testing.T) {
	a := newLeased(t, newFakeLease(64*MiB))
	s := a.Device().DefaultStream()
	const rounds = 500 // the old code's race showed in every run of 500, not of 50
	var wg sync.WaitGroup
	wg.Add(2)
	errs := make(chan error, 2*rounds)
	go func() {
		defer wg.Done()
		for range rounds {
			if _, err := a.Alloc(context.Background(), MiB, s); err != nil {
				errs <- err
			}
		}
	}()
	go func() {
		defer wg.Done()
		for range rounds {
			p, err := a.Prepare(alloc.KindDirect)
			if err == nil {
				err = a.Swap(p) // frees what the old allocator still holds
			}
			if err != nil {
				errs <- err
			}
		}
	}()
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}
