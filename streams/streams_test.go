package streams_test

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/vramkit/vram/device"
	"github.com/vramkit/vram/device/sim"
	"github.com/vramkit/vram/streams"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// newDev is a simulated device, closed (and checked for open streams)
// when the test ends.
func newDev(t testing.TB) *sim.Device {
	t.Helper()
	dev, err := sim.New(sim.Config{TotalBytes: 64 << 20})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if r := dev.Leaks(); !r.Empty() {
			t.Errorf("device left with %s", r)
		}
		if err := dev.Close(); err != nil {
			t.Error(err)
		}
	})
	return dev
}

func newGroups(t testing.TB) (*streams.Groups, *sim.Device) {
	dev := newDev(t)
	g := streams.New(dev)
	t.Cleanup(func() {
		if err := g.Close(); err != nil {
			t.Error(err)
		}
	})
	return g, dev
}

// hold holds group in g, failing the test if it cannot.
func hold(t testing.TB, g *streams.Groups, group string) (device.Stream, func() error) {
	t.Helper()
	s, release, err := g.Hold(group)
	if err != nil {
		t.Fatalf("Hold(%q): %v", group, err)
	}
	return s, release
}

func TestHoldAndLookups(t *testing.T) {
	g, _ := newGroups(t)
	if names := g.Names(); len(names) != 0 {
		t.Errorf("groups before first use: %v", names)
	}
	s1, _ := hold(t, g, "")
	s2, _ := hold(t, g, "default")
	s3, _ := hold(t, g, "solver")
	s4, _ := hold(t, g, "solver")
	for name, tc := range map[string]struct {
		got   device.Stream
		group string
	}{
		"an empty name is default": {s1, "default"},
		"default by name":          {s2, "default"},
		"a named group":            {s3, "solver"},
		"a second hold":            {s4, "solver"},
	} {
		t.Run(name, func(t *testing.T) {
			want, err := g.GroupStream(tc.group)
			if err != nil || tc.got != want || want == nil {
				t.Errorf("held %v; GroupStream(%q) = %v, %v; want the one stream", tc.got, tc.group, want, err)
			}
		})
	}
	if s3 == s1 {
		t.Error("two groups share a stream")
	}
	if s, _, err := g.HoldExisting("solver"); err != nil || s != s3 {
		t.Errorf("HoldExisting(solver) = %v, %v; want its stream", s, err)
	}
	if got := g.Names(); !slices.Equal(got, []string{"default", "solver"}) {
		t.Errorf("Names = %v", got)
	}
}

func TestErrors(t *testing.T) {
	g, _ := newGroups(t)
	for name, tc := range map[string]struct {
		do   func() error
		want error
	}{
		"stream of an unknown group":      {func() error { _, err := g.GroupStream("zz"); return err }, streams.ErrUnknownGroup},
		"held existing, of unknown group": {func() error { _, _, err := g.HoldExisting("zz"); return err }, streams.ErrUnknownGroup},
	} {
		t.Run(name, func(t *testing.T) {
			if err := tc.do(); !errors.Is(err, tc.want) {
				t.Errorf("got %v, want %v", err, tc.want)
			}
		})
	}
	if names := g.Names(); len(names) != 0 {
		t.Errorf("failed look-ups made groups %v", names)
	}
}

// TestLastReleaseForgets: a group stays while any hold of it does; the
// last release forgets it and closes its stream, and the name can be
// held again, with a new stream.
func TestLastReleaseForgets(t *testing.T) {
	g, _ := newGroups(t)
	sa, r1 := hold(t, g, "a")
	_, r2 := hold(t, g, "a")
	if err := r1(); err != nil {
		t.Fatal(err)
	}
	if s, err := g.GroupStream("a"); err != nil || s != sa {
		t.Errorf("a, still held once: %v, %v; want its stream", s, err)
	}
	if err := errors.Join(r1(), r2()); err != nil { // a second release of r1 counts nothing
		t.Fatal(err)
	}
	if s, err := g.GroupStream("a"); !errors.Is(err, streams.ErrUnknownGroup) {
		t.Errorf("a, released: %v, %v; want ErrUnknownGroup", s, err)
	}
	g.WaitClosed(sa)
	if _, err := sa.Query(); !errors.Is(err, device.ErrClosed) {
		t.Errorf("the stream of the released group: Query = %v, want ErrClosed", err)
	}
	if s, _ := hold(t, g, "a"); s == sa {
		t.Error("a held again kept its closed stream")
	}
}

