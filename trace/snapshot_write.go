package trace

// Writing PyTorch memory snapshots.
//
// A History is what PyTorch's memory visualizer (pytorch.org/memory_viz,
// torch/cuda/_memory_viz.py) draws: the segments held at the end, each
// with its blocks, and the trace entries that led there. WriteSnapshot
// pickles it as torch.cuda.memory._dump_snapshot would (a dict with
// "segments" and "device_traces", one device). RecordReplay makes one
// from a replay: the allocator's calls become "alloc", "free_requested"
// and "free_completed" entries, its device allocations and frees
// "segment_alloc" and "segment_free", its page maps and unmaps
// "segment_map" and "segment_unmap", and what it holds at the end of the
// log (before it is closed) the segments.

import (
	"bufio"
	"fmt"
	"io"
	"slices"
	"sort"
	"sync"
	"time"

	ogorek "github.com/kisielk/og-rek"

	"github.com/vramkit/vram/alloc"
	"github.com/vramkit/vram/device"
	"github.com/vramkit/vram/internal/userfile"
)

// SnapshotEntry is one trace entry of a History. Action is PyTorch's:
// "alloc", "free_requested", "free_completed", "segment_alloc",
// "segment_free", "segment_map" or "segment_unmap".
type SnapshotEntry struct {
	Action string
	Addr   uint64 // the block's or segment's address
	Size   uint64 // bytes
	Stream uint64 // stream handle; 0 is the default stream
	TimeUS int64  // microseconds from the start of the recording
}

// SnapshotBlock is a block of a segment: allocated, or free (PyTorch's
// "active_allocated" and "inactive").
type SnapshotBlock struct {
	Addr, Size uint64
	Allocated  bool
}

// SnapshotSegment is a device allocation held at the end of a History,
// with its blocks in address order, covering it.
type SnapshotSegment struct {
	Addr, Size, Stream uint64
	Blocks             []SnapshotBlock
	Expandable         bool // mapped pages of an expandable segment
}

// History is an allocation history to write as a PyTorch snapshot.
type History struct {
	Segments []SnapshotSegment // held at the end, in address order
	Entries  []SnapshotEntry   // in order
}

// expandable reports whether h maps pages (an expandable allocator's).
func (h History) expandable() bool {
	for _, s := range h.Segments {
		if s.Expandable {
			return true
		}
	}
	for _, e := range h.Entries {
		if e.Action == "segment_map" {
			return true
		}
	}
	return false
}

// WriteSnapshotFile writes h as a PyTorch memory snapshot to the named
// file, whole or not at all: it is written beside path and renamed into
// place once complete, so a failed write leaves what was at path as it
// was. A path that exists and is not a regular file is refused.
func WriteSnapshotFile(path string, h History) error {
	if err := userfile.Write(path, userfile.Options{}, func(w io.Writer) error { return WriteSnapshot(w, h) }); err != nil {
		return fmt.Errorf("trace: %w", err)
	}
	return nil
}

// WriteSnapshot writes h as a PyTorch memory snapshot: a protocol-2
// pickle of the dict torch.cuda.memory._dump_snapshot writes, which
// Python's pickle.load and PyTorch's memory visualizer read.
func WriteSnapshot(w io.Writer, h History) error {
	segs := make([]any, 0, len(h.Segments))
	for _, s := range h.Segments {
		segs = append(segs, segmentDict(s))
	}
	entries := make([]any, 0, len(h.Entries))
	for _, e := range h.Entries {
		entries = append(entries, map[string]any{
			"action": e.Action, "addr": int64(e.Addr), "size": int64(e.Size),
			"stream": int64(e.Stream), "time_us": e.TimeUS, "frames": []any{},
		})
	}
	top := map[string]any{
		"segments":             segs,
		"device_traces":        []any{entries},
		"allocator_settings":   map[string]any{"expandable_segments": h.expandable()},
		"external_annotations": []any{},
	}
	bw := bufio.NewWriter(w)
	enc := ogorek.NewEncoderWithConfig(bw, &ogorek.EncoderConfig{Protocol: 2, StrictUnicode: true})
	if err := enc.Encode(top); err != nil {
		return fmt.Errorf("trace: write snapshot: %w", err)
	}
	if err := bw.Flush(); err != nil {
		return fmt.Errorf("trace: write snapshot: %w", err)
	}
	return nil
}

