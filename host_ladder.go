package vram

// The host ladder: where a host array's memory comes from when the
// caller lets the manager choose (HostMemory.Alloc with no Rung).
//
//  1. Pinned, while the pinned bytes in use (arrays and staging buffers)
//     stay under the pinned limit (HostOptions.PinnedLimit, by default
//     DefaultPinnedFraction of the host's RAM) and the host limit allows.
//  2. Pageable (Go memory), while the host limit (HostOptions.Limit) and
//     the RAM the host has available (Linux's MemAvailable, less a
//     reserve of RAM/16) allow.
//  3. File-backed: a memory-mapped .npy file in the spill directory
//     (HostOptions.SpillDir, else $VRAM_SPILL_DIR, else the system's
//     temporary directory), removed when the array is freed unless the
//     caller keeps it. To the device it is pageable memory: copies and
//     the chunk pipeline stage it through pinned buffers.
//
// The host's RAM and what it has available are the process's
// (internal/meminfo): where its cgroup's memory limit (a pod's, a Slurm
// job's) is lower, they are that limit and what it leaves.
//
// Every host array, forced or chosen, is counted (HostStats) while it
// lives, and freeing it takes exactly its bytes off its rung's count.
// A forced rung is counted but never refused for the limits.

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sync"

	"github.com/vramkit/vram/device"
	"github.com/vramkit/vram/internal/mapfile"
	"github.com/vramkit/vram/internal/meminfo"
	"github.com/vramkit/vram/internal/units"
	"github.com/vramkit/vram/npy"
)

// DefaultPinnedFraction is the share of the host's RAM the ladder pins at
// most unless HostOptions.PinnedLimit says otherwise (where the RAM is
// unknown, 1 GiB).
const DefaultPinnedFraction = 0.25

// SpillDirEnv names the environment variable that sets the spill
// directory when HostOptions.SpillDir is empty.
const SpillDirEnv = "VRAM_SPILL_DIR"

// HostOptions configures the manager's host memory (WithHostOptions). A
// plain value; the zero value means the defaults.
type HostOptions struct {
	// PinnedLimit caps the pinned bytes the ladder and the staging pool
	// take; 0 means DefaultPinnedFraction of the host's RAM.
	PinnedLimit uint64
	// Limit caps the host RAM the manager's host arrays and staging
	// buffers take in all (pinned and pageable; file-backed arrays are on
	// disk); past it the ladder spills to files. 0: no cap but the RAM
	// available.
	Limit uint64
	// SpillDir is where file-backed arrays go; "" means $VRAM_SPILL_DIR,
	// else os.TempDir().
	SpillDir string
}

// HostRung is a rung of the host ladder. A plain value.
type HostRung uint8

const (
	// RungAuto lets the ladder choose (HostMemory.Alloc).
	RungAuto HostRung = iota
	// RungPinned is page-locked memory.
	RungPinned
	// RungMapped is pinned memory the device can also address.
	RungMapped
	// RungPageable is ordinary Go memory.
	RungPageable
	// RungFile is a memory-mapped .npy file.
	RungFile
)

var rungNames = [...]string{"auto", "pinned", "mapped", "pageable", "file"}

func (r HostRung) String() string {
	if int(r) < len(rungNames) {
		return rungNames[r]
	}
	return fmt.Sprintf("HostRung(%d)", r)
}

// HostPlacement is where a host array's memory came from and why. A
// plain value.
type HostPlacement struct {
	Rung   HostRung
	Forced bool   // the caller chose the rung
	Reason string // why the ladder chose it, with the figures
	Path   string // RungFile: the .npy file
	Keep   bool   // RungFile: the file stays when the array is freed
}

// String is the rung, its file and why: "pinned: fits: …",
// "file /tmp/x.npy (kept): …".
func (p HostPlacement) String() string {
	s := p.Rung.String()
	if p.Path != "" {
		s += " " + p.Path
		if p.Keep {
			s += " (kept)"
		}
	}
	if p.Reason != "" {
		s += ": " + p.Reason
	}
	return s
}