func TestReinit(t *testing.T) {
	g, dev := newGroups(t)
	hold(t, g, "a")
	hold(t, g, "b")
	before := map[string]device.Stream{}
	for _, n := range g.Names() {
		before[n], _ = g.GroupStream(n)
	}
	if err := dev.Reset(); err != nil {
		t.Fatal(err)
	}
	// After a reset the old streams are invalid.
	if err := before["a"].Synchronize(); !errors.Is(err, device.ErrInvalidated) {
		t.Fatalf("old stream after reset: %v, want ErrInvalidated", err)
	}
	if err := g.Reinit(); err != nil {
		t.Fatal(err)
	}
	for n, old := range before {
		s, _ := g.GroupStream(n)
		if s == old {
			t.Errorf("group %s kept its stream", n)
		}
		if err := s.Synchronize(); err != nil {
			t.Errorf("group %s's new stream: %v", n, err)
		}
	}
	if names := g.Names(); !slices.Equal(names, []string{"a", "b"}) {
		t.Errorf("groups after Reinit: %v", names)
	}
}

// failingMaker makes streams from dev until it is told to fail.
type failingMaker struct {
	dev  device.Device
	fail atomic.Bool
}

var errMake = errors.New("no more streams")

func (f *failingMaker) NewStream() (device.Stream, error) {
	if f.fail.Load() {
		return nil, errMake
	}
	return f.dev.NewStream()
}

func TestFailedStreamChangesNothing(t *testing.T) {
	dev := newDev(t)
	mk := &failingMaker{dev: dev}
	g := streams.New(mk)
	defer g.Close()
	hold(t, g, "a")
	sa, _ := g.GroupStream("a")
	mk.fail.Store(true)
	if _, _, err := g.Hold("c"); !errors.Is(err, errMake) {
		t.Errorf("Hold of a new group with no stream: %v", err)
	}
	if names := g.Names(); !slices.Equal(names, []string{"a"}) {
		t.Errorf("a failed Hold made a group: %v", names)
	}
	if err := g.Reinit(); !errors.Is(err, errMake) {
		t.Errorf("Reinit with no streams: %v", err)
	}
	if s, _ := g.GroupStream("a"); s != sa {
		t.Error("a failed Reinit changed a stream")
	}
	if s, _, err := g.Hold("a"); err != nil || s != sa {
		t.Errorf("holding an existing group needs no stream: %v, %v", s, err)
	}
}

func TestClose(t *testing.T) {
	g, dev := newGroups(t)
	_, ra := hold(t, g, "a")
	hold(t, g, "b")
	if r := dev.Leaks(); r.Streams != 2 {
		t.Fatalf("want 2 open streams, have %s", r)
	}
	if err := g.Close(); err != nil {
		t.Fatal(err)
	}
	if r := dev.Leaks(); r.Streams != 0 {
		t.Errorf("Close left %d streams open", r.Streams)
	}
	if _, _, err := g.Hold("a"); !errors.Is(err, streams.ErrClosed) {
		t.Errorf("Hold after Close: %v", err)
	}
	if err := ra(); err != nil {
		t.Errorf("a release after Close: %v", err)
	}
	if err := g.Reinit(); !errors.Is(err, streams.ErrClosed) {
		t.Errorf("Reinit after Close: %v", err)
	}
	if err := g.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

// TestConcurrent holds and releases groups from many goroutines, racing
// on the creation of the same new groups (and with Reinit); each group
// held at the end has exactly one stream and the device no spare ones.
func TestConcurrent(t *testing.T) {
	g, dev := newGroups(t)
	const workers, each = 8, 200
	var mu sync.Mutex
	kept := map[string]int{} // holds kept to the end, by group
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := range each {
				grp := fmt.Sprintf("g%d", (w+i)%7)
				s, release, err := g.Hold(grp)
				if err != nil {
					t.Error(err)
					return
				}
				if got, err := g.GroupStream(grp); err != nil || got == nil || s == nil {
					t.Errorf("held %q: %v, %v", grp, got, err)
				}
				if i%2 == 0 {
					if err := release(); err != nil {
						t.Error(err)
					}
					continue
				}
				mu.Lock()
				kept[grp]++
				mu.Unlock()
			}
		})
	}
	wg.Go(func() {
		for range 5 {
			if err := g.Reinit(); err != nil {
				t.Error(err)
			}
		}
	})
	wg.Wait()
	g.WaitClosing()
	var want []string
	for grp := range kept {
		want = append(want, grp)
	}
	slices.Sort(want)
	if got := g.Names(); !slices.Equal(got, want) {
		t.Errorf("groups %v; want those still held, %v", got, want)
	}
	if r := dev.Leaks(); r.Streams != len(g.Names()) {
		t.Errorf("%d open streams for %d groups", r.Streams, len(g.Names()))
	}
}

