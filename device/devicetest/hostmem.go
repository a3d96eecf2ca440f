package devicetest

// Pinned host memory: device.HostAllocator.

import (
	"errors"
	"testing"

	"github.com/vramkit/vram/device"
)

func testHostMemory(t *testing.T, o opener) {
	d := o.fresh(t)
	ha, isHA := d.(device.HostAllocator)
	if !isHA {
		t.Skip("device is no device.HostAllocator")
	}
	start := memFree(t, d)
	t.Run("pinned", func(t *testing.T) {
		b := hbuf(t)(ha.HostAlloc(10000, false))
		if len(b.Data) != 10000 || b.DevicePtr != 0 {
			t.Errorf("HostAlloc(10000, false) = %d bytes, device address %v; want 10000 bytes, none", len(b.Data), b.DevicePtr)
		}
		freeNear(t, d, memFree(t, d), start, "with pinned host memory (which takes no device memory)")
		ok(t, ha.HostFree(b))
		err := ha.HostFree(b)
		if !errors.Is(err, device.ErrDoubleFree) && !errors.Is(err, device.ErrInvalidPointer) {
			t.Errorf("second HostFree = %v; want ErrDoubleFree or ErrInvalidPointer", err)
		}
	})
	t.Run("mapped", func(t *testing.T) {
		backed(t, d)
		b := hbuf(t)(ha.HostAlloc(4096, true))
		defer func() { ok(t, ha.HostFree(b)) }()
		if b.DevicePtr == 0 {
			t.Fatal("mapped HostAlloc has no device address")
		}
		copy(b.Data, "host bytes seen by the device")
		p := ptr(t)(d.Malloc(4096))
		defer func() { ok(t, d.Free(p)) }()
		s := d.DefaultStream()
		ok(t, d.CopyDtoD(p, b.DevicePtr, 4096, s))
		got := make([]byte, 29)
		ok(t, d.CopyDtoH(got, p, s))
		syncStream(t, s)
		if string(got) != "host bytes seen by the device" {
			t.Errorf("device read %q through the mapped address", got)
		}
	})
}
