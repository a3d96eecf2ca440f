package trace

// Reading PyTorch memory snapshots.
//
// torch.cuda.memory._dump_snapshot pickles a dict: "segments" (the
// device segments PyTorch held at the dump, each with its "blocks") and
// "device_traces" (one list per device of the allocator's history:
// "alloc", "free_requested", "free_completed", "segment_alloc",
// "segment_free", ... with "addr", "size", "stream", "time_us").
// ReadSnapshot turns it into a self-contained allocation log:
//
//   - first the blocks live when recording began, allocated at time 0 in
//     address order: an address freed in the history before any alloc of
//     it (the free's size), and a block "active_allocated" at the dump
//     that the history never allocates (the block's size);
//   - then, in order, each "alloc" and each free of a live address
//     ("free_requested" where the snapshot has such entries, else
//     "free_completed", else the older "free"), at its time_us less the
//     first entry's, plus 1 µs, in seconds, so the history comes strictly
//     after the blocks at time 0.
//
// What PyTorch reserved is read from the segment entries, walked back
// from the segments at the dump: what it held when recording began, its
// peak, and how many segments it used.
//
// A snapshot is untrusted input, and what reading one may cost is
// bounded per byte of it: the pickle is decoded by decodePickle (pickle.go:
// only plain data, at most MaxPickleBytesPerByte bytes allocated per
// byte), and the walk that follows visits at most one segment, block or
// history entry per snapshotBytesPerItem bytes of the pickle, each kept in
// a few dozen bytes, so a pickle that refers to one list of blocks from
// every segment (its own bytes few, the blocks it names many) is refused
// instead of multiplied. Errors name a value by its type and a clipped
// rendering, never a whole value.

import (
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"sort"

	"github.com/vramkit/vram/internal/units"
)

// ErrSnapshot is wrapped by ReadSnapshot's errors on input that is not a
// PyTorch memory snapshot.
var ErrSnapshot = errors.New("not a PyTorch memory snapshot")

// PyTorchFigures are what PyTorch's own caching allocator did over a
// snapshot's history, on the real GPU. Bytes are bytes.
type PyTorchFigures struct {
	// PeakReserved is the most memory it held from the device.
	PeakReserved uint64
	// ReservedAtStart is what it held when recording began.
	ReservedAtStart uint64
	// PeakAllocated is the most bytes in allocated blocks by its own
	// accounting (after its rounding).
	PeakAllocated uint64
	// Segments is how many device segments it used: those held at the
	// dump plus those it freed during the history.
	Segments int
	// SegmentAllocs and SegmentFrees count its device allocations and
	// frees during the history.
	SegmentAllocs, SegmentFrees int
	// Expandable reports expandable segments (expandable_segments:True).
	Expandable bool
}

// Snapshot is a PyTorch memory snapshot read as an allocation log.
type Snapshot struct {
	// Events are the log: the blocks live at start, then the history.
	Events []Event
	// LiveAtStart is how many of Events are blocks live at start.
	LiveAtStart int
	// PyTorch is what PyTorch's allocator reserved.
	PyTorch PyTorchFigures
}

// IsSnapshot reports whether data, the first bytes of a file, begin a
// pickle of protocol 2 or later (what _dump_snapshot writes); an RMM CSV
// never does.
func IsSnapshot(prefix []byte) bool {
	return len(prefix) >= 2 && prefix[0] == 0x80 && prefix[1] >= 2 && prefix[1] <= 5
}

// ReadSnapshotFile reads the PyTorch memory snapshot in the named file.
func ReadSnapshotFile(path string) (*Snapshot, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("trace: %w", err)
	}
	defer f.Close()
	s, err := ReadSnapshot(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return s, nil
}

// snapshotBytesPerItem is the fewest bytes of pickle per segment, block
// or history entry a snapshot may have: each is a dict of its own, at
// least 6 bytes even with every key and value a memo reference.
const snapshotBytesPerItem = 4

