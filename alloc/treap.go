package alloc

// An intrusive treap of free blocks keyed by (size, address): best fit is
// one descent (lowerBound). Invariants: keys ascend in order; a parent's
// priority is at least its children's; n and bytes count the blocks held.
// Not safe for concurrent use: the owning core's lock protects it.

// treap is an intrusive treap of free blocks keyed by (size, addr).
type treap struct {
	root  *block
	n     int    // blocks
	bytes uint64 // sum of sizes
}

func keyLess(a, b *block) bool {
	return a.size < b.size || (a.size == b.size && a.addr < b.addr)
}

func (t *treap) insert(b *block) {
	p := &t.root
	for *p != nil && (*p).prio >= b.prio {
		if keyLess(b, *p) {
			p = &(*p).left
		} else {
			p = &(*p).right
		}
	}
	// Split the subtree at *p around b's key.
	cur := *p
	l, r := &b.left, &b.right
	for cur != nil {
		if keyLess(cur, b) {
			*l = cur
			l = &cur.right
			cur = cur.right
		} else {
			*r = cur
			r = &cur.left
			cur = cur.left
		}
	}
	*l, *r = nil, nil
	*p = b
	t.n++
	t.bytes += b.size
}

func (t *treap) remove(b *block) {
	p := &t.root
	for *p != b {
		if keyLess(b, *p) {
			p = &(*p).left
		} else {
			p = &(*p).right
		}
	}
	// Merge b's children in its place.
	a, c := b.left, b.right
	for a != nil && c != nil {
		if a.prio > c.prio {
			*p = a
			p = &a.right
			a = a.right
		} else {
			*p = c
			p = &c.left
			c = c.left
		}
	}
	if a != nil {
		*p = a
	} else {
		*p = c
	}
	b.left, b.right = nil, nil
	t.n--
	t.bytes -= b.size
}

// lowerBound returns the smallest block of at least n bytes (lowest address
// among equals), or nil.
func (t *treap) lowerBound(n uint64) *block {
	var best *block
	for x := t.root; x != nil; {
		if x.size >= n {
			best = x
			x = x.left
		} else {
			x = x.right
		}
	}
	return best
}

// max returns the largest block, or nil.
func (t *treap) max() *block {
	x := t.root
	if x == nil {
		return nil
	}
	for x.right != nil {
		x = x.right
	}
	return x
}
