package sim_test

import (
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/vramkit/vram/device"
	"github.com/vramkit/vram/device/sim"
)

// Streams run concurrently: work on one stream never waits for work on
// another unless an event says so. Each operation under test is bracketed
// on its stream by two one-index marker kernels that record the time the
// stream reached them, so the interval [before, after] covers exactly the
// operation (and nothing on another stream can stretch it); the test then
// checks the intervals intersect, by a margin no scheduler delay on a
// loaded machine comes near, instead of comparing totals with the sum.

// interval is when a stream ran an operation.
type interval struct{ start, end time.Time }

func (iv interval) String() string { return iv.end.Sub(iv.start).String() }

// overlap is how long a and b both ran.
func overlap(a, b interval) time.Duration {
	lo, hi := a.start, a.end
	if b.start.After(lo) {
		lo = b.start
	}
	if b.end.Before(hi) {
		hi = b.end
	}
	return max(hi.Sub(lo), 0)
}

// timeline brackets operations on streams with marker kernels.
type timeline struct {
	t   *testing.T
	d   *sim.Device
	mu  sync.Mutex
	ivs map[string]*interval
}

func newTimeline(t *testing.T, d *sim.Device) *timeline {
	return &timeline{t: t, d: d, ivs: map[string]*interval{}}
}

// mark enqueues on s a kernel that stores the time s reaches it in *at.
func (tl *timeline) mark(s device.Stream, at *time.Time) {
	tl.t.Helper()
	check(tl.t, tl.d.LaunchFunc(s, 1, func(device.View, int, int) error {
		now := time.Now()
		tl.mu.Lock()
		*at = now
		tl.mu.Unlock()
		return nil
	}))
}

// run enqueues enq's operations on s between two markers, recorded as name.
func (tl *timeline) run(name string, s device.Stream, enq func()) {
	tl.t.Helper()
	iv := &interval{}
	tl.ivs[name] = iv
	tl.mark(s, &iv.start)
	enq()
	tl.mark(s, &iv.end)
}

// get returns the recorded interval name (after the streams synchronized).
func (tl *timeline) get(name string) interval {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	iv := *tl.ivs[name]
	if iv.start.IsZero() || iv.end.IsZero() {
		tl.t.Fatalf("%s: a marker never ran", name)
	}
	return iv
}

// sleepKernel is a one-block kernel that takes about d without using a
// core, as a GPU kernel takes no host CPU.
func sleepKernel(d time.Duration) func(device.View, int, int) error {
	return func(device.View, int, int) error {
		time.Sleep(d)
		return nil
	}
}

// spinKernel is a kernel whose blocks keep a core busy for about d each.
func spinKernel(d time.Duration) func(device.View, int, int) error {
	return func(device.View, int, int) error {
		for end := time.Now().Add(d); time.Now().Before(end); {
		}
		return nil
	}
}

