package batch_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vramkit/vram"
	"github.com/vramkit/vram/account"
	"github.com/vramkit/vram/batch"
	"github.com/vramkit/vram/device/sim"
	"github.com/vramkit/vram/internal/simtest"
	"github.com/vramkit/vram/kernel"
)

// elasticFixture is a batch of runs float32 inputs x and outputs y =
// 3x+1 (8 bytes a run on the device), under a manager cap that holds
// chunkRuns runs of both, so that the batch takes runs/chunkRuns chunks;
// its compute step counts how often each run is computed.
type elasticFixture struct {
	m      *vram.Manager
	dev    *sim.Device
	c      *vram.Client
	b      *batch.Batch
	x, y   *batch.Array
	hx, hy *vram.HostArray
	k      *kernel.Kernel
	runs   int
	cap    uint64
	seen   []int // per run: times computed (Run's goroutine)
}

func newElastic(t *testing.T, runs, chunkRuns int) *elasticFixture {
	t.Helper()
	dev := simtest.New(t, 64<<20, func(c *sim.Config) { c.Granularity = 4 << 10 })
	capBytes := uint64(8 * chunkRuns)
	m, err := vram.New(dev, vram.WithAllocatorChoice(account.Choice{Kind: vram.Pool}), vram.WithCap(capBytes), vram.WithLogger(slog.New(slog.DiscardHandler)))
	must(t, err)
	t.Cleanup(func() { m.Close() })
	c, err := m.Register(vram.ClientOptions{Name: "elastic", Group: "e"})
	must(t, err)
	f := &elasticFixture{m: m, dev: dev, c: c, b: batch.New(), runs: runs, cap: capBytes, seen: make([]int, runs)}
	f.x = f.b.In(c, "x", vram.ArrayRequest{Shape: []int{runs}, DType: vram.Float32})
	f.y = f.b.Out(c, "y", vram.ArrayRequest{Shape: []int{runs}, DType: vram.Float32})
	must(t, f.b.Allocate(context.Background()))
	t.Cleanup(func() { f.b.Close() })
	xs := make([]float32, runs)
	for i := range xs {
		xs[i] = float32(i%8191) * 0.5
	}
	f.hx, err = m.NewHostArray([]int{runs}, vram.Float32, vram.Pinned, xs)
	must(t, err)
	f.hy, err = m.NewHostArray([]int{runs}, vram.Float32, vram.Pinned, nil)
	must(t, err)
	t.Cleanup(func() { f.hx.Free(); f.hy.Free() })
	must(t, f.x.Use(batch.Host(f.hx)))
	must(t, f.y.Use(batch.Host(f.hy)))
	f.k = affineKernel(t)
	return f
}

// affineKernel is y = 3x + 1 over float32 arrays x and y, on the host.
func affineKernel(t *testing.T) *kernel.Kernel {
	t.Helper()
	k, err := kernel.New("affine", "", func(a kernel.Args, lo, hi int) error {
		x, y := a.Float32s(0), a.Float32s(1)
		for i := lo; i < hi; i++ {
			y[i] = 3*x[i] + 1
		}
		return nil
	}, 0)
	must(t, err)
	return k
}

// compute launches the kernel over ch, first calling at (nil: nothing)
// with the chunk, and counts its runs.
func (f *elasticFixture) compute(at func(ch *batch.Chunk)) batch.Compute {
	return func(_ context.Context, ch *batch.Chunk) error {
		if at != nil {
			at(ch)
		}
		for i := ch.Start; i < ch.Start+ch.Len; i++ {
			f.seen[i]++
		}
		return ch.Launch(f.k, f.x, f.y)
	}
}

// unbroken is y of the same batch run on a manager of its own at one
// length: what every elastic run must write, byte for byte.
func unbroken(t *testing.T, runs, chunkRuns int) []byte {
	t.Helper()
	g := newElastic(t, runs, chunkRuns)
	if _, err := g.b.Run(context.Background(), batch.Options{Buffers: 1}, g.compute(nil)); err != nil {
		t.Fatal(err)
	}
	return bytes.Clone(g.hy.Data())
}

