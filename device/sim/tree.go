package sim

// An ordered map keyed by a pair of uint64s, as a treap (a binary search
// tree kept balanced by random heap priorities).
//
// The simulator keeps every index it needs in one of these: live
// allocations and freed ones by address (floor queries find the allocation
// an interior pointer falls in), free address ranges by address with the
// largest free span of each subtree (first-fit at or after an address in
// O(log n)), and free async-pool blocks by (size, address) (best fit is a
// ceiling query). Nodes are recycled through a free list, so a steady
// stream of inserts and deletes allocates nothing.
//
// A tree is not safe for concurrent use; the device's mutex guards them.

import (
	"math"
	"math/bits"
)

type tnode[V any] struct {
	k1, k2  uint64 // key, compared as (k1, k2)
	span    uint64 // length of the range this node stands for (address trees)
	maxSpan uint64 // largest span in this subtree
	prio    uint32
	l, r    *tnode[V]
	v       V
}

type tree[V any] struct {
	root *tnode[V]
	pool *tnode[V] // recycled nodes, linked through r
	n    int
	seed uint64
	path []**tnode[V] // scratch for insert/delete, reused
}

func keyLess(a1, a2, b1, b2 uint64) bool { return a1 < b1 || (a1 == b1 && a2 < b2) }

func (t *tree[V]) rand() uint32 {
	if t.seed == 0 {
		t.seed = 0x9e3779b97f4a7c15
	}
	x := t.seed
	x ^= x << 13
	x ^= x >> 7
	x ^= x << 17
	t.seed = x
	return uint32(x >> 32)
}

func fix[V any](n *tnode[V]) {
	m := n.span
	if n.l != nil && n.l.maxSpan > m {
		m = n.l.maxSpan
	}
	if n.r != nil && n.r.maxSpan > m {
		m = n.r.maxSpan
	}
	n.maxSpan = m
}

// split divides n into the keys below (k1, k2) and the rest.
func split[V any](n *tnode[V], k1, k2 uint64) (lo, hi *tnode[V]) {
	if n == nil {
		return nil, nil
	}
	if keyLess(n.k1, n.k2, k1, k2) {
		a, b := split(n.r, k1, k2)
		n.r = a
		fix(n)
		return n, b
	}
	a, b := split(n.l, k1, k2)
	n.l = b
	fix(n)
	return a, n
}

// merge joins a and b, every key of a below every key of b.
func merge[V any](a, b *tnode[V]) *tnode[V] {
	if a == nil {
		return b
	}
	if b == nil {
		return a
	}
	if a.prio > b.prio {
		a.r = merge(a.r, b)
		fix(a)
		return a
	}
	b.l = merge(a, b.l)
	fix(b)
	return b
}

func (t *tree[V]) newNode() *tnode[V] {
	if n := t.pool; n != nil {
		t.pool = n.r
		n.r = nil
		return n
	}
	return new(tnode[V])
}

func (t *tree[V]) recycle(n *tnode[V]) {
	var zero V
	*n = tnode[V]{v: zero, r: t.pool}
	t.pool = n
}

func (t *tree[V]) fixPath() {
	for i := len(t.path) - 1; i >= 0; i-- {
		fix(*t.path[i])
	}
	t.path = t.path[:0]
}

// insert adds key (k1, k2) with span and value v. The key must be absent.
func (t *tree[V]) insert(k1, k2, span uint64, v V) {
	n := t.newNode()
	n.k1, n.k2, n.span, n.maxSpan, n.prio, n.v = k1, k2, span, span, t.rand(), v
	p := &t.root
	t.path = t.path[:0]
	for *p != nil && (*p).prio >= n.prio {
		t.path = append(t.path, p)
		if keyLess(k1, k2, (*p).k1, (*p).k2) {
			p = &(*p).l
		} else {
			p = &(*p).r
		}
	}
	n.l, n.r = split(*p, k1, k2)
	fix(n)
	*p = n
	t.fixPath()
	t.n++
}

// remove deletes key (k1, k2) and returns its value; ok is false when absent.
func (t *tree[V]) remove(k1, k2 uint64) (v V, ok bool) {
	p := &t.root
	t.path = t.path[:0]
	for *p != nil {
		n := *p
		if n.k1 == k1 && n.k2 == k2 {
			*p = merge(n.l, n.r)
			t.fixPath()
			v = n.v
			t.recycle(n)
			t.n--
			return v, true
		}
		t.path = append(t.path, p)
		if keyLess(k1, k2, n.k1, n.k2) {
			p = &n.l
		} else {
			p = &n.r
		}
	}
	t.path = t.path[:0]
	return v, false
}