// HostStats is the host memory a manager's host arrays and staging pool
// hold now, by rung. A plain value.
type HostStats struct {
	Pinned, Mapped, Pageable, File uint64 // host arrays, in bytes
	Staging                        uint64 // staging pool buffers (pinned), free or in use
	// PinnedCached is pinned memory freed arrays left in the pinned pool's
	// cache (alloc.PinnedPool) for the next pinned array; the ladder
	// trims it when it needs the room.
	PinnedCached       uint64
	PinnedLimit, Limit uint64 // the limits in force (Limit 0: none)
	SpillDir           string
}

// RAM is the host memory counted against HostOptions.Limit.
func (s HostStats) RAM() uint64 {
	return s.Pinned + s.Mapped + s.Pageable + s.Staging + s.PinnedCached
}

// HostArrayOptions says how HostMemory.Alloc makes an array. A plain value.
type HostArrayOptions struct {
	// Rung forces a rung; RungAuto (the zero value) lets the ladder choose.
	Rung HostRung
	// Like fills the array, as NewHostArray's like.
	Like any
	// Keep keeps a file-backed array's file when the array is freed.
	Keep bool
	// Name is the file's name stem in the spill directory ("" for
	// "vram"); a random part keeps names unique.
	Name string
}

// HostMemory is the manager's host side: host arrays placed on the
// ladder, .npy files mapped as arrays, what they hold, and the staging
// pool. Get it from Manager.Host; it is safe for concurrent use.
type HostMemory struct{ m *Manager }

// Host returns the manager's host side.
func (m *Manager) Host() HostMemory { return HostMemory{m} }

// Stats returns what the host arrays and the staging pool hold.
func (h HostMemory) Stats() HostStats { return h.m.host.stats() }

// Staging is the manager's staging pool (cubie's ChunkBufferPool).
func (h HostMemory) Staging() *StagingPool { return h.m.host.staging }

// Alloc makes a host array on the ladder; see Manager.allocHostArray.
func (h HostMemory) Alloc(shape []int, dtype DType, o HostArrayOptions) (*HostArray, error) {
	return h.m.allocHostArray(shape, dtype, o)
}

// Open maps an existing .npy file as a host array; see
// Manager.openHostArray.
func (h HostMemory) Open(path string, writable bool) (*HostArray, error) {
	return h.m.openHostArray(path, writable)
}

// allocHostArray (HostMemory.Alloc) makes a zeroed host array of shape and dtype on the rung
// o.Rung forces, or on the one the ladder chooses (see host_ladder.go's
// overview: pinned, pageable, file-backed), and logs the choice at debug
// level. Placement says which and why. Free it before the manager is
// closed (Close frees a pinned or file-backed array still live and names
// it in its error, ErrLiveHostArrays). A file-backed array's views must not be used after Free: its
// mapping is gone, and touching it faults. The limits are checked as
// each array is placed; a staging buffer made at the same moment may
// overshoot them by its size.
func (m *Manager) allocHostArray(shape []int, dtype DType, o HostArrayOptions) (*HostArray, error) {
	r := ArrayRequest{Shape: shape, DType: dtype, Memory: Pageable, Unchunkable: true}
	if err := r.Validate(); err != nil {
		return nil, fmt.Errorf("alloc host array: %w", err)
	}
	if o.Rung > RungFile {
		return nil, fmt.Errorf("alloc host array: rung %v: want auto, pinned, mapped, pageable or file: %w", o.Rung, ErrInvalidRequest)
	}
	if m.isClosed() {
		return nil, closedErr("alloc host array")
	}
	n, _ := elements(shape)
	place := HostPlacement{Rung: o.Rung, Forced: o.Rung != RungAuto, Keep: o.Keep, Reason: "forced by the caller"}
	// One choice at a time, so that two arrays never both take the last
	// room under a limit.
	m.host.placeMu.Lock()
	if !place.Forced {
		place.Rung, place.Reason = m.host.choose(n * dtype.Size())
	}
	h, err := m.placeHost(slices.Clone(shape), dtype, &place, o.Name)
	m.host.placeMu.Unlock()
	if err != nil {
		return nil, fmt.Errorf("alloc host array %v%v on the %v rung: %w", dtype, shape, place.Rung, err)
	}
	m.log.Debug("vram: host array placed", "shape", shape, "dtype", dtype.String(), "bytes", h.Bytes(),
		"rung", place.Rung.String(), "forced", place.Forced, "reason", place.Reason, "path", place.Path)
	if err := fill(h, o.Like); err != nil {
		return nil, errors.Join(fmt.Errorf("alloc host array: %w", err), h.Free())
	}
	return h, nil
}

