package sim

import (
	"maps"
	"math/rand/v2"
	"slices"
	"testing"
)

// refEntry is the reference model's view of a tree node.
type refEntry struct{ k1, k2, span uint64 }

func refLess(a, b refEntry) int {
	switch {
	case keyLess(a.k1, a.k2, b.k1, b.k2):
		return -1
	case keyLess(b.k1, b.k2, a.k1, a.k2):
		return 1
	}
	return 0
}

// TestTreeAgainstReference drives the treap and a sorted slice with the
// same random operations and compares every answer.
func TestTreeAgainstReference(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	var tr tree[int]
	var ref []refEntry
	for i := range 20000 {
		k := refEntry{rng.Uint64N(500), rng.Uint64N(3), rng.Uint64N(1000)}
		at, found := slices.BinarySearchFunc(ref, k, refLess)
		switch op := rng.IntN(6); {
		case op < 2 && !found:
			tr.insert(k.k1, k.k2, k.span, i)
			ref = slices.Insert(ref, at, k)
		case op == 2 && found:
			if _, ok := tr.remove(k.k1, k.k2); !ok {
				t.Fatalf("remove(%v) missed a present key", k)
			}
			ref = slices.Delete(ref, at, at+1)
		case op == 3:
			n := tr.floor(k.k1, k.k2)
			var want *refEntry
			if found {
				want = &ref[at]
			} else if at > 0 {
				want = &ref[at-1]
			}
			if (n == nil) != (want == nil) || n != nil && (n.k1 != want.k1 || n.k2 != want.k2) {
				t.Fatalf("floor(%v) = %v, want %v", k, n, want)
			}
		case op == 4:
			n := tr.ceil(k.k1, k.k2)
			var want *refEntry
			if at < len(ref) {
				want = &ref[at]
			}
			if (n == nil) != (want == nil) || n != nil && (n.k1 != want.k1 || n.k2 != want.k2) {
				t.Fatalf("ceil(%v) = %v, want %v", k, n, want)
			}
		case op == 5:
			n := tr.fit(k.k1, k.span)
			var want *refEntry
			for j := range ref {
				if ref[j].k1 >= k.k1 && ref[j].span >= k.span {
					want = &ref[j]
					break
				}
			}
			if (n == nil) != (want == nil) || n != nil && (n.k1 != want.k1 || n.k2 != want.k2) {
				t.Fatalf("fit(%d, %d) = %v, want %v", k.k1, k.span, n, want)
			}
		}
		if tr.len() != len(ref) {
			t.Fatalf("len %d, reference %d", tr.len(), len(ref))
		}
	}
	var keys []refEntry
	tr.each(func(n *tnode[int]) bool {
		keys = append(keys, refEntry{n.k1, n.k2, n.span})
		return true
	})
	if !slices.Equal(keys, ref) {
		t.Fatal("in-order walk differs from the reference")
	}
}

// TestTreeOverlapping checks overlapping and mayOverlap against a scan of
// a reference, over ranges mostly short with a few long ones (the case
// the pruning by largest span is for), keys repeated with several k2.
func TestTreeOverlapping(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	var tr tree[int]
	var ref []refEntry // sorted by key
	for i := range 10000 {
		k := refEntry{rng.Uint64N(10_000), rng.Uint64N(3), rng.Uint64N(20)}
		if rng.IntN(50) == 0 {
			k.span = rng.Uint64N(3000)
		}
		at, found := slices.BinarySearchFunc(ref, k, refLess)
		if found {
			tr.remove(k.k1, k.k2)
			ref = slices.Delete(ref, at, at+1)
		} else if rng.IntN(3) > 0 {
			tr.insert(k.k1, k.k2, k.span, i)
			ref = slices.Insert(ref, at, k)
		}
		lo := rng.Uint64N(10_100)
		hi := lo + 1 + rng.Uint64N(30)
		var want []refEntry
		for j := len(ref) - 1; j >= 0; j-- {
			if e := ref[j]; e.k1 < hi && e.k1+e.span > lo {
				want = append(want, e)
			}
		}
		var got []refEntry
		tr.overlapping(lo, hi, func(n *tnode[int]) bool {
			got = append(got, refEntry{n.k1, n.k2, n.span})
			return true
		})
		if !slices.Equal(got, want) {
			t.Fatalf("step %d: overlapping(%d, %d) = %v, want %v", i, lo, hi, got, want)
		}
		if may := tr.mayOverlap(lo, hi); !may && len(want) > 0 {
			t.Fatalf("step %d: mayOverlap(%d, %d) = false, but %v overlap", i, lo, hi, want)
		}
		var first []refEntry
		tr.overlapping(lo, hi, func(n *tnode[int]) bool {
			first = append(first, refEntry{n.k1, n.k2, n.span})
			return false
		})
		if len(first) != min(1, len(want)) || len(want) > 0 && first[0] != want[0] {
			t.Fatalf("step %d: overlapping(%d, %d) stopped after %v, want only the first of %v", i, lo, hi, first, want)
		}
	}
}

// FuzzVASpace checks the address space allocator: ranges handed out never
// overlap, stay inside the region, handedOut is true exactly of the
// addresses ever handed out, and releasing everything leaves one free
// range covering the region.
func FuzzVASpace(f *testing.F) {
	f.Add([]byte{1, 2, 3, 200, 4, 130, 5, 255})
	f.Add([]byte{9, 9, 9, 9, 128, 129, 130, 131})
	f.Fuzz(func(t *testing.T, ops []byte) {
		const g = 1 << 12
		rg := region{lo: 1 << 30, hi: 1<<30 + 64*g}
		v := newVASpace(rg)
		live := map[uint64]uint64{}
		var ever [64]bool // granules ever handed out
		for _, op := range ops {
			if op < 128 || len(live) == 0 {
				n := uint64(op%8+1) * g
				a, ok := v.alloc(n)
				if !ok {
					continue
				}
				if a < rg.lo || a+n > rg.hi || a%g != 0 {
					t.Fatalf("alloc(%d) = 0x%x outside the region or misaligned", n, a)
				}
				for b, m := range live {
					if a < b+m && b < a+n {
						t.Fatalf("alloc [0x%x,+%d) overlaps [0x%x,+%d)", a, n, b, m)
					}
				}
				live[a] = n
				for i := a; i < a+n; i += g {
					ever[(i-rg.lo)/g] = true
				}
				for i, was := range ever {
					if got := v.handedOut(rg.lo + uint64(i)*g + g/2); got != was {
						t.Fatalf("handedOut(granule %d) = %v, but it was handed out: %v", i, got, was)
					}
				}
				continue
			}
			keys := slices.Sorted(maps.Keys(live))
			a := keys[int(op)%len(keys)]
			v.release(a, live[a])
			delete(live, a)
		}
		for a, n := range live {
			v.release(a, n)
		}
		if v.free.len() != 1 || v.free.root.k1 != rg.lo || v.free.root.span != rg.hi-rg.lo {
			t.Fatalf("after releasing everything the free list has %d ranges", v.free.len())
		}
	})
}