func TestStreamsOverlap(t *testing.T) {
	const (
		// Few bytes at a slow link: the race detector's bookkeeping of a
		// large copy can stall every goroutine (it is not preemptible).
		bw   = 10e6 // bytes per second
		n    = 3e6  // 300 ms at bw
		op   = 300 * time.Millisecond
		rows = 1000 // a 2-D copy of n bytes in this many rows
	)
	// Each case enqueues, back to back, an operation "a" on stream A and
	// "b" on stream B, each about 300 ms long, and wants them to share at
	// least a third of that (a loaded machine may start b late).
	type env struct {
		d      *sim.Device
		tl     *timeline
		a, b   device.Stream
		dA, dB device.Ptr
		hA, hB []byte
		h2D    []byte // host side of the 2-D copy: rows at twice their width
	}
	copyIn := func(e *env, s device.Stream, p device.Ptr, h []byte) func() {
		return func() { check(t, e.d.CopyHtoD(p, h, s)) }
	}
	cases := map[string]struct {
		a, b func(e *env) func()
	}{
		"copy and sleeping kernel": {
			a: func(e *env) func() { return copyIn(e, e.a, e.dA, e.hA) },
			b: func(e *env) func() {
				return func() { check(t, e.d.LaunchFunc(e.b, 1, sleepKernel(op))) }
			},
		},
		"copy and spinning kernel": {
			a: func(e *env) func() { return copyIn(e, e.a, e.dA, e.hA) },
			b: func(e *env) func() {
				return func() { check(t, e.d.LaunchFunc(e.b, 1, spinKernel(op))) }
			},
		},
		"kernel and copy out": {
			a: func(e *env) func() {
				return func() { check(t, e.d.LaunchFunc(e.a, 1, sleepKernel(op))) }
			},
			b: func(e *env) func() {
				return func() { check(t, e.d.CopyDtoH(e.hB, e.dB, e.b)) }
			},
		},
		"two copies": {
			a: func(e *env) func() { return copyIn(e, e.a, e.dA, e.hA) },
			b: func(e *env) func() {
				return func() { check(t, e.d.CopyDtoH(e.hB, e.dB, e.b)) }
			},
		},
		"2-D copy and kernel": {
			a: func(e *env) func() {
				return func() {
					w := uint64(n / rows)
					check(t, e.d.CopyDtoH2D(e.h2D, 2*w, e.dA, w, w, rows, e.a))
				}
			},
			b: func(e *env) func() {
				return func() { check(t, e.d.LaunchFunc(e.b, 1, sleepKernel(op))) }
			},
		},
		"memset and kernel": {
			a: func(e *env) func() {
				return func() { check(t, e.d.Memset(e.dA, 7, n, e.a)) }
			},
			b: func(e *env) func() {
				return func() { check(t, e.d.LaunchFunc(e.b, 1, sleepKernel(op))) }
			},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			sim.RetryTimed(t, func() string {
				d := newSim(t, sim.Config{TotalBytes: 256 * MiB, CopyBandwidth: bw})
				e := &env{d: d, tl: newTimeline(t, d)}
				e.a = get[device.Stream](t)(d.NewStream())
				defer func() { check(t, e.a.Close()) }()
				e.b = get[device.Stream](t)(d.NewStream())
				defer func() { check(t, e.b.Close()) }()
				e.dA = get[device.Ptr](t)(d.Malloc(n))
				defer func() { check(t, d.Free(e.dA)) }()
				e.dB = get[device.Ptr](t)(d.Malloc(n))
				defer func() { check(t, d.Free(e.dB)) }()
				e.hA, e.hB, e.h2D = make([]byte, n), make([]byte, n), make([]byte, 2*n)

				ea, eb := tc.a(e), tc.b(e)
				start := time.Now()
				e.tl.run("a", e.a, ea)
				e.tl.run("b", e.b, eb)
				check(t, e.a.Synchronize())
				check(t, e.b.Synchronize())
				total := time.Since(start)
				a, b := e.tl.get("a"), e.tl.get("b")
				shared := overlap(a, b)
				t.Logf("a %v, b %v, both running %v, in all %v", a, b, shared, total)
				for what, iv := range map[string]interval{"a": a, "b": b} {
					if iv.end.Sub(iv.start) < op*9/10 {
						t.Errorf("%s took %v, want about %v: the emulation is too fast", what, iv, op)
					}
				}
				if shared < op/3 {
					return fmt.Sprintf("a (%v) and b (%v) ran together for %v, want at least %v: the streams did not run concurrently",
						a, b, shared, op/3)
				}
				return ""
			})
		})
	}
}

// An event wait holds only the waiting stream: the recorded stream and a
// third stream run on, and the work after the wait starts once the
// recorded work is done, not before.
func TestEventWaitOverlap(t *testing.T) {
	sim.RetryTimed(t, func() string { return eventWaitOverlapOnce(t) })
}

// eventWaitOverlapOnce is one try of TestEventWaitOverlap: "" if the
// streams overlapped as they should, else why not.
func eventWaitOverlapOnce(t *testing.T) string {
	const (
		bw = 10e6
		n  = 3e6 // 300 ms at bw (few bytes: see TestStreamsOverlap)
		op = 300 * time.Millisecond
	)
	d := newSim(t, sim.Config{TotalBytes: 256 * MiB, CopyBandwidth: bw})
	tl := newTimeline(t, d)
	var streams [3]device.Stream
	for i := range streams {
		streams[i] = get[device.Stream](t)(d.NewStream())
		defer func(s device.Stream) { check(t, s.Close()) }(streams[i])
	}
	k, w, o := streams[0], streams[1], streams[2]
	p := get[device.Ptr](t)(d.Malloc(n))
	defer func() { check(t, d.Free(p)) }()
	q := get[device.Ptr](t)(d.Malloc(n))
	defer func() { check(t, d.Free(q)) }()
	r := get[device.Ptr](t)(d.Malloc(n))
	defer func() { check(t, d.Free(r)) }()
	ev := get[device.Event](t)(d.NewEvent())
	defer func() { check(t, ev.Close()) }()

	// k: kernel (300 ms), record ev, copy in (300 ms).
	// w: wait ev, copy in (300 ms): must start after the kernel, and
	//    may run alongside k's copy.
	// o: copy out (300 ms): runs alongside the kernel.
	tl.run("kernel", k, func() { check(t, d.LaunchFunc(k, 1, sleepKernel(op))) })
	check(t, ev.Record(k))
	tl.run("k copy", k, func() { check(t, d.CopyHtoD(q, make([]byte, n), k)) })
	check(t, ev.Wait(w))
	tl.run("waited copy", w, func() { check(t, d.CopyHtoD(p, make([]byte, n), w)) })
	tl.run("other copy", o, func() { check(t, d.CopyDtoH(make([]byte, n), r, o)) })
	for _, s := range streams {
		check(t, s.Synchronize())
	}
	kern, kc, waited, other := tl.get("kernel"), tl.get("k copy"), tl.get("waited copy"), tl.get("other copy")
	t.Logf("kernel %v, k's copy %v, waited copy %v, other copy %v", kern, kc, waited, other)
	if waited.start.Before(kern.end) {
		t.Errorf("the copy after the event wait started %v before the recorded kernel ended",
			kern.end.Sub(waited.start))
	}
	if got := overlap(kern, other); got < op/3 {
		return fmt.Sprintf("a third stream's copy ran alongside the kernel for %v, want at least %v", got, op/3)
	}
	if got := overlap(kc, waited); got < op/3 {
		return fmt.Sprintf("the waited copy ran alongside the recorded stream's next copy for %v, want at least %v: "+
			"the wait held the recorded stream", got, op/3)
	}
	return ""
}