// placeHost makes the array on place.Rung.
func (m *Manager) placeHost(shape []int, dtype DType, place *HostPlacement, name string) (*HostArray, error) {
	var mem MemoryType
	switch place.Rung {
	case RungFile:
		h, err := m.host.fileArray(shape, dtype, place, name)
		if err != nil {
			return nil, err
		}
		h.setLast(m.dev.DefaultStream())
		m.host.track(h)
		return h, nil
	case RungPinned:
		mem = Pinned
	case RungMapped:
		mem = Mapped
	default:
		mem = Pageable
	}
	h, err := m.newHost(shape, dtype, mem, "", m.dev.DefaultStream())
	if err != nil {
		return nil, err
	}
	h.place = place
	return h, nil
}

// openHostArray (HostMemory.Open) maps the existing .npy file path (C order, a dtype vram
// knows, little-endian) as a file-backed host array, writable when
// writable is true; a read-only array must not be written, nor copied
// into (the write faults). Freeing it unmaps the file and never removes
// it.
func (m *Manager) openHostArray(path string, writable bool) (*HostArray, error) {
	if m.isClosed() {
		return nil, closedErr("open host array")
	}
	open := npy.Open
	if writable {
		open = npy.OpenWrite
	}
	f, err := open(path)
	if err != nil {
		return nil, fmt.Errorf("open host array: %w", err)
	}
	hd := f.Header()
	dtype, ok := dtypeOfDescr(hd.Descr)
	if !ok || hd.Fortran {
		return nil, errors.Join(fmt.Errorf("open host array %s: %v: want a C-order array of %v: %w",
			path, hd, DTypes(), ErrNotSupported), f.Close())
	}
	place := &HostPlacement{Rung: RungFile, Forced: true, Reason: "opened from a file", Path: path, Keep: true}
	h, err := m.host.mapArray(f, slices.Clone(hd.Shape), dtype, place, writable)
	if err != nil {
		return nil, fmt.Errorf("open host array: %w", err)
	}
	h.setLast(m.dev.DefaultStream())
	m.host.track(h)
	return h, nil
}

// Placement says which rung of the host ladder the array is on and why.
// Arrays made by NewHostArray or a request are forced.
func (h *HostArray) Placement() HostPlacement {
	if h.place != nil {
		return *h.place
	}
	rung := map[MemoryType]HostRung{Pinned: RungPinned, Mapped: RungMapped, Pageable: RungPageable}[h.memory]
	return HostPlacement{Rung: rung, Forced: true, Reason: "forced by the caller"}
}

// npyDescr is dtype's NumPy type string (little-endian).
func npyDescr(d DType) string {
	return map[DType]string{Float64: "<f8", Float32: "<f4", Int32: "<i4", Int64: "<i8", Uint8: "|u1",
		Uint32: "<u4", Complex64: "<c8", Complex128: "<c16"}[d]
}

// dtypeOfDescr is the DType of a NumPy type string.
func dtypeOfDescr(s string) (DType, bool) {
	for _, d := range DTypes() {
		if npyDescr(d) == s || (len(s) == 3 && s[0] == '=' && npyDescr(d)[1:] == s[1:]) {
			return d, true
		}
	}
	return 0, false
}

