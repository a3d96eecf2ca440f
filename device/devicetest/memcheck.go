package devicetest

// The memory checker: each misuse of device memory gives one distinct
// error.

import (
	"bytes"
	"errors"
	"testing"

	"github.com/vramkit/vram/device"
)

// memcheckErrs are the memory checker's sentinels: each misuse must wrap
// its own and none of the others.
var memcheckErrs = []error{device.ErrOutOfBounds, device.ErrUseAfterFree, device.ErrDoubleFree,
	device.ErrInvalidated, device.ErrInvalidPointer}

// isOnly is isErr that also fails when err wraps another memcheck sentinel
// than want, so that each misuse gives a distinct error.
func isOnly(t *testing.T, err, want error, what string) {
	t.Helper()
	isErr(t, err, want, what)
	for _, other := range memcheckErrs {
		if other != want && errors.Is(err, other) {
			t.Errorf("%s: error %v wraps %q as well as %q; each misuse must give one distinct error", what, err, other, want)
		}
	}
}

func testMemcheck(t *testing.T, o opener) {
	t.Run("out of bounds", func(t *testing.T) { memcheckOutOfBounds(t, o) })
	t.Run("use after free", func(t *testing.T) { memcheckUseAfterFree(t, o) })
	t.Run("double free", func(t *testing.T) { memcheckDoubleFree(t, o) })
	t.Run("invalid pointer", func(t *testing.T) { memcheckInvalidPointer(t, o) })
	t.Run("zero bytes", func(t *testing.T) { memcheckZeroBytes(t, o) })
	t.Run("pointer from another device", func(t *testing.T) { memcheckOtherDevice(t, o) })
}

// memcheckOutOfBounds: copies and memsets past an allocation's end are
// refused with ErrOutOfBounds alone, and write nothing.
func memcheckOutOfBounds(t *testing.T, o opener) {
	d := o.fresh(t)
	backed(t, d)
	s := d.DefaultStream()
	p := ptr(t)(d.Malloc(1000))
	q := ptr(t)(d.Malloc(1000))
	defer func() { ok(t, d.Free(p)); ok(t, d.Free(q)) }()
	ok(t, d.CopyHtoD(p, pattern(1000, 1), s))
	ok(t, d.CopyHtoD(q, pattern(1000, 2), s))
	cases := map[string]func() error{
		"HtoD past end":       func() error { return d.CopyHtoD(p.Add(999), []byte{1, 2}, s) },
		"DtoH past end":       func() error { return d.CopyDtoH(make([]byte, 1001), p, s) },
		"DtoD dst past end":   func() error { return d.CopyDtoD(p.Add(1), q, 1000, s) },
		"DtoD src past end":   func() error { return d.CopyDtoD(p, q.Add(500), 501, s) },
		"Memset past end":     func() error { return d.Memset(p, 0, 1001, s) },
		"Memset from the end": func() error { return d.Memset(p.Add(1000), 0, 1, s) },
	}
	for _, name := range sortedKeys(cases) {
		t.Run(name, func(t *testing.T) {
			isOnly(t, cases[name](), device.ErrOutOfBounds, name)
		})
	}
	// Refused means refused: not a byte written, here or next door.
	gotP, gotQ := make([]byte, 1000), make([]byte, 1000)
	ok(t, d.CopyDtoH(gotP, p, s))
	ok(t, d.CopyDtoH(gotQ, q, s))
	syncStream(t, s)
	if !bytes.Equal(gotP, pattern(1000, 1)) || !bytes.Equal(gotQ, pattern(1000, 2)) {
		t.Errorf("refused out-of-bounds accesses changed device memory")
	}
}

// memcheckUseAfterFree: a freed pointer, of Malloc or MallocAsync, is
// refused with ErrUseAfterFree alone, even to move no bytes.
func memcheckUseAfterFree(t *testing.T, o opener) {
	d := o.fresh(t)
	backed(t, d)
	s := d.DefaultStream()
	p := ptr(t)(d.Malloc(1000))
	ok(t, d.Free(p))
	cases := map[string]func() error{
		"HtoD":   func() error { return d.CopyHtoD(p, []byte{1}, s) },
		"DtoH":   func() error { return d.CopyDtoH(make([]byte, 1), p.Add(10), s) },
		"Memset": func() error { return d.Memset(p, 0, 8, s) },
		// Moving no bytes does not make a freed pointer valid.
		"HtoD of 0 bytes":   func() error { return d.CopyHtoD(p, nil, s) },
		"Memset of 0 bytes": func() error { return d.Memset(p, 0, 0, s) },
	}
	for _, name := range sortedKeys(cases) {
		t.Run(name, func(t *testing.T) {
			isOnly(t, cases[name](), device.ErrUseAfterFree, name)
		})
	}
	if aa, isAA := d.(device.AsyncAllocator); isAA {
		q := ptr(t)(aa.MallocAsync(1000, s))
		ok(t, aa.FreeAsync(q, s))
		isOnly(t, d.CopyHtoD(q, []byte{1}, s), device.ErrUseAfterFree, "HtoD to a FreeAsync'd block")
	}
	syncStream(t, s)
}

