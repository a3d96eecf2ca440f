// The allocators the commands name with --allocator, and what info says
// about their defaults.

package main

import (
	"fmt"
	"os"
	"strings"

	"github.com/vramkit/vram"
	"github.com/vramkit/vram/account"
	"github.com/vramkit/vram/alloc"
	"github.com/vramkit/vram/device"
	"github.com/vramkit/vram/internal/units"
)

// The names --allocator takes are the allocator registry's (alloc.Names,
// alloc.Lookup: aliases too), in its order, the order replay and bench
// run them in: "pool" is the segment Pool and "expandable" the
// expandable-segments allocator, and the manager (vram run) serves its
// Pool kind from the latter where the device manages virtual memory.

// allocatorHelp says which names --allocator takes: "direct (or
// default), pool (or cupy), …".
func allocatorHelp() string {
	var names []string
	for _, e := range alloc.Allocators() {
		n := e.Name
		if len(e.Aliases) > 0 {
			n += " (or " + strings.Join(e.Aliases, ", ") + ")"
		}
		names = append(names, n)
	}
	return strings.Join(names, ", ")
}

// allNames is the default of a comma-separated --allocator list: every
// allocator, in the registry's order.
func allNames() string { return strings.Join(alloc.Names(), ",") }

// lookupAllocator reads one --allocator name.
func lookupAllocator(name string) (alloc.Entry, error) {
	e, err := alloc.Lookup(name)
	if err != nil {
		return alloc.Entry{}, usagef("--allocator %q: want %s", name, allocatorHelp())
	}
	return e, nil
}

// planAllocator is the allocator plan counts bytes for unless told.
const planAllocator = alloc.NamePool

// managerAllocOptions are the manager options that choose vram run's
// allocator: $VRAM_ALLOC_CONF's (vram.ReadAllocConf), with, when
// --allocator names one (name is not ""), the flag's choice winning: the
// registry's allocator of that name (account.ChoiceOf), as in replay and
// bench, with the variable's configuration of it. With neither the flag
// nor the variable naming one, the manager's default serves (Expandable
// where the device manages virtual memory, else Pool).
func managerAllocOptions(name string) ([]vram.Option, error) {
	conf, err := vram.ReadAllocConf(os.Getenv(vram.AllocConfEnv))
	if err != nil {
		return nil, usagef("%v", err)
	}
	if name == "" {
		return conf.Options(), nil
	}
	e, err := lookupAllocator(name)
	if err != nil {
		return nil, err
	}
	choice := account.ChoiceOf(e)
	choice.Configs = conf.Allocator.Configs
	return append(conf.Options(), vram.WithAllocatorChoice(choice)), nil
}

// parseAllocators reads a comma-separated --allocator list.
func parseAllocators(list string) ([]alloc.Entry, error) {
	var entries []alloc.Entry
	for _, name := range strings.Split(list, ",") {
		if strings.TrimSpace(name) == "" {
			continue
		}
		e, err := lookupAllocator(name)
		if err != nil {
			return nil, err
		}
		entries = append(entries, e)
	}
	if len(entries) == 0 {
		return nil, usagef("--allocator %q names no allocator; want a comma-separated list of %s", list, allocatorHelp())
	}
	return entries, nil
}

// allocatorGranularity is the rounding unit the planner should count
// bytes in for the allocator e on dev: what the allocator says
// (alloc.Granular), else the planner's default.
func allocatorGranularity(e alloc.Entry, dev device.Device) (uint64, error) {
	a, err := e.New(dev, alloc.Configs{})
	if err != nil {
		return 0, fmt.Errorf("allocator for the granularity: %w", err)
	}
	defer a.Close()
	return granularityOf(a), nil
}

// granularityOf is a's rounding unit: what it says (alloc.Granular), else
// the planner's default.
func granularityOf(a alloc.Allocator) uint64 {
	if g, ok := a.(alloc.Granular); ok && g.Granularity() > 0 {
		return g.Granularity()
	}
	return vram.DefaultGranularity
}

// allocatorReport is what info says about the allocators.
type allocatorReport struct {
	// Default is what vram run uses unless told (by --allocator or
	// $VRAM_ALLOC_CONF): the Pool kind's allocator on this device,
	// expandable where the device can map pages, else pool.
	Default string   `json:"default"`
	Kinds   []string `json:"kinds"` // the names --allocator takes (alloc.Names)
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
	// Conf is $VRAM_ALLOC_CONF when it is set: Default is then the
	// allocator it configures, and CapBytes its limit (0: none).
	Conf     string `json:"alloc_conf,omitempty"`
	CapBytes uint64 `json:"cap_bytes,omitempty"`

	notes []string // the text lines, one per allocator
}

// allocatorDefaults builds the report by making each allocator on dev.
func allocatorDefaults(dev device.Device) allocatorReport {
	rep := allocatorReport{Kinds: alloc.Names(), Granularity: map[string]uint64{}}
	for _, e := range alloc.Allocators() {
		a, err := e.New(dev, alloc.Configs{})
		if err != nil {
			if rep.Unavailable == nil {
				rep.Unavailable = map[string]string{}
			}
			rep.Unavailable[e.Name] = err.Error()
			rep.notes = append(rep.notes, fmt.Sprintf("%-10s unavailable: %s", e.Name, err))
			continue
		}
		rep.Granularity[e.Name] = granularityOf(a)
		line := e.Summary
		switch a := a.(type) {
		case *alloc.Pool:
			p := toPoolConfigJSON(a.Config())
			rep.Pool = p
			line += fmt.Sprintf(": small ≤ %s in %s segments, medium in %s–%s segments, large ≥ %s on their own",
				units.Format(p.SmallSize), units.Format(p.SmallSegment), units.Format(p.MediumSegment),
				units.Format(p.MaxMediumSegment), units.Format(p.LargeSize))
		case *alloc.AsyncPool:
			if th := a.ReleaseThreshold(); th == alloc.KeepAll {
				rep.AsyncKeepsAll = true
				line += ", keeps all freed memory"
			} else {
				rep.AsyncReleaseThreshold = th
				line += ", release threshold " + units.Format(th)
			}
		}
		a.Close()
		rep.notes = append(rep.notes, fmt.Sprintf("%-10s rounds to %s; %s", e.Name, units.Format(rep.Granularity[e.Name]), line))
	}
	// vram run's manager serves its Pool kind as the registry chooses
	// for the device ($VRAM_ALLOC_CONF aside).
	if a, e, err := vram.Pool.New(dev, alloc.Configs{}); err == nil {
		rep.Default = e.Name
		a.Close()
	}
	return rep
}

// configured makes Default the allocator that $VRAM_ALLOC_CONF's options
// conf give a manager of dev, as vram run's would be, and says its cap;
// with the variable unset it leaves the report as it is.
func (r *allocatorReport) configured(dev device.Device, conf []vram.Option) error {
	r.Conf = os.Getenv(vram.AllocConfEnv)
	if strings.TrimSpace(r.Conf) == "" {
		r.Conf = ""
		return nil
	}
	m, err := vram.New(dev, conf...)
	if err != nil {
		return fmt.Errorf("$%s %s on this device: %w", vram.AllocConfEnv, clipEnv(r.Conf), err)
	}
	defer m.Close()
	_, mem := m.Account().Report()
	r.Default = mem.Allocator
	r.CapBytes, _ = m.Account().Cap()
	return nil
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
