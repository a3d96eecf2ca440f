package sim

import (
	"errors"
	"fmt"
	"math/bits"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/vramkit/vram/device"
	"github.com/vramkit/vram/internal/meminfo"
	"github.com/vramkit/vram/internal/units"
)

// Defaults for a zero Config.
const (
	DefaultTotalBytes  = 8 * units.GiB
	DefaultGranularity = 2 * units.MiB
	// MaxContextBytes caps the default context size: a context takes
	// min(TotalBytes/32, MaxContextBytes), rounded down to the granularity.
	MaxContextBytes = 256 * units.MiB
	// DefaultPinnedLimit is the most the default cap on live pinned host
	// memory can be; the default is half the host's RAM when that is less
	// (the simulator's pinned buffers are real host memory).
	DefaultPinnedLimit = 64 * units.GiB
	// DefaultBackingLimit is the most the default cap on host memory
	// backing device memory can be; the default is half the host's RAM
	// when that is less.
	DefaultBackingLimit = 64 * units.GiB
	// PoolAlignment is the alignment (and rounding) of MallocAsync blocks.
	PoolAlignment uint64 = 512
	// MaxTotalBytes caps Config.TotalBytes: 256 TiB (2^48 bytes), far more
	// than any GPU, so that every device's address region fits many times
	// in the simulator's address range (see vaspace.go).
	MaxTotalBytes = 256 * units.TiB
	// MaxGranularity caps Config.Granularity: 1 TiB, the alignment of
	// every device's address region, so that Malloc addresses are aligned
	// to the granularity.
	MaxGranularity = units.TiB
)

// Config describes a simulated device. The zero value is a backed 8 GiB
// device with a 256 MiB context and 2 MiB granularity.
type Config struct {
	// TotalBytes is the device memory MemInfo reports as total, at most
	// MaxTotalBytes. 0 means DefaultTotalBytes.
	TotalBytes uint64
	// ContextBytes is the memory the context itself takes from the total
	// (it is never free). 0 means min(TotalBytes/32, 256 MiB) rounded down
	// to the granularity; set NoContext for a context that takes nothing.
	ContextBytes uint64
	// NoContext makes the context take no memory (ContextBytes is ignored).
	NoContext bool
	// Granularity is the unit in which Malloc reserves memory and the
	// async pool grows: a power of two from PoolAlignment to
	// MaxGranularity. 0 means DefaultGranularity (2 MiB, as current
	// drivers).
	Granularity uint64
	// AddressOnly keeps accounting and addresses but no bytes: nothing of
	// the device's size is spent on the host, so a 100 GiB device can be
	// simulated on a small machine. Copies, memsets and kernels then
	// return errors wrapping device.ErrNotSupported.
	AddressOnly bool
	// ReleaseThreshold is the async pool's initial release threshold in
	// bytes (CU_MEMPOOL_ATTR_RELEASE_THRESHOLD; the driver's default is 0).
	ReleaseThreshold uint64
	// KernelWorkers is how many goroutines run a LaunchFunc kernel's
	// blocks. 0 means runtime.GOMAXPROCS(0).
	KernelWorkers int
	// CopyBandwidth, in bytes per second, makes each copy and memset take
	// as long as it would over a link that fast (the stream's goroutine
	// does the host copy, then sleeps out the rest of that time, so a
	// copy takes the longer of the two, not their sum), so overlap of
	// copies and compute can be seen. Copies on different streams run at
	// once, each at this bandwidth. 0 copies at host memory speed.
	CopyBandwidth uint64
	// PinnedLimit caps the bytes of pinned host memory (HostAlloc) live
	// at once; past it HostAlloc fails with ErrOutOfMemory, as pinning
	// does when the host runs short. 0 means DefaultPinnedLimit or half
	// the host's RAM, whichever is less, so that pinning more than the
	// machine can hold is an error, not the Go runtime's fatal out of
	// memory.
	PinnedLimit uint64
	// BackingLimit caps the host bytes a backed device spends on the
	// bytes of its allocations at once. An allocation's bytes are made on
	// its first access (a whole Malloc's requested size, or a whole async
	// pool segment); an access that would take the bytes past the limit
	// fails with ErrOutOfMemory instead of ending the process in the Go
	// runtime's fatal out of memory (a 64 GiB granularity on a small
	// host). 0 means DefaultBackingLimit or half the host's RAM, whichever
	// is less. Ignored when AddressOnly.
	BackingLimit uint64
	// KernelTime, per index, makes each kernel launch over n indices
	// take at least n × KernelTime of stream time (kerneltime.go): the
	// kernel runs, then the stream sleeps out the rest. 0 runs kernels
	// at the host's speed.
	KernelTime time.Duration
	// Name is the device name Info reports. "" means "vram simulator".
	Name string
	// Ordinal is the device index Info reports.
	Ordinal int
	// Shared names a shared device (spec shared=NAME; shared.go): every
	// Device opened with this name and SharedDir, in this process or any
	// other of the host, takes its memory from one device's. MemInfo's
	// free is the total less what all of them hold (each its context,
	// Mallocs, async pool reserve and physical memory), and an allocation
	// past the total fails with ErrOutOfMemory in whichever Device asks.
	// Contents, addresses, streams and fault injection stay per Device.
	// All must agree on TotalBytes and Granularity. A name is 1 to
	// MaxSharedName letters, digits, '.', '_' or '-'. Linux only; ""
	// means a private device.
	Shared string
	// SharedDir is the directory of the shared device's ledger file
	// (spec dir=PATH). "" means $VRAM_SIM_DIR, or DefaultSharedDir().
	SharedDir string
}

