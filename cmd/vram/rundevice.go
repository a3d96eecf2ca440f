// `vram run`'s devices: a spec (--device, or each of --devices) sized by
// --vram where its backend takes a size, a cap of --vram on a device of
// its own memory, and the manager put on it. Both the one-device job and
// each device of --devices open theirs here.

package main

import (
	"errors"
	"fmt"

	"github.com/vramkit/vram"
	"github.com/vramkit/vram/device"
	"github.com/vramkit/vram/internal/units"
)

// runSpec is the device a job opens, read from its flags.
type runSpec struct {
	spec device.Spec // sized by --vram where its backend takes a size
	// src names the flags the spec came from, for messages: `--device
	// "sim" with --vram 256MiB`.
	src string
	// limit is the cap to put on a device of its own memory (a GPU, or
	// auto finding one): --vram, given or not, so that the default batch
	// is chunked on a GPU too. Unused on a device the spec sizes.
	limit uint64
}

// sizeRunSpec sizes spec by --vram where it opens a device of a given
// size (sim, or auto falling back to it) whose options give none, and
// refuses a spec sized twice (its options and --vram given) or a --vram
// below one page of that device. src names where spec came from.
func sizeRunSpec(spec device.Spec, src string, vramFlag sizeFlag) (runSpec, error) {
	rs := runSpec{spec: spec, src: src, limit: vramFlag.bytes}
	info := spec.Info()
	switch {
	case info.TotalBytes != 0 && vramFlag.set:
		return runSpec{}, usagef("%s sizes the device and so does --vram %s; give one of them", src, vramFlag.text)
	case !spec.Sizable():
		return rs, nil // sized by its options, or a device of its own memory
	case vramFlag.bytes < info.Granularity:
		return runSpec{}, usagef("--vram %s%s: want at least %s, one page of the simulated device (its granularity)",
			vramFlag.text, vramFlag.note(), units.Format(info.Granularity))
	}
	sized, err := spec.WithTotal(vramFlag.bytes)
	if err != nil {
		return runSpec{}, usageError{fmt.Errorf("%s with --vram %s: %w", src, vramFlag.text, err)}
	}
	rs.spec, rs.src = sized, fmt.Sprintf("%s with --vram %s", src, vramFlag.text)
	return rs, nil
}

// runDevice is a device a job opened, and what the job puts on it.
type runDevice struct {
	dev  device.Device
	info device.Info
	// fallback says why auto did not use CUDA; nil when it did or the
	// spec was not auto.
	fallback error
	// limit is the manager's cap: --vram on a device of its own memory,
	// 0 on one the spec (or --vram) sized.
	limit uint64
}

// openRunDevice opens the device spec names, sized by --vram
// (sizeRunSpec), refusing a cap below one page of a device of its own
// memory. src names where spec came from.
func (a *app) openRunDevice(spec device.Spec, src string, vramFlag sizeFlag) (runDevice, error) {
	rs, err := sizeRunSpec(spec, src, vramFlag)
	if err != nil {
		return runDevice{}, err
	}
	dev, fallback, err := a.openDeviceAs(rs.spec, rs.src)
	if err != nil {
		return runDevice{}, err
	}
	rd := runDevice{dev: dev, info: dev.Info(), fallback: fallback, limit: rs.limit}
	if rs.spec.SizedBy(rd.info) {
		rd.limit = 0 // the spec, or --vram, sized the device itself
	}
	if rd.limit > 0 && rd.limit < rd.info.Granularity {
		err := usagef("--vram %s%s: want at least %s, one page of %s", vramFlag.text, vramFlag.note(),
			units.Format(rd.info.Granularity), rd.info.Name)
		return runDevice{}, errors.Join(err, closeErr("device", dev.Close()))
	}
	return rd, nil
}

// managerOptions are the options of the manager a job puts on rd: the
// allocator ($VRAM_ALLOC_CONF's, then --allocator's), the logger, the
// host limit of --host-mem and the budget: a lease of the node broker
// (--socket), or the cap on a device of its own memory.
// Every manager of `vram run` is built from these, on one device or many.
func (a *app) managerOptions(f runFlags, rd runDevice) ([]vram.Option, error) {
	opts, err := managerAllocOptions(f.allocator)
	if err != nil {
		return nil, err
	}
	opts = append(opts, vram.WithLogger(a.managerLogger()), vram.WithHostOptions(vram.HostOptions{Limit: f.hostMem.bytes}))
	return append(opts, f.capOptions(rd.limit)...), nil // runlease.go
}

// newRunManager is the memory manager of a job on rd (managerOptions).
func (a *app) newRunManager(f runFlags, rd runDevice) (*vram.Manager, error) {
	opts, err := a.managerOptions(f, rd)
	if err != nil {
		return nil, err
	}
	return vram.New(rd.dev, opts...) // its errors, and the broker's, say what they are of
}