func ExampleGroups() {
	dev, _ := sim.New(sim.Config{})
	defer dev.Close()
	g := streams.New(dev)
	defer g.Close()

	s1, release1, _ := g.Hold("solver") // one member
	s2, release2, _ := g.Hold("solver") // another
	fmt.Println("the members share a stream:", s1 == s2)
	_, _, _ = g.Hold("") // the default group
	fmt.Println(g.Names())

	_ = release1()
	_ = release2() // the last: solver is forgotten, its stream closed behind its work
	_, err := g.GroupStream("solver")
	fmt.Println(errors.Is(err, streams.ErrUnknownGroup), g.Names())
	// Output:
	// the members share a stream: true
	// [default solver]
	// true [default]
}

func TestEnsure(t *testing.T) {
	g, _ := newGroups(t)
	s, err := g.Ensure("solo")
	if err != nil || s == nil {
		t.Fatalf("Ensure a new group = %v, %v", s, err)
	}
	if got, err := g.GroupStream("solo"); err != nil || got != s {
		t.Errorf("GroupStream after Ensure = %v, %v; want the ensured stream", got, err)
	}
	if again, err := g.Ensure("solo"); err != nil || again != s {
		t.Errorf("a second Ensure = %v, %v; want the same stream", again, err)
	}
	if d, err := g.Ensure(""); err != nil || d == nil {
		t.Errorf("Ensure(\"\") = %v, %v", d, err)
	} else if got, _ := g.GroupStream(streams.Default); got != d {
		t.Error("Ensure(\"\") did not make the default group")
	}

	dev := newDev(t)
	mk := &failingMaker{dev: dev}
	fg := streams.New(mk)
	defer fg.Close()
	mk.fail.Store(true)
	if _, err := fg.Ensure("x"); !errors.Is(err, errMake) {
		t.Errorf("Ensure with no stream to be had = %v", err)
	}
	if names := fg.Names(); len(names) != 0 {
		t.Errorf("a failed Ensure left groups %v", names)
	}
}

