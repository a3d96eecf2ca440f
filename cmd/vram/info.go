// `vram info`: what device a spec opens, its memory, and the allocators'
// defaults.

package main

import (
	"errors"
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"github.com/vramkit/vram"
	"github.com/vramkit/vram/device"
	"github.com/vramkit/vram/internal/units"
)

// infoReport is `vram info --json`.
type infoReport struct {
	Spec     string   `json:"spec"`     // the --device spec given
	Backends []string `json:"backends"` // backends linked into this binary
	// Fallback says why "auto" chose the simulator; empty when it did not.
	Fallback   string          `json:"fallback,omitempty"`
	Devices    []deviceReport  `json:"devices"`
	Allocators allocatorReport `json:"allocators"`
}

// deviceReport describes one device. Sizes are in bytes.
type deviceReport struct {
	Backend           string `json:"backend"`
	Name              string `json:"name"`
	Ordinal           int    `json:"ordinal"`
	Driver            string `json:"driver"`
	ComputeCapability string `json:"compute_capability,omitempty"`
	TotalBytes        uint64 `json:"total_bytes"`
	FreeBytes         uint64 `json:"free_bytes"`
	ContextBytes      uint64 `json:"context_bytes"`
	Granularity       uint64 `json:"granularity"`
	Backed            bool   `json:"backed"`
	AsyncAlloc        bool   `json:"async_alloc"`    // a stream-ordered pool (cuMemAllocAsync)
	PinnedHost        bool   `json:"pinned_host"`    // pinned host memory
	Copy2D            bool   `json:"copy_2d"`        // one-call pitched copies (a chunk in one copy)
	GoKernels         bool   `json:"go_kernels"`     // runs kernels written in Go (the simulator)
	PTXKernels        bool   `json:"ptx_kernels"`    // loads PTX kernels (CUDA)
	VirtualMemory     bool   `json:"virtual_memory"` // reserves address ranges and maps pages (the expandable pool)
}

func (a *app) infoCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "info",
		Short: "Show the device, its memory and the allocators' defaults",
		Long: `Info opens the device named by --device and shows its backend, name, driver,
total and free memory, the memory its context takes, its allocation
granularity and the allocators' defaults. With --device auto it also says
why it fell back to the simulator when it did. With $VRAM_ALLOC_CONF set,
the allocator vram run would use is the one it configures (a bad value is
an error).`,
		Example: `  vram info
  vram info --device sim:vram=8GiB --json
  VRAM_DEVICE=cuda:1 vram info`,
		Args: usageArgs(0, 0, ""),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.info()
		},
	}
}

func (a *app) info() error {
	conf, err := managerAllocOptions("") // $VRAM_ALLOC_CONF, refused before the device opens
	if err != nil {
		return err
	}
	dev, fallback, err := a.openDevice(a.spec)
	if err != nil {
		return err
	}
	defer dev.Close()
	rep := infoReport{Spec: a.device, Backends: device.Backends()}
	if fallback != nil {
		rep.Fallback = fallback.Error()
	}
	d, err := describeDevice(dev)
	if err != nil {
		return err
	}
	rep.Devices = append(rep.Devices, d)
	// On CUDA, list the other devices of the backend too.
	if d.Backend != "sim" {
		for ord := 0; ord < maxListedDevices; ord++ {
			if ord == d.Ordinal {
				continue
			}
			other, err := device.Open(fmt.Sprintf("%s:%d", d.Backend, ord))
			if err != nil {
				if !errors.Is(err, device.ErrNoDevice) {
					a.log.Debug("listing devices", "ordinal", ord, "err", err)
				}
				break
			}
			od, err := describeDevice(other)
			other.Close()
			if err != nil {
				return err
			}
			rep.Devices = append(rep.Devices, od)
		}
	}
	rep.Allocators = allocatorDefaults(dev)
	if err := rep.Allocators.configured(dev, conf); err != nil {
		return err
	}
	if a.json {
		return a.writeJSON(rep)
	}
	return a.printInfo(rep)
}

// maxListedDevices bounds the devices info lists.
const maxListedDevices = 64