// segmentDict is a segment as _dump_snapshot writes it.
func segmentDict(s SnapshotSegment) map[string]any {
	var allocated int64
	blocks := make([]any, 0, len(s.Blocks))
	for _, b := range s.Blocks {
		state := "inactive"
		var req int64
		if b.Allocated {
			state, req = "active_allocated", int64(b.Size)
			allocated += int64(b.Size)
		}
		blocks = append(blocks, map[string]any{
			"address": int64(b.Addr), "size": int64(b.Size), "requested_size": req,
			"state": state, "frames": []any{},
		})
	}
	kind := "large"
	if s.Size <= 1<<20 {
		kind = "small"
	}
	return map[string]any{
		"device": int64(0), "address": int64(s.Addr), "total_size": int64(s.Size),
		"allocated_size": allocated, "active_size": allocated, "requested_size": allocated,
		"stream": int64(s.Stream), "segment_type": kind, "segment_pool_id": ogorek.Tuple{int64(0), int64(0)},
		"is_expandable": s.Expandable, "frames": []any{}, "blocks": blocks,
	}
}

// RecordReplay is ReplayOn that also records the replay as a
// History: what the allocator newAlloc makes did, as PyTorch's allocator
// history would show it. The allocator sees a device that records its
// synchronous allocations (at the device's granularity, as the device
// reserves them), its stream-ordered ones and its page mappings (as an
// expandable segment's "segment_map" and "segment_unmap", snapshot_vm.go);
// other optional abilities of the simulator (generations, sub-allocation
// checks) are hidden from it.
func RecordReplay(events []Event, newDev DeviceFactory, newAlloc Factory, opts Options) (Result, History, error) {
	rec := &recorder{start: time.Now(), segs: map[uint64]segInfo{}, blocks: map[uint64]uint64{}}
	res, err := ReplayOn(events, newDev, func(dev device.Device) (alloc.Allocator, error) {
		a, err := newAlloc(recordDevice(dev, rec))
		if err != nil {
			return nil, err
		}
		return &recAllocator{up: a, rec: rec}, nil
	}, opts)
	return res, rec.history, err
}

// segInfo is a live device allocation, or a mapping of pages.
type segInfo struct {
	size, stream uint64
	mapped       bool // a mapping (part of an expandable segment)
}

// recorder collects a History.
type recorder struct {
	start time.Time

	mu      sync.Mutex         // protects the fields below
	stream  uint64             // stream of the allocation being made
	segs    map[uint64]segInfo // live device allocations (and the stream-ordered pool's reservations)
	blocks  map[uint64]uint64  // live allocator blocks → size
	done    bool               // the end state is taken; record nothing more
	history History

	poolReserved uint64 // the stream-ordered pool's reservation at the last reading
}

func (r *recorder) addLocked(action string, addr, size, stream uint64) {
	r.history.Entries = append(r.history.Entries, SnapshotEntry{Action: action, Addr: addr, Size: size,
		Stream: stream, TimeUS: time.Since(r.start).Microseconds()})
}

func (r *recorder) segment(p device.Ptr, n uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.done {
		return
	}
	r.segs[uint64(p)] = segInfo{size: n, stream: r.stream}
	r.addLocked("segment_alloc", uint64(p), n, r.stream)
}

func (r *recorder) segmentFree(p device.Ptr) {
	r.mu.Lock()
	defer r.mu.Unlock()
	s, ok := r.segs[uint64(p)]
	if r.done || !ok {
		return
	}
	delete(r.segs, uint64(p))
	r.addLocked("segment_free", uint64(p), s.size, s.stream)
}

// poolUsage records the pool's segments that came and went, when the
// reservation read is not the last one seen.
func (r *recorder) poolUsage(reserved uint64, ps device.PoolSegmenter) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.done || reserved == r.poolReserved {
		return
	}
	r.poolReserved = reserved
	now := map[uint64]uint64{}
	for _, seg := range ps.PoolSegments() {
		now[uint64(seg.Addr)] = seg.Size
	}
	gone := make([]uint64, 0)
	for a, s := range r.segs {
		if !s.mapped && now[a] != s.size {
			gone = append(gone, a)
		}
	}
	slices.Sort(gone)
	for _, a := range gone {
		r.addLocked("segment_free", a, r.segs[a].size, r.segs[a].stream)
		delete(r.segs, a)
	}
	came := make([]uint64, 0)
	for a := range now {
		if _, ok := r.segs[a]; !ok {
			came = append(came, a)
		}
	}
	slices.Sort(came)
	for _, a := range came {
		r.segs[a] = segInfo{size: now[a], stream: r.stream}
		r.addLocked("segment_alloc", a, now[a], r.stream)
	}
}

