package alloc_test

// Gate figures of the allocators' placement (package internal/gate): every
// allocator of the registry replays every shared trace and two families of
// traces generated from them (package internal/tracefamily), on the
// address-only simulator with 2 MiB pages: the family of the programs'
// traces (the PyTorch runs, those with an .info.json beside them), and
// the placement family of the offline placement problems (minimalloc's),
// which online best fit cannot pack near their optimum and whose figures
// would otherwise hide the programs'. Per replay: peak reserved over peak
// live, and pages over the floor (⌈peak reserved / page⌉ less ⌈peak live
// / page⌉); per allocator over a family: their median, 95th percentile
// and maximum, how many replays are over the bound (floorBound), and
// allocations that failed. All are deterministic: the same code gives the
// same figures.

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sync"
	"testing"

	"github.com/vramkit/vram/alloc"
	"github.com/vramkit/vram/device"
	"github.com/vramkit/vram/device/sim"
	"github.com/vramkit/vram/internal/gate"
	"github.com/vramkit/vram/internal/sharedtraces"
	"github.com/vramkit/vram/internal/tracefamily"
	"github.com/vramkit/vram/trace"
)

// The gate's families: members of seeds 0 … gateFamily−1 (the placement
// family: placementFamily). Other seeds are held out (heldOutSeed on), to
// check a policy chosen with these.
const (
	gateFamily      = 512
	placementFamily = 128
	heldOutSeed     = 1 << 20
)

// outcome is one replay's figures.
type outcome struct {
	ratio     float64 // peak reserved / peak live
	overFloor int64   // pages over the floor
	overBound bool    // peak reserved past floorBound
	failed    int     // allocations refused
}

// replayOutcome replays events against the allocator newAlloc makes.
func replayOutcome(events []trace.Event, newAlloc trace.Factory) (outcome, error) {
	res, err := trace.ReplayOn(events, replaySim(events), newAlloc, trace.Options{})
	if err != nil {
		return outcome{}, err
	}
	page := sim.DefaultGranularity
	floor, bound := floorBound(res.PeakLive, page)
	return outcome{
		ratio:     res.Fragmentation(),
		overFloor: int64((res.PeakReserved+page-1)/page) - int64(floor),
		overBound: res.PeakReserved > bound,
		failed:    res.FailedAllocs,
	}, nil
}

// replayAll replays each trace against a fresh allocator of newAlloc, as
// many at once as there are processors; the outcomes are in the traces'
// order.
func replayAll(t testing.TB, traces [][]trace.Event, newAlloc trace.Factory) []outcome {
	out := make([]outcome, len(traces))
	errs := make([]error, len(traces))
	next := make(chan int)
	var wg sync.WaitGroup
	for range runtime.GOMAXPROCS(0) {
		wg.Go(func() {
			for i := range next {
				out[i], errs[i] = replayOutcome(traces[i], newAlloc)
			}
		})
	}
	for i := range traces {
		next <- i
	}
	close(next)
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("replay %d: %v", i, err)
		}
	}
	return out
}

// entryFactory makes e's allocator with its default configuration.
func entryFactory(e alloc.Entry) trace.Factory {
	return func(dev device.Device) (alloc.Allocator, error) { return e.New(dev, alloc.Configs{}) }
}

// round4 keeps a ratio's four decimals (a figure of the file).
func round4(x float64) float64 { return math.Round(x*1e4) / 1e4 }

// quantile is the nearest-rank q-quantile of sorted xs.
func quantile[T int64 | float64](xs []T, q float64) T {
	return xs[max(0, int(math.Ceil(q*float64(len(xs))))-1)]
}

// familyFigures summarizes an allocator's outcomes over a family.
func familyFigures(prefix string, outs []outcome) []gate.Figure {
	ratios := make([]float64, len(outs))
	pages := make([]int64, len(outs))
	over, failed := 0, 0
	for i, o := range outs {
		ratios[i], pages[i] = o.ratio, o.overFloor
		if o.overBound {
			over++
		}
		failed += o.failed
	}
	slices.Sort(ratios)
	slices.Sort(pages)
	fig := func(name string, v float64, unit string) gate.Figure {
		return gate.Figure{Name: prefix + name, Value: v, Unit: unit, Better: gate.Lower}
	}
	figs := []gate.Figure{
		fig("over the bound", float64(over), "replays"),
		fig("failed allocations", float64(failed), "allocations"),
	}
	for _, q := range []struct {
		name string
		q    float64
	}{{"median", 0.5}, {"p95", 0.95}, {"max", 1}} {
		figs = append(figs, fig("reserved/live "+q.name, round4(quantile(ratios, q.q)), "ratio"),
			fig("pages over the floor "+q.name, float64(quantile(pages, q.q)), "pages"))
	}
	return figs
}

// eventsOf is the members' events.
func eventsOf(members []tracefamily.Member) [][]trace.Event {
	out := make([][]trace.Event, len(members))
	for i, m := range members {
		out[i] = m.Events
	}
	return out
}

// sharedSources reads the shared traces: all of them, and split into the
// programs' (with an .info.json) and the placement problems.
func sharedSources(t testing.TB) (all, programs, placement []tracefamily.Source) {
	dir := sharedtraces.Dir(t)
	all, err := tracefamily.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range all {
		if _, err := os.Stat(filepath.Join(dir, s.Name+".info.json")); err == nil {
			programs = append(programs, s)
		} else {
			placement = append(placement, s)
		}
	}
	if len(programs) == 0 || len(placement) == 0 {
		t.Fatalf("%d program traces and %d placement problems in %s; want some of each", len(programs), len(placement), dir)
	}
	return all, programs, placement
}

// TestGateReplays: every allocator of the registry on every shared trace
// and on the two families (figures above).
func TestGateReplays(t *testing.T) {
	gate.Need(t)
	all, programs, placement := sharedSources(t)
	var shared [][]trace.Event
	for _, s := range all {
		shared = append(shared, s.Events)
	}
	fam, plc := tracefamily.Family(programs, 0, gateFamily), tracefamily.Family(placement, 0, placementFamily)
	t.Logf("%d shared traces; the family: %s; the placement family: %s", len(shared), tracefamily.Describe(fam), tracefamily.Describe(plc))
	var figs []gate.Figure
	for _, e := range alloc.Allocators() {
		for i, o := range replayAll(t, shared, entryFactory(e)) {
			name := fmt.Sprintf("replay/%s/%s: ", all[i].Name, e.Name)
			figs = append(figs,
				gate.Figure{Name: name + "reserved/live", Value: round4(o.ratio), Unit: "ratio", Better: gate.Lower},
				gate.Figure{Name: name + "pages over the floor", Value: float64(o.overFloor), Unit: "pages", Better: gate.Lower})
		}
		figs = append(figs, familyFigures(fmt.Sprintf("family/%s: ", e.Name), replayAll(t, eventsOf(fam), entryFactory(e)))...)
		figs = append(figs, familyFigures(fmt.Sprintf("placement family/%s: ", e.Name), replayAll(t, eventsOf(plc), entryFactory(e)))...)
	}
	gate.Record(t, figs...)
}
