package devicetest

// The stream-ordered pool: device.AsyncAllocator.

import (
	"bytes"
	"math"
	"testing"

	"github.com/vramkit/vram/device"
)

func asyncOf(t *testing.T, d device.Device) device.AsyncAllocator {
	t.Helper()
	aa, isAA := d.(device.AsyncAllocator)
	if !isAA {
		t.Skip("device is no device.AsyncAllocator")
	}
	return aa
}

func testAsyncPool(t *testing.T, o opener) {
	t.Run("same stream reuses at once", func(t *testing.T) { poolSameStreamReuse(t, o) })
	t.Run("other stream waits for the free", func(t *testing.T) { poolOtherStreamWaits(t, o) })
	t.Run("usage and release threshold", func(t *testing.T) { poolUsageAndThreshold(t, o) })
	t.Run("trim", func(t *testing.T) { poolTrim(t, o) })
	t.Run("copies through pool memory", func(t *testing.T) { poolCopies(t, o) })
}

// poolSameStreamReuse: a block freed on a stream is handed out again on
// that stream at once, though the free is not complete.
func poolSameStreamReuse(t *testing.T, o opener) {
	d := o.fresh(t)
	aa := asyncOf(t, d)
	s := strm(t)(d.NewStream())
	defer func() { ok(t, s.Close()) }()
	ok(t, aa.SetReleaseThreshold(math.MaxUint64))
	release := hold(t, d, s) // the free is not complete: only s may reuse
	p := ptr(t)(aa.MallocAsync(1<<20, s))
	ok(t, aa.FreeAsync(p, s))
	q := ptr(t)(aa.MallocAsync(1<<20, s))
	if q != p {
		t.Errorf("MallocAsync on the freeing stream = %v, want the block just freed %v", q, p)
	}
	ok(t, aa.FreeAsync(q, s))
	release()
	syncStream(t, s)
	ok(t, aa.TrimPool(0))
}

// poolOtherStreamWaits: a block freed on one stream is not reused on
// another before the work up to the free has finished, unless the driver
// makes the other stream wait.
func poolOtherStreamWaits(t *testing.T, o opener) {
	d := o.fresh(t)
	aa := asyncOf(t, d)
	s1 := strm(t)(d.NewStream())
	s2 := strm(t)(d.NewStream())
	defer func() { ok(t, s1.Close()); ok(t, s2.Close()) }()
	ok(t, aa.SetReleaseThreshold(math.MaxUint64))
	release := hold(t, d, s1)
	p := ptr(t)(aa.MallocAsync(1<<20, s1))
	ok(t, aa.FreeAsync(p, s1))
	q := ptr(t)(aa.MallocAsync(1<<20, s2))
	if q == p {
		// Allowed only if the driver made stream 2 wait for stream 1
		// (CUDA's internal dependencies); the simulator never does.
		if done, err := s2.Query(); err != nil || done {
			t.Fatalf("a block freed on stream 1 was reused on stream 2 before stream 1's work up to the free finished, and stream 2 does not wait for it")
		}
	}
	release()
	syncStream(t, s1)
	ok(t, aa.FreeAsync(q, s2))
	syncStream(t, s2)
	ok(t, aa.TrimPool(0))
}

// poolUsageAndThreshold: PoolUsage counts what the pool reserves and
// uses; a high release threshold keeps freed memory, 0 gives it back at
// the next synchronization.
func poolUsageAndThreshold(t *testing.T, o opener) {
	d := o.fresh(t)
	aa := asyncOf(t, d)
	s := d.DefaultStream()
	start := memFree(t, d)
	ok(t, aa.SetReleaseThreshold(math.MaxUint64))
	p := ptr(t)(aa.MallocAsync(3<<20, s))
	res, used, err := aa.PoolUsage()
	ok(t, err)
	if used < 3<<20 || res < used {
		t.Errorf("PoolUsage with 3 MiB live = reserved %d, used %d", res, used)
	}
	if f := memFree(t, d); start-f+memSlack(d) < res {
		t.Errorf("free memory dropped by %d, less than the pool's reserve %d", start-f, res)
	}
	ok(t, aa.FreeAsync(p, s))
	syncStream(t, s)
	res2, used2, err := aa.PoolUsage()
	ok(t, err)
	if used2 != 0 || res2 == 0 {
		t.Errorf("after free and sync with a high threshold: reserved %d, used %d; want memory kept, none used", res2, used2)
	}
	ok(t, aa.SetReleaseThreshold(0))
	syncStream(t, s)
	res3, _, err := aa.PoolUsage()
	ok(t, err)
	if res3 != 0 {
		t.Errorf("after a sync with threshold 0 the pool still holds %d bytes", res3)
	}
	freeNear(t, d, memFree(t, d), start, "after the pool released everything")
}

// poolTrim: TrimPool(0) gives back every unused byte.
func poolTrim(t *testing.T, o opener) {
	d := o.fresh(t)
	aa := asyncOf(t, d)
	s := d.DefaultStream()
	ok(t, aa.SetReleaseThreshold(math.MaxUint64))
	var ps []device.Ptr
	for range 4 {
		ps = append(ps, ptr(t)(aa.MallocAsync(4<<20, s)))
	}
	for _, p := range ps {
		ok(t, aa.FreeAsync(p, s))
	}
	syncStream(t, s)
	ok(t, aa.TrimPool(0))
	if res, used, err := aa.PoolUsage(); err != nil || res != 0 || used != 0 {
		t.Errorf("PoolUsage after TrimPool(0) = %d, %d, %v; want 0, 0, nil", res, used, err)
	}
}

// poolCopies: copies work in and out of pool memory.
func poolCopies(t *testing.T, o opener) {
	d := o.fresh(t)
	aa := asyncOf(t, d)
	backed(t, d)
	s := d.DefaultStream()
	p := ptr(t)(aa.MallocAsync(1000, s))
	ok(t, d.CopyHtoD(p, pattern(1000, 1), s))
	got := make([]byte, 1000)
	ok(t, d.CopyDtoH(got, p, s))
	ok(t, aa.FreeAsync(p, s))
	syncStream(t, s)
	if !bytes.Equal(got, pattern(1000, 1)) {
		t.Errorf("bytes through a MallocAsync block differ")
	}
}