// get finds key (k1, k2).
func (t *tree[V]) get(k1, k2 uint64) *tnode[V] {
	n := t.root
	for n != nil {
		if n.k1 == k1 && n.k2 == k2 {
			return n
		}
		if keyLess(k1, k2, n.k1, n.k2) {
			n = n.l
		} else {
			n = n.r
		}
	}
	return nil
}

// floor finds the largest key <= (k1, k2).
func (t *tree[V]) floor(k1, k2 uint64) *tnode[V] {
	var best *tnode[V]
	n := t.root
	for n != nil {
		if keyLess(k1, k2, n.k1, n.k2) {
			n = n.l
		} else {
			best = n
			n = n.r
		}
	}
	return best
}

// ceil finds the smallest key >= (k1, k2).
func (t *tree[V]) ceil(k1, k2 uint64) *tnode[V] {
	var best *tnode[V]
	n := t.root
	for n != nil {
		if keyLess(n.k1, n.k2, k1, k2) {
			n = n.r
		} else {
			best = n
			n = n.l
		}
	}
	return best
}

// fit finds the node with the smallest key whose k1 >= from and whose span
// is at least need.
func (t *tree[V]) fit(from, need uint64) *tnode[V] { return fitIn(t.root, from, need) }

func fitIn[V any](n *tnode[V], from, need uint64) *tnode[V] {
	for n != nil && n.maxSpan >= need {
		if n.k1 < from {
			n = n.r
			continue
		}
		if f := fitIn(n.l, from, need); f != nil {
			return f
		}
		if n.span >= need {
			return n
		}
		n = n.r
	}
	return nil
}

// overlapping calls fn for every node whose range [k1, k1+span) meets
// [lo, hi), in descending key order (so the nearest start at or below lo
// comes before those further down), until fn returns false. Subtrees whose
// ranges cannot reach lo are skipped by their largest span, so the cost is
// that of two descents plus the nodes it reports, plus the paths to
// nodes far below lo with spans long enough to maybe reach it.
func (t *tree[V]) overlapping(lo, hi uint64, fn func(n *tnode[V]) bool) {
	overlapIn(t.root, math.MaxUint64, lo, hi, fn)
}

// overlapIn walks n's subtree, whose keys all have k1 <= upper.
func overlapIn[V any](n *tnode[V], upper, lo, hi uint64, fn func(n *tnode[V]) bool) bool {
	for n != nil {
		if reach, c := bits.Add64(upper, n.maxSpan, 0); c == 0 && reach <= lo {
			return true // every range here ends at or before lo
		}
		if n.k1 < hi {
			if !overlapIn(n.r, upper, lo, hi, fn) {
				return false
			}
			if n.k1+n.span > lo && !fn(n) {
				return false
			}
		}
		upper = n.k1
		n = n.l
	}
	return true
}

// mayOverlap is a quick test for overlapping: false means no node's range
// meets [lo, hi), at the cost of one floor query. The nearest node
// starting below hi must miss lo, and no node further down may be long
// enough to reach it.
func (t *tree[V]) mayOverlap(lo, hi uint64) bool {
	if hi <= lo {
		return false
	}
	g := t.floor(hi-1, math.MaxUint64)
	switch {
	case g == nil:
		return false
	case g.k1 >= lo || g.k1+g.span > lo:
		return true
	}
	// Every other node starts at or below g.k1 < lo.
	return t.root.maxSpan > lo-g.k1
}

// each calls fn for every node in key order until fn returns false.
func (t *tree[V]) each(fn func(n *tnode[V]) bool) { eachIn(t.root, fn) }

func eachIn[V any](n *tnode[V], fn func(n *tnode[V]) bool) bool {
	for n != nil {
		if !eachIn(n.l, fn) {
			return false
		}
		if !fn(n) {
			return false
		}
		n = n.r
	}
	return true
}

// clear empties the tree, keeping nothing (the nodes go to the garbage
// collector, not the free list, so a reset device gives memory back).
func (t *tree[V]) clear() {
	t.root, t.pool, t.n = nil, nil, 0
}

func (t *tree[V]) len() int { return t.n }
