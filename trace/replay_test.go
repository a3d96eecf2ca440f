package trace_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/vramkit/vram/alloc"
	"github.com/vramkit/vram/device"
	"github.com/vramkit/vram/device/sim"
	"github.com/vramkit/vram/internal/sharedtraces"
	"github.com/vramkit/vram/internal/units"
	"github.com/vramkit/vram/trace"
)

// allocators are the ones replays run against.
var allocators = map[string]trace.Factory{
	"Direct": func(dev device.Device) (alloc.Allocator, error) { return alloc.NewDirect(dev), nil },
	"AsyncPool": func(dev device.Device) (alloc.Allocator, error) {
		return alloc.NewAsyncPool(dev, alloc.AsyncConfig{})
	},
	"Pool": func(dev device.Device) (alloc.Allocator, error) { return alloc.NewPool(dev, alloc.PoolConfig{}) },
}

// TestReplayCounts replays a small log with every oddity a log can have.
func TestReplayCounts(t *testing.T) {
	const mib = units.MiB
	events := []trace.Event{
		{Action: trace.Allocate, Pointer: 0xa0, Size: 3 * mib},
		{Action: trace.Allocate, Pointer: 0xb0, Size: mib, Stream: 7},
		{Action: trace.Free, Pointer: 0xc0, Size: mib},                // never allocated: skipped
		{Action: trace.AllocateFailure, Size: 1 << 50},                // not replayed
		{Action: trace.Allocate, Pointer: 0xd0, Size: 0},              // zero bytes: skipped
		{Action: trace.Free, Pointer: 0xd0},                           // its free: skipped
		{Action: trace.Free, Pointer: 0xa0, Size: 3 * mib, Stream: 7}, // freed on another stream
		{Action: trace.Allocate, Pointer: 0xa0, Size: 2 * mib},        // the address again
		{Action: trace.Allocate, Pointer: 0xa0, Size: 5 * mib},        // again, without a free
		{Action: trace.Free, Pointer: 0xb0, Size: mib, Stream: 7},
	}
	for name, newAlloc := range allocators {
		t.Run(name, func(t *testing.T) {
			res, err := trace.ReplayOn(events, simFor(events), newAlloc, trace.Options{Samples: 100})
			if err != nil {
				t.Fatal(err)
			}
			if res.Events != 10 || res.Allocs != 4 || res.Frees != 3 || res.UnmatchedFrees != 1 ||
				res.TraceFailures != 1 || res.ZeroSize != 1 || res.Reallocs != 1 || res.FailedAllocs != 0 {
				t.Errorf("counts: %+v", res)
			}
			if res.PeakLive != 6*mib {
				t.Errorf("PeakLive = %s, want 6 MiB", units.Format(res.PeakLive))
			}
			if res.PeakReserved < res.PeakLive || res.PeakInUse < res.PeakLive {
				t.Errorf("peaks below the live peak: in use %d, reserved %d, live %d", res.PeakInUse, res.PeakReserved, res.PeakLive)
			}
			if res.DeviceAllocs == 0 || res.EventsPerSec <= 0 || res.Wall <= 0 {
				t.Errorf("DeviceAllocs %d, %g events/s, wall %v", res.DeviceAllocs, res.EventsPerSec, res.Wall)
			}
			if res.Final.InUse == 0 || res.Final.Allocs-res.Final.Frees != 1 {
				t.Errorf("one block should stay live at the end: %+v", res.Final)
			}
			// One per event: the realloc's implied free is part of its
			// Allocate's event, not a point of its own.
			if len(res.Samples) != 10 {
				t.Errorf("%d samples, want 10", len(res.Samples))
			}
			for i, sm := range res.Samples {
				if sm.Event != i {
					t.Errorf("sample %d is of event %d", i, sm.Event)
				}
			}
		})
	}
}

