package cuda

import (
	"bytes"
	"errors"
	"math"
	"strings"
	"testing"
	"unsafe"

	"github.com/vramkit/vram/device"
)

// TestMemcpy2DLayout checks memcpy2D against CUDA_MEMCPY2D_v2 as cuda.h
// declares it on a 64-bit system: size_t and pointers 8 bytes, the
// CUmemorytype enums 4 bytes padded to the next pointer.
func TestMemcpy2DLayout(t *testing.T) {
	var c memcpy2D
	fields := map[string]struct{ got, want uintptr }{
		"srcXInBytes":   {unsafe.Offsetof(c.srcXInBytes), 0},
		"srcY":          {unsafe.Offsetof(c.srcY), 8},
		"srcMemoryType": {unsafe.Offsetof(c.srcMemoryType), 16},
		"srcHost":       {unsafe.Offsetof(c.srcHost), 24},
		"srcDevice":     {unsafe.Offsetof(c.srcDevice), 32},
		"srcArray":      {unsafe.Offsetof(c.srcArray), 40},
		"srcPitch":      {unsafe.Offsetof(c.srcPitch), 48},
		"dstXInBytes":   {unsafe.Offsetof(c.dstXInBytes), 56},
		"dstY":          {unsafe.Offsetof(c.dstY), 64},
		"dstMemoryType": {unsafe.Offsetof(c.dstMemoryType), 72},
		"dstHost":       {unsafe.Offsetof(c.dstHost), 80},
		"dstDevice":     {unsafe.Offsetof(c.dstDevice), 88},
		"dstArray":      {unsafe.Offsetof(c.dstArray), 96},
		"dstPitch":      {unsafe.Offsetof(c.dstPitch), 104},
		"WidthInBytes":  {unsafe.Offsetof(c.widthInBytes), 112},
		"Height":        {unsafe.Offsetof(c.height), 120},
	}
	for name, f := range fields {
		t.Run(name, func(t *testing.T) {
			if f.got != f.want {
				t.Errorf("offset of %s = %d, want %d", name, f.got, f.want)
			}
		})
	}
	if s := unsafe.Sizeof(c); s != 128 {
		t.Errorf("sizeof(memcpy2D) = %d, want 128", s)
	}
	if cuMemoryTypeHost != 1 || cuMemoryTypeDevice != 2 {
		t.Errorf("CU_MEMORYTYPE_HOST, _DEVICE = %d, %d; want 1, 2", cuMemoryTypeHost, cuMemoryTypeDevice)
	}
}

func TestShape2D(t *testing.T) {
	tests := map[string]struct {
		hostLen                            int
		hostPitch, devPitch, width, height uint64
		hostExt, devExt                    uint64
		err                                error
		msg                                string
	}{
		"plain":              {hostLen: 1000, hostPitch: 100, devPitch: 256, width: 100, height: 10, hostExt: 1000, devExt: 2404},
		"one row":            {hostLen: 50, hostPitch: 50, devPitch: 50, width: 50, height: 1, hostExt: 50, devExt: 50},
		"last row short":     {hostLen: 901, hostPitch: 100, devPitch: 100, width: 1, height: 10, hostExt: 901, devExt: 901},
		"zero width":         {hostLen: 0, hostPitch: 0, devPitch: 0, width: 0, height: 7},
		"zero height":        {hostLen: 0, hostPitch: 100, devPitch: 100, width: 100, height: 0},
		"host pitch < width": {hostLen: 1000, hostPitch: 99, devPitch: 100, width: 100, height: 2, err: device.ErrInvalidValue, msg: "host pitch"},
		"dev pitch < width":  {hostLen: 1000, hostPitch: 100, devPitch: 99, width: 100, height: 1, err: device.ErrInvalidValue, msg: "device pitch"},
		"host too short":     {hostLen: 999, hostPitch: 100, devPitch: 100, width: 100, height: 10, err: device.ErrInvalidValue, msg: "rows need 1000 B"},
		"host overflow":      {hostLen: 1000, hostPitch: math.MaxUint64 / 2, devPitch: 100, width: 1, height: 4, err: device.ErrInvalidValue, msg: "2^64"},
		"device overflow":    {hostLen: 1000, hostPitch: 1, devPitch: math.MaxUint64, width: 1, height: 3, err: device.ErrOutOfBounds, msg: "2^64"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			h, d, err := shape2D("Copy", tc.hostLen, tc.hostPitch, tc.devPitch, tc.width, tc.height)
			if tc.err != nil {
				if !errors.Is(err, tc.err) || !strings.Contains(err.Error(), tc.msg) {
					t.Fatalf("shape2D = %v; want an error wrapping %v that mentions %q", err, tc.err, tc.msg)
				}
				return
			}
			if err != nil || h != tc.hostExt || d != tc.devExt {
				t.Fatalf("shape2D = %d, %d, %v; want %d, %d", h, d, err, tc.hostExt, tc.devExt)
			}
		})
	}
}

