package capi

// A Manager: one device's vram manager as the C library serves it, over
// the device's memory account (package account: the allocator, its cap
// and a broker's lease).
//
// Locking, in this order: useMu (read: a call is using the manager;
// write: Close), then the account's own, then mu, which protects the
// books. Nothing holding mu calls the device or the account.

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/vramkit/vram"
	"github.com/vramkit/vram/account"
	"github.com/vramkit/vram/device"
	"github.com/vramkit/vram/internal/units"
)

// Source is the framework an allocation came through. Its values are
// the C header's enum vram_source.
type Source uint8

// The sources, in vram.h's order.
const (
	SourceC Source = iota
	SourceTorch
	SourceCuPy
	SourceNumba
	NumSources
)

var sourceNames = [NumSources]string{SourceC: "c", SourceTorch: "torch", SourceCuPy: "cupy", SourceNumba: "numba"}

// String is "c", "torch", "cupy" or "numba".
func (s Source) String() string {
	if s < NumSources {
		return sourceNames[s]
	}
	return fmt.Sprintf("source(%d)", uint8(s))
}

// ParseSource checks a source number from C.
func ParseSource(n int) (Source, error) {
	if n < 0 || n >= int(NumSources) {
		return 0, fmt.Errorf("vram: source %d: want 0 (c) to %d (%s): %w", n, NumSources-1, Source(NumSources-1), device.ErrInvalidValue)
	}
	return Source(n), nil
}

// Unordered is the stream handle of an allocation or free whose caller
// names no stream (the package doc says how it is ordered).
const Unordered = ^uintptr(0)

// liveAlloc is what the manager knows of a pointer it handed out.
type liveAlloc struct {
	size uint64 // bytes asked for
	src  Source
}

// Manager is one device's vram manager as the C library serves it: its
// allocations by pointer, each framework's books, and the streams of the
// programs that call in. Safe for concurrent use.
type Manager struct {
	handle    int64 // set by Registry.Open before the manager is shared
	spec      string
	ordinal   int
	dev       device.Device
	vm        *vram.Manager        // the client API's manager, whose account the allocator API shares
	acct      *account.Account     // vm's account: the allocator, its cap and the broker's lease; never swapped
	foreign   device.ForeignCaller // nil where the backend borrows no streams (the simulator)
	leased    bool                 // acct follows a broker's lease: allocations claim room under it first
	unordered device.Stream        // where allocations that name no stream are made

	useMu  sync.RWMutex // read: a call is using the manager; write: Close
	closed bool         // protected by useMu

	mu         sync.Mutex                // protects the fields below
	live       map[device.Ptr]liveAlloc  // pointers handed out
	books      [NumSources]Books         // per framework
	keyed      map[uintptr]device.Stream // simulator: stream key → its stream
	hookErrors uint64                    // hook calls that failed and could not say so (a free hook returns nothing)
	lastHook   string                    // the last such failure
	lastOOM    string                    // the manager's report at the last out of memory, "" if none
}

// Handle is the manager's handle, > 0.
func (m *Manager) Handle() int64 { return m.handle }

// Ordinal is the device ordinal the manager is open on.
func (m *Manager) Ordinal() int { return m.ordinal }

// Spec is the device spec the manager was opened with.
func (m *Manager) Spec() string { return m.spec }

// Manager is the vram manager behind m, which the client API registers
// its clients with.
func (m *Manager) Manager() *vram.Manager { return m.vm }

// Account is the device-memory account behind m: its vram manager's,
// which the allocator API allocates through.
func (m *Manager) Account() *account.Account { return m.acct }

// use marks a call in progress and makes the calling thread's driver
// state safe to change (keepThread); done undoes both.
func (m *Manager) use(op string) (done func(), err error) {
	m.useMu.RLock()
	if m.closed {
		m.useMu.RUnlock()
		return nil, fmt.Errorf("vram: %s: manager %d: %w", op, m.handle, ErrClosed)
	}
	restore, err := keepThread(m.dev)
	if err != nil {
		m.useMu.RUnlock()
		return nil, fmt.Errorf("vram: %s: %w", op, err)
	}
	return func() { restore(); m.useMu.RUnlock() }, nil
}

// keepThread is dev's KeepThread where it has one, else nothing to do.
func keepThread(dev device.Device) (restore func(), err error) {
	if fc, ok := dev.(device.ForeignCaller); ok {
		return fc.KeepThread()
	}
	return func() {}, nil
}

// Alloc allocates n > 0 bytes for src, ordered on the stream whose
// handle is h (Unordered: none named). An allocation past the cap is
// refused before the device is asked, with an error wrapping
// device.ErrOutOfMemory; OOMReport then has the manager's report at that
// moment.
func (m *Manager) Alloc(src Source, n uint64, h uintptr) (device.Ptr, error) {
	if n == 0 {
		return 0, fmt.Errorf("vram: alloc of 0 bytes for %s: %w", src, device.ErrInvalidValue)
	}
	if src >= NumSources {
		return 0, fmt.Errorf("vram: alloc for %v: %w", src, device.ErrInvalidValue)
	}
	done, err := m.use("alloc")
	if err != nil {
		return 0, err
	}
	defer done()
	s, err := m.allocStream(h)
	if err != nil {
		return 0, fmt.Errorf("vram: alloc of %s for %s: %w", units.Format(n), src, err)
	}
	p, err := m.leasedAlloc(n, s)
	m.mu.Lock()
	defer m.mu.Unlock()
	if err != nil {
		if errors.Is(err, device.ErrOutOfMemory) {
			m.books[src].OOMs++
		}
		return 0, fmt.Errorf("vram: alloc of %s for %s on %s: %w", units.Format(n), src, streamName(h), err)
	}
	m.live[p] = liveAlloc{size: n, src: src}
	m.books[src].alloc(n)
	return p, nil
}

