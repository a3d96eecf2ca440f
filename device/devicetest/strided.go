package devicetest

// Tests of device.StridedCopier, the optional 2-D (pitched) copy.

import (
	"bytes"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/vramkit/vram/device"
)

func stridedOf(t *testing.T, d device.Device) device.StridedCopier {
	t.Helper()
	sc, isSC := d.(device.StridedCopier)
	if !isSC {
		t.Skip("device is no device.StridedCopier")
	}
	backed(t, d)
	return sc
}

// region is a 2-D block within a pitched buffer.
type region struct {
	off, pitch, width, height uint64
}

// within reports whether byte i of the buffer lies in one of r's rows.
func (r region) within(i uint64) bool {
	if i < r.off {
		return false
	}
	row, col := (i-r.off)/r.pitch, (i-r.off)%r.pitch
	return row < r.height && col < r.width
}

// put writes src's rows (region s) into dst's rows (region d) on the host,
// the reference a 2-D copy must match.
func put(dst []byte, d region, src []byte, s region) {
	for r := range d.height {
		copy(dst[d.off+r*d.pitch:][:d.width], src[s.off+r*s.pitch:][:s.width])
	}
}

func testStrided(t *testing.T, o opener) {
	t.Run("round trip", func(t *testing.T) { stridedRoundTrip(t, o) })
	t.Run("refused", func(t *testing.T) { testStridedRefused(t, o) })
	t.Run("order", func(t *testing.T) { testStridedOrder(t, o) })
	t.Run("asynchrony", func(t *testing.T) { testStridedAsync(t, o) })
}