// checkOnce checks that every run was computed exactly once and y is
// want.
func (f *elasticFixture) checkOnce(t *testing.T, want []byte) {
	t.Helper()
	for i, n := range f.seen {
		if n != 1 {
			t.Fatalf("run %d computed %d times; want every run once", i, n)
		}
	}
	if !bytes.Equal(f.hy.Data(), want) {
		t.Fatal("results differ from the unbroken batch's")
	}
}

// TestElasticCapChanges lowers the manager's cap twice and raises it
// once during a batch of 1,000 chunks: every run is done once, the
// results are byte for byte the unbroken batch's, and the report lists
// the three changes, each from the length before to the one the cap
// allows, with the cap's reason.
func TestElasticCapChanges(t *testing.T) {
	const chunkRuns, runs = 1024, 1000 * 1024
	want := unbroken(t, runs, chunkRuns)
	for _, buffers := range []int{1, 2} {
		t.Run(fmt.Sprintf("%d buffers", buffers), func(t *testing.T) {
			f := newElastic(t, runs, chunkRuns)
			if p := f.b.Plan(); p.Chunks < 990 {
				t.Fatalf("plan of %d chunks; the test wants 1,000", p.Chunks)
			}
			caps := map[int]uint64{250 * chunkRuns: f.cap / 2, 500 * chunkRuns: f.cap / 4, 700 * chunkRuns: f.cap}
			rep, err := f.b.Run(context.Background(), batch.Options{Buffers: buffers, Grow: true}, f.compute(func(ch *batch.Chunk) {
				for at, c := range caps {
					if ch.Start <= at && at < ch.Start+ch.Len {
						must(t, f.m.Account().SetCap(c))
					}
				}
			}))
			if err != nil {
				t.Fatal(err)
			}
			f.checkOnce(t, want)
			if len(rep.Recuts) != 3 {
				t.Fatalf("%d re-cuts %+v; want the three changes", len(rep.Recuts), rep.Recuts)
			}
			l0 := f.b.Plan().ChunkLength // after the raise: the length the full cap allows
			for i, c := range rep.Recuts {
				t.Logf("re-cut %d at chunk %d: %d → %d runs, %d buffers: %s", i, c.Chunk, c.From, c.To, c.Buffers, c.Why)
				if !strings.Contains(c.Why, "SetCap") || c.At <= 0 || c.Buffers != buffers {
					t.Errorf("re-cut %d %+v: want the cap's reason, a time and %d buffers", i, c, buffers)
				}
			}
			r0, r1, r2 := rep.Recuts[0], rep.Recuts[1], rep.Recuts[2]
			if !(r0.To < r0.From && r1.From == r0.To && r1.To < r1.From && r2.From == r1.To && r2.To > r2.From && r2.To == l0) {
				t.Errorf("lengths %d→%d, %d→%d, %d→%d: want two shrinks then a grow back to %d", r0.From, r0.To, r1.From, r1.To, r2.From, r2.To, l0)
			}
			if rep.ChunksDone != rep.Chunks || rep.Runs != runs {
				t.Errorf("report %d of %d chunks, %d runs; want all of %d", rep.ChunksDone, rep.Chunks, rep.Runs, runs)
			}
			if capBytes, used := f.m.Account().Cap(); used > capBytes {
				t.Errorf("%d bytes charged under a cap of %d", used, capBytes)
			}
		})
	}
}