// Short copies keep their emulated time while a kernel's workers hold
// every P: a copy that slept would wait for the scheduler to preempt a
// worker (10 ms or more) before it could finish, ten times its length.
//
// Load stretches every copy, kernel or not, so the bound is relative to
// the same copies timed alone just before (a baseline), and the check is
// tried up to three times.
func TestShortCopiesBesideBusyKernel(t *testing.T) {
	sim.RetryTimed(t, func() string { return shortCopiesOnce(t) })
}

// shortCopiesOnce is one try of TestShortCopiesBesideBusyKernel.
func shortCopiesOnce(t *testing.T) string {
	const (
		bw     = 100e6
		n      = 50e3 // 0.5 ms at bw
		copies = 20
		spin   = 600 * time.Millisecond
	)
	workers := runtime.GOMAXPROCS(0)
	d := newSim(t, sim.Config{TotalBytes: 64 * MiB, CopyBandwidth: bw, KernelWorkers: workers})
	tl := newTimeline(t, d)
	k := get[device.Stream](t)(d.NewStream())
	defer func() { check(t, k.Close()) }()
	c := get[device.Stream](t)(d.NewStream())
	defer func() { check(t, c.Close()) }()
	p := get[device.Ptr](t)(d.Malloc(n))
	defer func() { check(t, d.Free(p)) }()
	src := make([]byte, n)
	tl.run("alone", c, func() {
		for range copies {
			check(t, d.CopyHtoD(p, src, c))
		}
	})
	check(t, c.Synchronize())
	alone := tl.get("alone")

	// Every worker signals once it spins; the copy stream starts then.
	var started sync.WaitGroup
	started.Add(workers)
	busy := make(chan struct{})
	go func() { started.Wait(); close(busy) }()
	tl.run("kernel", k, func() {
		check(t, d.LaunchFunc(k, workers, func(v device.View, lo, hi int) error {
			started.Done()
			return spinKernel(spin)(v, lo, hi)
		}))
	})
	check(t, d.LaunchFunc(c, 1, func(device.View, int, int) error { <-busy; return nil }))
	tl.run("copies", c, func() {
		for range copies {
			check(t, d.CopyHtoD(p, src, c))
		}
	})
	check(t, c.Synchronize())
	check(t, k.Synchronize())
	kern, cp := tl.get("kernel"), tl.get("copies")
	t.Logf("%d copies of %v each took %v in all beside a kernel of %d spinning workers (%v), %v alone",
		copies, time.Duration(n/bw*float64(time.Second)), cp, workers, kern, alone)
	if min := time.Duration(copies * n / bw * float64(time.Second)); cp.end.Sub(cp.start) < min {
		t.Errorf("the copies took %v, less than their emulated %v", cp, min)
	}
	// 20 copies that each waited for the scheduler took 200–400 ms; spun
	// they take 10 ms. The bound: 150 ms, or four times the same copies
	// alone when load made those slow (a semantic check, not a speed goal).
	limit := max(150*time.Millisecond, 4*alone.end.Sub(alone.start))
	if cp.end.Sub(cp.start) > limit {
		return fmt.Sprintf("the copies took %v (%v alone), want under %v: short copies wait for the scheduler", cp, alone, limit)
	}
	return ""
}
