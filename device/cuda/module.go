package cuda

import (
	"fmt"
	"runtime"
	"strings"
	"sync/atomic"

	"github.com/vramkit/vram/device"
)

// module is a CUmodule loaded from PTX. Safe for concurrent use.
type module struct {
	d       *Device
	h       uintptr // CUmodule
	gen     uint64
	entries map[string][]ptxParam // parameter lists read from the PTX text
	closed  atomic.Bool
}

// LoadPTX compiles PTX text with the driver's JIT (cuModuleLoadDataEx) for
// this GPU. A compile error carries the JIT's log. The PTX's .entry
// parameter lists are read too, so Launch can check its arguments' count
// and widths before the driver reads them.
func (d *Device) LoadPTX(ptx string) (device.Module, error) {
	if strings.TrimSpace(ptx) == "" {
		return nil, fmt.Errorf("cuda: LoadPTX: empty PTX text: %w", device.ErrInvalidValue)
	}
	if strings.IndexByte(ptx, 0) >= 0 {
		return nil, fmt.Errorf("cuda: LoadPTX: PTX text contains a NUL byte: %w", device.ErrInvalidValue)
	}
	image := append([]byte(ptx), 0) // the driver reads PTX up to its NUL
	if err := d.enter(); err != nil {
		return nil, err
	}
	defer d.exit()
	var h uintptr
	r, log := d.lib.moduleLoadData(&h, image)
	runtime.KeepAlive(image)
	if r != Success {
		if log != "" {
			return nil, fmt.Errorf("cuda: LoadPTX for %s (sm_%s): %w\nJIT log:\n%s",
				d.info.Name, strings.ReplaceAll(d.info.ComputeCapability, ".", ""), r, log)
		}
		return nil, fmt.Errorf("cuda: LoadPTX for %s: %w", d.info.Name, r)
	}
	m := &module{d: d, h: h, gen: d.p.gen.Load(), entries: ptxEntries(ptx)}
	d.mu.Lock()
	d.syncGenLocked()
	d.modules[m] = struct{}{}
	d.mu.Unlock()
	return m, nil
}

func (m *module) enter(op string) error {
	if err := m.d.enter(); err != nil {
		return err
	}
	switch {
	case m.closed.Load():
		m.d.exit()
		return fmt.Errorf("cuda: %s: module: %w", op, device.ErrClosed)
	case !m.d.current(m.gen):
		m.d.exit()
		return fmt.Errorf("cuda: %s: module loaded before a device reset: %w", op, device.ErrInvalidated)
	}
	return nil
}

// Function finds a kernel by its entry name (cuModuleGetFunction).
func (m *module) Function(name string) (device.Function, error) {
	if name == "" || strings.IndexByte(name, 0) >= 0 {
		return nil, fmt.Errorf("cuda: Function(%q): bad entry name: %w", name, device.ErrInvalidValue)
	}
	if err := m.enter("Function"); err != nil {
		return nil, err
	}
	defer m.d.exit()
	var h uintptr
	if r := m.d.lib.moduleGetFunction(&h, m.h, append([]byte(name), 0)); r != Success {
		if r == ErrorNotFound {
			return nil, fmt.Errorf("cuda: Function(%q): no such entry in the module: %w: %w", name, device.ErrInvalidValue, r)
		}
		return nil, fmt.Errorf("cuda: Function(%q): %w", name, r)
	}
	// A name the PTX parse did not read gives nil params: Launch then
	// checks only the Go types of the arguments.
	return &function{m: m, h: h, name: name, params: m.entries[name]}, nil
}

// Close unloads the module (cuModuleUnload). Its functions can no longer
// be launched.
func (m *module) Close() error {
	if err := m.enter("Close"); err != nil {
		return err
	}
	defer m.d.exit()
	if !m.closed.CompareAndSwap(false, true) {
		return fmt.Errorf("cuda: close module: %w", device.ErrClosed)
	}
	m.d.mu.Lock()
	delete(m.d.modules, m)
	m.d.mu.Unlock()
	if r := m.d.lib.moduleUnload(m.h); r != Success {
		return fmt.Errorf("cuda: close module: %w", r)
	}
	return nil
}

// function is a CUfunction. Safe for concurrent use.
type function struct {
	m      *module
	h      uintptr // CUfunction
	name   string
	params []ptxParam // nil when the PTX declaration was not read
}

// Launch enqueues the kernel on s (cuLaunchKernel). Arguments are passed by
// value: device.Ptr as a 64-bit address, int32/uint32/float32 as 4 bytes,
// int64/uint64/float64 as 8. Their number and widths are checked against
// the PTX declaration, and every non-zero device.Ptr against the device's
// live allocations (a stale or freed one is refused before the kernel can
// fault on it). The argument memory is pinned Go memory, held until the
// driver has copied it, which it does before cuLaunchKernel returns.
func (f *function) Launch(s device.Stream, grid, block device.Dim3, sharedMem uint32, args ...any) error {
	for _, v := range []uint32{grid.X, grid.Y, grid.Z, block.X, block.Y, block.Z} {
		if v == 0 {
			return fmt.Errorf("cuda: launch %s: grid %v and block %v must have no zero dimension: %w",
				f.name, grid, block, device.ErrInvalidValue)
		}
	}
	var pin runtime.Pinner
	defer pin.Unpin()
	slots, vals, ptrs, err := packArgs(f.name, f.params, args, &pin)
	if err != nil {
		return fmt.Errorf("cuda: launch %s: %w", f.name, err)
	}
	d := f.m.d
	if err := f.m.enter("Launch " + f.name); err != nil {
		return err
	}
	defer d.exit()
	st, err := d.streamOf("Launch "+f.name, s)
	if err != nil {
		return err
	}
	d.mu.Lock()
	for i, sl := range slots {
		if !sl.ptr || sl.bits == 0 {
			continue
		}
		if err := d.checkRangeLocked(fmt.Sprintf("Launch %s argument %d", f.name, i), device.Ptr(sl.bits), 1); err != nil {
			d.mu.Unlock()
			return err
		}
	}
	d.mu.Unlock()
	r := d.lib.launchKernel(f.h,
		[3]uint32{grid.X, grid.Y, grid.Z}, [3]uint32{block.X, block.Y, block.Z},
		sharedMem, st.h, ptrs)
	runtime.KeepAlive(vals)
	runtime.KeepAlive(ptrs)
	if r != Success {
		return fmt.Errorf("cuda: launch %s grid %v block %v on %v: %w", f.name, grid, block, st, r)
	}
	return nil
}
