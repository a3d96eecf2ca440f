package devicetest

// Info, memory accounting, Malloc and copies: what every device does.

import (
	"bytes"
	"testing"

	"github.com/vramkit/vram/device"
)

func testInfo(t *testing.T, o opener) {
	d := o.fresh(t)
	info := d.Info()
	free, total, err := d.MemInfo()
	ok(t, err)
	if info.Backend == "" || info.Name == "" {
		t.Errorf("Info has an empty backend or name: %+v", info)
	}
	if total == 0 || total != info.TotalBytes {
		t.Errorf("MemInfo total %d, Info.TotalBytes %d: want equal and > 0", total, info.TotalBytes)
	}
	if free == 0 || free > total || free > total-info.ContextBytes {
		t.Errorf("MemInfo free %d of total %d with context %d", free, total, info.ContextBytes)
	}
	if info.Granularity == 0 || info.Granularity&(info.Granularity-1) != 0 {
		t.Errorf("Info.Granularity %d: want a power of two", info.Granularity)
	}
	if s := d.DefaultStream(); s == nil || s.Handle() != 0 {
		t.Errorf("DefaultStream %v: want a stream with handle 0", s)
	}
}

func testAccounting(t *testing.T, o opener) {
	d := o.fresh(t)
	g := d.Info().Granularity
	start := memFree(t, d)
	sizes := map[string]uint64{
		"one granule":      g,
		"granule plus one": g + 1,
		"three granules":   3 * g,
		"many granules":    16*g + 12345,
	}
	var ptrs []device.Ptr
	var spent uint64
	for _, name := range sortedKeys(sizes) {
		n := sizes[name]
		t.Run(name, func(t *testing.T) {
			before := memFree(t, d)
			p := ptr(t)(d.Malloc(n))
			ptrs = append(ptrs, p)
			after := memFree(t, d)
			lo, hi, slack := n, roundUp(n, g)+g, memSlack(d)
			drop := int64(before) - int64(after)
			if drop < int64(lo)-int64(slack) || drop > int64(hi+slack) {
				t.Errorf("Malloc(%d): free went from %d to %d; want a drop between %d and %d (give or take %d on %s)",
					n, before, after, lo, hi, slack, d.Info().Backend)
			}
			spent += before - after
		})
	}
	freeNear(t, d, memFree(t, d), start-spent, "after the allocations, against their drops one by one")
	for _, p := range ptrs {
		ok(t, d.Free(p))
	}
	freeNear(t, d, memFree(t, d), start, "after freeing everything (where it started)")
	if aa, isAA := d.(device.AsyncAllocator); isAA {
		s := d.DefaultStream()
		var ps []device.Ptr
		for _, n := range []uint64{1, 1000, g, 5*g + 3} {
			ps = append(ps, ptr(t)(aa.MallocAsync(n, s)))
		}
		for _, p := range ps {
			ok(t, aa.FreeAsync(p, s))
		}
		ok(t, aa.SetReleaseThreshold(0))
		syncStream(t, s)
		ok(t, aa.TrimPool(0))
		freeNear(t, d, memFree(t, d), start, "after MallocAsync, FreeAsync, a synchronize and a trim")
	}
}

func testMalloc(t *testing.T, o opener) {
	d := o.fresh(t)
	type span struct{ lo, hi uint64 }
	var spans []span
	sizes := []uint64{1, 255, 256, 4097, 1 << 20, 3<<20 + 1}
	for _, n := range sizes {
		p := ptr(t)(d.Malloc(n))
		if p == 0 {
			t.Fatalf("Malloc(%d) returned the null pointer", n)
		}
		if p%256 != 0 {
			t.Errorf("Malloc(%d) = %v: not aligned to 256 bytes", n, p)
		}
		for _, s := range spans {
			if uint64(p) < s.hi && uint64(p)+n > s.lo {
				t.Errorf("Malloc(%d) = %v overlaps a live allocation [0x%x, 0x%x)", n, p, s.lo, s.hi)
			}
		}
		spans = append(spans, span{uint64(p), uint64(p) + n})
	}
	for _, s := range spans {
		ok(t, d.Free(device.Ptr(s.lo)))
	}
	// The largest block that fits must fit; more than the total must not.
	_, total, err := d.MemInfo()
	ok(t, err)
	_, err = d.Malloc(total + 1)
	isErr(t, err, device.ErrOutOfMemory, "Malloc(total+1)")
}

func testCopies(t *testing.T, o opener) {
	d := o.fresh(t)
	backed(t, d)
	s := d.DefaultStream()
	const n = 1 << 16
	a := ptr(t)(d.Malloc(n))
	b := ptr(t)(d.Malloc(n))
	defer func() { ok(t, d.Free(a)); ok(t, d.Free(b)) }()
	src := pattern(n, 3)
	cases := map[string]struct {
		run  func() error
		want func() []byte
	}{
		"HtoD then DtoH": {
			run:  func() error { return d.CopyHtoD(a, src, s) },
			want: func() []byte { return src },
		},
		"interior pointer": {
			run: func() error {
				if err := d.CopyHtoD(a, src, s); err != nil {
					return err
				}
				return d.CopyHtoD(a.Add(100), []byte("interior"), s)
			},
			want: func() []byte {
				w := bytes.Clone(src)
				copy(w[100:], "interior")
				return w
			},
		},
		"DtoD": {
			run: func() error {
				if err := d.CopyHtoD(b, pattern(n, 9), s); err != nil {
					return err
				}
				return d.CopyDtoD(a, b, n, s)
			},
			want: func() []byte { return pattern(n, 9) },
		},
		"Memset range": {
			run: func() error {
				if err := d.CopyHtoD(a, src, s); err != nil {
					return err
				}
				return d.Memset(a.Add(10), 0xab, 20, s)
			},
			want: func() []byte {
				w := bytes.Clone(src)
				for i := 10; i < 30; i++ {
					w[i] = 0xab
				}
				return w
			},
		},
		"Memset zero whole": {
			run: func() error {
				if err := d.CopyHtoD(a, src, s); err != nil {
					return err
				}
				return d.Memset(a, 0, n, s)
			},
			want: func() []byte { return make([]byte, n) },
		},
	}
	for _, name := range sortedKeys(cases) {
		tc := cases[name]
		t.Run(name, func(t *testing.T) {
			ok(t, tc.run())
			got := make([]byte, n)
			ok(t, d.CopyDtoH(got, a, s))
			syncStream(t, s)
			if !bytes.Equal(got, tc.want()) {
				t.Errorf("device bytes differ from what was written")
			}
		})
	}
}