// stridedRoundTrip moves sub-blocks in and out of a pitched device buffer
// and checks every byte, inside the block and around it.
func stridedRoundTrip(t *testing.T, o opener) {
	d := o.fresh(t)
	sc := stridedOf(t, d)
	s := d.DefaultStream()
	// A device matrix of 24 rows of 384 bytes (the pitch) and a host one
	// of 20 rows of 200 bytes; each case moves a sub-block and must leave
	// every byte outside it as it was.
	const devRows, devPitch = 24, 384
	const hostRows, hostPitch = 20, 200
	const devLen, hostLen = devRows * devPitch, hostRows * hostPitch
	p := ptr(t)(d.Malloc(devLen))
	defer func() { ok(t, d.Free(p)) }()
	cases := map[string]struct {
		dev, host region // where the block lies in each buffer
	}{
		"sub-block":         {dev: region{2*devPitch + 10, devPitch, 100, 8}, host: region{3*hostPitch + 7, hostPitch, 100, 8}},
		"one row":           {dev: region{5*devPitch + 1, devPitch, 150, 1}, host: region{hostPitch - 150, hostPitch, 150, 1}},
		"pitch equal width": {dev: region{devPitch, 64, 64, 12}, host: region{0, 64, 64, 12}},
		"full width rows":   {dev: region{0, devPitch, devPitch, 10}, host: region{0, devPitch, devPitch, 10}},
		"last rows to end":  {dev: region{(devRows-4)*devPitch + devPitch - 30, devPitch, 30, 4}, host: region{(hostRows-4)*hostPitch + hostPitch - 30, hostPitch, 30, 4}},
		"one byte columns":  {dev: region{7, devPitch, 1, devRows}, host: region{0, 3, 1, devRows}},
	}
	for _, name := range sortedKeys(cases) {
		tc := cases[name]
		t.Run(name, func(t *testing.T) {
			// Device starts as a known pattern; the host source another.
			before := pattern(devLen, 11)
			ok(t, d.CopyHtoD(p, before, s))
			src := pattern(hostLen, 97)
			ok(t, sc.CopyHtoD2D(p.Add(tc.dev.off), tc.dev.pitch, src[tc.host.off:], tc.host.pitch, tc.dev.width, tc.dev.height, s))
			gotDev := make([]byte, devLen)
			ok(t, d.CopyDtoH(gotDev, p, s))
			// And back: into a host buffer filled with a marker, so that
			// bytes between rows must stay the marker.
			back := bytes.Repeat([]byte{0x5a}, hostLen)
			ok(t, sc.CopyDtoH2D(back[tc.host.off:], tc.host.pitch, p.Add(tc.dev.off), tc.dev.pitch, tc.dev.width, tc.dev.height, s))
			syncStream(t, s)

			wantDev := bytes.Clone(before)
			put(wantDev, tc.dev, src, tc.host)
			if i := firstDiff(gotDev, wantDev); i >= 0 {
				t.Fatalf("after CopyHtoD2D device byte %d = %#x, want %#x (in the block: %v)", i, gotDev[i], wantDev[i], tc.dev.within(uint64(i)))
			}
			wantBack := bytes.Repeat([]byte{0x5a}, hostLen)
			put(wantBack, tc.host, wantDev, tc.dev)
			if i := firstDiff(back, wantBack); i >= 0 {
				t.Fatalf("after CopyDtoH2D host byte %d = %#x, want %#x (in the block: %v)", i, back[i], wantBack[i], tc.host.within(uint64(i)))
			}
		})
	}
	t.Run("zero width or height copies nothing", func(t *testing.T) {
		ok(t, d.CopyHtoD(p, pattern(devLen, 1), s))
		ok(t, sc.CopyHtoD2D(p, devPitch, nil, 0, 0, 5, s))
		ok(t, sc.CopyHtoD2D(p, devPitch, nil, 100, 100, 0, s))
		ok(t, sc.CopyDtoH2D(nil, 100, p, devPitch, 100, 0, s))
		got := make([]byte, devLen)
		ok(t, d.CopyDtoH(got, p, s))
		syncStream(t, s)
		if !bytes.Equal(got, pattern(devLen, 1)) {
			t.Errorf("a 2-D copy of zero width or height changed device memory")
		}
	})
	t.Run("pool memory", func(t *testing.T) {
		aa, isAA := d.(device.AsyncAllocator)
		if !isAA {
			t.Skip("device is no device.AsyncAllocator")
		}
		q := ptr(t)(aa.MallocAsync(10*100, s))
		src := pattern(10*64, 3)
		ok(t, sc.CopyHtoD2D(q, 100, src, 64, 64, 10, s))
		got := make([]byte, 10*64)
		ok(t, sc.CopyDtoH2D(got, 64, q, 100, 64, 10, s))
		ok(t, aa.FreeAsync(q, s))
		syncStream(t, s)
		if !bytes.Equal(got, src) {
			t.Errorf("rows through a MallocAsync block differ")
		}
	})
}

func firstDiff(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	if len(a) != len(b) {
		return min(len(a), len(b))
	}
	return -1
}

// oneOf fails unless err wraps one of wants and says more than the bare
// sentinel.
func oneOf(t *testing.T, err error, what string, wants ...error) {
	t.Helper()
	for _, w := range wants {
		if errors.Is(err, w) {
			isErr(t, err, w, what)
			return
		}
	}
	t.Fatalf("%s: got error %v, want one wrapping one of %q", what, err, wants)
}

