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

func TestAddAndLookups(t *testing.T) {
	g, _ := newGroups(t)
	if got := g.Members("default"); len(got) != 0 || got == nil {
		t.Errorf("Members of an unused default group = %#v, want empty", got)
	}
	if names := g.Names(); len(names) != 0 {
		t.Errorf("groups before first use: %v", names)
	}
	for id, grp := range map[uint64]string{1: "", 2: "default", 3: "solver", 4: "solver"} {
		if err := g.Add(id, grp); err != nil {
			t.Fatalf("Add(%d, %q): %v", id, grp, err)
		}
	}
	for name, tc := range map[string]struct {
		id    uint64
		group string
	}{
		"empty name joins default": {1, "default"},
		"default by name":          {2, "default"},
		"named group":              {3, "solver"},
		"second member":            {4, "solver"},
	} {
		t.Run(name, func(t *testing.T) {
			got, err := g.Group(tc.id)
			if err != nil || got != tc.group {
				t.Errorf("Group(%d) = %q, %v; want %q", tc.id, got, err, tc.group)
			}
			s, err := g.Stream(tc.id)
			want, _ := g.GroupStream(tc.group)
			if err != nil || s != want || s == nil {
				t.Errorf("Stream(%d) = %v, %v; want the group's stream %v", tc.id, s, err, want)
			}
		})
	}
	s3, _ := g.Stream(3)
	s1, _ := g.Stream(1)
	if s3 == s1 {
		t.Error("two groups share a stream")
	}
	if got := g.Members("solver"); !slices.Equal(got, []uint64{3, 4}) {
		t.Errorf("Members(solver) = %v", got)
	}
	if got := g.Members(""); !slices.Equal(got, []uint64{1, 2}) {
		t.Errorf("Members(\"\") = %v", got)
	}
	if got := g.Members("nope"); len(got) != 0 {
		t.Errorf("Members of an unknown group = %v", got)
	}
	if n := g.Size("solver"); n != 2 {
		t.Errorf("Size(solver) = %d", n)
	}
	if got := g.Names(); !slices.Equal(got, []string{"default", "solver"}) {
		t.Errorf("Names = %v", got)
	}
}

func TestErrors(t *testing.T) {
	g, _ := newGroups(t)
	if err := g.Add(1, "a"); err != nil {
		t.Fatal(err)
	}
	for name, tc := range map[string]struct {
		do   func() error
		want error
	}{
		"add twice, same group":      {func() error { return g.Add(1, "a") }, streams.ErrAlreadyGrouped},
		"add twice, other group":     {func() error { return g.Add(1, "b") }, streams.ErrAlreadyGrouped},
		"group of unknown client":    {func() error { _, err := g.Group(9); return err }, streams.ErrNotGrouped},
		"stream of unknown client":   {func() error { _, err := g.Stream(9); return err }, streams.ErrNotGrouped},
		"move unknown client":        {func() error { return g.Move(9, "a") }, streams.ErrNotGrouped},
		"remove unknown client":      {func() error { return g.Remove(9) }, streams.ErrNotGrouped},
		"stream of an unknown group": {func() error { _, err := g.GroupStream("zz"); return err }, streams.ErrUnknownGroup},
	} {
		t.Run(name, func(t *testing.T) {
			if err := tc.do(); !errors.Is(err, tc.want) {
				t.Errorf("got %v, want %v", err, tc.want)
			}
		})
	}
	// A failed Add changed nothing.
	if grp, _ := g.Group(1); grp != "a" || g.Size("b") != 0 {
		t.Errorf("after refused adds: client 1 in %q, b has %d", grp, g.Size("b"))
	}
}

func TestMoveAndRemove(t *testing.T) {
	g, _ := newGroups(t)
	_ = g.Add(1, "a")
	_ = g.Add(2, "a")
	sa, _ := g.GroupStream("a")
	if err := g.Move(1, "b"); err != nil {
		t.Fatal(err)
	}
	sb, _ := g.GroupStream("b")
	if s, _ := g.Stream(1); s != sb || sb == sa {
		t.Errorf("after Move, client 1's stream is %v; want b's %v (a's is %v)", s, sb, sa)
	}
	if got := g.Members("a"); !slices.Equal(got, []uint64{2}) {
		t.Errorf("a = %v after the move", got)
	}
	if err := g.Move(1, "b"); err != nil {
		t.Errorf("move into the group it is in: %v", err)
	}
	if got := g.Members("b"); !slices.Equal(got, []uint64{1}) {
		t.Errorf("b = %v", got)
	}
	if err := g.Remove(2); err != nil {
		t.Fatal(err)
	}
	// An emptied group is forgotten and its stream closed.
	if s, err := g.GroupStream("a"); !errors.Is(err, streams.ErrUnknownGroup) || g.Size("a") != 0 {
		t.Errorf("emptied group a: stream %v, %v (was %v), size %d; want ErrUnknownGroup", s, err, sa, g.Size("a"))
	}
	g.WaitClosed(sa)
	if _, err := sa.Query(); !errors.Is(err, device.ErrClosed) {
		t.Errorf("the stream of the emptied group: Query = %v, want ErrClosed", err)
	}
	if err := g.Add(2, "b"); err != nil {
		t.Errorf("re-add after Remove: %v", err)
	}
}