// A group lives while it is held: the last release closes its stream,
// after the work queued on it, in the background: the release returns
// while that work still runs. (Groups were once never forgotten: every
// name ever used kept a stream and its goroutine; and the last call once
// waited for the work, a long kernel included, holding its caller's
// locks.)
func TestEmptyGroupsAreForgotten(t *testing.T) {
	for name, tc := range map[string]func(t *testing.T, g *streams.Groups) (leave func() error){
		"the release of its one hold": func(t *testing.T, g *streams.Groups) func() error {
			_, release := hold(t, g, "a")
			return release
		},
		"a move: the new group held, then the old released": func(t *testing.T, g *streams.Groups) func() error {
			_, release := hold(t, g, "a")
			hold(t, g, "b")
			return release
		},
		"one of two holds released, then the other": func(t *testing.T, g *streams.Groups) func() error {
			_, member := hold(t, g, "a")
			_, call := hold(t, g, "a")
			if err := member(); err != nil {
				t.Fatal(err)
			}
			if _, err := g.GroupStream("a"); err != nil {
				t.Fatalf("a held group was forgotten when another hold ended: %v", err)
			}
			return call
		},
	} {
		t.Run(name, func(t *testing.T) {
			g, dev := newGroups(t)
			leave := tc(t, g)
			s, err := g.GroupStream("a")
			if err != nil {
				t.Fatal(err)
			}
			// The call returns while the work queued on the stream runs (a
			// kernel that ends only when told); the stream closes after it.
			var ran atomic.Bool
			release := make(chan struct{})
			if err := dev.LaunchFunc(s, 1, func(device.View, int, int) error {
				<-release
				ran.Store(true)
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			left := make(chan error, 1)
			go func() { left <- leave() }()
			select {
			case err := <-left:
				if err != nil {
					t.Error(err)
				}
			case <-time.After(20 * time.Second):
				close(release)
				<-left
				t.Fatal("leaving the group waited for its stream's work")
			}
			if names := g.Names(); slices.Contains(names, "a") {
				t.Errorf("groups %v: a is still there with no hold", names)
			}
			close(release)
			g.WaitClosed(s)
			if !ran.Load() {
				t.Error("the stream was closed before its work finished")
			}
			if _, err := s.Query(); !errors.Is(err, device.ErrClosed) {
				t.Errorf("the stream of the forgotten group: Query = %v, want ErrClosed", err)
			}
		})
	}
	t.Run("many names", func(t *testing.T) {
		g, dev := newGroups(t)
		for i := range 200 {
			_, release := hold(t, g, fmt.Sprint("g", i))
			if err := release(); err != nil {
				t.Fatal(err)
			}
		}
		if n := len(g.Names()); n != 0 {
			t.Errorf("%d groups left", n)
		}
		if err := g.Close(); err != nil { // waits for the closes in the background
			t.Fatal(err)
		}
		if n := dev.Leaks().Streams; n != 0 {
			t.Errorf("%d streams left on the device", n)
		}
	})
}

// Ensure and Hold read a group's stream under the lock that Reinit writes
// it under (Ensure once returned it after unlocking: a data race under
// -race every time the two ran together).
// TestEnsureRacesWithReinit: Ensure and Hold read a group's stream under
// the lock Reinit replaces it under (the race detector checks). Ensure
// runs in a loop of its own: a read just after the unlock races only
// with a Reinit that takes the lock before the reader's next lock.
func TestEnsureRacesWithReinit(t *testing.T) {
	g, _ := newGroups(t)
	hold(t, g, "a")
	var wg sync.WaitGroup
	done := make(chan struct{})
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer close(done)
		for range 1000 {
			if err := g.Reinit(); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	loop := func(f func() error) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-done:
					return
				default:
				}
				if err := f(); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	loop(func() error { _, err := g.Ensure("a"); return err })
	loop(func() error {
		_, release, err := g.Hold("a")
		if err != nil {
			return err
		}
		return release()
	})
	wg.Wait()
}

// TestHoldRacesWithClose: a Close that comes while Hold is between
// holding its group and returning does not make Hold fail or panic (it
// once looked the group up a second time, in the table Close had just
// emptied); the stream Hold returns is the closed group's, and its release
// is harmless.
func TestHoldRacesWithClose(t *testing.T) {
	dev := newDev(t)
	g := streams.New(dev)
	streams.SetHoldHook(func() {
		if err := g.Close(); err != nil {
			t.Error(err)
		}
	})
	defer streams.SetHoldHook(nil)
	s, release, err := g.Hold("a")
	if err != nil || s == nil {
		t.Fatalf("Hold with a Close beside it: stream %v, error %v; want the group's stream", s, err)
	}
	if err := release(); err != nil {
		t.Fatalf("release after Close: %v", err)
	}
	if _, _, err := g.Hold("a"); !errors.Is(err, streams.ErrClosed) {
		t.Fatalf("Hold after Close: %v, want ErrClosed", err)
	}
}