// TestElasticConcurrentChanges changes the cap from another goroutine at
// random moments (the batch re-plans at its next chunk boundary), and in
// one case cancels the batch at a random chunk: every run done is done
// once and right, and once the batch is closed nothing is left on the
// device, in the allocator or in the staging pool. Run it under -race.
func TestElasticConcurrentChanges(t *testing.T) {
	const chunkRuns, runs = 1024, 1000 * 1024
	want := unbroken(t, runs, chunkRuns)
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	for _, cancelAt := range []bool{false, true} {
		t.Run(fmt.Sprintf("cancel=%v", cancelAt), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, uint64(len(t.Name()))))
			f := newElastic(t, runs, chunkRuns)
			chunks := f.b.Plan().Chunks
			stopAt := rng.IntN(chunks-2) + 1
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			done := make(chan int, chunks+8)
			var wg sync.WaitGroup
			changer := rand.New(rand.NewPCG(rng.Uint64(), rng.Uint64()))
			buffers := 1 + rng.IntN(2)
			wg.Go(func() { f.changeCaps(t, ctx, changer, done) })
			rep, err := f.b.Run(ctx, batch.Options{Buffers: buffers, Grow: true, Progress: func(p batch.Progress) {
				select {
				case done <- p.Chunk:
				default:
				}
				if cancelAt && p.Chunk == stopAt {
					cancel()
				}
			}}, f.compute(nil))
			cancel()
			wg.Wait()
			t.Logf("%d chunks, %d done, %d re-cuts", rep.Chunks, rep.ChunksDone, len(rep.Recuts))
			switch {
			case cancelAt:
				if !errors.Is(err, context.Canceled) || rep.Runs >= runs || rep.ChunksDone < stopAt {
					t.Fatalf("cancelled at chunk %d: %v, %d runs done; want context.Canceled, %d chunks done at least, not every run", stopAt, err, rep.Runs, stopAt)
				}
				for i := range rep.Runs {
					if f.seen[i] != 1 {
						t.Fatalf("run %d computed %d times", i, f.seen[i])
					}
				}
				if got := f.hy.Data()[:4*rep.Runs]; !bytes.Equal(got, want[:4*rep.Runs]) {
					t.Fatal("the runs done differ from the unbroken batch's")
				}
			case err != nil:
				t.Fatal(err)
			default:
				f.checkOnce(t, want)
			}
			must(t, f.b.Close())
			must(t, f.m.Host().Staging().Trim())
			if _, st := f.m.Account().Stats(); st.InUse != 0 {
				t.Errorf("allocator stats %+v after Close; want nothing in use", st)
			}
			if _, used := f.m.Account().Cap(); used != 0 {
				t.Errorf("%d bytes charged to the cap after Close", used)
			}
			if s := f.m.Host().Staging().Stats(); s.InUse != 0 || s.Buffers != 0 {
				t.Errorf("staging pool %+v after the batch; want nothing", s)
			}
		})
	}
}

// changeCaps sets the cap to random sizes, from a sixteenth of the
// fixture's up to all of it, each after a random count of chunks done,
// until ctx is done; it ends with the full cap.
func (f *elasticFixture) changeCaps(t *testing.T, ctx context.Context, rng *rand.Rand, done <-chan int) {
	defer func() { must(t, f.m.Account().SetCap(f.cap)) }()
	next := 1 + rng.IntN(100)
	for {
		select {
		case <-ctx.Done():
			return
		case n := <-done:
			if n < next {
				continue
			}
			c := f.cap/16 + uint64(rng.Int64N(int64(f.cap-f.cap/16)))
			if err := f.m.Account().SetCap(c); err != nil {
				t.Error(err)
				return
			}
			next = n + 1 + rng.IntN(100)
		}
	}
}

