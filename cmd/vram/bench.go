// `vram bench`: a quick allocator micro-benchmark.
//
// Each case runs for --time against a fresh allocator on the device and
// counts operations; an operation is one Alloc or one Free. The cases:
//
//	pair SIZE   Alloc then Free of SIZE bytes, over and over, on one
//	            stream: the cache-hit path of a pool, a device call each
//	            for direct
//	mixed       a random workload: sizes log-uniform from 512 B to 16 MiB,
//	            up to 256 blocks live, allocs and frees in equal measure;
//	            it also reports peak reserved / peak live bytes
//
// Heap allocations per operation come from runtime.MemStats, so they
// include the device's own bookkeeping.

package main

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"runtime"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/vramkit/vram/alloc"
	"github.com/vramkit/vram/device"
	"github.com/vramkit/vram/internal/units"
)

// benchRow is one allocator's result in one case: an element of `vram
// bench --json`'s array.
type benchRow struct {
	Allocator        string  `json:"allocator"`
	Case             string  `json:"case"`
	Ops              int     `json:"ops"`
	NsPerOp          float64 `json:"ns_per_op"`
	AllocsPerOp      float64 `json:"heap_allocs_per_op"`
	DeviceAllocs     uint64  `json:"device_allocs"`
	PeakLiveBytes    uint64  `json:"peak_live_bytes,omitempty"`
	PeakReserved     uint64  `json:"peak_reserved_bytes,omitempty"`
	ReservedOverLive float64 `json:"reserved_over_live,omitempty"`
	// Skipped says why a case did not run (it does not fit the device).
	Skipped string `json:"skipped,omitempty"`
}

type benchFlags struct {
	allocators string
	duration   time.Duration
	seed       uint64
}

// benchDevice is the device bench uses unless --device or $VRAM_DEVICE
// names one: an
// address-only simulator, so device allocations cost bookkeeping only
// and a 64 MiB block costs no host memory.
const benchDevice = "sim:vram=64GiB,backed=false,context=0"

func (a *app) benchCommand() *cobra.Command {
	var f benchFlags
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Time the allocators on a few micro-benchmarks",
		Long: `Bench times each allocator on alloc/free pairs of a few sizes (the cache-hit
path of a pool) and on a random workload, and prints ns per operation,
heap allocations per operation, device allocations and, for the random
workload, peak reserved over peak live bytes.

Unless --device or $VRAM_DEVICE names a device it runs on an address-only
simulator (` + benchDevice + `), so that it
measures the allocators and not host memory; give --device cuda to time
them against the driver.`,
		Example: `  vram bench
  vram bench --allocator pool --time 1s --json
  vram bench --device cuda`,
		Args: usageArgs(0, 0, ""),
		RunE: func(cmd *cobra.Command, args []string) error {
			spec := a.spec
			if !a.deviceSet && strings.TrimSpace(os.Getenv(device.EnvDevice)) == "" {
				var err error
				if spec, err = device.ParseSpec(benchDevice); err != nil {
					return err
				}
			}
			return a.bench(spec, f)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.allocators, "allocator", allNames(), "comma-separated allocators to time: "+allocatorHelp())
	fl.DurationVar(&f.duration, "time", 200*time.Millisecond, "how long to run each case")
	fl.Uint64Var(&f.seed, "seed", 1, "seed of the random workload")
	return cmd
}

// benchCase is one micro-benchmark: run performs operations until
// deadline and returns how many, and the most bytes it had live at once
// by the sizes it asked for (0 when it does not keep count).
type benchCase struct {
	name string
	run  func(al alloc.Allocator, s device.Stream, deadline time.Time) (ops int, peakLive uint64, err error)
}

