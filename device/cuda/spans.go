package cuda

import "sort"

// The backend keeps its own record of what it has handed out, because the
// driver's answer to a bad address can be a crash or a sticky error that
// ruins the context: a copy, memset, free or kernel argument is checked
// against these records first, so a pointer from before a Reset returns
// device.ErrInvalidated, a freed one device.ErrUseAfterFree or
// device.ErrDoubleFree, and a range past its allocation
// device.ErrOutOfBounds, without the driver ever seeing it.

// spanKind says what made a span.
type spanKind uint8

const (
	kindMalloc   spanKind = iota + 1 // cuMemAlloc
	kindAsync                        // cuMemAllocAsync
	kindMapped                       // the device address of a mapped pinned host buffer
	kindHost                         // a pinned host buffer, by its host address
	kindVM                           // mapped virtual memory with access granted (vmm.go)
	kindReserved                     // an address reservation (vmm.go's records)
	kindMapping                      // one mapping of physical memory (vmm.go's records)
)

func (k spanKind) String() string {
	switch k {
	case kindMalloc:
		return "Malloc"
	case kindAsync:
		return "MallocAsync"
	case kindMapped:
		return "mapped host buffer"
	case kindHost:
		return "pinned host buffer"
	case kindVM:
		return "mapped virtual memory"
	case kindReserved:
		return "address reservation"
	case kindMapping:
		return "mapping"
	}
	return "unknown"
}

// span is one allocation: [base, base+size).
type span struct {
	base, size uint64
	kind       spanKind
}

func (s span) end() uint64 { return s.base + s.size }

// spanSet is a set of non-overlapping spans sorted by base. Lookups are
// O(log n); inserts and removals move the tail (O(n)), which is cheap for
// the few thousand allocations a device holds. Not safe for concurrent use.
type spanSet struct{ s []span }

// search returns the index of the first span whose base is > addr.
func (ss *spanSet) search(addr uint64) int {
	return sort.Search(len(ss.s), func(i int) bool { return ss.s[i].base > addr })
}

// insert adds sp, first dropping any spans it overlaps (an address range
// the driver hands out again replaces what was recorded there before).
func (ss *spanSet) insert(sp span) {
	ss.removeOverlapping(sp.base, sp.size)
	i := ss.search(sp.base)
	ss.s = append(ss.s, span{})
	copy(ss.s[i+1:], ss.s[i:])
	ss.s[i] = sp
}

// containing returns the span that holds addr.
func (ss *spanSet) containing(addr uint64) (span, bool) {
	i := ss.search(addr)
	if i == 0 {
		return span{}, false
	}
	sp := ss.s[i-1]
	if addr < sp.end() || (sp.size == 0 && addr == sp.base) {
		return sp, true
	}
	return span{}, false
}

// get returns the span that starts exactly at base.
func (ss *spanSet) get(base uint64) (span, bool) {
	sp, ok := ss.containing(base)
	if !ok || sp.base != base {
		return span{}, false
	}
	return sp, true
}

// remove drops the span starting at base and reports whether there was one.
func (ss *spanSet) remove(base uint64) (span, bool) {
	i := ss.search(base)
	if i == 0 || ss.s[i-1].base != base {
		return span{}, false
	}
	sp := ss.s[i-1]
	ss.s = append(ss.s[:i-1], ss.s[i:]...)
	return sp, true
}

// removeOverlapping drops every span that overlaps [base, base+size).
func (ss *spanSet) removeOverlapping(base, size uint64) {
	if size == 0 {
		size = 1
	}
	end := base + size
	lo := ss.search(base)
	if lo > 0 && ss.s[lo-1].end() > base {
		lo--
	}
	hi := lo
	for hi < len(ss.s) && ss.s[hi].base < end {
		hi++
	}
	if hi > lo {
		ss.s = append(ss.s[:lo], ss.s[hi:]...)
	}
}

// all returns the spans in address order (the caller must not keep it
// across changes).
func (ss *spanSet) all() []span { return ss.s }

func (ss *spanSet) len() int { return len(ss.s) }

func (ss *spanSet) clear() { ss.s = ss.s[:0] }

// moveAll adds every span of from to ss and empties from.
func (ss *spanSet) moveAll(from *spanSet) {
	for _, sp := range from.s {
		ss.insert(sp)
	}
	from.clear()
}

// freedSet remembers the most recent frees, up to a bound, so a second free
// or a use of a freed pointer can be told from a pointer that was never
// allocated. Not safe for concurrent use.
type freedSet struct {
	spans spanSet
	order []uint64 // bases in the order they were freed, oldest first
	max   int
}

func (f *freedSet) add(sp span) {
	if f.max == 0 {
		f.max = 4096
	}
	f.spans.insert(sp)
	f.order = append(f.order, sp.base)
	for len(f.order) > f.max {
		f.spans.remove(f.order[0])
		f.order = f.order[1:]
	}
}

// forget drops records overlapping a range the driver handed out again.
func (f *freedSet) forget(base, size uint64) { f.spans.removeOverlapping(base, size) }

func (f *freedSet) containing(addr uint64) (span, bool) { return f.spans.containing(addr) }

func (f *freedSet) clear() {
	f.spans.clear()
	f.order = f.order[:0]
}