// TestElasticClaim: a group that cannot allocate beside a running batch
// claims memory back; the batch gives it at its next chunk boundary
// (a re-cut to shorter chunks, the claim's reason in its report), the
// claimant allocates, and the batch's results are the unbroken batch's.
func TestElasticClaim(t *testing.T) {
	const runs, cut = 4 << 20, 200_000 // 32 MiB of arrays on 64 MiB, in 21 chunks
	want := unbroken(t, runs, runs)
	f := newElastic(t, runs, runs)
	must(t, f.m.Account().SetCap(0)) // the device alone bounds it
	other, err := f.m.Register(vram.ClientOptions{Name: "other", Group: "other"})
	must(t, err)
	// 48 MiB, whole: more than the 32 MiB the batch leaves free.
	must(t, other.Queue(map[string]vram.ArrayRequest{"big": {Shape: []int{12 << 20}, DType: vram.Float32, Unchunkable: true}}))
	claimed, got := make(chan error, 1), make(chan error, 1)
	var once sync.Once
	rep, err := f.b.Run(context.Background(), batch.Options{Buffers: 1, MaxChunkLength: cut}, f.compute(func(ch *batch.Chunk) {
		if ch.Index != 3 {
			return
		}
		once.Do(func() {
			seq := f.m.Account().LastChange().Seq
			_, err := other.Allocate(context.Background())
			claimed <- err
			go func() { got <- f.allocateOnceGiven(other, seq) }()
		})
	}))
	if err != nil {
		t.Fatal(err)
	}
	if cerr := <-claimed; cerr == nil || !strings.Contains(cerr.Error(), "claims") {
		t.Fatalf("the other group's first Allocate: %v; want a failure that claims memory back", cerr)
	}
	if err := <-got; err != nil {
		t.Fatalf("the claimant's Allocate once the batch gave memory back: %v", err)
	}
	f.checkOnce(t, want)
	shrunk := false
	for _, c := range rep.Recuts {
		t.Logf("re-cut at chunk %d: %d → %d runs, arrays %d → %d: %s", c.Chunk, c.From, c.To, c.ArraysFrom, c.ArraysTo, c.Why)
		shrunk = shrunk || (c.ArraysTo < c.ArraysFrom && strings.Contains(c.Why, "claims"))
	}
	if !shrunk {
		t.Errorf("re-cuts %+v: want one to shorter arrays for the claim", rep.Recuts)
	}
}

// allocateOnceGiven waits for a budget change after seq that says a group
// gave memory back, then allocates c's group.
func (f *elasticFixture) allocateOnceGiven(c *vram.Client, seq uint64) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for {
		bc, err := f.m.Account().WaitChange(ctx, seq)
		if err != nil {
			return err
		}
		if seq = bc.Seq; strings.Contains(bc.Why, "gave") {
			_, err := c.Allocate(ctx)
			return err
		}
	}
}

// TestWriteBehind: a chunk's outputs are drained while later chunks
// compute: the drain of a chunk after the first waits until the compute
// step of the chunk two after it (or of the last) has been called, which
// a run that drained each chunk before going on would never reach. The
// first, the probe's, takes 200 ms (a slow disk): hiding such writes is
// worth more than pinning the slots behind the device takes. The report
// counts the writer's time.
func TestWriteBehind(t *testing.T) {
	f := newBatchFixture(t, 200_000, 1)
	_, _, out := f.hosts(t, vram.Pinned)
	var mu sync.Mutex
	gates := map[int]chan struct{}{}
	index := map[int]int{} // chunk start → index
	gate := func(i int) chan struct{} {
		mu.Lock()
		defer mu.Unlock()
		if gates[i] == nil {
			gates[i] = make(chan struct{})
		}
		return gates[i]
	}
	last := make(chan struct{})
	drained := 0
	must(t, f.out.Use(batch.Drain(func(sp vram.Span, st *vram.HostArray) error {
		mu.Lock()
		i := index[sp.Start]
		mu.Unlock()
		if i == 0 { // the first runs alone: the run's probe
			time.Sleep(200 * time.Millisecond)
		} else {
			select {
			case <-gate(i + 2):
			case <-last:
			case <-time.After(20 * time.Second):
				return fmt.Errorf("chunk %d drained, but chunk %d never computed: the drains do not run behind the device", i, i+2)
			}
		}
		drained++
		return st.CopyChunkTo(out, sp)
	})))
	rep, err := f.b.Run(context.Background(), batch.Options{Buffers: 1}, func(ctx context.Context, ch *batch.Chunk) error {
		mu.Lock()
		index[ch.Start] = ch.Index
		mu.Unlock()
		close(gate(ch.Index))
		if ch.Start+ch.Len == f.runs {
			close(last)
		}
		return f.compute(ctx, ch)
	})
	if err != nil {
		t.Fatal(err)
	}
	if bad := f.checkOut(out.Float32s(), f.runs); bad != 0 || drained != rep.Chunks || rep.Chunks < 4 || rep.Write <= 0 {
		t.Fatalf("%d wrong results, %d drains of %d chunks, write time %v: want every result right, each of 4 or more chunks drained, the time counted",
			bad, drained, rep.Chunks, rep.Write)
	}
}