// ReadSnapshot reads a PyTorch memory snapshot (a pickle made by
// torch.cuda.memory._dump_snapshot) as an allocation log. A snapshot
// whose segment and history sizes add up past MaxSize is refused, and so
// is one that costs more than the bound in the file overview.
func ReadSnapshot(r io.Reader) (*Snapshot, error) {
	v, n, err := decodePickle(r)
	if err != nil {
		return nil, fmt.Errorf("trace: decode the pickle (want one written by torch.cuda.memory._dump_snapshot): %w: %w", err, ErrSnapshot)
	}
	top, ok := v.(*pyDict)
	if !ok {
		return nil, fmt.Errorf("trace: the pickle holds %s, want the dict _dump_snapshot writes: %w", describe(v), ErrSnapshot)
	}
	w := &snapWalk{left: n / snapshotBytesPerItem, bytes: n}
	segs, err := listOf(top, "segments")
	if err != nil {
		return nil, err
	}
	devs, err := listOf(top, "device_traces")
	if err != nil {
		return nil, err
	}
	entries, err := historyOf(devs, w)
	if err != nil {
		return nil, err
	}
	if len(entries) == 0 {
		return nil, fmt.Errorf("trace: the snapshot has no allocation history (device_traces is empty): record it with torch.cuda.memory._record_memory_history() before the dump: %w", ErrSnapshot)
	}
	state, err := segmentsOf(segs, w)
	if err != nil {
		return nil, err
	}
	if err := checkSnapshotBytes(entries, state); err != nil {
		return nil, err
	}
	s := &Snapshot{}
	s.Events, s.LiveAtStart = snapshotEvents(entries, state)
	s.PyTorch = pytorchFigures(entries, state)
	return s, nil
}

// snapEntry is one entry of a snapshot's device_traces.
type snapEntry struct {
	action             string
	addr, size, stream uint64
	timeUS             int64
}

// snapBlock is one block of a segment at the dump.
type snapBlock struct {
	addr, size uint64
	state      string
}

// snapState is the segments at the dump.
type snapState struct {
	reserved   uint64 // sum of total_size (checkSnapshotBytes bounds it)
	allocated  uint64 // sum of allocated_size
	sizeSum    u128   // sum of total_size and allocated_size, unwrapped
	segments   int
	expandable bool
	blocks     []snapBlock
}

// snapWalk counts what the walk over a decoded snapshot may still visit.
type snapWalk struct {
	left  int64 // segments, blocks and entries still allowed
	bytes int64 // the pickle's size
}

// take counts n more items visited, refusing past the bound.
func (w *snapWalk) take(n int) error {
	if w.left -= int64(n); w.left < 0 {
		return fmt.Errorf("trace: the snapshot names more segments, blocks and history entries than one per %d of its %d bytes, "+
			"which only a pickle that refers to one list or dict from many places can do (PyTorch writes each once): %w",
			snapshotBytesPerItem, w.bytes, ErrSnapshot)
	}
	return nil
}

// listOf is top[key] as a list.
func listOf(m *pyDict, key string) ([]any, error) {
	v, ok := m.m[key]
	if !ok {
		return nil, fmt.Errorf("trace: the snapshot has no %q key: %w", key, ErrSnapshot)
	}
	l, ok := v.(*pyList)
	if !ok {
		return nil, fmt.Errorf("trace: the snapshot's %q is %s, want a list: %w", key, describe(v), ErrSnapshot)
	}
	return l.items, nil
}

// historyOf reads every device's trace entries, merged in time order
// (one device's entries keep their order).
func historyOf(devs []any, w *snapWalk) ([]snapEntry, error) {
	var all []snapEntry
	for d, dv := range devs {
		l, ok := dv.(*pyList)
		if !ok {
			return nil, fmt.Errorf("trace: device_traces[%d] is %s, want a list: %w", d, describe(dv), ErrSnapshot)
		}
		if err := w.take(len(l.items)); err != nil {
			return nil, err
		}
		for i, ev := range l.items {
			m, ok := ev.(*pyDict)
			if !ok {
				return nil, fmt.Errorf("trace: device_traces[%d][%d] is %s, want a dict: %w", d, i, describe(ev), ErrSnapshot)
			}
			e, err := entryOf(m)
			if err != nil {
				return nil, fmt.Errorf("trace: device_traces[%d][%d]: %w", d, i, err)
			}
			all = append(all, e)
		}
	}
	if len(devs) > 1 {
		sort.SliceStable(all, func(i, j int) bool { return all[i].timeUS < all[j].timeUS })
	}
	return all, nil
}

