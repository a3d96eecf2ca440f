// The allocators the commands name with --allocator, and what info says
// about their defaults.

package main

import (
	"fmt"
	"slices"
	"strings"

	"github.com/vramkit/vram"
	"github.com/vramkit/vram/alloc"
	"github.com/vramkit/vram/device"
	"github.com/vramkit/vram/internal/units"
)

// allocatorKinds are the names --allocator takes, in the order replay and
// bench run them. "pool" is the segment Pool and "expandable" the
// expandable-segments allocator; the manager (vram run) serves its Pool
// kind from the latter where the device manages virtual memory.
var allocatorKinds = []string{"direct", "pool", "async", "expandable"}

// defaultAllocator is the allocator plan uses unless told, and run where
// the device cannot map pages.
const defaultAllocator = "pool"

// newAllocator makes the allocator named kind on dev.
func newAllocator(kind string, dev device.Device) (alloc.Allocator, error) {
	switch kind {
	case "direct":
		return alloc.NewDirect(dev), nil
	case "pool":
		return alloc.NewPool(dev, alloc.PoolConfig{})
	case "async":
		return alloc.NewAsyncPool(dev, alloc.AsyncConfig{})
	case "expandable":
		return alloc.NewExpandable(dev, alloc.ExpandableConfig{})
	}
	return nil, usagef("--allocator %q: want one of %s", kind, strings.Join(allocatorKinds, ", "))
}

// managerAllocOptions are the manager options that choose vram run's
// allocator: first those of $VRAM_ALLOC_CONF (vram.AllocConfFromEnv),
// then, when --allocator names one (name is not ""), the flag's choice,
// which wins.
// As in replay and bench, "pool" is the segment alloc.Pool and
// "expandable" alloc.Expandable; with neither the flag nor the variable
// naming one, the manager's default serves (Expandable where the device
// manages virtual memory, else Pool).
func managerAllocOptions(name string) ([]vram.Option, error) {
	opts, err := vram.AllocConfFromEnv()
	if err != nil {
		return nil, usagef("%v", err)
	}
	switch name {
	case "":
		return opts, nil
	case "pool", "expandable":
		return append(opts, vram.WithAllocator(vram.Pool), vram.WithExpandable(name == "expandable", alloc.ExpandableConfig{})), nil
	}
	kind, err := vram.ParseAllocatorKind(name)
	if err != nil {
		return nil, usagef("--allocator %q: want one of %s", name, strings.Join(allocatorKinds, ", "))
	}
	return append(opts, vram.WithAllocator(kind)), nil
}

// parseAllocators reads a comma-separated --allocator list.
func parseAllocators(list string) ([]string, error) {
	var kinds []string
	for _, k := range strings.Split(list, ",") {
		k = strings.ToLower(strings.TrimSpace(k))
		if k == "" {
			continue
		}
		if !slices.Contains(allocatorKinds, k) {
			return nil, usagef("--allocator: unknown allocator %q; want a comma-separated list of %s", k, strings.Join(allocatorKinds, ", "))
		}
		kinds = append(kinds, k)
	}
	if len(kinds) == 0 {
		return nil, usagef("--allocator %q names no allocator; want a list of %s", list, strings.Join(allocatorKinds, ", "))
	}
	return kinds, nil
}

// allocatorGranularity is the rounding unit the planner should count
// bytes in for the allocator named kind on dev: what the allocator says
// (alloc.Granular), else the planner's default.
func allocatorGranularity(kind string, dev device.Device) (uint64, error) {
	a, err := newAllocator(kind, dev)
	if err != nil {
		return 0, fmt.Errorf("allocator for the granularity: %w", err)
	}
	defer a.Close()
	if g, ok := a.(alloc.Granular); ok && g.Granularity() > 0 {
		return g.Granularity(), nil
	}
	return vram.DefaultGranularity, nil
}

