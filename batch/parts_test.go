package batch_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vramkit/vram"
	"github.com/vramkit/vram/batch"
	"github.com/vramkit/vram/device/sim"
)

// multiParts makes a fixture per device config and the parts of one
// batch over them, every part with fs[0]'s host arrays.
func multiParts(t *testing.T, runs int, mods ...func(*sim.Config)) ([]*batchFixture, []batch.Part, *vram.HostArray) {
	t.Helper()
	var fs []*batchFixture
	for _, mod := range mods {
		fs = append(fs, newBatchFixture(t, runs, 2, mod))
	}
	in, table, out := fs[0].hosts(t, vram.Pinned)
	var parts []batch.Part
	for _, f := range fs {
		f.use(t, in, table, out)
		parts = append(parts, batch.Part{Batch: f.b, Compute: f.compute})
	}
	return fs, parts, out
}

func size(n uint64) func(*sim.Config) { return func(c *sim.Config) { c.TotalBytes = n } }

// Devices of different sizes, one holding the whole batch: every result
// right, every chunk done once, each device some, progress counting the
// batch's chunks.
func TestRunPartsSizes(t *testing.T) {
	const runs = 200_000
	fs, parts, out := multiParts(t, runs, size(1<<20), size(2<<20), size(8<<20))
	if fs[2].plan().Chunks != 1 {
		t.Fatalf("the 8 MiB device's plan has %d chunks; the test wants it to hold the batch whole", fs[2].plan().Chunks)
	}
	var seen []int
	rep, err := batch.RunParts(context.Background(), parts, batch.Options{Progress: func(p batch.Progress) { seen = append(seen, p.Chunk) }})
	if err != nil {
		t.Fatal(err)
	}
	took, ran := 0, 0
	for i, p := range rep.Parts {
		took += p.Chunks
		ran += p.Runs
		if p.ChunksDone != p.Chunks {
			t.Errorf("device %d took %d chunks and did %d", i, p.Chunks, p.ChunksDone)
		}
		if plan := fs[i].plan(); plan.Chunks > 1 && p.ChunkLength > plan.ChunkLength {
			t.Errorf("device %d cut chunks of %d runs, longer than its plan's %d", i, p.ChunkLength, plan.ChunkLength)
		}
	}
	if ran != runs {
		t.Errorf("the devices ran %d runs of %d", ran, runs)
	}
	if took != rep.Chunks || rep.ChunksDone != rep.Chunks || len(seen) != rep.Chunks || seen[len(seen)-1] != rep.Chunks {
		t.Errorf("parts took %d chunks, did %d, progress %v; want each of %d once", took, rep.ChunksDone, seen, rep.Chunks)
	}
	if bad := fs[0].checkOut(out.Float32s(), runs); bad != 0 {
		t.Fatalf("%d wrong results", bad)
	}
	if want := uint64(2 * runs * 4); rep.BytesOut != want {
		t.Errorf("bytes out %d; want %d", rep.BytesOut, want)
	}
	t.Logf("chunks per device: %d, %d, %d", rep.Parts[0].Chunks, rep.Parts[1].Chunks, rep.Parts[2].Chunks)
}

// waitFor is a compute step that first waits until open is closed (or
// the batch stops): a device held back so that the test, not the
// scheduler, says which device takes chunks when.
func waitFor(open <-chan struct{}, compute batch.Compute) batch.Compute {
	return func(ctx context.Context, ch *batch.Chunk) error {
		select {
		case <-open:
		case <-ctx.Done():
			return ctx.Err()
		}
		return compute(ctx, ch)
	}
}

// after is a compute step that closes open once it has run n chunks.
func after(n int, open chan struct{}, compute batch.Compute) batch.Compute {
	var mu sync.Mutex
	ran := 0
	return func(ctx context.Context, ch *batch.Chunk) error {
		mu.Lock()
		if ran++; ran == n {
			close(open)
		}
		mu.Unlock()
		return compute(ctx, ch)
	}
}