// NPYDescr is the NumPy type string ('<f4', …) of d's little-endian
// form, as vram writes it in .npy headers.
func NPYDescr(d DType) string { return npyDescr(d) }

// hostCounts are the bytes held on each rung. Guarded by hostPool.mu.
type hostCounts struct {
	pinned, mapped, pageable, file uint64
}

// slot is the count of mem's rung (the file rung's when file is true).
func (c *hostCounts) slot(mem MemoryType, file bool) *uint64 {
	switch {
	case file:
		return &c.file
	case mem == Pinned:
		return &c.pinned
	case mem == Mapped:
		return &c.mapped
	}
	return &c.pageable
}

// hostLimits are the resolved options.
type hostLimits struct {
	pinned, limit uint64
	spill         string
}

func resolveHostOptions(o HostOptions) hostLimits {
	l := hostLimits{pinned: o.PinnedLimit, limit: o.Limit, spill: o.SpillDir}
	if l.pinned == 0 {
		if ram := meminfo.RAM(); ram > 0 {
			l.pinned = uint64(float64(ram) * DefaultPinnedFraction)
		} else {
			l.pinned = units.GiB
		}
	}
	if l.spill == "" {
		l.spill = os.Getenv(SpillDirEnv)
	}
	if l.spill == "" {
		l.spill = os.TempDir()
	}
	return l
}

// choose picks the rung for n bytes and says why.
func (h *hostPool) choose(n uint64) (HostRung, string) {
	s := h.stats()
	if (h.lim.limit > 0 && s.RAM()+n > h.lim.limit) || s.Pinned+s.Mapped+s.Staging+s.PinnedCached+n > h.lim.pinned {
		// Idle staging buffers and cached pinned buffers give way to
		// arrays.
		h.staging.trim()
		if h.pinned != nil && s.PinnedCached > 0 {
			_ = h.pinned.Trim()
		}
		s = h.stats()
	}
	ram := s.RAM()
	avail, known := h.avail()
	reserve := meminfo.RAM() / 16
	headroom := "unknown"
	fitsRAM := true
	if known {
		left := uint64(0)
		if avail > reserve {
			left = avail - reserve
		}
		headroom = units.Format(left)
		fitsRAM = n <= left
	}
	fitsLimit := h.lim.limit == 0 || ram+n <= h.lim.limit
	limit := "no host limit"
	if h.lim.limit > 0 {
		limit = fmt.Sprintf("%s of the host limit %s in use", units.Format(ram), units.Format(h.lim.limit))
	}
	pinnedUse := s.Pinned + s.Mapped + s.Staging + s.PinnedCached
	switch {
	case h.ha != nil && pinnedUse+n <= h.lim.pinned && fitsLimit && fitsRAM:
		return RungPinned, fmt.Sprintf("%s fits: %s of the pinned limit %s in use; %s; RAM headroom %s",
			units.Format(n), units.Format(pinnedUse), units.Format(h.lim.pinned), limit, headroom)
	case n <= pageableLimit() && fitsLimit && fitsRAM:
		why := fmt.Sprintf("over the pinned limit (%s of %s in use)", units.Format(pinnedUse), units.Format(h.lim.pinned))
		if h.ha == nil {
			why = "the device cannot pin host memory"
		}
		return RungPageable, fmt.Sprintf("%s: %s; %s; RAM headroom %s", units.Format(n), why, limit, headroom)
	}
	return RungFile, fmt.Sprintf("%s does not fit in RAM: %s; RAM headroom %s; spilled to %s",
		units.Format(n), limit, headroom, h.lim.spill)
}