// TestRunChoosesBuffers: with no count given, a run chooses its buffers
// from what its first chunk cost, and says why with the figures it
// measured: whatever the machine's load made of them, the choice is the
// one its own figures call for (checkChoices). Which figures call for
// which shape is TestChoose's, on figures worked out by hand.
func TestRunChoosesBuffers(t *testing.T) {
	tests := map[string]func(*sim.Config){
		// About 800 KB a chunk each way at 100 MB/s, and 8 ms of
		// kernel: copies as long as compute.
		"copies as long as compute": func(c *sim.Config) { c.CopyBandwidth, c.KernelTime = 100e6, 160*time.Nanosecond },
		// Copies at memory speed beside 10 µs a run of kernel.
		"copies next to nothing": func(c *sim.Config) { c.KernelTime = 10 * time.Microsecond },
	}
	for name, mod := range tests {
		t.Run(name, func(t *testing.T) {
			f := newBatchFixture(t, 200_000, 1, mod)
			_, _, out := f.hosts(t, vram.Pinned)
			rep, err := f.b.Run(context.Background(), batch.Options{}, f.compute)
			if err != nil {
				t.Fatal(err)
			}
			if bad := f.checkOut(out.Float32s(), f.runs); bad != 0 {
				t.Fatalf("%d wrong results", bad)
			}
			if rep.Buffers < 1 || rep.Buffers > batch.MaxBuffers {
				t.Errorf("%d buffers in flight", rep.Buffers)
			}
			if n := checkChoices(t, rep); n < 1 {
				t.Errorf("the run made no choice it says why: %q", rep.BufferChoice)
			}
		})
	}
}

// TestSecondLook: a run whose staging holds one output slot at full
// length, and whose first chunk drained at once (an empty page cache)
// while the later ones take as long as their kernels, looks at its shape
// again once four chunks after the probe are drained, with their fills
// and writes, and each choice it makes is the one its figures call for
// (checkChoices; what the figures call for is TestChoose's).
func TestSecondLook(t *testing.T) {
	const runs = 800_000 // 16 chunks
	p := probeStaging(t, runs, 1, vram.Pinned)
	outChunk := p.chunk - p.in
	f := newFixture(t, runs, 1, fixtureOpts{host: vram.HostOptions{Limit: p.ram + outChunk + outChunk/2},
		sim: []func(*sim.Config){func(c *sim.Config) { c.KernelTime = 3 * time.Microsecond }}})
	_, _, out := f.hosts(t, vram.Pinned)
	first := true
	must(t, f.out.Use(batch.Drain(func(sp vram.Span, st *vram.HostArray) error {
		if !first {
			time.Sleep(time.Duration(sp.Len) * 3 * time.Microsecond)
		}
		first = false
		return st.CopyChunkTo(out, sp)
	})))
	rep, err := f.b.Run(context.Background(), batch.Options{Buffers: 1}, f.compute)
	if err != nil {
		t.Fatal(err)
	}
	if bad := f.checkOut(out.Float32s(), runs); bad != 0 {
		t.Fatalf("%d wrong results", bad)
	}
	for _, c := range rep.Recuts {
		t.Logf("re-cut at chunk %d: %d → %d: %s", c.Chunk, c.From, c.To, c.Why)
	}
	if n := checkChoices(t, rep); n < 2 || !strings.Contains(rep.BufferChoice, "; after ") {
		t.Errorf("choices %q: want the probe's, and a look after later chunks", rep.BufferChoice)
	}
}