// Each device cuts at its own length: a device that holds the batch
// whole is not held to a small device's plan. The small device computes
// nothing until the large one has started its fifth chunk, so no rate of
// the small one is known meanwhile (it counts at the large one's) and
// the large one's chunks double from its probe (⌈R/128⌉ runs, at most
// twice its longest chunk each time, parts.go): its fourth is 8 probes,
// longer than the small device's plan of under an eighth of the runs.
// Which device is faster by the clock decides nothing here.
func TestRunPartsOwnLengths(t *testing.T) {
	const runs = 200_000
	fs, parts, out := multiParts(t, runs, size(256<<10), size(8<<20))
	small := fs[0].plan().ChunkLength
	if fs[1].plan().Chunks != 1 || 8*small > runs {
		t.Fatalf("plans of %d and %d chunks (the small one's of %d runs); the test wants the large device to hold the batch whole, the small one under an eighth of it",
			fs[0].plan().Chunks, fs[1].plan().Chunks, small)
	}
	largeStarted := make(chan struct{})
	parts[0].Compute = waitFor(largeStarted, parts[0].Compute)
	parts[1].Compute = after(5, largeStarted, parts[1].Compute)
	// Two buffers, as allocated: the plans' lengths stand (with one
	// chosen, a device would plan again, longer).
	rep, err := batch.RunParts(context.Background(), parts, batch.Options{Buffers: 2})
	if err != nil {
		t.Fatal(err)
	}
	if bad := fs[0].checkOut(out.Float32s(), runs); bad != 0 {
		t.Fatalf("%d wrong results", bad)
	}
	if s := rep.Parts[0].ChunkLength; s > small {
		t.Errorf("the small device cut chunks of %d runs, longer than its plan's %d", s, small)
	}
	if long := rep.Parts[1].ChunkLength; long <= small {
		t.Errorf("the large device cut chunks of at most %d runs, no longer than the small device's plan of %d", long, small)
	}
}

// A device held back takes no chunk while it is held: the other takes
// every chunk it asks for meanwhile, and the batch still runs every run
// once. The second device's kernels wait until the first device has run
// eight chunks (the test says which device is slow, not a measurement);
// TestRunQueueDeals shows the dealing itself: chunks go to whichever part
// asks.
func TestRunPartsSlowDevice(t *testing.T) {
	const runs = 200_000
	// 256 KiB devices: about 28 chunks of their plans' length.
	fs, parts, out := multiParts(t, runs, size(256<<10), size(256<<10))
	fastDone := make(chan struct{})
	parts[0].Compute = after(8, fastDone, parts[0].Compute)
	parts[1].Compute = waitFor(fastDone, parts[1].Compute)
	rep, err := batch.RunParts(context.Background(), parts, batch.Options{Buffers: 2})
	if err != nil {
		t.Fatal(err)
	}
	if bad := fs[0].checkOut(out.Float32s(), runs); bad != 0 {
		t.Fatalf("%d wrong results", bad)
	}
	fast, slow := rep.Parts[0].Chunks, rep.Parts[1].Chunks
	if fast+slow != rep.Chunks || fast < 8 || rep.Parts[0].Runs+rep.Parts[1].Runs != runs {
		t.Errorf("the devices took %d and %d chunks of %d, %d and %d runs of %d; want them to add up, the first device 8 chunks or more",
			fast, slow, rep.Chunks, rep.Parts[0].Runs, rep.Parts[1].Runs, runs)
	}
}

// TestRunQueueDeals: a queue shared by two parts hands every run out
// once, in order, in chunks of at most the asker's limit and ⌈left/4⌉,
// to whichever part asks: one that asks twenty times as often (a device
// twenty times as fast) takes most of the chunks.
func TestRunQueueDeals(t *testing.T) {
	const runs, limit = 200_000, 7_000
	q := batch.NewRunQueue(runs, 2)
	next, took := 0, [2]int{}
	for ask := 0; ; ask++ {
		part := 0
		if ask%21 == 20 {
			part = 1
		}
		start, n, ok := q.Take(part, limit)
		if !ok {
			break
		}
		left := runs - next
		if start != next || n < 1 || n > limit || n > (left+3)/4 {
			t.Fatalf("take %d by part %d: runs %d+%d with %d left from %d; want the next runs, at most %d and ⌈left/4⌉", ask, part, start, n, left, next, limit)
		}
		next += n
		took[part]++
	}
	if next != runs || took[0] <= 10*took[1] {
		t.Errorf("handed out %d runs of %d; chunks %d and %d: want every run, the part asking twenty times as often taking over ten times the chunks", next, runs, took[0], took[1])
	}
}