func testStridedRefused(t *testing.T, o opener) {
	d := o.fresh(t)
	sc := stridedOf(t, d)
	s := d.DefaultStream()
	const n = 1000
	p := ptr(t)(d.Malloc(n))
	q := ptr(t)(d.Malloc(n))
	defer func() { ok(t, d.Free(q)) }()
	start := pattern(n, 42)
	ok(t, d.CopyHtoD(p, start, s))
	host := make([]byte, 4096)
	// Host-side bounds are an argument error; the contract allows either
	// sentinel there.
	hostBounds := []error{device.ErrInvalidValue, device.ErrOutOfBounds}
	cases := map[string]struct {
		call  func() error
		wants []error
	}{
		"HtoD device pitch below width": {func() error { return sc.CopyHtoD2D(p, 99, host, 100, 100, 2, s) }, []error{device.ErrInvalidValue}},
		"HtoD host pitch below width":   {func() error { return sc.CopyHtoD2D(p, 100, host, 99, 100, 2, s) }, []error{device.ErrInvalidValue}},
		"DtoH device pitch below width": {func() error { return sc.CopyDtoH2D(host, 100, p, 50, 51, 2, s) }, []error{device.ErrInvalidValue}},
		"DtoH host pitch below width":   {func() error { return sc.CopyDtoH2D(host, 10, p, 100, 11, 2, s) }, []error{device.ErrInvalidValue}},
		"pitch below width, one row":    {func() error { return sc.CopyHtoD2D(p, 99, host, 100, 100, 1, s) }, []error{device.ErrInvalidValue}},
		// 10 rows at pitch 100: the last row ends at 9*100+91 = 991 ≤ 1000
		// only from an offset ≤ 9; from 10 it runs one byte past.
		"HtoD last row one byte past": {func() error { return sc.CopyHtoD2D(p.Add(10), 100, host, 100, 91, 10, s) }, []error{device.ErrOutOfBounds}},
		"DtoH last row one byte past": {func() error { return sc.CopyDtoH2D(host, 100, p.Add(10), 100, 91, 10, s) }, []error{device.ErrOutOfBounds}},
		"rows past the end":           {func() error { return sc.CopyHtoD2D(p, 400, host, 100, 100, 4, s) }, []error{device.ErrOutOfBounds}},
		"first row past the end":      {func() error { return sc.CopyHtoD2D(p.Add(950), 100, host, 100, 100, 1, s) }, []error{device.ErrOutOfBounds}},
		"huge pitch overflows":        {func() error { return sc.CopyHtoD2D(p, 1<<63, host, 1, 1, 3, s) }, []error{device.ErrOutOfBounds, device.ErrInvalidValue}},
		"HtoD host source too short":  {func() error { return sc.CopyHtoD2D(p, 100, host[:899], 100, 100, 9, s) }, hostBounds},
		"DtoH host dest too short":    {func() error { return sc.CopyDtoH2D(host[:850], 100, p, 100, 51, 9, s) }, hostBounds},
		"host pitch overflows":        {func() error { return sc.CopyHtoD2D(p, 100, host, 1<<63, 10, 3, s) }, hostBounds},
		"to a freed allocation": {func() error {
			ok(t, d.Free(p))
			defer func() { p = ptr(t)(d.Malloc(n)); ok(t, d.CopyHtoD(p, start, s)) }()
			return sc.CopyHtoD2D(p, 100, host, 100, 10, 2, s)
		}, []error{device.ErrUseAfterFree}},
		"null pointer": {func() error { return sc.CopyDtoH2D(host, 100, 0, 100, 10, 2, s) }, []error{device.ErrInvalidPointer}},
		"nil stream":   {func() error { return sc.CopyHtoD2D(p, 100, host, 100, 10, 2, nil) }, []error{device.ErrInvalidValue}},
	}
	for _, name := range sortedKeys(cases) {
		tc := cases[name]
		t.Run(name, func(t *testing.T) {
			oneOf(t, tc.call(), name, tc.wants...)
			got := make([]byte, n)
			ok(t, d.CopyDtoH(got, p, s))
			syncStream(t, s)
			if !bytes.Equal(got, start) {
				t.Errorf("a refused 2-D copy changed the device bytes")
			}
		})
	}
	t.Run("last row exactly at the end is fine", func(t *testing.T) {
		src := pattern(991, 5)
		ok(t, sc.CopyHtoD2D(p.Add(9), 100, src, 100, 91, 10, s))
		got := make([]byte, n)
		ok(t, d.CopyDtoH(got, p, s))
		syncStream(t, s)
		want := bytes.Clone(start)
		put(want, region{9, 100, 91, 10}, src, region{0, 100, 91, 10})
		if !bytes.Equal(got, want) {
			t.Errorf("rows ending exactly at the allocation's end were not copied right")
		}
		ok(t, d.CopyHtoD(p, start, s))
	})
	ok(t, d.Free(p))
	syncStream(t, s)
}