// memcheckDoubleFree: a second Free or FreeAsync is ErrDoubleFree alone.
func memcheckDoubleFree(t *testing.T, o opener) {
	d := o.fresh(t)
	p := ptr(t)(d.Malloc(1000))
	ok(t, d.Free(p))
	isOnly(t, d.Free(p), device.ErrDoubleFree, "second Free")
	if aa, isAA := d.(device.AsyncAllocator); isAA {
		s := d.DefaultStream()
		q := ptr(t)(aa.MallocAsync(1000, s))
		ok(t, aa.FreeAsync(q, s))
		isOnly(t, aa.FreeAsync(q, s), device.ErrDoubleFree, "second FreeAsync")
		syncStream(t, s)
	}
}

// memcheckInvalidPointer: null, interior and never-allocated pointers are
// ErrInvalidPointer alone.
func memcheckInvalidPointer(t *testing.T, o opener) {
	d := o.fresh(t)
	p := ptr(t)(d.Malloc(1000))
	defer func() { ok(t, d.Free(p)) }()
	isOnly(t, d.Free(0), device.ErrInvalidPointer, "Free(0)")
	isOnly(t, d.Free(p.Add(256)), device.ErrInvalidPointer, "Free of an interior pointer")
	isOnly(t, d.Free(p.Add(1<<40)), device.ErrInvalidPointer, "Free of an address never allocated")
	if d.Info().Backed {
		isOnly(t, d.CopyHtoD(0, []byte{1}, d.DefaultStream()), device.ErrInvalidPointer, "copy to the null pointer")
	}
}

// memcheckZeroBytes: moving no bytes is allowed at nil and from an
// allocation's start to just past its end, and checked elsewhere.
func memcheckZeroBytes(t *testing.T, o opener) {
	// Moving no bytes is allowed at the nil pointer and anywhere from
	// an allocation's start to just past its end; a pointer past that
	// is still checked.
	d := o.fresh(t)
	backed(t, d)
	s := d.DefaultStream()
	p := ptr(t)(d.Malloc(1000))
	defer func() { ok(t, d.Free(p)) }()
	for name, at := range map[string]device.Ptr{"nil": 0, "start": p, "inside": p.Add(500), "end": p.Add(1000)} {
		for op, err := range map[string]error{
			"HtoD":   d.CopyHtoD(at, nil, s),
			"DtoH":   d.CopyDtoH(nil, at, s),
			"Memset": d.Memset(at, 0, 0, s),
			"DtoD":   d.CopyDtoD(at, p, 0, s),
		} {
			if err != nil {
				t.Errorf("0-byte %s at %s (%v): %v", op, name, at, err)
			}
		}
	}
	if err := d.CopyHtoD(p.Add(1<<40), nil, s); err == nil {
		t.Errorf("0-byte HtoD at an address never allocated: nil error")
	}
	syncStream(t, s)
}

// memcheckOtherDevice: another device's pointer is ErrInvalidPointer
// alone, in a free, a copy and a FreeAsync.
func memcheckOtherDevice(t *testing.T, o opener) {
	d1 := o.fresh(t)
	d2 := o.fresh(t)
	p := ptr(t)(d2.Malloc(1000))
	defer func() { ok(t, d2.Free(p)) }()
	err := d1.Free(p)
	isOnly(t, err, device.ErrInvalidPointer, "Free on one device of another's pointer")
	if d1.Info().Backed {
		isOnly(t, d1.CopyHtoD(p, []byte{1}, d1.DefaultStream()), device.ErrInvalidPointer, "copy to another device's pointer")
		q := ptr(t)(d1.Malloc(1000))
		defer func() { ok(t, d1.Free(q)) }()
		isOnly(t, d1.CopyDtoD(q, p, 8, d1.DefaultStream()), device.ErrInvalidPointer, "copy from another device's pointer")
	}
	if aa, isAA := d2.(device.AsyncAllocator); isAA {
		ap := ptr(t)(aa.MallocAsync(1000, d2.DefaultStream()))
		defer func() { ok(t, aa.FreeAsync(ap, d2.DefaultStream())); syncStream(t, d2.DefaultStream()) }()
		isOnly(t, d1.(device.AsyncAllocator).FreeAsync(ap, d1.DefaultStream()), device.ErrInvalidPointer, "FreeAsync on one device of another's MallocAsync pointer")
	}
}