// TestStridedRowByRow runs 2-D copies whose pitch is above the most
// cuMemcpy2D takes, which the Device does a row at a time: first at the
// driver's own limit (on the fake driver, 1 MiB), then with the Device's
// limit lowered so that every copy takes that path.
func TestStridedRowByRow(t *testing.T) {
	d := openOrSkip(t)
	s := d.DefaultStream()
	roundTrip := func(t *testing.T, hostPitch, devPitch, width, height uint64) {
		t.Helper()
		p, err := d.Malloc((height-1)*devPitch + width)
		if err != nil {
			t.Fatal(err)
		}
		defer d.Free(p)
		src := make([]byte, (height-1)*hostPitch+width)
		for i := range src {
			src[i] = byte(i*31 + i/7)
		}
		if err := d.CopyHtoD2D(p, devPitch, src, hostPitch, width, height, s); err != nil {
			t.Fatalf("CopyHtoD2D: %v", err)
		}
		back := bytes.Repeat([]byte{0xee}, len(src))
		if err := d.CopyDtoH2D(back, hostPitch, p, devPitch, width, height, s); err != nil {
			t.Fatalf("CopyDtoH2D: %v", err)
		}
		if err := s.Synchronize(); err != nil {
			t.Fatal(err)
		}
		for r := range height {
			row := src[r*hostPitch : r*hostPitch+width]
			if got := back[r*hostPitch : r*hostPitch+width]; !bytes.Equal(got, row) {
				t.Fatalf("row %d came back different", r)
			}
			if r+1 < height {
				if gap := back[r*hostPitch+width : (r+1)*hostPitch]; !bytes.Equal(gap, bytes.Repeat([]byte{0xee}, len(gap))) {
					t.Fatalf("the bytes between host rows %d and %d were written", r, r+1)
				}
			}
		}
	}
	t.Run("above the driver's max pitch", func(t *testing.T) {
		if d.maxPitch > 16<<20 {
			t.Skipf("the driver's max pitch is %d bytes: too much host memory to go past here", d.maxPitch)
		}
		roundTrip(t, d.maxPitch+512, 4096, 4000, 3)
	})
	t.Run("limit lowered", func(t *testing.T) {
		saved := d.maxPitch
		d.maxPitch = 256
		defer func() { d.maxPitch = saved }()
		roundTrip(t, 300, 1000, 200, 9)
	})
}

// TestStridedPinned checks that a 2-D copy whose rows lie in a pinned
// buffer is taken as pinned (and so not synchronized), and that rows
// running past the buffer's end make it a pageable copy.
func TestStridedPinned(t *testing.T) {
	d := openOrSkip(t)
	h, err := d.HostAlloc(1<<20, false)
	if err != nil {
		t.Fatal(err)
	}
	defer d.HostFree(h)
	p, err := d.Malloc(1 << 20)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Free(p)
	s, err := d.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := d.enter(); err != nil {
		t.Fatal(err)
	}
	_, pinned, err := d.prologue2D("test", s, p, 4096, 1000, 256, 255*4096+1000, h.Data[:255*2048+1000])
	d.exit()
	if err != nil || !pinned {
		t.Errorf("rows inside a pinned buffer: pinned = %v, %v; want true", pinned, err)
	}
	for i := range h.Data {
		h.Data[i] = byte(i % 251)
	}
	if err := d.CopyHtoD2D(p, 4096, h.Data, 2048, 1000, 256, s); err != nil {
		t.Fatal(err)
	}
	back, err := d.HostAlloc(1<<20, false)
	if err != nil {
		t.Fatal(err)
	}
	defer d.HostFree(back)
	if err := d.CopyDtoH2D(back.Data, 2048, p, 4096, 1000, 256, s); err != nil {
		t.Fatal(err)
	}
	if err := s.Synchronize(); err != nil {
		t.Fatal(err)
	}
	for r := range 256 {
		if !bytes.Equal(back.Data[r*2048:r*2048+1000], h.Data[r*2048:r*2048+1000]) {
			t.Fatalf("row %d of the pinned round trip differs", r)
		}
	}
	// A Go slice is not pinned.
	d.mu.Lock()
	goPinned := d.pinnedLocked(make([]byte, 4096))
	d.mu.Unlock()
	if goPinned {
		t.Error("a Go slice was taken for pinned memory")
	}
}