// withDefaults fills zero fields and checks the rest.
func (c Config) withDefaults() (Config, error) {
	if c.TotalBytes == 0 {
		c.TotalBytes = DefaultTotalBytes
	}
	if c.Granularity == 0 {
		c.Granularity = DefaultGranularity
	}
	if c.Granularity < PoolAlignment || c.Granularity > MaxGranularity || bits.OnesCount64(c.Granularity) != 1 {
		return c, fmt.Errorf("sim: granularity %d bytes: want a power of two from %d bytes to %s: %w",
			c.Granularity, PoolAlignment, units.Format(MaxGranularity), device.ErrInvalidValue)
	}
	if c.TotalBytes > MaxTotalBytes {
		return c, fmt.Errorf("sim: total memory %s is more than the simulator's limit of %s (sim.MaxTotalBytes): %w",
			units.Format(c.TotalBytes), units.Format(MaxTotalBytes), device.ErrInvalidValue)
	}
	if c.TotalBytes < c.Granularity {
		return c, fmt.Errorf("sim: total memory %s is less than the granularity %s: %w",
			units.Format(c.TotalBytes), units.Format(c.Granularity), device.ErrInvalidValue)
	}
	switch {
	case c.NoContext:
		c.ContextBytes = 0
	case c.ContextBytes == 0:
		c.ContextBytes = min(c.TotalBytes/32, MaxContextBytes) / c.Granularity * c.Granularity
	}
	if c.ContextBytes >= c.TotalBytes {
		return c, fmt.Errorf("sim: context %s leaves nothing of total memory %s: %w",
			units.Format(c.ContextBytes), units.Format(c.TotalBytes), device.ErrInvalidValue)
	}
	if c.KernelWorkers < 0 {
		return c, fmt.Errorf("sim: kernel workers %d: want >= 0: %w", c.KernelWorkers, device.ErrInvalidValue)
	}
	if c.KernelWorkers == 0 {
		c.KernelWorkers = runtime.GOMAXPROCS(0)
	}
	if c.PinnedLimit == 0 {
		c.PinnedLimit = DefaultPinnedLimit
		if ram := meminfo.RAM(); ram > 0 {
			c.PinnedLimit = min(c.PinnedLimit, ram/2)
		}
	}
	if c.BackingLimit == 0 {
		c.BackingLimit = DefaultBackingLimit
		if ram := meminfo.RAM(); ram > 0 {
			c.BackingLimit = min(c.BackingLimit, ram/2)
		}
	}
	if err := c.checkKernelTime(); err != nil {
		return c, err
	}
	if c.Name == "" {
		c.Name = "vram simulator"
	}
	if c.Ordinal < 0 {
		return c, fmt.Errorf("sim: ordinal %d: want >= 0: %w", c.Ordinal, device.ErrInvalidValue)
	}
	if c.Shared != "" {
		if err := checkSharedName(c.Shared); err != nil {
			return c, err
		}
	} else if c.SharedDir != "" {
		return c, fmt.Errorf("sim: ledger directory %s given for a private device: set Shared (spec shared=NAME) too: %w", device.QuoteSpec(c.SharedDir), device.ErrInvalidValue)
	}
	return c, nil
}