func TestReinit(t *testing.T) {
	g, dev := newGroups(t)
	_ = g.Add(1, "a")
	_ = g.Add(2, "b")
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
	if grp, _ := g.Group(1); grp != "a" {
		t.Errorf("membership lost by Reinit: client 1 in %q", grp)
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
	_ = g.Add(1, "a")
	_ = g.Add(2, "b")
	sa, _ := g.GroupStream("a")
	mk.fail.Store(true)
	if err := g.Add(3, "c"); !errors.Is(err, errMake) {
		t.Errorf("Add to a new group with no stream: %v", err)
	}
	if _, err := g.Group(3); !errors.Is(err, streams.ErrNotGrouped) {
		t.Errorf("client 3 was added anyway: %v", err)
	}
	if err := g.Move(1, "c"); !errors.Is(err, errMake) {
		t.Errorf("Move to a new group with no stream: %v", err)
	}
	if grp, _ := g.Group(1); grp != "a" {
		t.Errorf("client 1 moved anyway, to %q", grp)
	}
	if err := g.Reinit(); !errors.Is(err, errMake) {
		t.Errorf("Reinit with no streams: %v", err)
	}
	if s, _ := g.GroupStream("a"); s != sa {
		t.Error("a failed Reinit changed a stream")
	}
	if err := g.Add(4, "a"); err != nil {
		t.Errorf("joining an existing group needs no stream: %v", err)
	}
}

func TestClose(t *testing.T) {
	g, dev := newGroups(t)
	_ = g.Add(1, "a")
	_ = g.Add(2, "b")
	if r := dev.Leaks(); r.Streams != 2 {
		t.Fatalf("want 2 open streams, have %s", r)
	}
	if err := g.Close(); err != nil {
		t.Fatal(err)
	}
	if r := dev.Leaks(); r.Streams != 0 {
		t.Errorf("Close left %d streams open", r.Streams)
	}
	if err := g.Add(3, "a"); !errors.Is(err, streams.ErrClosed) {
		t.Errorf("Add after Close: %v", err)
	}
	if err := g.Reinit(); !errors.Is(err, streams.ErrClosed) {
		t.Errorf("Reinit after Close: %v", err)
	}
	if err := g.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

// TestConcurrent adds, moves, looks up and removes clients from many
// goroutines, racing on the creation of the same new groups; each group
// must end with exactly one stream and the device with no spare ones.
func TestConcurrent(t *testing.T) {
	g, dev := newGroups(t)
	const workers, each = 8, 200
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := range each {
				id := uint64(w*each + i + 1)
				grp := fmt.Sprintf("g%d", i%5)
				if err := g.Add(id, grp); err != nil {
					t.Error(err)
					return
				}
				if _, err := g.Stream(id); err != nil {
					t.Error(err)
				}
				if i%3 == 0 {
					if err := g.Move(id, fmt.Sprintf("g%d", (i+1)%7)); err != nil {
						t.Error(err)
					}
				}
				_ = g.Members(grp)
				if i%2 == 0 {
					if err := g.Remove(id); err != nil {
						t.Error(err)
					}
				}
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
	total := 0
	for _, n := range g.Names() {
		total += g.Size(n)
	}
	if total != workers*each/2 {
		t.Errorf("%d clients in groups, want %d", total, workers*each/2)
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

	_ = g.Add(1, "solver")
	_ = g.Add(2, "solver")
	_ = g.Add(3, "") // the default group
	err := g.Add(1, "other")
	fmt.Println(errors.Is(err, streams.ErrAlreadyGrouped))

	s1, _ := g.Stream(1)
	s2, _ := g.Stream(2)
	fmt.Println("1 and 2 share a stream:", s1 == s2)
	fmt.Println(g.Members("solver"), g.Members("default"), g.Members("unknown"))

	_ = g.Move(2, "post")
	grp, _ := g.Group(2)
	fmt.Println("2 is in", grp, "of", g.Names())
	// Output:
	// true
	// 1 and 2 share a stream: true
	// [1 2] [3] []
	// 2 is in post of [default post solver]
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
	if m := g.Members("solo"); len(m) != 0 {
		t.Errorf("an ensured group has members %v", m)
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

// A group lives while it has members or holds: the last Remove, Move or
// release closes its stream, after the work queued on it, in the
// background: the call returns while that work still runs. (Groups were
// once never forgotten: every name ever used kept a stream and its
// goroutine; and the last call once waited for the work, a long kernel
// included, holding its caller's locks.)
func TestEmptyGroupsAreForgotten(t *testing.T) {
	for name, tc := range map[string]func(t *testing.T, g *streams.Groups) (leave func() error){
		"Remove": func(t *testing.T, g *streams.Groups) func() error {
			if err := g.Add(1, "a"); err != nil {
				t.Fatal(err)
			}
			return func() error { return g.Remove(1) }
		},
		"Move": func(t *testing.T, g *streams.Groups) func() error {
			if err := g.Add(1, "a"); err != nil {
				t.Fatal(err)
			}
			return func() error { return g.Move(1, "b") }
		},
		"release of a Hold": func(t *testing.T, g *streams.Groups) func() error {
			_, release, err := g.Hold("a")
			if err != nil {
				t.Fatal(err)
			}
			return release
		},
		"Remove while held, then release": func(t *testing.T, g *streams.Groups) func() error {
			if err := g.Add(1, "a"); err != nil {
				t.Fatal(err)
			}
			_, release, err := g.Hold("a")
			if err != nil {
				t.Fatal(err)
			}
			if err := g.Remove(1); err != nil {
				t.Fatal(err)
			}
			if _, err := g.GroupStream("a"); err != nil {
				t.Fatalf("a held group was forgotten when its last member left: %v", err)
			}
			return release
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
				t.Errorf("groups %v: a is still there with no member", names)
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
			if err := g.Add(uint64(i), fmt.Sprint("g", i)); err != nil {
				t.Fatal(err)
			}
			if err := g.Remove(uint64(i)); err != nil {
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
	if err := g.Add(1, "a"); err != nil {
		t.Fatal(err)
	}
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