// TestDriverOutOfMemory asks the driver for more than is free but no more
// than the device's total (so the request reaches the driver): the error
// must wrap device.ErrOutOfMemory and the driver's Result, and give the
// figures.
func TestDriverOutOfMemory(t *testing.T) {
	d := openOrSkip(t)
	s, err := d.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	free := warmFree(t, d, s)
	_, total, err := d.MemInfo()
	if err != nil {
		t.Fatal(err)
	}
	if total-free < 2 {
		t.Skipf("the device reports %d of %d bytes free: no size between free and total to ask for", free, total)
	}
	n := free + (total-free)/2 + 1
	calls := map[string]func() (device.Ptr, error){
		"Malloc":      func() (device.Ptr, error) { return d.Malloc(n) },
		"MallocAsync": func() (device.Ptr, error) { return d.MallocAsync(n, s) },
	}
	for name, call := range calls {
		t.Run(name, func(t *testing.T) {
			p, err := call()
			if err == nil {
				d.Free(p)
				t.Fatalf("%s of %d bytes with %d free succeeded", name, n, free)
			}
			var r Result
			if !errors.Is(err, device.ErrOutOfMemory) || !errors.As(err, &r) || r != ErrorOutOfMemory {
				t.Fatalf("%s = %v; want an error wrapping device.ErrOutOfMemory and CUDA_ERROR_OUT_OF_MEMORY", name, err)
			}
			if msg := err.Error(); !strings.Contains(msg, "free of") || !strings.Contains(msg, "CUDA_ERROR_OUT_OF_MEMORY") {
				t.Errorf("%s error %q lacks the device's figures or the driver's name", name, msg)
			}
		})
	}
	memBack(t, d, free, "after the refused allocations")
}

// TestNoAliasAfterReset: an allocation made after a Reset never reuses the
// address range of one made before it (the driver may offer it; the Device
// passes it over), so the old pointer still fails with ErrInvalidated and
// cannot reach the new memory.
func TestNoAliasAfterReset(t *testing.T) {
	d := openOrSkip(t)
	s := d.DefaultStream()
	const n = 1 << 20
	var old []device.Ptr
	for range 4 {
		p, err := d.Malloc(n)
		if err != nil {
			t.Fatal(err)
		}
		old = append(old, p)
	}
	if err := d.Reset(); err != nil {
		t.Fatal(err)
	}
	s = d.DefaultStream()
	var fresh []device.Ptr
	for range 4 {
		q, err := d.Malloc(n)
		if err != nil {
			t.Fatal(err)
		}
		fresh = append(fresh, q)
		a, err := d.MallocAsync(n, s)
		if err != nil {
			t.Fatal(err)
		}
		fresh = append(fresh, a)
	}
	for _, q := range fresh {
		for _, p := range old {
			if uint64(q) < uint64(p)+n && uint64(p) < uint64(q)+n {
				t.Errorf("allocation %v after the Reset overlaps %v from before it", q, p)
			}
		}
	}
	for _, p := range old {
		if err := d.Memset(p, 1, n, s); !errors.Is(err, device.ErrInvalidated) {
			t.Errorf("Memset of %v from before the Reset = %v; want ErrInvalidated", p, err)
		}
	}
	for _, q := range fresh {
		if err := d.Free(q); err != nil {
			t.Errorf("Free(%v): %v", q, err)
		}
	}
}