// specKeys documents the options ParseSpec accepts.
var specKeys = []string{"vram", "context", "granularity", "backed", "threshold", "workers", "bandwidth", "kerneltime", "pinned", "backing", "name", "ordinal", "shared", "dir"}

// ParseSpec reads the options of a "sim:..." device spec (the text after
// the colon) into a Config:
//
//	vram=SIZE         total memory (also total=SIZE), e.g. vram=24GiB
//	context=SIZE      memory the context takes; context=0 for none
//	granularity=SIZE  allocation granularity, e.g. granularity=64KiB
//	backed=BOOL       false for an address-only device (no bytes on the host)
//	threshold=SIZE    async pool release threshold
//	workers=N         goroutines per kernel launch
//	bandwidth=SIZE    emulated copy bandwidth per second, e.g. bandwidth=16GB
//	kerneltime=DUR    emulated kernel time per index, e.g. kerneltime=2us
//	pinned=SIZE       cap on live pinned host memory (default 64 GiB)
//	backing=SIZE      cap on host memory backing device memory (default 64 GiB)
//	name=TEXT         device name
//	ordinal=N         device index
//	shared=NAME       a shared device: one device's memory for every
//	                  Device of this name, in any process (Config.Shared)
//	dir=PATH          directory of the shared device's ledger (no commas;
//	                  default $VRAM_SIM_DIR, or DefaultSharedDir())
//
// Options are separated by commas; keys are case-insensitive. An unknown
// key or a bad value returns an error wrapping device.ErrBadSpec.
func ParseSpec(opts string) (Config, error) {
	var c Config
	opts = strings.TrimSpace(opts)
	if opts == "" {
		return c, nil
	}
	for _, kv := range strings.Split(opts, ",") {
		kv = strings.TrimSpace(kv)
		if kv == "" {
			continue
		}
		k, v, ok := strings.Cut(kv, "=")
		k, v = strings.ToLower(strings.TrimSpace(k)), strings.TrimSpace(v)
		if !ok || v == "" {
			return c, fmt.Errorf("sim option %s: want key=value (keys: %s): %w", device.QuoteSpec(kv), strings.Join(specKeys, ", "), device.ErrBadSpec)
		}
		bad := func(err error) error { return badOption(k, v, err) }
		var err error
		switch k {
		case "vram", "total", "mem", "memory":
			c.TotalBytes, err = positiveSize(v, "total memory")
		case "context", "ctx":
			c.ContextBytes, err = units.ParseSize(v)
			c.NoContext = err == nil && c.ContextBytes == 0
		case "granularity", "gran":
			c.Granularity, err = positiveSize(v, "granularity")
		case "backed":
			var b bool
			b, err = strconv.ParseBool(v)
			c.AddressOnly = !b
		case "threshold", "release-threshold":
			c.ReleaseThreshold, err = units.ParseSize(v)
		case "workers":
			c.KernelWorkers, err = strconv.Atoi(v)
			if err == nil && c.KernelWorkers <= 0 {
				err = fmt.Errorf("want a positive count")
			}
		case "bandwidth", "bw":
			c.CopyBandwidth, err = units.ParseSize(v)
		case "kerneltime", "kernel-time":
			c.KernelTime, err = parseKernelTime(v)
		case "pinned":
			c.PinnedLimit, err = positiveSize(v, "the limit")
		case "backing":
			c.BackingLimit, err = positiveSize(v, "the limit")
		case "name":
			c.Name = v
		case "shared":
			c.Shared, err = v, checkSharedName(v)
		case "dir":
			c.SharedDir = v
		case "ordinal":
			c.Ordinal, err = strconv.Atoi(v)
			if err == nil && c.Ordinal < 0 {
				err = fmt.Errorf("want >= 0")
			}
		default:
			return c, fmt.Errorf("unknown sim option %s (known: %s): %w", device.QuoteSpec(k), strings.Join(specKeys, ", "), device.ErrBadSpec)
		}
		if err != nil {
			return c, bad(err)
		}
	}
	if c.SharedDir != "" && c.Shared == "" {
		return c, fmt.Errorf("sim option dir=%s: a ledger directory is for a shared device; add shared=NAME: %w", device.QuoteSpec(c.SharedDir), device.ErrBadSpec)
	}
	return c, nil
}