func (a *app) bench(spec device.Spec, f benchFlags) error {
	entries, err := parseAllocators(f.allocators)
	if err != nil {
		return err
	}
	if f.duration <= 0 {
		return usagef("--time %v: want a positive duration such as 200ms", f.duration)
	}
	dev, _, err := a.openDevice(spec)
	if err != nil {
		return err
	}
	defer dev.Close()
	cases := []benchCase{
		pairCase(4 * units.KiB),
		pairCase(units.MiB),
		pairCase(64 * units.MiB),
		mixedCase(f.seed),
	}
	bar := a.progress(len(entries)*len(cases), "benchmarking")
	defer bar.Finish()
	var rows []benchRow
	for _, e := range entries {
		for _, c := range cases {
			if err := a.ctx.Err(); err != nil {
				return err
			}
			row, err := runBenchCase(dev, e, c, f.duration)
			switch {
			case errors.Is(err, device.ErrOutOfMemory):
				// A case too big for this device is reported, not fatal.
				row = benchRow{Allocator: e.Name, Case: c.name, Skipped: "does not fit the device"}
				a.log.Debug("bench case skipped", "allocator", e.Name, "case", c.name, "err", err)
			case err != nil:
				return fmt.Errorf("bench %s, %s: %w", e.Name, c.name, err)
			}
			rows = append(rows, row)
			bar.Add(1)
		}
	}
	bar.Finish()
	if a.json {
		return a.writeJSON(rows)
	}
	info := dev.Info()
	fmt.Fprintf(a.stdout, "%s:%d %s, %s total, %s per case\n", info.Backend, info.Ordinal, info.Name,
		units.Format(info.TotalBytes), f.duration)
	tw := a.table()
	fmt.Fprintln(tw, "ALLOCATOR\tCASE\tOPS\tNS/OP\tHEAP ALLOCS/OP\tDEVICE ALLOCS\tRESERVED/LIVE")
	for _, r := range rows {
		if r.Skipped != "" {
			fmt.Fprintf(tw, "%s\t%s\t-\t-\t-\t-\t%s\n", r.Allocator, r.Case, r.Skipped)
			continue
		}
		ratio := "-"
		if r.ReservedOverLive > 0 {
			ratio = fmt.Sprintf("%.3f", r.ReservedOverLive)
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%.1f\t%.2f\t%d\t%s\n", r.Allocator, r.Case, r.Ops, r.NsPerOp, r.AllocsPerOp, r.DeviceAllocs, ratio)
	}
	return tw.Flush()
}

// runBenchCase times one case against a fresh allocator e on dev, on a
// stream of its own, and closes both.
func runBenchCase(dev device.Device, e alloc.Entry, c benchCase, d time.Duration) (row benchRow, err error) {
	al, err := e.New(dev, alloc.Configs{})
	if err != nil {
		return row, err
	}
	defer func() { err = errors.Join(err, al.Close()) }()
	s, err := dev.NewStream()
	if err != nil {
		return row, err
	}
	defer func() { err = errors.Join(err, s.Close()) }()
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	start := time.Now()
	ops, peakLive, err := c.run(al, s, start.Add(d))
	elapsed := time.Since(start)
	runtime.ReadMemStats(&after)
	if err != nil {
		return row, err
	}
	if err := s.Synchronize(); err != nil {
		return row, err
	}
	st := al.Stats()
	row = benchRow{
		Allocator:    e.Name,
		Case:         c.name,
		Ops:          ops,
		NsPerOp:      float64(elapsed.Nanoseconds()) / float64(max(ops, 1)),
		AllocsPerOp:  float64(after.Mallocs-before.Mallocs) / float64(max(ops, 1)),
		DeviceAllocs: st.DeviceAllocs,
	}
	if peakLive > 0 {
		row.PeakLiveBytes = peakLive
		row.PeakReserved = st.PeakReserved
		row.ReservedOverLive = float64(st.PeakReserved) / float64(peakLive)
	}
	return row, nil
}

// opsBetweenClockReads is how many operations run between two looks at
// the clock.
const opsBetweenClockReads = 256

// pairCase allocates and frees n bytes over and over.
func pairCase(n uint64) benchCase {
	return benchCase{
		name: "pair " + strings.ReplaceAll(units.Format(n), " ", ""),
		run: func(al alloc.Allocator, s device.Stream, deadline time.Time) (int, uint64, error) {
			ops := 0
			for {
				for range opsBetweenClockReads / 2 {
					p, err := al.Alloc(n, s)
					if err != nil {
						return ops, 0, err
					}
					if err := al.Free(p, s); err != nil {
						return ops, 0, err
					}
					ops += 2
				}
				if !time.Now().Before(deadline) {
					return ops, 0, nil
				}
			}
		},
	}
}

// mixedCase is the random workload. Its operations are drawn before the
// clock starts, from seed.
func mixedCase(seed uint64) benchCase {
	const (
		steps   = 1 << 14
		maxLive = 256
		minSize = 512.0
		maxSize = 16 << 20
	)
	rng := rand.New(rand.NewPCG(seed, 0x5eed))
	sizes := make([]uint64, steps)
	alloc1 := make([]bool, steps) // true: allocate, false: free a random live block
	picks := make([]uint32, steps)
	for i := range sizes {
		sizes[i] = uint64(math.Exp(math.Log(minSize) + rng.Float64()*(math.Log(maxSize)-math.Log(minSize))))
		alloc1[i] = rng.IntN(2) == 0
		picks[i] = rng.Uint32()
	}
	return benchCase{
		name: "mixed",
		run: func(al alloc.Allocator, s device.Stream, deadline time.Time) (ops int, peak uint64, err error) {
			type block struct {
				p device.Ptr
				n uint64
			}
			live := make([]block, 0, maxLive)
			var bytes uint64
			defer func() {
				for _, b := range live {
					err = errors.Join(err, al.Free(b.p, s))
				}
			}()
			for i := 0; ; i = (i + 1) % steps {
				if (alloc1[i] || len(live) == 0) && len(live) < maxLive {
					p, err := al.Alloc(sizes[i], s)
					if err != nil {
						return ops, peak, err
					}
					live = append(live, block{p, sizes[i]})
					bytes += sizes[i]
					peak = max(peak, bytes)
				} else {
					k := int(picks[i] % uint32(len(live)))
					if err := al.Free(live[k].p, s); err != nil {
						return ops, peak, err
					}
					bytes -= live[k].n
					live[k] = live[len(live)-1]
					live = live[:len(live)-1]
				}
				ops++
				if ops%opsBetweenClockReads == 0 && !time.Now().Before(deadline) {
					return ops, peak, nil
				}
			}
		},
	}
}