func entryOf(m *pyDict) (snapEntry, error) {
	var e snapEntry
	a, ok := m.m["action"].(string)
	if !ok {
		return e, fmt.Errorf("\"action\" is %s, want a string: %w", describe(m.m["action"]), ErrSnapshot)
	}
	e.action = a
	var err error
	if e.addr, err = uintOf(m, "addr"); err != nil {
		return e, err
	}
	if e.size, err = uintOf(m, "size"); err != nil {
		return e, err
	}
	if _, ok := m.m["stream"]; ok {
		if e.stream, err = uintOf(m, "stream"); err != nil {
			return e, err
		}
	}
	if _, ok := m.m["time_us"]; ok {
		t, err := uintOf(m, "time_us")
		if err != nil {
			return e, err
		}
		e.timeUS = int64(t)
	}
	return e, nil
}

// uintOf is m[key] as a non-negative integer below 2⁶³.
func uintOf(m *pyDict, key string) (uint64, error) {
	v, ok := m.m[key]
	if !ok {
		return 0, fmt.Errorf("no %q: %w", key, ErrSnapshot)
	}
	if n, ok := v.(int64); ok && n >= 0 {
		return uint64(n), nil
	}
	return 0, fmt.Errorf("%q is %s, want a non-negative integer: %w", key, describe(v), ErrSnapshot)
}

// segmentsOf reads the segments at the dump.
func segmentsOf(segs []any, w *snapWalk) (snapState, error) {
	var st snapState
	if err := w.take(len(segs)); err != nil {
		return st, err
	}
	for i, sv := range segs {
		m, ok := sv.(*pyDict)
		if !ok {
			return st, fmt.Errorf("trace: segments[%d] is %s, want a dict: %w", i, describe(sv), ErrSnapshot)
		}
		total, err := uintOf(m, "total_size")
		if err != nil {
			return st, fmt.Errorf("trace: segments[%d]: %w", i, err)
		}
		st.reserved += total
		st.sizeSum = st.sizeSum.add(total)
		st.segments++
		if _, ok := m.m["allocated_size"]; ok {
			n, err := uintOf(m, "allocated_size")
			if err != nil {
				return st, fmt.Errorf("trace: segments[%d]: %w", i, err)
			}
			st.allocated += n
			st.sizeSum = st.sizeSum.add(n)
		}
		if x, ok := m.m["is_expandable"].(bool); ok && x {
			st.expandable = true
		}
		blocks, err := blocksOf(m, w)
		if err != nil {
			return st, fmt.Errorf("trace: segments[%d]: %w", i, err)
		}
		for j, bv := range blocks {
			b, ok := bv.(*pyDict)
			if !ok {
				return st, fmt.Errorf("trace: segments[%d].blocks[%d] is %s, want a dict: %w", i, j, describe(bv), ErrSnapshot)
			}
			var sb snapBlock
			if sb.addr, err = uintOf(b, "address"); err != nil {
				return st, fmt.Errorf("trace: segments[%d].blocks[%d]: %w", i, j, err)
			}
			if sb.size, err = uintOf(b, "size"); err != nil {
				return st, fmt.Errorf("trace: segments[%d].blocks[%d]: %w", i, j, err)
			}
			sb.state, _ = b.m["state"].(string)
			st.blocks = append(st.blocks, sb)
		}
	}
	return st, nil
}

// blocksOf is a segment's "blocks" (none if it has no such key), counted
// against the walk's bound.
func blocksOf(m *pyDict, w *snapWalk) ([]any, error) {
	v, ok := m.m["blocks"]
	if !ok {
		return nil, nil
	}
	l, ok := v.(*pyList)
	if !ok {
		return nil, fmt.Errorf("\"blocks\" is %s, want a list: %w", describe(v), ErrSnapshot)
	}
	return l.items, w.take(len(l.items))
}