// badOption is the error of option k=v that err refuses, quoting v once,
// clipped: a size's error and strconv's are given by their reason alone,
// and one that quotes v itself (a shared device name's) without v.
func badOption(k, v string, err error) error {
	var (
		ne *strconv.NumError
		se *units.SizeError
	)
	switch {
	case errors.As(err, &se):
		return fmt.Errorf("sim option %s=%s: %s: %w: %w", k, device.QuoteSpec(v), se.Reason, units.ErrBadSize, device.ErrBadSpec)
	case errors.Is(err, device.ErrInvalidValue):
		return fmt.Errorf("sim option %s (%v): %w", k, err, device.ErrBadSpec)
	case errors.As(err, &ne):
		err = ne.Err
	}
	return fmt.Errorf("sim option %s=%s: %v: %w", k, device.QuoteSpec(v), err, device.ErrBadSpec)
}

// positiveSize reads a size that must be > 0 (what names it).
func positiveSize(v, what string) (uint64, error) {
	n, err := units.ParseSize(v)
	if err == nil && n == 0 {
		err = fmt.Errorf("%s must be > 0", what)
	}
	return n, err
}

func init() {
	device.Register("sim", func(opts string) (device.Device, error) {
		cfg, err := ParseSpec(opts)
		if err != nil {
			return nil, err
		}
		return openConfig(cfg)
	})
	device.RegisterSpecReader("sim", device.SpecReader{Check: checkSpec, OpenSized: openSized})
}

// checkSpec is what a spec's options give (device.SpecReader.Check): the
// memory they set, and the granularity, the default where they set none.
func checkSpec(opts string) (device.SpecInfo, error) {
	cfg, err := ParseSpec(opts)
	if err != nil {
		return device.SpecInfo{}, err
	}
	gran := cfg.Granularity
	if gran == 0 {
		gran = DefaultGranularity
	}
	return device.SpecInfo{TotalBytes: cfg.TotalBytes, Granularity: gran}, nil
}

// openSized opens the simulator opts describe with total bytes of memory
// (device.SpecReader.OpenSized).
func openSized(opts string, total uint64) (device.Device, error) {
	cfg, err := ParseSpec(opts)
	if err != nil {
		return nil, err
	}
	cfg.TotalBytes = total
	return openConfig(cfg)
}

// openConfig makes the simulator of cfg for device.Open: an invalid
// figure is a bad spec.
func openConfig(cfg Config) (device.Device, error) {
	d, err := New(cfg)
	if errors.Is(err, device.ErrInvalidValue) {
		return nil, fmt.Errorf("%w: %w", device.ErrBadSpec, err)
	}
	if err != nil {
		return nil, err // the spec is fine; the device is not to be had (a shared device full or in use otherwise)
	}
	return d, nil
}