// TestReplayFailedAllocations: on a device too small, refused allocations
// are counted and their frees skipped; the replay goes on.
func TestReplayFailedAllocations(t *testing.T) {
	var events []trace.Event
	for i := range 20 {
		events = append(events, trace.Event{Action: trace.Allocate, Pointer: uint64(i + 1), Size: 8 * units.MiB})
	}
	for i := range 20 {
		events = append(events, trace.Event{Action: trace.Free, Pointer: uint64(i + 1), Size: 8 * units.MiB})
	}
	cfg := sim.Config{TotalBytes: 64 * units.MiB, NoContext: true, AddressOnly: true}
	res, err := trace.ReplayOn(events, simOf(cfg), allocators["Direct"], trace.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if res.Allocs != 8 || res.FailedAllocs != 12 || res.Frees != 8 || res.Final.OOMs != 12 {
		t.Errorf("on a 64 MiB device: %d allocs, %d failed, %d frees, %d OOMs; want 8, 12, 8, 12",
			res.Allocs, res.FailedAllocs, res.Frees, res.Final.OOMs)
	}
	if res.PeakLive != 64*units.MiB {
		t.Errorf("PeakLive = %s, want what was replayed, 64 MiB", units.Format(res.PeakLive))
	}
}

func TestReplayOptions(t *testing.T) {
	dev, err := sim.New(sim.Config{TotalBytes: units.GiB, AddressOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Close()
	d := alloc.NewDirect(dev)
	defer d.Close()
	events := []trace.Event{{Action: trace.Allocate, Pointer: 1, Size: 1}}
	tests := map[string]trace.Options{
		"no device":        {},
		"negative samples": {Device: dev, Samples: -1},
	}
	for name, opts := range tests {
		t.Run(name, func(t *testing.T) {
			if _, err := trace.Replay(events, d, opts); !errors.Is(err, trace.ErrOptions) {
				t.Errorf("err = %v, want trace.ErrOptions", err)
			}
		})
	}
}

// TestSamplesBounded: a long log gives at most MaxSamples points, in
// order, ending at the last event.
func TestSamplesBounded(t *testing.T) {
	var events []trace.Event
	r := rand.New(rand.NewPCG(1, 1))
	for i := range 30011 {
		events = append(events, trace.Event{Action: trace.Allocate, Pointer: uint64(i + 1), Size: 1 + r.Uint64N(4096)})
		if i > 10 {
			events = append(events, trace.Event{Action: trace.Free, Pointer: uint64(i - 9)})
		}
	}
	for _, n := range []int{1, 7, 2000, 5000} {
		res, err := trace.ReplayOn(events, simFor(events), allocators["AsyncPool"], trace.Options{Samples: n})
		if err != nil {
			t.Fatal(err)
		}
		want := min(n, trace.MaxSamples)
		if len(res.Samples) > want || len(res.Samples) < want/2 {
			t.Errorf("Samples %d: got %d points, want at most %d (and not far fewer)", n, len(res.Samples), want)
		}
		last := -1
		for _, s := range res.Samples {
			if s.Event <= last || s.Reserved < s.InUse {
				t.Fatalf("Samples %d: bad point %+v after event %d", n, s, last)
			}
			last = s.Event
		}
		if last != len(events)-1 {
			t.Errorf("Samples %d: last point at event %d, want %d", n, last, len(events)-1)
		}
	}
}

// TestTraceAdaptorRoundTrip records a random workload through
// alloc.Trace, reads the log back with Read, and replays it: the replay
// must see what the recording saw.
func TestTraceAdaptorRoundTrip(t *testing.T) {
	dev, err := sim.New(sim.Config{TotalBytes: 4 * units.GiB, AddressOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Close()
	s1, err := dev.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	defer s1.Close()
	streams := []device.Stream{dev.DefaultStream(), s1}
	var log bytes.Buffer
	rec := alloc.NewTrace(alloc.NewDirect(dev), &log)
	r := rand.New(rand.NewPCG(2, 3))
	var live []device.Ptr
	var bytesLive, peak uint64
	sizes := map[device.Ptr]uint64{}
	for range 3000 {
		if len(live) == 0 || (len(live) < 50 && r.IntN(3) > 0) {
			n := 1 + r.Uint64N(8*units.MiB)
			p, err := rec.Alloc(n, streams[r.IntN(2)])
			if err != nil {
				t.Fatal(err)
			}
			live = append(live, p)
			sizes[p] = n
			bytesLive += n
			peak = max(peak, bytesLive)
			continue
		}
		k := r.IntN(len(live))
		p := live[k]
		live = append(live[:k], live[k+1:]...)
		if err := rec.Free(p, streams[r.IntN(2)]); err != nil {
			t.Fatal(err)
		}
		bytesLive -= sizes[p]
	}
	_, _ = rec.Alloc(1<<50, s1) // a failure line
	recorded := rec.Stats()
	if err := rec.Close(); err != nil {
		t.Fatal(err)
	}

	events, err := trace.Read(&log)
	if err != nil {
		t.Fatal(err)
	}
	sum := trace.Summarize(events)
	if sum.Events != 3001 || sum.Allocs != int(recorded.Allocs) || sum.Frees != int(recorded.Frees) ||
		sum.Failures != 1 || sum.UnmatchedFrees != 0 || sum.Streams != 2 || sum.PeakLive != peak {
		t.Fatalf("Summarize(log) = %+v; recorded %+v, peak live %d", sum, recorded, peak)
	}
	res, err := trace.ReplayOn(events, simFor(events), allocators["Direct"], trace.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if res.PeakLive != peak || res.PeakInUse != recorded.PeakInUse || res.DeviceAllocs != recorded.DeviceAllocs {
		t.Errorf("replay: peak live %d, peak in use %d, device allocs %d; recording: %d, %d, %d",
			res.PeakLive, res.PeakInUse, res.DeviceAllocs, peak, recorded.PeakInUse, recorded.DeviceAllocs)
	}
}

// sharedTraces reads every trace of the shared directory.
func sharedTraces(t testing.TB) map[string][]trace.Event {
	t.Helper()
	dir := sharedtraces.Dir(t)
	files, _ := filepath.Glob(filepath.Join(dir, "*.csv"))
	out := map[string][]trace.Event{}
	for _, f := range files {
		events, err := trace.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		out[strings.TrimSuffix(filepath.Base(f), ".csv")] = events
	}
	return out
}

// TestSharedTraces reads every shared trace, checks its figures against
// its .info.json where there is one, and replays it on Direct, AsyncPool
// and Pool.
func TestSharedTraces(t *testing.T) {
	traces := sharedTraces(t)
	if len(traces) < 9 {
		t.Errorf("found %d traces, want the 9 of traces/README.md", len(traces))
	}
	for name, events := range traces {
		t.Run(name, func(t *testing.T) {
			sum := trace.Summarize(events)
			if sum.Allocs == 0 || sum.Frees == 0 || sum.Failures != 0 {
				t.Errorf("summary: %+v", sum)
			}
			info := filepath.Join(sharedtraces.Dir(t), name+".info.json")
			if b, err := os.ReadFile(info); err == nil {
				var want struct {
					Events        int    `json:"events"`
					TracePeakLive uint64 `json:"trace_peak_live"`
				}
				if err := json.Unmarshal(b, &want); err != nil {
					t.Fatal(err)
				}
				if sum.Events != want.Events || sum.PeakLive != want.TracePeakLive {
					t.Errorf("events %d, peak live %d; %s says %d, %d", sum.Events, sum.PeakLive, info, want.Events, want.TracePeakLive)
				}
			}
			for aname, newAlloc := range allocators {
				res, err := trace.ReplayOn(events, simFor(events), newAlloc, trace.Options{Samples: 500})
				if err != nil {
					t.Fatalf("%s: %v", aname, err)
				}
				if res.PeakLive != sum.PeakLive || res.FailedAllocs != 0 || res.UnmatchedFrees != sum.UnmatchedFrees ||
					res.PeakReserved < res.PeakLive || res.Allocs != sum.Allocs {
					t.Errorf("%s: %+v", aname, res)
				}
				t.Logf("%-9s peak live %9s, peak reserved %9s (%.3f), device allocs %5d, %.2fM events/s",
					aname, units.Format(res.PeakLive), units.Format(res.PeakReserved), res.Fragmentation(),
					res.DeviceAllocs, res.EventsPerSec/1e6)
			}
		})
	}
}

// BenchmarkReplay replays every shared trace on each allocator, on a
// fresh device and allocator per iteration (made and closed outside the
// timer), and reports events per second and heap allocations per event.
func BenchmarkReplay(b *testing.B) {
	traces := sharedTraces(b)
	for name, events := range traces {
		for aname, newAlloc := range allocators {
			b.Run(fmt.Sprintf("%s/%s", name, aname), func(b *testing.B) {
				cfg := simConfig(events)
				var total int
				for b.Loop() {
					b.StopTimer()
					dev, err := sim.New(cfg)
					if err != nil {
						b.Fatal(err)
					}
					a, err := newAlloc(dev)
					if err != nil {
						b.Fatal(err)
					}
					b.StartTimer()
					if _, err := trace.Replay(events, a, trace.Options{Device: dev}); err != nil {
						b.Fatal(err)
					}
					b.StopTimer()
					_ = a.Close()
					_ = dev.Close()
					b.StartTimer()
					total += len(events)
				}
				b.ReportMetric(float64(total)/b.Elapsed().Seconds(), "events/s")
			})
		}
	}
}

// FuzzReplay replays arbitrary logs (frees of unknown pointers, pointers
// reused without a free, zero sizes, failures, several streams) on a small
// device, with the allocator the first byte picks: Replay must never fail,
// its counts must agree with Summarize, and closing the allocator must
// give the device everything back (ReplayOn checks).
func FuzzReplay(f *testing.F) {
	f.Add([]byte{0, 0, 1, 10, 1, 1, 10, 2, 9, 0, 0, 1, 3})
	f.Add([]byte{1, 0, 1, 255, 0, 2, 255, 0, 3, 255, 1, 2, 0, 3, 0, 0})
	f.Add([]byte{2, 0, 1, 255, 0, 2, 255, 0, 3, 255, 1, 2, 0, 3, 0, 0, 3, 4, 9, 0, 4, 9})
	names := slices.Sorted(maps.Keys(allocators))
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) == 0 {
			return
		}
		name := names[int(data[0])%len(names)]
		data = data[1:]
		var events []trace.Event
		for i := 0; i+2 < len(data) && len(events) < 2000; i += 3 {
			events = append(events, trace.Event{
				Action:  trace.Action(data[i]%3 + 1),
				Pointer: uint64(data[i+1] % 16),
				Size:    uint64(data[i+2]) * 64 * units.KiB, // up to 16 MiB, sometimes 0
				Stream:  uint64(data[i] / 3 % 3),
			})
		}
		sum := trace.Summarize(events)
		cfg := sim.Config{TotalBytes: 64 * units.MiB, NoContext: true, AddressOnly: true}
		res, err := trace.ReplayOn(events, simOf(cfg), allocators[name], trace.Options{Samples: 10})
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if res.Allocs+res.FailedAllocs+res.ZeroSize != sum.Allocs || res.UnmatchedFrees != sum.UnmatchedFrees ||
			res.TraceFailures != sum.Failures || res.Reallocs != sum.Reallocs {
			t.Fatalf("%s: replay %+v disagrees with summary %+v", name, res, sum)
		}
		if res.FailedAllocs == 0 && res.PeakLive != sum.PeakLive {
			t.Fatalf("%s: peak live %d, summary says %d", name, res.PeakLive, sum.PeakLive)
		}
	})
}
