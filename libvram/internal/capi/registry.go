package capi

// The registry: the process's managers by handle and by device ordinal.
// Handles are small integers, never Go pointers (C may not keep those),
// and are never reused within a process, so a stale handle is refused
// rather than mistaken for a newer manager.

import (
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"sync"

	"github.com/vramkit/vram"
	"github.com/vramkit/vram/alloc"
	"github.com/vramkit/vram/broker"
	"github.com/vramkit/vram/device"
)

// Sentinel errors.
var (
	// ErrNoManager: no open manager has the handle, or none is open on
	// the device a hook names.
	ErrNoManager = errors.New("no such vram manager")
	// ErrBusy: a manager is already open on the device, or one being
	// closed still has live allocations.
	ErrBusy = errors.New("busy")
	// ErrBadPointer: a free of a pointer the manager did not hand out, one
	// freed already, or one freed with another size than it was asked
	// with.
	ErrBadPointer = errors.New("pointer not allocated by this manager")
	// ErrClosed: the manager has been closed.
	ErrClosed = errors.New("vram manager closed")
)

// Registry holds the managers of a process: at most one per device
// ordinal, so that every framework's allocations on a device count
// against one budget. Safe for concurrent use. The zero value is ready.
type Registry struct {
	mu        sync.Mutex // protects the fields below
	last      int64      // the last handle given
	byHandle  map[int64]*Manager
	byOrdinal map[int]*Manager
}

// Options are what Open's caller chooses. The zero value opens the
// default device ($VRAM_DEVICE, else auto) with no cap.
type Options struct {
	Spec string // a device.Open spec: "", "auto", "sim:vram=1GiB", "cuda:1", …
	Cap  uint64 // bytes the manager's allocations may take, as the allocator charges them; 0: $VRAM_ALLOC_CONF's limit, else none
	// Broker, when not "", is the node broker's socket: the manager's
	// budget is a lease of it (broker.At), asked for as Lease says, and
	// Cap is ignored (Lease.Cap bounds the lease).
	Broker string
	Lease  vram.LeaseOptions
}

// Open opens the device, makes a vram manager on it with the allocator
// that $VRAM_ALLOC_CONF configures (vram.ParseAllocConf) and the cap, and
// registers it. It fails with ErrBusy when a manager is open on the same
// device ordinal, and refuses the async allocator kind (see newManager).
func (r *Registry) Open(o Options) (*Manager, error) {
	conf, err := vram.AllocConfFromEnv()
	if err != nil {
		return nil, fmt.Errorf("vram: open %q: %w", o.Spec, err)
	}
	dev, err := device.Open(o.Spec)
	if err != nil {
		return nil, fmt.Errorf("vram: open %q: %w", o.Spec, err)
	}
	return r.openOn(dev, o, conf)
}

// openOn is Open on a device already open, which the manager then owns.
func (r *Registry) openOn(dev device.Device, o Options, conf []vram.Option) (*Manager, error) {
	restore, err := keepThread(dev)
	if err != nil {
		return nil, errors.Join(fmt.Errorf("vram: open %q: %w", o.Spec, err), dev.Close())
	}
	defer restore()
	m, err := newManager(dev, o, conf)
	if err != nil {
		return nil, errors.Join(err, dev.Close())
	}
	r.mu.Lock()
	if other := r.byOrdinal[m.ordinal]; other != nil {
		r.mu.Unlock()
		return nil, errors.Join(fmt.Errorf("vram: open %q: manager %d is open on device %d (%s); a process has one manager, and one budget, per device: %w",
			o.Spec, other.handle, m.ordinal, other.spec, ErrBusy), m.shut())
	}
	if r.byHandle == nil {
		r.byHandle, r.byOrdinal = map[int64]*Manager{}, map[int]*Manager{}
	}
	r.last++
	m.handle = r.last
	r.byHandle[m.handle] = m
	r.byOrdinal[m.ordinal] = m
	r.mu.Unlock()
	return m, nil
}