// leasedAlloc allocates n bytes on s through the account, which claims
// room for them first under the broker's lease, if it has one
// (account.Account.Alloc): the broker bounds the wait by its reclaim
// deadline, leaseClaimTimeout bounds it here. A claim the broker cannot
// cover fails before the device is asked, with an error wrapping
// device.ErrOutOfMemory. Without a lease no context is made.
func (m *Manager) leasedAlloc(n uint64, s device.Stream) (device.Ptr, error) {
	if !m.leased {
		return m.acct.Alloc(context.Background(), n, s)
	}
	ctx, cancel := context.WithTimeout(context.Background(), leaseClaimTimeout)
	defer cancel()
	return m.acct.Alloc(ctx, n, s)
}

// leaseClaimTimeout bounds an allocation's wait for the broker's lease.
const leaseClaimTimeout = 2 * time.Minute

// Free returns p, last used on the stream whose handle is h (Unordered:
// none named), to the allocator. n is the size p was asked with, or 0 to
// skip that check. A pointer not live here, or a size that differs, is
// refused with ErrBadPointer and nothing changes.
func (m *Manager) Free(p device.Ptr, n uint64, h uintptr) error {
	done, err := m.use("free")
	if err != nil {
		return err
	}
	defer done()
	s, err := m.freeStream(h)
	if err != nil {
		return fmt.Errorf("vram: free of %v: %w", p, err)
	}
	m.mu.Lock()
	a, ok := m.live[p]
	switch {
	case !ok:
		m.mu.Unlock()
		return fmt.Errorf("vram: free of %v: not live in manager %d (never allocated here, or freed already): %w", p, m.handle, ErrBadPointer)
	case n != 0 && n != a.size:
		m.mu.Unlock()
		return fmt.Errorf("vram: free of %v with size %d: it was allocated with size %d (for %s): %w", p, n, a.size, a.src, ErrBadPointer)
	}
	delete(m.live, p)
	m.mu.Unlock()
	err = m.acct.Free(p, s)
	m.mu.Lock()
	defer m.mu.Unlock()
	if err != nil && !errors.Is(err, device.ErrInvalidated) {
		m.live[p] = a // the allocator kept it: so do the books
		return fmt.Errorf("vram: free of %v: %w", p, err)
	}
	m.books[a.src].free(a.size)
	if err != nil {
		return fmt.Errorf("vram: free of %v (taken back): %w", p, err)
	}
	return nil
}

// Trim returns the allocator's cached memory to the device (PyTorch's
// empty_cache, CuPy's free_all_blocks).
func (m *Manager) Trim() error {
	done, err := m.use("trim")
	if err != nil {
		return err
	}
	defer done()
	if err := m.acct.Trim(context.Background()); err != nil {
		return fmt.Errorf("vram: trim: %w", err)
	}
	return nil
}

// ResetPeaks sets the allocator's peaks and every source's to the
// current values.
func (m *Manager) ResetPeaks() error {
	done, err := m.use("reset peaks")
	if err != nil {
		return err
	}
	defer done()
	m.acct.ResetPeaks()
	m.mu.Lock()
	for i := range m.books {
		m.books[i].PeakInUse = m.books[i].InUse
	}
	m.mu.Unlock()
	return nil
}

// NoteHookError records a failure a hook could not report to its caller
// (a free hook returns nothing): it counts in Stats and shows in the
// report.
func (m *Manager) NoteHookError(err error) {
	m.mu.Lock()
	m.hookErrors++
	m.lastHook = clip(err.Error(), 500)
	m.mu.Unlock()
}

// noteOOM keeps the manager's report at an out of memory, with the
// frameworks' books (the observer runs on the failing call's goroutine,
// before it returns, holding no lock of m's).
func (m *Manager) noteOOM(r vram.ManagerReport) {
	s := m.report(r)
	m.mu.Lock()
	m.lastOOM = s
	m.mu.Unlock()
}

// closeIfIdle marks m closed, waiting for calls in progress, unless it has
// live allocations: then it returns ErrBusy and m stays open.
func (m *Manager) closeIfIdle() error {
	m.useMu.Lock()
	defer m.useMu.Unlock()
	if m.closed {
		return fmt.Errorf("vram: close manager %d: %w", m.handle, ErrClosed)
	}
	m.mu.Lock()
	n, bytes := len(m.live), uint64(0)
	for _, a := range m.live {
		bytes += a.size
	}
	m.mu.Unlock()
	if n > 0 {
		return fmt.Errorf("vram: close manager %d: %d allocations (%s) are still live; free them first: %w", m.handle, n, units.Format(bytes), ErrBusy)
	}
	m.closed = true
	return nil
}

// shut releases everything m made: its streams, the vram manager (and
// its account) and the device. Called once no call can use m.
func (m *Manager) shut() error {
	var errs []error
	for _, s := range m.keyed {
		errs = append(errs, s.Close())
	}
	if m.unordered != nil {
		errs = append(errs, m.unordered.Close())
	}
	errs = append(errs, m.vm.Close(), m.dev.Close())
	return errors.Join(errs...)
}

// clip shortens s to at most n bytes, marking the cut.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