// finish takes the end state: the live device allocations as segments,
// each cut into its live blocks and the free gaps between them.
func (r *recorder) finish() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.done {
		return
	}
	r.done = true
	bases := make([]uint64, 0, len(r.segs))
	for b := range r.segs {
		bases = append(bases, b)
	}
	slices.Sort(bases)
	bases = joinMapped(bases, r.segs)
	addrs := make([]uint64, 0, len(r.blocks))
	for a := range r.blocks {
		addrs = append(addrs, a)
	}
	slices.Sort(addrs)
	for _, base := range bases {
		s := r.segs[base]
		seg := SnapshotSegment{Addr: base, Size: s.size, Stream: s.stream, Expandable: s.mapped}
		at := base
		i := sort.Search(len(addrs), func(i int) bool { return addrs[i] >= base })
		for ; i < len(addrs) && addrs[i] < base+s.size; i++ {
			a, n := addrs[i], r.blocks[addrs[i]]
			if a > at {
				seg.Blocks = append(seg.Blocks, SnapshotBlock{Addr: at, Size: a - at})
			}
			seg.Blocks = append(seg.Blocks, SnapshotBlock{Addr: a, Size: n, Allocated: true})
			at = a + n
		}
		if end := base + s.size; at < end {
			seg.Blocks = append(seg.Blocks, SnapshotBlock{Addr: at, Size: end - at})
		}
		r.history.Segments = append(r.history.Segments, seg)
	}
}

// recDevice records a device's synchronous allocations as segments.
type recDevice struct {
	device.Device
	rec *recorder
}

// Malloc records a segment of what the device reserves: n rounded up to
// its granularity.
func (d *recDevice) Malloc(n uint64) (device.Ptr, error) {
	p, err := d.Device.Malloc(n)
	if err == nil {
		if g := d.Info().Granularity; g > 1 {
			n = (n + g - 1) / g * g
		}
		d.rec.segment(p, n)
	}
	return p, err
}

func (d *recDevice) Free(p device.Ptr) error {
	err := d.Device.Free(p)
	if err == nil {
		d.rec.segmentFree(p)
	}
	return err
}

// recAsyncDevice also records the stream-ordered pool's reservations as
// segments: what an allocator over the pool (alloc.AsyncPool) counts as
// its device allocations and frees, and its Reserved. The allocator reads
// the reservation (PoolUsage) after each allocation and in Stats, Trim
// and Close; at each such reading that finds it changed, the recorder
// lists the pool's segments (the simulator states them, PoolSegments) and
// records those that came and went, so the snapshot shows what the
// allocator saw.
type recAsyncDevice struct {
	recDevice
	async device.AsyncAllocator
}

func (d *recAsyncDevice) MallocAsync(n uint64, s device.Stream) (device.Ptr, error) {
	return d.async.MallocAsync(n, s)
}

func (d *recAsyncDevice) FreeAsync(p device.Ptr, s device.Stream) error {
	return d.async.FreeAsync(p, s)
}

func (d *recAsyncDevice) SetReleaseThreshold(n uint64) error { return d.async.SetReleaseThreshold(n) }
func (d *recAsyncDevice) TrimPool(keep uint64) error         { return d.async.TrimPool(keep) }

// PoolUsage reads the reservation and, when it changed since the last
// reading, records the pool's segments that came and went.
func (d *recAsyncDevice) PoolUsage() (reserved, used uint64, err error) {
	reserved, used, err = d.async.PoolUsage()
	if ps, ok := d.async.(device.PoolSegmenter); ok && err == nil {
		d.rec.poolUsage(reserved, ps)
	}
	return reserved, used, err
}

// recAllocator records an allocator's calls; Close takes the end state
// before closing it.
type recAllocator struct {
	up  alloc.Allocator
	rec *recorder
}

func (a *recAllocator) Alloc(n uint64, s device.Stream) (device.Ptr, error) {
	r := a.rec
	r.mu.Lock()
	r.stream = uint64(s.Handle())
	r.mu.Unlock()
	p, err := a.up.Alloc(n, s)
	if err != nil {
		return p, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.done {
		r.blocks[uint64(p)] = n
		r.addLocked("alloc", uint64(p), n, uint64(s.Handle()))
	}
	return p, nil
}

func (a *recAllocator) Free(p device.Ptr, s device.Stream) error {
	if err := a.up.Free(p, s); err != nil {
		return err
	}
	r := a.rec
	r.mu.Lock()
	defer r.mu.Unlock()
	if n, ok := r.blocks[uint64(p)]; ok && !r.done {
		delete(r.blocks, uint64(p))
		r.addLocked("free_requested", uint64(p), n, uint64(s.Handle()))
		r.addLocked("free_completed", uint64(p), n, uint64(s.Handle()))
	}
	return nil
}

func (a *recAllocator) Stats() alloc.Stats { return a.up.Stats() }
func (a *recAllocator) Trim() error        { return a.up.Trim() }

// ResetPeaks resets the allocator's peaks, when it can.
func (a *recAllocator) ResetPeaks() {
	if r, ok := a.up.(alloc.PeakResetter); ok {
		r.ResetPeaks()
	}
}

func (a *recAllocator) Close() error {
	a.rec.finish()
	return a.up.Close()
}