// checkSnapshotBytes refuses a snapshot whose sizes, the segments' total
// and allocated sizes and every entry's, add up past MaxSize: no device
// holds that much, and the walk back through the history (pytorchFigures,
// in int64) stays exact below it.
func checkSnapshotBytes(entries []snapEntry, st snapState) error {
	sum := st.sizeSum
	for _, e := range entries {
		sum = sum.add(e.size)
	}
	if sum.hi != 0 || sum.lo > MaxSize {
		return fmt.Errorf("trace: the snapshot's segment and history sizes add up to more than %s (trace.MaxSize, %d bytes), which no device holds: %w",
			units.Format(MaxSize), uint64(MaxSize), ErrSnapshot)
	}
	return nil
}

// freeAction is the entry that frees a block in this history.
func freeAction(entries []snapEntry) string {
	has := map[string]bool{}
	for _, e := range entries {
		has[e.action] = true
	}
	for _, a := range []string{"free_requested", "free_completed", "free"} {
		if has[a] {
			return a
		}
	}
	return "free_requested"
}

// snapshotEvents builds the log: blocks live at start, then the history.
func snapshotEvents(entries []snapEntry, st snapState) ([]Event, int) {
	free := freeAction(entries)
	allocated := make(map[uint64]bool, len(entries)/2)
	initial := make(map[uint64]uint64)
	for _, e := range entries {
		switch e.action {
		case "alloc":
			allocated[e.addr] = true
		case free:
			if _, ok := initial[e.addr]; !ok && !allocated[e.addr] {
				initial[e.addr] = e.size
			}
		}
	}
	for _, b := range st.blocks {
		if _, ok := initial[b.addr]; !ok && b.state == "active_allocated" && !allocated[b.addr] {
			initial[b.addr] = b.size
		}
	}
	addrs := make([]uint64, 0, len(initial))
	for a := range initial {
		addrs = append(addrs, a)
	}
	slices.Sort(addrs)
	events := make([]Event, 0, len(addrs)+len(entries))
	live := make(map[uint64]bool, len(addrs))
	for _, a := range addrs {
		events = append(events, Event{Action: Allocate, Pointer: a, Size: initial[a]})
		live[a] = true
	}
	t0 := entries[0].timeUS
	for _, e := range entries {
		t := float64(e.timeUS-t0)/1e6 + 1e-6
		switch e.action {
		case "alloc":
			live[e.addr] = true
			events = append(events, Event{Time: t, Action: Allocate, Pointer: e.addr, Size: e.size, Stream: e.stream})
		case free:
			if live[e.addr] {
				delete(live, e.addr)
				events = append(events, Event{Time: t, Action: Free, Pointer: e.addr, Size: e.size, Stream: e.stream})
			}
		}
	}
	return events, len(addrs)
}

// pytorchFigures walks the history back from the dump: reserved bytes
// through the segment entries, allocated bytes through alloc and
// free_completed entries (or the history's free entries).
func pytorchFigures(entries []snapEntry, st snapState) PyTorchFigures {
	f := PyTorchFigures{Expandable: st.expandable}
	completed := "free_completed"
	if freeAction(entries) == "free" {
		completed = "free"
	}
	res, allocd := int64(st.reserved), int64(st.allocated)
	peakRes, peakAlloc := res, allocd
	for i := len(entries) - 1; i >= 0; i-- {
		e := entries[i]
		switch e.action {
		case "segment_alloc", "segment_map":
			res -= int64(e.size)
			if e.action == "segment_alloc" {
				f.SegmentAllocs++
			}
		case "segment_free", "segment_unmap":
			res += int64(e.size)
			if e.action == "segment_free" {
				f.SegmentFrees++
			}
		case "alloc":
			allocd -= int64(e.size)
		case completed:
			allocd += int64(e.size)
		}
		peakRes = max(peakRes, res)
		peakAlloc = max(peakAlloc, allocd)
	}
	f.PeakReserved = uint64(max(peakRes, 0))
	f.ReservedAtStart = uint64(max(res, 0))
	f.PeakAllocated = uint64(max(peakAlloc, 0))
	f.Segments = st.segments + f.SegmentFrees
	return f
}