// TestLookReverts: a change the probe's model predicts to pay is
// measured once four chunks of it are drained, and kept or undone as the
// measurement says (checkChoices). The kernel takes 30 ms a launch
// whatever its length (a sleep), and the copies a third of that over the
// link: one chunk looks like copies beside compute, so two buffers are
// predicted to pay; their chunks are half as long, twice as many kernels
// of 30 ms, so a run costs half as much again as with one, and the look
// measures it — on a loaded machine the figures may differ, and the
// decisions follow them.
func TestLookReverts(t *testing.T) {
	k, err := kernel.New("fixed", "", func(a kernel.Args, lo, hi int) error {
		if lo == 0 {
			time.Sleep(30 * time.Millisecond)
		}
		in, out, tab, ld := a.Float32s(0), a.Float32s(1), a.Float32s(2), a.Shape(0)[1]
		for i := lo; i < hi; i++ {
			for r := range 2 {
				out[r*ld+i] = in[r*ld+i]*tab[0] + tab[1]
			}
		}
		return nil
	}, 0)
	must(t, err)
	// 1,600,000 runs on 1 MiB: 32 chunks of 50,000 runs, 800 KB each
	// way a chunk: 10 ms at 160 MB/s.
	f := newBatchFixture(t, 1_600_000, 1, func(c *sim.Config) { c.CopyBandwidth = 160e6 })
	_, _, out := f.hosts(t, vram.Pinned)
	rep, err := f.b.Run(context.Background(), batch.Options{}, func(_ context.Context, ch *batch.Chunk) error {
		return ch.Launch(k, f.in, f.out, f.table)
	})
	if err != nil {
		t.Fatal(err)
	}
	if bad := f.checkOut(out.Float32s(), f.runs); bad != 0 {
		t.Fatalf("%d wrong results", bad)
	}
	checkChoices(t, rep)
	changed := strings.HasPrefix(rep.BufferChoice, "chose")
	measured := strings.Contains(rep.BufferChoice, "s per 100,000 runs measured")
	if changed != measured {
		t.Errorf("choices %q: want a change the probe made measured by a look, and nothing measured without one", rep.BufferChoice)
	}
	if reverted := strings.Contains(rep.BufferChoice, "back to"); reverted && (len(rep.Recuts) < 2 || rep.Recuts[len(rep.Recuts)-1].Buffers != 1) {
		t.Errorf("undone, but the re-cuts %+v do not end back at one buffer", rep.Recuts)
	}
}

// Decisions as a run's report words them (choose.go, look.go).
var (
	// "chose S: …; for the R runs left it predicts B s, instead of A s with S0"
	choseRe = regexp.MustCompile(`chose [^:]*:.*?it predicts ([0-9.e+-]+) s, instead of ([0-9.e+-]+) s`)
	// "kept S: …; for the R runs left it predicts A s, the best other (S2) B s, not 3% better"
	keptRe = regexp.MustCompile(`kept [^:]*:.*?it predicts ([0-9.e+-]+) s, the best other \([^)]*\) ([0-9.e+-]+) s`)
	// "after N chunks, kept: X s per 100,000 runs measured against Y s with …"
	stayRe = regexp.MustCompile(`after \d+ chunks?, kept: ([0-9.e+-]+) s per 100,000 runs measured against ([0-9.e+-]+) s`)
	// "after N chunks, back to …: X s per 100,000 runs measured, against Y s before the change"
	backRe = regexp.MustCompile(`after \d+ chunks?, back to [^:]*: ([0-9.e+-]+) s per 100,000 runs measured, against ([0-9.e+-]+) s`)
)