func describeDevice(dev device.Device) (deviceReport, error) {
	info := dev.Info()
	free, total, err := dev.MemInfo()
	if err != nil {
		return deviceReport{}, fmt.Errorf("memory info of %s %d: %w", info.Backend, info.Ordinal, err)
	}
	_, async := dev.(device.AsyncAllocator)
	_, host := dev.(device.HostAllocator)
	_, copy2d := dev.(device.StridedCopier)
	_, goKernels := dev.(device.FuncLauncher)
	_, ptx := dev.(device.ModuleLoader)
	_, vm := dev.(device.VirtualMemory)
	return deviceReport{
		Backend:           info.Backend,
		Name:              info.Name,
		Ordinal:           info.Ordinal,
		Driver:            info.Driver,
		ComputeCapability: info.ComputeCapability,
		TotalBytes:        total,
		FreeBytes:         free,
		ContextBytes:      info.ContextBytes,
		Granularity:       info.Granularity,
		Backed:            info.Backed,
		AsyncAlloc:        async,
		PinnedHost:        host,
		Copy2D:            copy2d,
		GoKernels:         goKernels,
		PTXKernels:        ptx,
		VirtualMemory:     vm,
	}, nil
}

func (a *app) printInfo(rep infoReport) error {
	// Sections separated by blank lines, values in one column.
	section := func(rows [][2]string) error {
		for _, r := range rows {
			if _, err := fmt.Fprintf(a.stdout, "%-12s %s\n", r[0], r[1]); err != nil {
				return err
			}
		}
		return nil
	}
	head := [][2]string{{"spec", rep.Spec}, {"backends", strings.Join(rep.Backends, ", ") + " (linked)"}}
	if rep.Fallback != "" {
		head = append(head, [2]string{"fallback", "auto chose the simulator: " + rep.Fallback})
	}
	if err := section(head); err != nil {
		return err
	}
	for _, d := range rep.Devices {
		rows := [][2]string{
			{"device", fmt.Sprintf("%s:%d  %s", d.Backend, d.Ordinal, d.Name)},
			{"driver", d.Driver},
		}
		if d.ComputeCapability != "" {
			rows = append(rows, [2]string{"compute", "capability " + d.ComputeCapability})
		}
		rows = append(rows,
			[2]string{"memory", fmt.Sprintf("%s total, %s free, %s used by the context",
				units.Format(d.TotalBytes), units.Format(d.FreeBytes), units.Format(d.ContextBytes))},
			[2]string{"granularity", units.Format(d.Granularity)},
			[2]string{"features", features(d)})
		fmt.Fprintln(a.stdout)
		if err := section(rows); err != nil {
			return err
		}
	}
	al := rep.Allocators
	def := "default " + al.Default
	if al.Conf != "" {
		def = fmt.Sprintf("%s as $%s %s sets it", al.Default, vram.AllocConfEnv, clipEnv(al.Conf))
		if al.CapBytes > 0 {
			def += ", capped at " + units.Format(al.CapBytes)
		}
	}
	rows := [][2]string{{"allocators", fmt.Sprintf("%s (%s)", strings.Join(al.Kinds, ", "), def)}}
	for _, line := range al.notes {
		rows = append(rows, [2]string{"", line})
	}
	fmt.Fprintln(a.stdout)
	return section(rows)
}

func features(d deviceReport) string {
	var f []string
	if d.Backed {
		f = append(f, "backed memory")
	} else {
		f = append(f, "address-only (no bytes behind addresses)")
	}
	if d.AsyncAlloc {
		f = append(f, "stream-ordered pool")
	}
	if d.PinnedHost {
		f = append(f, "pinned host memory")
	}
	if d.Copy2D {
		f = append(f, "2-D copies")
	}
	if d.GoKernels {
		f = append(f, "Go kernels")
	}
	if d.PTXKernels {
		f = append(f, "PTX kernels")
	}
	if d.VirtualMemory {
		f = append(f, "virtual memory (vram run's default pool is expandable)")
	}
	return strings.Join(f, ", ")
}