// stats reads the counts. The staging pool's bytes are read first, with
// no lock of h held (the pool takes h.mu under its own lock).
func (h *hostPool) stats() HostStats {
	staging := h.staging.held()
	var cached uint64
	if h.pinned != nil {
		st := h.pinned.Stats()
		cached = st.Reserved - min(st.InUse, st.Reserved)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return HostStats{Pinned: h.n.pinned, Mapped: h.n.mapped, Pageable: h.n.pageable, File: h.n.file,
		Staging: staging, PinnedCached: cached, PinnedLimit: h.lim.pinned, Limit: h.lim.limit, SpillDir: h.lim.spill}
}

// count adds n bytes to a rung's count and returns the function that
// takes them off again, once.
func (h *hostPool) count(n uint64, mem MemoryType, file bool) func() {
	h.mu.Lock()
	*h.n.slot(mem, file) += n
	h.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			h.mu.Lock()
			*h.n.slot(mem, file) -= n
			h.mu.Unlock()
		})
	}
}

// fileArray makes a file-backed array: a new .npy file in the spill
// directory, mapped.
func (h *hostPool) fileArray(shape []int, dtype DType, place *HostPlacement, name string) (*HostArray, error) {
	if !mapfile.Supported {
		return nil, fmt.Errorf("file-backed host memory: %w", ErrNotSupported)
	}
	if name == "" {
		name = "vram"
	}
	tmp, err := os.CreateTemp(h.lim.spill, filepath.Base(name)+"-*.npy")
	if err != nil {
		return nil, fmt.Errorf("file-backed host memory in the spill directory %s (choose another with $%s, or the manager's spill directory): %w",
			h.lim.spill, SpillDirEnv, err)
	}
	path := tmp.Name()
	if err := tmp.Close(); err != nil {
		return nil, errors.Join(err, os.Remove(path))
	}
	f, err := npy.Create(path, npy.Header{Descr: npyDescr(dtype), Shape: shape}, 0o644)
	if err != nil {
		return nil, errors.Join(err, os.Remove(path))
	}
	if err := mapfile.Reserve(f.OS(), f.DataOffset()+f.DataBytes()); err != nil {
		return nil, errors.Join(fmt.Errorf("file-backed host memory: reserve %s of disk for %s in the spill directory %s "+
			"(free room there, or choose a roomier one with $%s, or the manager's spill directory): %w: %w",
			units.Format(uint64(f.DataOffset()+f.DataBytes())), path, h.lim.spill, SpillDirEnv, err, errHostOutOfMemory), f.Close(), os.Remove(path))
	}
	place.Path = path
	a, err := h.mapArray(f, shape, dtype, place, true)
	if err != nil {
		return nil, errors.Join(err, os.Remove(path))
	}
	return a, nil
}

// mapArray maps the data of the open .npy file f as a host array and
// takes f; freeing the array unmaps and closes it, and removes the file
// unless place.Keep.
func (h *hostPool) mapArray(f *npy.File, shape []int, dtype DType, place *HostPlacement, writable bool) (*HostArray, error) {
	off, n := f.DataOffset(), f.DataBytes()
	var whole, data []byte
	if n > 0 {
		if !mapfile.Supported {
			return nil, errors.Join(fmt.Errorf("map %s: memory-mapped files are not supported on %s: %w", f.OS().Name(), runtime.GOOS, ErrNotSupported), f.Close())
		}
		var err error
		whole, err = mapfile.Map(f.OS(), off+n, writable)
		if err != nil {
			return nil, errors.Join(err, f.Close())
		}
		data = whole[off : off+n : off+n]
	} else {
		data = []byte{}
	}
	uncount := h.count(uint64(n), Pageable, true)
	release := func(device.Stream) error {
		uncount()
		var errs []error
		if whole != nil {
			errs = append(errs, mapfile.Unmap(whole))
		}
		errs = append(errs, f.Close())
		if !place.Keep {
			errs = append(errs, os.Remove(place.Path))
		}
		return errors.Join(errs...)
	}
	return &HostArray{data: data, shape: shape, dtype: dtype, memory: Pageable, place: place, release: release}, nil
}