// checkChoices checks that every decision rep words — the probe's and
// each look's — is the one the figures it quotes call for: a change only
// where it is predicted (or measured) to save MinGain of the time, within
// the rounding of the figures to three digits. It returns how many
// decisions it read.
func checkChoices(t testing.TB, rep batch.Report) int {
	t.Helper()
	num := func(s string) float64 {
		v, err := strconv.ParseFloat(s, 64)
		if err != nil {
			t.Fatalf("figure %q in %q: %v", s, rep.BufferChoice, err)
		}
		return v
	}
	const round = 0.01 // two figures of three digits
	n := 0
	for _, clause := range strings.Split(rep.BufferChoice, "; after ") {
		if n > 0 {
			clause = "after " + clause
		}
		n++
		switch m := [4][]string{choseRe.FindStringSubmatch(clause), keptRe.FindStringSubmatch(clause), stayRe.FindStringSubmatch(clause), backRe.FindStringSubmatch(clause)}; {
		case m[0] != nil && num(m[0][1]) > (1-batch.MinGain)*num(m[0][2])*(1+round):
			t.Errorf("%q: a change predicted to take %s s instead of %s s saves under %.0f%%", clause, m[0][1], m[0][2], 100*batch.MinGain)
		case m[1] != nil && num(m[1][2]) < (1-batch.MinGain)*num(m[1][1])*(1-round):
			t.Errorf("%q: kept, though the best other is predicted to take %s s instead of %s s", clause, m[1][2], m[1][1])
		case m[2] != nil && num(m[2][1]) > (1-batch.MinGain)*num(m[2][2])*(1+round):
			t.Errorf("%q: kept a change measured at %s s against %s s before it", clause, m[2][1], m[2][2])
		case m[3] != nil && num(m[3][1]) < (1-batch.MinGain)*num(m[3][2])*(1-round):
			t.Errorf("%q: undid a change measured at %s s against %s s before it", clause, m[3][1], m[3][2])
		}
	}
	return n
}

// errRecorder is a testing.TB that counts the errors it is given.
type errRecorder struct {
	testing.TB
	errs int
}

func (r *errRecorder) Errorf(string, ...any) { r.errs++ }

// TestCheckChoices: the checker of TestRunChoosesBuffers and the looks'
// tests finds a decision its figures do not call for.
func TestCheckChoices(t *testing.T) {
	tests := map[string]struct {
		choice    string
		decisions int
		errs      int
	}{
		"a change that pays":       {"chose 2 buffers: the first chunk took x; for the 9 runs left it predicts 0.5 s, instead of 1 s with 1 buffer", 1, 0},
		"a change that does not":   {"chose 2 buffers: the first chunk took x; for the 9 runs left it predicts 0.99 s, instead of 1 s with 1 buffer", 1, 1},
		"kept, rightly":            {"kept 1 buffer: x; for the 9 runs left it predicts 1 s, the best other (2 buffers) 0.99 s, not 3% better", 1, 0},
		"kept, wrongly":            {"kept 1 buffer: x; for the 9 runs left it predicts 1 s, the best other (2 buffers) 0.5 s, not 3% better", 1, 1},
		"measured and kept":        {"chose 2 buffers: x; it predicts 0.5 s, instead of 1 s with 1 buffer; after 5 chunks, kept: 0.5 s per 100,000 runs measured against 1 s with 1 buffer", 2, 0},
		"measured, wrongly undone": {"chose 2 buffers: x; it predicts 0.5 s, instead of 1 s with 1 buffer; after 5 chunks, back to 1 buffer: 0.5 s per 100,000 runs measured, against 1 s before the change", 2, 1},
		"measured, rightly undone": {"chose 2 buffers: x; it predicts 0.5 s, instead of 1 s with 1 buffer; after 5 chunks, back to 1 buffer: 1.5 s per 100,000 runs measured, against 1 s before the change", 2, 0},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			r := &errRecorder{TB: t}
			if n := checkChoices(r, batch.Report{BufferChoice: tc.choice}); n != tc.decisions || r.errs != tc.errs {
				t.Errorf("read %d decisions, %d errors; want %d, %d", n, r.errs, tc.decisions, tc.errs)
			}
		})
	}
}