// A part that fails stops the batch: its error, naming the device, is
// returned, and every part cleans up. Parts that do not declare the same
// batch are refused.
func TestRunPartsFailure(t *testing.T) {
	const runs = 200_000
	fs, parts, _ := multiParts(t, runs, size(1<<20), size(1<<20))
	boom := errors.New("boom")
	// Device 0 waits in its first chunk until device 1 has one, so that
	// device 0 cannot take every chunk before device 1 is set up (it did,
	// on a quiet machine).
	started := make(chan struct{})
	var once sync.Once
	failing := []batch.Part{
		{Batch: parts[0].Batch, Compute: func(ctx context.Context, ch *batch.Chunk) error {
			select {
			case <-started:
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(20 * time.Second):
			}
			return fs[0].compute(ctx, ch)
		}},
		{Batch: parts[1].Batch, Compute: func(context.Context, *batch.Chunk) error {
			once.Do(func() { close(started) })
			return boom
		}},
	}
	if _, err := batch.RunParts(context.Background(), failing, batch.Options{}); !errors.Is(err, boom) || !strings.Contains(err.Error(), "device 1") {
		t.Fatalf("err %v; want boom from device 1", err)
	}
	other := newBatchFixture(t, runs+1, 2, size(1<<20)) // another batch: its runs differ
	other.use(t, fs[0].in.Host(), fs[0].table.Host(), nil)
	pageable := newBatchFixture(t, runs, 2, size(1<<20))
	pageable.hosts(t, vram.Pageable) // the same arrays, other host arrays
	tests := map[string]struct {
		parts []batch.Part
		want  string
	}{
		"no parts":         {nil, "no parts"},
		"other runs":       {[]batch.Part{parts[0], {Batch: other.b, Compute: other.compute}}, "is not part 0's"},
		"other host sides": {[]batch.Part{parts[0], {Batch: pageable.b, Compute: pageable.compute}}, "another host side than part 0's"},
		"not allocated":    {[]batch.Part{parts[0], {Batch: batch.New(), Compute: fs[1].compute}}, "part 1: the batch is not allocated"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if _, err := batch.RunParts(context.Background(), tc.parts, batch.Options{}); !errors.Is(err, batch.ErrBatch) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v; want ErrBatch saying %q", err, tc.want)
			}
		})
	}
}

// Devices that hold the batch whole share it when MaxChunkLength cuts
// it, with full-length host arrays (whose chunk axes the requests state)
// and with fill and drain functions: every result right.
func TestRunPartsMaxChunkLength(t *testing.T) {
	const runs = 20_000 // 320 KB of chunked arrays: whole on 8 MiB
	for _, sides := range []string{"host arrays", "functions"} {
		t.Run(sides, func(t *testing.T) {
			fs, parts, out := multiParts(t, runs, size(8<<20), size(8<<20))
			if sides == "functions" {
				in := fs[0].in.Host()
				fill := batch.Fill(func(sp vram.Span, st *vram.HostArray) error { return st.CopyChunkFrom(in, sp) })
				drain := batch.Drain(func(sp vram.Span, st *vram.HostArray) error { return st.CopyChunkTo(out, sp) })
				for _, f := range fs {
					must(t, f.in.Use(fill))
					must(t, f.out.Use(drain))
				}
			}
			rep, err := batch.RunParts(context.Background(), parts, batch.Options{MaxChunkLength: 1000})
			if err != nil {
				t.Fatal(err)
			}
			// At most 1000 runs a chunk: 20 at least, more as the queue's
			// last chunks shrink so that the devices finish together.
			p0, p1 := rep.Parts[0], rep.Parts[1]
			if rep.Chunks < 20 || p0.ChunkLength > 1000 || p1.ChunkLength > 1000 || p0.Chunks+p1.Chunks != rep.Chunks || p0.Runs+p1.Runs != runs {
				t.Errorf("report: %d chunks, parts took %d (%d runs, cut at %d) and %d (%d, %d); want 20 or more of at most 1000 runs, every run once",
					rep.Chunks, p0.Chunks, p0.Runs, p0.ChunkLength, p1.Chunks, p1.Runs, p1.ChunkLength)
			}
			if bad := fs[0].checkOut(out.Float32s(), runs); bad != 0 {
				t.Fatalf("%d wrong results", bad)
			}
			if _, err := batch.RunParts(context.Background(), parts, batch.Options{MaxChunkLength: -1}); !errors.Is(err, batch.ErrBatch) {
				t.Errorf("MaxChunkLength -1: %v; want ErrBatch", err)
			}
		})
	}
}

// A batch whose context is cancelled part-way stops on every device:
// the error wraps ctx's, the chunks done are counted, and every device is
// left clean (the fixtures' clean-up checks for leaks).
func TestRunPartsCancel(t *testing.T) {
	const runs = 200_000
	slow := func(c *sim.Config) { c.TotalBytes, c.KernelTime = 256<<10, 2*time.Microsecond }
	_, parts, _ := multiParts(t, runs, slow, slow)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	rep, err := batch.RunParts(ctx, parts, batch.Options{Progress: func(p batch.Progress) {
		if p.Chunk == 3 {
			cancel()
		}
	}})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err %v; want one wrapping context.Canceled", err)
	}
	if rep.ChunksDone < 3 || rep.ChunksDone >= rep.Chunks {
		t.Errorf("%d of %d chunks done; want the batch stopped after the third", rep.ChunksDone, rep.Chunks)
	}
}