// testStridedOrder interleaves 2-D and 1-D copies on one stream: each read
// must see exactly the writes enqueued before it.
func testStridedOrder(t *testing.T, o opener) {
	d := o.fresh(t)
	sc := stridedOf(t, d)
	s := strm(t)(d.NewStream())
	defer func() { ok(t, s.Close()) }()
	const rows, pitch, width = 16, 256, 200
	const n = rows * pitch
	p := ptr(t)(d.Malloc(n))
	defer func() { ok(t, d.Free(p)) }()
	const rounds = 32
	block := region{off: 3, pitch: pitch, width: width, height: rows}
	srcs := make([][]byte, rounds)
	whole := make([][]byte, rounds)
	rowsBack := make([][]byte, rounds)
	for i := range rounds {
		ok(t, d.CopyHtoD(p, pattern(n, byte(i)), s))
		srcs[i] = pattern(rows*width, byte(100+i))
		ok(t, sc.CopyHtoD2D(p.Add(block.off), pitch, srcs[i], width, width, rows-1, s))
		rowsBack[i] = make([]byte, rows*width)
		ok(t, sc.CopyDtoH2D(rowsBack[i], width, p.Add(block.off), pitch, width, rows-1, s))
		whole[i] = make([]byte, n)
		ok(t, d.CopyDtoH(whole[i], p, s))
	}
	syncStream(t, s)
	for i := range rounds {
		want := pattern(n, byte(i))
		put(want, region{block.off, pitch, width, rows - 1}, srcs[i], region{0, width, width, rows - 1})
		if j := firstDiff(whole[i], want); j >= 0 {
			t.Fatalf("round %d: the 1-D read after the 2-D write saw byte %d = %#x, want %#x", i, j, whole[i][j], want[j])
		}
		wantRows := bytes.Clone(srcs[i])
		clear(wantRows[(rows-1)*width:])
		if j := firstDiff(rowsBack[i], wantRows); j >= 0 {
			t.Fatalf("round %d: the 2-D read saw byte %d = %#x, want %#x", i, j, rowsBack[i][j], wantRows[j])
		}
	}
}

// testStridedAsync: a 2-D copy on a busy stream waits its turn, and an
// event orders it after another stream's work.
func testStridedAsync(t *testing.T, o opener) {
	d := o.fresh(t)
	sc := stridedOf(t, d)
	s1 := strm(t)(d.NewStream())
	s2 := strm(t)(d.NewStream())
	defer func() { ok(t, s1.Close()); ok(t, s2.Close()) }()
	e := evt(t)(d.NewEvent())
	defer func() { ok(t, e.Close()) }()
	p := ptr(t)(d.Malloc(4 * 64))
	defer func() { ok(t, d.Free(p)) }()
	ok(t, d.Memset(p, 0, 4*64, s1))
	syncStream(t, s1)

	src := hostText(t, d, fmt.Sprintf("%-32s%-32s%-32s", "row zero", "row one", "row two"))
	got := hostBytes(t, d, 3*32)
	release := hold(t, d, s1)
	ok(t, sc.CopyHtoD2D(p, 64, src, 32, 32, 3, s1))
	ok(t, e.Record(s1))
	ok(t, e.Wait(s2))
	ok(t, sc.CopyDtoH2D(got, 32, p, 64, 32, 3, s2))
	if done, err := s2.Query(); err != nil || done {
		t.Fatalf("stream two's 2-D copy did not wait for the event: Query = %v, %v", done, err)
	}
	time.Sleep(20 * time.Millisecond) // time for a wrongly ordered copy to run
	if !bytes.Equal(got, make([]byte, 3*32)) {
		t.Fatalf("the 2-D copy ran before the work it waits for (read %q)", got)
	}
	release()
	syncStream(t, s2)
	if !bytes.Equal(got, src) {
		t.Fatalf("after the event, stream two read %q, want %q", got, src)
	}
}