// allocatorReport is what info says about the allocators.
type allocatorReport struct {
	// Default is what vram run uses unless told (by --allocator or
	// $VRAM_ALLOC_CONF): expandable where the device can map pages, else pool.
	Default string   `json:"default"`
	Kinds   []string `json:"kinds"` // the names --allocator takes
	// Granularity is each allocator's rounding unit on this device, bytes.
	Granularity map[string]uint64 `json:"granularity"`
	// Pool is the caching pool's configuration, defaults filled in.
	Pool poolConfigJSON `json:"pool"`
	// AsyncKeepsAll is true when the async pool keeps all freed memory
	// (the default); else AsyncReleaseThreshold is the bytes it keeps.
	AsyncKeepsAll         bool   `json:"async_keeps_all_freed"`
	AsyncReleaseThreshold uint64 `json:"async_release_threshold_bytes,omitempty"`
	// Unavailable says, per allocator, why it cannot run on this device.
	Unavailable map[string]string `json:"unavailable,omitempty"`
}

// allocatorDefaults builds the report by making each allocator on dev.
func allocatorDefaults(dev device.Device) allocatorReport {
	rep := allocatorReport{
		Default:     defaultAllocator,
		Kinds:       allocatorKinds,
		Granularity: map[string]uint64{},
	}
	for _, kind := range allocatorKinds {
		a, err := newAllocator(kind, dev)
		if err != nil {
			if rep.Unavailable == nil {
				rep.Unavailable = map[string]string{}
			}
			rep.Unavailable[kind] = err.Error()
			continue
		}
		rep.Granularity[kind] = vram.DefaultGranularity
		if g, ok := a.(alloc.Granular); ok && g.Granularity() > 0 {
			rep.Granularity[kind] = g.Granularity()
		}
		switch a := a.(type) {
		case *alloc.Pool:
			rep.Pool = toPoolConfigJSON(a.Config())
		case *alloc.AsyncPool:
			if th := a.ReleaseThreshold(); th == alloc.KeepAll {
				rep.AsyncKeepsAll = true
			} else {
				rep.AsyncReleaseThreshold = th
			}
		}
		a.Close()
	}
	// vram run's manager serves its Pool kind from Expandable where it can
	// be made ($VRAM_ALLOC_CONF aside).
	if _, ok := rep.Granularity["expandable"]; ok {
		rep.Default = "expandable"
	}
	return rep
}

// notes writes the report as lines for info's text output.
func (r allocatorReport) notes() []string {
	var lines []string
	for _, kind := range r.Kinds {
		if why, ok := r.Unavailable[kind]; ok {
			lines = append(lines, fmt.Sprintf("%-10s unavailable: %s", kind, why))
			continue
		}
		var line string
		switch kind {
		case "direct":
			line = "every call goes to the device"
		case "pool":
			p := r.Pool
			line = fmt.Sprintf("caching best-fit pool: small ≤ %s in %s segments, medium in %s–%s segments, large ≥ %s on their own",
				units.Format(p.SmallSize), units.Format(p.SmallSegment), units.Format(p.MediumSegment),
				units.Format(p.MaxMediumSegment), units.Format(p.LargeSize))
		case "async":
			th := "keeps all freed memory"
			if !r.AsyncKeepsAll {
				th = "release threshold " + units.Format(r.AsyncReleaseThreshold)
			}
			line = "the device's stream-ordered pool, " + th
		case "expandable":
			line = "best fit in one growing range per stream and size class, 2 MiB pages mapped as it grows and unmapped before passing its high-water mark, on trim and on out of memory"
		}
		lines = append(lines, fmt.Sprintf("%-10s rounds to %s; %s", kind, units.Format(r.Granularity[kind]), line))
	}
	return lines
}

// poolConfigJSON is alloc.PoolConfig with JSON names. Sizes are bytes.
type poolConfigJSON struct {
	SmallSize        uint64 `json:"small_size_bytes"`
	SmallSegment     uint64 `json:"small_segment_bytes"`
	LargeSize        uint64 `json:"large_size_bytes"`
	MediumSegment    uint64 `json:"medium_segment_bytes"`
	MaxMediumSegment uint64 `json:"max_medium_segment_bytes"`
	GrowthDivisor    uint64 `json:"growth_divisor"`
	KeepCache        bool   `json:"keep_cache"`
}

func toPoolConfigJSON(c alloc.PoolConfig) poolConfigJSON {
	return poolConfigJSON{c.SmallSize, c.SmallSegment, c.LargeSize, c.MediumSegment, c.MaxMediumSegment,
		c.GrowthDivisor, c.KeepCache}
}