// Get returns the open manager with handle h.
func (r *Registry) Get(h int64) (*Manager, error) {
	r.mu.Lock()
	m := r.byHandle[h]
	r.mu.Unlock()
	if m == nil {
		return nil, fmt.Errorf("vram: manager %d: never opened, or closed: %w", h, ErrNoManager)
	}
	return m, nil
}

// ForDevice returns the manager open on device ordinal, the one a
// framework's hook (which names only a device) allocates through.
func (r *Registry) ForDevice(ordinal int) (*Manager, error) {
	r.mu.Lock()
	m := r.byOrdinal[ordinal]
	r.mu.Unlock()
	if m == nil {
		return nil, fmt.Errorf("vram: no manager is open on device %d; open one first (vram_open, or vram.open in Python): %w", ordinal, ErrNoManager)
	}
	return m, nil
}

// All returns the open managers, by handle.
func (r *Registry) All() []*Manager {
	r.mu.Lock()
	ms := make([]*Manager, 0, len(r.byHandle))
	for _, m := range r.byHandle {
		ms = append(ms, m)
	}
	r.mu.Unlock()
	sort.Slice(ms, func(i, j int) bool { return ms[i].handle < ms[j].handle })
	return ms
}

// Close closes the manager with handle h and forgets it. It refuses, with
// ErrBusy and nothing changed, while the manager has live allocations:
// their owners (a framework's tensors) would be left pointing at freed
// memory.
func (r *Registry) Close(h int64) error {
	m, err := r.Get(h)
	if err != nil {
		return fmt.Errorf("vram: close: %w", err)
	}
	restore, err := keepThread(m.dev)
	if err != nil {
		return fmt.Errorf("vram: close manager %d: %w", h, err)
	}
	defer restore()
	r.mu.Lock()
	if r.byHandle[h] != m {
		r.mu.Unlock()
		return fmt.Errorf("vram: close manager %d: closed meanwhile: %w", h, ErrNoManager)
	}
	if err := m.closeIfIdle(); err != nil {
		r.mu.Unlock()
		return err
	}
	delete(r.byHandle, h)
	delete(r.byOrdinal, m.ordinal)
	r.mu.Unlock()
	return m.shut()
}

// newManager makes the vram manager of o on dev. The async kind is
// refused: the device's stream-ordered pool orders reuse only on the
// allocating stream, which a hook that names no stream cannot give.
func newManager(dev device.Device, o Options, conf []vram.Option) (*Manager, error) {
	m := &Manager{spec: o.Spec, dev: dev, ordinal: dev.Info().Ordinal, live: map[device.Ptr]liveAlloc{}, keyed: map[uintptr]device.Stream{}}
	if m.spec == "" {
		m.spec = device.DefaultSpec()
	}
	m.foreign, _ = dev.(device.ForeignCaller)
	opts := append(conf, vram.WithLogger(slog.New(slog.DiscardHandler)),
		vram.WithOOMObserver(func(_ *alloc.OutOfMemoryError, rep vram.ManagerReport) { m.noteOOM(rep) }))
	switch {
	case o.Broker != "":
		lease := o.Lease
		lease.Broker = broker.At(o.Broker)
		opts = append(opts, vram.WithLease(lease))
		m.leased = true
	case o.Cap > 0: // else $VRAM_ALLOC_CONF's limit, if any, stands
		opts = append(opts, vram.WithCap(o.Cap))
	}
	vm, err := vram.New(dev, opts...)
	if err != nil {
		return nil, fmt.Errorf("vram: open %q: %w", o.Spec, err)
	}
	m.vm = vm
	if kind, _ := vm.AllocatorStats(); kind == vram.AsyncPool {
		return nil, errors.Join(fmt.Errorf("vram: open %q: the async allocator orders reuse on the allocating stream, which Numba's and CuPy's hooks do not name; choose pool or direct in %s: %w",
			o.Spec, vram.AllocConfEnv, device.ErrInvalidValue), vm.Close())
	}
	m.al = vm.Allocator()
	s, err := dev.NewStream()
	if err != nil {
		return nil, errors.Join(fmt.Errorf("vram: open %q: the stream for unordered allocations: %w", o.Spec, err), vm.Close())
	}
	m.unordered = s
	return m, nil
}
