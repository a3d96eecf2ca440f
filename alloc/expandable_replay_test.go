package alloc_test

// Replays of the real PyTorch traces in ../shared/traces (where that
// folder is present) against Expandable, and of perturbed copies of them
// (sizes scaled, streams shuffled), which stand in for traces not seen:
// the bounds the allocator is held to must hold on all of them.

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"github.com/vramkit/vram/alloc"
	"github.com/vramkit/vram/device"
	"github.com/vramkit/vram/trace"
)

// pytorchTraces are the real PyTorch traces of ../shared/traces.
var pytorchTraces = []string{"ZidongLiu_memory", "W_medium_512_training", "bcrafton_memory_snapshot", "k_fullstep"}

// tracesDir finds ../shared/traces from the package directory, or skips.
func tracesDir(t testing.TB) string {
	for _, d := range []string{"../../shared/traces", "../shared/traces"} {
		if _, err := os.Stat(filepath.Join(d, "k_fullstep.csv")); err == nil {
			return d
		}
	}
	t.Skip("the shared PyTorch traces (../shared/traces) are not here")
	return ""
}

// pytorchInfo is the part of a trace's .info.json the bounds use.
type pytorchInfo struct {
	PeakReserved uint64 `json:"pytorch_peak_reserved"`
	PeakLive     uint64 `json:"pytorch_peak_live"`
}

// perturb returns a copy of events with sizes scaled by scale (rounded
// to 512 bytes, at least 1) and, when shuffle is set, each stream mapped to
// one of three at random, consistently per pointer's allocation.
func perturb(events []trace.Event, scale float64, shuffle bool, seed uint64) []trace.Event {
	r := rand.New(rand.NewPCG(seed, 1))
	out := make([]trace.Event, len(events))
	streamOf := map[uint64]uint64{}
	for i, e := range events {
		if scale != 1 {
			e.Size = max(uint64(float64(e.Size)*scale)/512*512, 1)
		}
		if shuffle {
			if e.Action == trace.Allocate {
				streamOf[e.Pointer] = uint64(r.IntN(3))
			}
			e.Stream = streamOf[e.Pointer]
		}
		out[i] = e
	}
	return out
}

// expandableReplay replays events against a fresh Expandable and returns
// the replay's result and the allocator's page counts.
func expandableReplay(t testing.TB, events []trace.Event, cfg alloc.ExpandableConfig) (trace.Result, alloc.PageStats) {
	var e *alloc.Expandable
	res, err := trace.ReplayOn(events, replaySim(events), func(dev device.Device) (alloc.Allocator, error) {
		var err error
		e, err = alloc.NewExpandable(dev, cfg)
		return e, err
	}, trace.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return res, e.PageStats()
}

// TestExpandableReplays holds Expandable to the bounds on every real
// trace and on perturbed copies: peak mapped over peak live at most 1.03
// and at most PyTorch's own ratio, and map plus unmap calls at most three
// times the pages mapped at the peak.
func TestExpandableReplays(t *testing.T) {
	dir := tracesDir(t)
	if testing.Short() {
		t.Skip("replays of the shared traces take seconds")
	}
	variants := []struct {
		name    string
		scale   float64
		shuffle bool
	}{{"as recorded", 1, false}, {"sizes ×0.7", 0.7, false}, {"sizes ×1.3", 1.3, false}, {"streams shuffled", 1, true}}
	for _, name := range pytorchTraces {
		events, err := trace.ReadFile(filepath.Join(dir, name+".csv"))
		if err != nil {
			t.Fatal(err)
		}
		var info pytorchInfo
		raw, err := os.ReadFile(filepath.Join(dir, name+".info.json"))
		if err == nil {
			err = json.Unmarshal(raw, &info)
		}
		if err != nil {
			t.Fatal(err)
		}
		pytorchRatio := float64(info.PeakReserved) / float64(info.PeakLive)
		for _, v := range variants {
			t.Run(fmt.Sprintf("%s/%s", name, v.name), func(t *testing.T) {
				if raceOn && name == "k_fullstep" && v.name != "as recorded" {
					t.Skip("a minute each under the race detector; the run without it checks these figures")
				}
				ev := perturb(events, v.scale, v.shuffle, 7)
				res, ps := expandableReplay(t, ev, alloc.ExpandableConfig{})
				ratio := res.Fragmentation()
				calls := ps.Maps + ps.Unmaps
				t.Logf("peak live %d, peak mapped %d: ratio %.4f (PyTorch %.3f); pages at peak %d, maps %d, unmaps %d (%.2f× the peak; %d before growths), failed %d",
					res.PeakLive, res.PeakReserved, ratio, pytorchRatio, ps.PeakMapped, ps.Maps, ps.Unmaps,
					float64(calls)/float64(max(ps.PeakMapped, 1)), ps.GrowthUnmaps, res.FailedAllocs)
				if res.FailedAllocs > 0 {
					t.Errorf("%d allocations failed", res.FailedAllocs)
				}
				if ratio > 1.03 || (v.name == "as recorded" && ratio > pytorchRatio) {
					t.Errorf("peak mapped / peak live = %.4f; want at most 1.03 and PyTorch's %.3f", ratio, pytorchRatio)
				}
				if calls > 3*ps.PeakMapped {
					t.Errorf("%d map and unmap calls for %d pages at the peak; want at most 3×", calls, ps.PeakMapped)
				}
			})
		}
	}
}
