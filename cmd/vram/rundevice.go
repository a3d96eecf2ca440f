// `vram run`'s device: --device and --vram made into a spec, and the cap
// on a real device.

package main

import (
	"errors"
	"fmt"
	"strings"

	"github.com/vramkit/vram/device"
	"github.com/vramkit/vram/device/sim"
	"github.com/vramkit/vram/internal/units"
)

// runDeviceSpec folds --vram into the device spec when the spec may open
// the simulator (sim, or auto falling back to it) and does not size it
// already. src names where spec came from, for messages. It returns the
// cap to put on a real device (cuda, or auto finding a GPU): --vram,
// given or not, so that the default batch is chunked on a GPU too.
func runDeviceSpec(spec, src string, f runFlags) (string, uint64, error) {
	size, err := units.ParseSize(f.vram)
	if err != nil || size == 0 {
		return "", 0, usagef("--vram %q: want a positive size such as 256MiB", f.vram)
	}
	name, opts, _ := strings.Cut(strings.TrimSpace(spec), ":")
	name = strings.ToLower(strings.TrimSpace(name))
	if name != "sim" && name != "auto" {
		return spec, size, nil
	}
	limit := size // if auto finds a GPU
	if name == "sim" {
		limit = 0 // --vram sizes the simulator instead
	}
	cfg, err := sim.ParseSpec(opts)
	if err != nil {
		return "", 0, usageError{fmt.Errorf("%s: %w", src, err)}
	}
	if cfg.TotalBytes != 0 {
		if f.vramSet {
			return "", 0, usagef("%s sizes the simulator and so does --vram %s; give one of them", src, f.vram)
		}
		return spec, limit, nil
	}
	gran := cfg.Granularity
	if gran == 0 {
		gran = sim.DefaultGranularity
	}
	if size < gran {
		return "", 0, usagef("--vram %s%s: want at least %s, one page of the simulator (its granularity)",
			f.vram, bytesNote(f.vram), units.Format(gran))
	}
	if strings.TrimSpace(opts) != "" {
		opts += ","
	}
	return name + ":" + opts + "vram=" + f.vram, limit, nil
}

// openRunDevice opens the device --device and --vram name, and returns
// the cap to put on a real device (0 on the simulator, which --vram
// sizes).
func (a *app) openRunDevice(f runFlags) (device.Device, error, uint64, error) {
	spec, limit, err := runDeviceSpec(a.device, a.deviceSource(), f)
	if err != nil {
		return nil, nil, 0, err
	}
	flags := a.deviceSource()
	if spec != a.device {
		flags += fmt.Sprintf(" with --vram %s (the spec %q)", f.vram, spec)
	}
	dev, fallback, err := a.openDeviceAs(spec, flags)
	if err != nil {
		return nil, nil, 0, err
	}
	info := dev.Info()
	if info.Backend == "sim" {
		limit = 0 // --vram sized the simulator itself
	}
	if limit > 0 && limit < info.Granularity {
		err := usagef("--vram %s%s: want at least %s, one page of %s", f.vram, bytesNote(f.vram), units.Format(info.Granularity), info.Name)
		return nil, nil, 0, errors.Join(err, closeErr("device", dev.Close()))
	}
	return dev, fallback, limit, nil
}
